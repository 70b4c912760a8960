"""Kernel launch through the CUDA driver API (ctypes on libcuda), with Params passed by value.

Why not PyCUDA's own launch: PyCUDA packs kernel arguments into one buffer and launches with
CU_LAUNCH_PARAM_BUFFER_POINTER, which does not keep a by-value parameter's 64-byte alignment (sm90
Params hold CUtensorMap descriptors, alignas(64)): such a kernel reads garbage (DESIGN.md). The kernelParams
form of cuLaunchKernel (an array of pointers, one per parameter) lets the driver place each parameter at
the offset the kernel declares, which is how CUTLASS's own adapters launch (cudaLaunchKernelEx with an
argument array).

Passing Params by value as a `__grid_constant__` parameter, instead of a pointer to a device copy, is a
speed matter, not only a style one: read through a pointer, every Params field the kernel uses is a load
into a register, and the stream-K 128x128x64 cooperative kernel spilled 1934 bytes at 168 registers that way
(ptxas -v, nvcc 13.0); by value its fields are constant-bank operands and it spills nothing.

PyCUDA still owns the context (the primary context, made current by pycuda.autoprimaryctx), memory, streams
and events; this module loads the cubin into that same current context.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from typing import Sequence

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_ALIGN = 128      # the strictest alignment a Params struct has (CUtensorMap 64; the Hopper FMHA kernels 128)

_lib: ctypes.CDLL | None = None


class DriverError(RuntimeError):
    """A CUDA driver call failed; `code` is the CUresult, the message has its name and description."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: {text}")
        self.call = call
        self.code = code


def _libcuda() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            lib = ctypes.CDLL("libcuda.so.1")
        vp, ci, cu = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleUnload.argtypes = [vp]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [vp, ci, ci]
        lib.cuLaunchKernel.argtypes = [vp, cu, cu, cu, cu, cu, cu, cu, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        lib.cuGetErrorName.argtypes = [ci, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorString.argtypes = [ci, ctypes.POINTER(ctypes.c_char_p)]
        for f in (lib.cuModuleLoadData, lib.cuModuleUnload, lib.cuModuleGetFunction, lib.cuFuncSetAttribute,
                  lib.cuLaunchKernel, lib.cuGetErrorName, lib.cuGetErrorString):
            f.restype = ci
        _lib = lib
    return _lib


def _check(call: str, code: int) -> None:
    if code == 0:
        return
    lib = _libcuda()
    name, desc = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(desc))
    text = f"{(name.value or b'CUDA_ERROR_%d' % code).decode()}: {(desc.value or b'unknown error').decode()}"
    raise DriverError(call, code, text)


class PackedParams:
    """Params bytes in a 64-byte-aligned host buffer plus the kernelParams array that points at it.
    The driver copies the bytes at launch, so one PackedParams can be launched any number of times."""

    __slots__ = ("size", "_raw", "_array")

    def __init__(self, params: bytes) -> None:
        if not params:
            raise ValueError("empty Params")
        self.size = len(params)
        self._raw = ctypes.create_string_buffer(self.size + _ALIGN)
        base = ctypes.addressof(self._raw)
        aligned = (base + _ALIGN - 1) // _ALIGN * _ALIGN
        ctypes.memmove(aligned, params, self.size)
        self._array = (ctypes.c_void_p * 1)(aligned)

    @property
    def array(self) -> ctypes.Array:
        return self._array

    def data(self) -> bytes:
        return ctypes.string_at(self._array[0], self.size)


class DriverKernel:
    """One `extern "C"` kernel of a cubin, loaded into the current context."""

    def __init__(self, cubin: str | Path, symbol: str) -> None:
        lib = _libcuda()
        image = Path(cubin).read_bytes()
        self._module = ctypes.c_void_p()
        _check(f"cuModuleLoadData({Path(cubin).name})", lib.cuModuleLoadData(ctypes.byref(self._module), image))
        self._image = image     # the driver may read the image lazily: keep it alive with the module
        fn = ctypes.c_void_p()
        try:
            _check(f"cuModuleGetFunction({symbol})",
                   lib.cuModuleGetFunction(ctypes.byref(fn), self._module, symbol.encode()))
        except DriverError:
            lib.cuModuleUnload(self._module)
            raise
        self.symbol = symbol
        self._fn = fn
        self.max_dynamic_shared = 48 * 1024

    def allow_shared(self, nbytes: int) -> None:
        """Raise the function's dynamic shared-memory limit (needed above 48 KiB)."""
        if nbytes > self.max_dynamic_shared:
            _check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                   _libcuda().cuFuncSetAttribute(self._fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes)))
            self.max_dynamic_shared = int(nbytes)

    def launch(self, grid: Sequence[int], block: Sequence[int], shared: int, stream: int,
               params: PackedParams) -> None:
        """cuLaunchKernel with the Params by value. `stream` is a CUstream handle (PyCUDA Stream.handle)."""
        self.allow_shared(shared)
        code = _libcuda().cuLaunchKernel(self._fn, int(grid[0]), int(grid[1]), int(grid[2]),
                                         int(block[0]), int(block[1]), int(block[2]), int(shared),
                                         ctypes.c_void_p(int(stream) or None), params.array, None)
        _check(f"cuLaunchKernel({self.symbol})", code)

    def unload(self) -> None:
        if self._module:
            _libcuda().cuModuleUnload(self._module)
            self._module = ctypes.c_void_p()
