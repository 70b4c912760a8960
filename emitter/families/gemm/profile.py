"""GEMM's side of the profiler: the profile problem (m, n, k, batch), the named shape sets, the op kernels are
compared under, the fewest bytes a GEMM moves, and the split-K slice counts a serial split-K instance is timed at.
The profile stage reaches them through the run-time hooks of emitter/families/gemm/runtime.py (profile_problem,
profile_op, profile_min_bytes, profile_splits, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

SQUARE_SIZES = (1024, 2048, 4096, 8192, 16384)
LLM_M = (16, 128, 512, 2048, 8192)
LLM_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 8192), (128256, 4096))


@dataclass(frozen=True, order=True)
class Problem:
    """GEMM's profile problem (the sizes; alpha and beta are the config's). Other families' profile problems
    have the same face: FAMILY, key, flops, as_dict() (with "family"), ordering by their own fields."""

    FAMILY: ClassVar[str] = "gemm"

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def key(self) -> str:
        base = f"{self.m}x{self.n}x{self.k}"
        return base if self.batch == 1 else f"{base}x{self.batch}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def ident(self) -> tuple[int, int, int, int]:
        """What groupings and sort orders identify it by (emitter.profile.config.problem_ident)."""
        return (self.m, self.n, self.k, self.batch)

    def as_dict(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k, "batch": self.batch}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Problem":
        return cls(int(d["m"]), int(d["n"]), int(d["k"]), int(d.get("batch", 1)))

    def __str__(self) -> str:
        return self.key


def named_set(name: str) -> list[Problem]:
    if name == "square":
        return [Problem(s, s, s) for s in SQUARE_SIZES]
    if name == "llm":
        return [Problem(m, n, k) for m in LLM_M for (n, k) in LLM_NK]
    raise KeyError(name)


NAMED_SETS = ("square", "llm")


# ------------------------------------------------------------------------------------------------ the op
_LETTER = {"row": "t", "col": "n"}


@dataclass(frozen=True)
class Op:
    """What a GEMM kernel computes, apart from the problem size: the key kernels are compared under (the GEMM
    family's profile op: emitter.families.gemm.runtime.profile_op)."""

    FAMILY: ClassVar[str] = "gemm"

    a: str
    b: str
    c: str
    d: str
    layout_a: str
    layout_b: str
    layout_c: str
    accumulator: str = "f32"
    activation: str = "identity"
    bias: str = "none"
    fast_accum: bool = False      # sm90a fp8 fast accumulation: different numerics, so its own op

    @property
    def layout(self) -> str:
        """BLAS letters, A row-major = t: 'tn' + output letter (t = row-major D)."""
        return _LETTER[self.layout_a] + _LETTER[self.layout_b] + _LETTER[self.layout_c]

    @property
    def key(self) -> str:
        parts = [f"{self.a}{self.b}", f"{self.c}{self.d}", f"acc{self.accumulator}", self.layout]
        if self.activation != "identity":
            parts.append(self.activation)
        if self.bias != "none":
            parts.append(f"bias{self.bias}")
        if self.fast_accum:
            parts.append("fastacc")
        return "_".join(parts)

    @property
    def fused_epilogue(self) -> bool:
        return self.activation != "identity" or self.bias != "none"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "c": self.c, "d": self.d, "layout_a": self.layout_a,
                "layout_b": self.layout_b, "layout_c": self.layout_c, "accumulator": self.accumulator,
                "activation": self.activation, "bias": self.bias, "fast_accum": self.fast_accum,
                "layout": self.layout, "key": self.key}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Op":
        return cls(**{k: d[k] for k in ("a", "b", "c", "d", "layout_a", "layout_b", "layout_c")},
                   accumulator=d.get("accumulator", "f32"), activation=d.get("activation", "identity"),
                   bias=d.get("bias", "none"), fast_accum=bool(d.get("fast_accum", False)))

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "Op":
        """The op of a manifest instance's `config` (GemmInstance.config(): fast accumulation is
        `fp8_fast_accum`)."""
        ep = cfg.get("epilogue") or {}
        return cls(a=cfg["a"], b=cfg["b"], c=cfg["c"], d=cfg["d"], layout_a=cfg["layout_a"],
                   layout_b=cfg["layout_b"], layout_c=cfg["layout_c"], accumulator=cfg.get("accumulator", "f32"),
                   activation=ep.get("activation", "identity"), bias=ep.get("bias", "none"),
                   fast_accum=bool(cfg.get("fp8_fast_accum", False)))


_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "tf32": 4, "f64": 8, "s8": 1, "s32": 4, "e4m3": 1, "e5m2": 1}


def min_bytes(op: Op, p: Problem, beta: float) -> int:
    """The fewest bytes the GEMM must move: A and B read once, D written once, C read when beta != 0."""
    ab = (p.m * p.k * _BYTES[op.a] + p.k * p.n * _BYTES[op.b]) * p.batch
    d = p.m * p.n * _BYTES[op.d] * p.batch
    c = p.m * p.n * _BYTES[op.c] * p.batch if beta != 0 else 0
    bias = (p.m if op.bias == "row" else p.n if op.bias == "column" else 0) * _BYTES[op.c]
    return ab + c + d + bias


# ------------------------------------------------------------------------------------------------ split-K
# split-K slice counts the profiler tries on a split_k: serial instance (cutlass_profiler's --split_k_slices)
SPLIT_K_CHOICES = (2, 3, 4, 6, 8, 12, 16)
MIN_K_BLOCKS_PER_SLICE = 4      # a slice shorter than this many tile-k blocks cannot fill the mainloop pipeline


def split_k_candidates(tile: tuple[int, int, int], m: int, n: int, k: int, batch: int, sm_count: int) -> list[int]:
    """The slice counts worth timing for one problem: 1, then more while the split work units still fit in
    two waves of the GPU (beyond that, splitting only adds the reduction) and every slice keeps at least
    MIN_K_BLOCKS_PER_SLICE k-blocks. Large problems (a full wave of output tiles) get [1]."""
    tm, tn, tk = tile
    tiles = -(-m // tm) * -(-n // tn) * max(batch, 1)
    out = [1]
    for s in SPLIT_K_CHOICES:
        if tiles * s > 2 * max(sm_count, 1) or k < s * MIN_K_BLOCKS_PER_SLICE * tk:
            break
        out.append(s)
    return out
