"""The vocabulary the CUTLASS families share: target arches (with their CUTLASS API generation), epilogue
activations, split-K modes, the AUTO marker of integer fields and an (m, n, k) shape. GEMM and conv instances are
made of these; data types are emitter.dtypes.DType."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Arch(Enum):
    sm75 = ("sm75", 75, 2)
    sm80 = ("sm80", 80, 2)
    sm86 = ("sm86", 86, 2)
    sm89 = ("sm89", 89, 2)
    sm90a = ("sm90a", 90, 3)

    @property
    def yaml(self) -> str:
        return self.value[0]

    @property
    def cc(self) -> int:
        return self.value[1]

    @property
    def cutlass_major(self) -> int:
        """2 = CUTLASS 2.x device API (sm75..sm89), 3 = CUTLASS 3.x collectives (sm90a)."""
        return self.value[2]

    def __str__(self) -> str:
        return self.yaml


class Activation(Enum):
    identity = "identity"
    relu = "relu"
    gelu = "gelu"
    silu = "silu"
    sigmoid = "sigmoid"
    clamp = "clamp"

    def __str__(self) -> str:
        return self.value


class SplitK(Enum):
    none = "none"
    serial = "serial"
    parallel = "parallel"

    def __str__(self) -> str:
        return self.value


AUTO = 0  # integer fields: 0 means "derive" (stages, alignments, instruction shape components)


@dataclass(frozen=True)
class Shape3:
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def as_list(self) -> list[int]:
        return [self.m, self.n, self.k]
