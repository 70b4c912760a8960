"""Data types: one enum member carries every fact about a type (C++ spelling, bits, numpy type)."""

from __future__ import annotations

from enum import Enum


class DType(Enum):
    # value = (yaml name, C++ type, bits, numpy dtype name used on the host, is_float)
    f16 = ("f16", "cutlass::half_t", 16, "float16", True)
    bf16 = ("bf16", "cutlass::bfloat16_t", 16, "bfloat16", True)   # host side: uint16 bit pattern
    f32 = ("f32", "float", 32, "float32", True)
    tf32 = ("tf32", "cutlass::tfloat32_t", 32, "float32", True)
    f64 = ("f64", "double", 64, "float64", True)
    s8 = ("s8", "int8_t", 8, "int8", False)
    s32 = ("s32", "int32_t", 32, "int32", False)
    e4m3 = ("e4m3", "cutlass::float_e4m3_t", 8, "float8_e4m3fn", True)
    e5m2 = ("e5m2", "cutlass::float_e5m2_t", 8, "float8_e5m2", True)

    @property
    def yaml(self) -> str:
        return self.value[0]

    @property
    def cpp(self) -> str:
        return self.value[1]

    @property
    def bits(self) -> int:
        return self.value[2]

    @property
    def bytes(self) -> int:
        return self.value[2] // 8

    @property
    def numpy_name(self) -> str:
        return self.value[3]

    @property
    def is_float(self) -> bool:
        return self.value[4]

    @property
    def is_fp8(self) -> bool:
        return self in (DType.e4m3, DType.e5m2)

    @classmethod
    def names(cls) -> list[str]:
        return [d.yaml for d in cls]

    @classmethod
    def parse(cls, text: str) -> "DType":
        for d in cls:
            if d.yaml == text:
                return d
        raise KeyError(text)

    def __str__(self) -> str:
        return self.yaml


# Accepted aliases in specs -> canonical names.
DTYPE_ALIASES = {
    "fp16": "f16", "half": "f16", "float16": "f16",
    "bfloat16": "bf16",
    "fp32": "f32", "float": "f32", "float32": "f32",
    "fp64": "f64", "double": "f64", "float64": "f64",
    "int8": "s8", "i8": "s8", "int32": "s32", "i32": "s32",
    "fp8_e4m3": "e4m3", "float8_e4m3": "e4m3", "e4m3fn": "e4m3",
    "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2",
}
