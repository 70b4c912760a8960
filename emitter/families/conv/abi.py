"""ctypes mirror of templates/conv/common/conv_abi.h (EMITTER_CONV_ABI_VERSION 1) and the conv host shim.

tests/test_conv_abi.py compiles a C program printing the C struct's size and offsets and compares them here."""

from __future__ import annotations

import ctypes
from pathlib import Path

from emitter.kit.shim import HostShim, ShimError

CONV_ABI_VERSION = 1
_I3 = ctypes.c_int * 3
_L4 = ctypes.c_longlong * 4


class EmitterConvProblem(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int), ("d", ctypes.c_int), ("h", ctypes.c_int), ("w", ctypes.c_int), ("c", ctypes.c_int),
        ("k", ctypes.c_int), ("t", ctypes.c_int), ("r", ctypes.c_int), ("s", ctypes.c_int),
        ("z", ctypes.c_int), ("p", ctypes.c_int), ("q", ctypes.c_int),
        ("pad_front", _I3), ("pad_back", _I3), ("stride", _I3), ("dilation", _I3),
        ("groups", ctypes.c_int), ("split_k_slices", ctypes.c_int), ("options", ctypes.c_int), ("reserved", ctypes.c_int),
        ("stride_x", _L4), ("stride_w", _L4), ("stride_y", _L4),
        ("ptr_x", ctypes.c_void_p), ("ptr_w", ctypes.c_void_p), ("ptr_y", ctypes.c_void_p),
        ("ptr_source", ctypes.c_void_p), ("ptr_bias", ctypes.c_void_p),
        ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
    ]


def c_problem_from(problem, pointers: dict[str, int]) -> EmitterConvProblem:
    """The shim's struct for a ConvProblem (problem.py) and device pointers by tensor name
    (x, w, y, source, bias; missing or 0 = null)."""
    p = problem
    zpq = p.output_extents()
    out = EmitterConvProblem(
        n=p.n, d=p.d, h=p.h, w=p.w, c=p.c, k=p.k, t=p.t, r=p.r, s=p.s, z=zpq[0], p=zpq[1], q=zpq[2],
        pad_front=_I3(*p.pad_front), pad_back=_I3(*p.pad_back), stride=_I3(*p.stride), dilation=_I3(*p.dilation),
        groups=getattr(p, "groups", 1), split_k_slices=p.split_k, options=0, reserved=0,
        stride_x=_L4(0, 0, 0, 0), stride_w=_L4(0, 0, 0, 0), stride_y=_L4(0, 0, 0, 0),
        alpha=p.alpha, beta=p.beta)
    for name in ("x", "w", "y", "source", "bias"):
        setattr(out, f"ptr_{name}", pointers.get(name) or None)
    return out


class ConvShim(HostShim):
    """One conv instance's host shared library: the runtime's HostShim (emitter_<name>_query / _initialize /
    _name), which must also export emitter_<name>_conv_abi with this emitter's conv ABI version."""

    def __init__(self, path: str | Path, name: str) -> None:
        super().__init__(path, name)
        try:
            abi = getattr(self.lib, f"emitter_{name}_conv_abi")
        except AttributeError as e:
            raise ShimError(f"host shim {self.path} lacks a conv ABI symbol: {e}") from None
        abi.restype = ctypes.c_int
        version = int(abi())
        if version != CONV_ABI_VERSION:
            raise ShimError(f"{self.path}: conv ABI version {version}, this emitter speaks {CONV_ABI_VERSION}: rebuild")
