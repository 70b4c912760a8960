"""torch beside emitter's own buffers: whether torch is here (and its version, for the outputs), and zero-copy torch
views of device pointers (__cuda_array_interface__), the way every family's baseline and profile check reads the
very bytes its kernel read. torch is imported by the caller, never here."""

from __future__ import annotations

import importlib.util
from typing import Any

from emitter.dtypes import DType

_TYPESTR = {1: "|u1", 2: "<i2", 4: "<f4", 8: "<f8"}


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_version() -> str | None:
    if not torch_available():
        return None
    import torch

    return f"{torch.__version__} (CUDA {torch.version.cuda})"


class CudaArray:
    """A device pointer dressed as a 1-D array, so torch.as_tensor can view it without a copy."""

    def __init__(self, ptr: int, count: int, itemsize: int, typestr: str | None = None) -> None:
        self.__cuda_array_interface__ = {"shape": (int(count),), "typestr": typestr or _TYPESTR[itemsize],
                                         "data": (int(ptr), False), "version": 3, "strides": None}


def torch_dtype(torch: Any, dt: DType) -> Any:
    return {DType.f16: torch.float16, DType.bf16: torch.bfloat16, DType.f32: torch.float32,
            DType.tf32: torch.float32, DType.f64: torch.float64, DType.s8: torch.int8, DType.s32: torch.int32,
            DType.e4m3: torch.float8_e4m3fn, DType.e5m2: torch.float8_e5m2}[dt]
