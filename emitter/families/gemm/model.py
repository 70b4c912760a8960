"""The GEMM instance record: one fully resolved kernel configuration.

A spec expands into candidate GemmInstance records (fields may still be AUTO / 0 meaning "derive").
The arch module (sm80.py for CUTLASS 2.x, sm90a.py for 3.x) resolves them: fills derived values
(instruction shape, alignments, stages, schedules) and checks every constraint, returning either the
resolved instance or a Rejection naming the rule and the fix. Templates only see resolved instances.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from emitter.dtypes import DType
from emitter.kit.enums import AUTO, Activation, Arch, Shape3, SplitK


class Layout(Enum):
    row = "row"   # cutlass::layout::RowMajor
    col = "col"   # cutlass::layout::ColumnMajor

    @property
    def cpp(self) -> str:
        return "cutlass::layout::RowMajor" if self is Layout.row else "cutlass::layout::ColumnMajor"

    @property
    def letter(self) -> str:
        # BLAS convention used in names: A row-major = "t", column-major = "n" (cuBLAS TN = A row, B col).
        return "t" if self is Layout.row else "n"

    def __str__(self) -> str:
        return self.value


class OpClass(Enum):
    tensorop = "tensorop"
    simt = "simt"

    def __str__(self) -> str:
        return self.value


class KernelSchedule(Enum):  # CUTLASS 3.x only
    auto = "auto"
    cooperative = "cooperative"
    pingpong = "pingpong"

    def __str__(self) -> str:
        return self.value


class EpilogueSchedule(Enum):  # CUTLASS 3.x only
    auto = "auto"
    tma = "tma"            # TmaWarpSpecialized{Cooperative,} matching the kernel schedule
    no_smem = "no_smem"    # NoSmemWarpSpecialized (direct stores)

    def __str__(self) -> str:
        return self.value


class TileScheduler(Enum):  # CUTLASS 3.x only
    persistent = "persistent"
    stream_k = "stream_k"

    def __str__(self) -> str:
        return self.value


class Raster(Enum):  # CUTLASS 3.x only: the order the persistent / stream-K scheduler hands out output tiles
    heuristic = "heuristic"   # CUTLASS's Heuristic: along_m when the tile grid has more columns (N) than rows (M)
    along_m = "along_m"       # consecutive tiles walk down M (one column of tiles after another)
    along_n = "along_n"       # consecutive tiles walk along N (one row of tiles after another)

    def __str__(self) -> str:
        return self.value


class Reduction(Enum):  # CUTLASS 3.x stream-K / split-K only: how the partial tiles of one output tile meet
    deterministic = "deterministic"         # in K order, each split waiting for the one before (a turnstile)
    nondeterministic = "nondeterministic"   # every split adds into the first split's partial as it arrives

    def __str__(self) -> str:
        return self.value


class Promotion(Enum):  # CUTLASS 3.x fp8 full accumulation: how partial sums reach the f32 accumulators
    serial = "serial"     # CUTLASS's: wait for every wgmma in flight, then add (the tensor cores idle meanwhile)
    overlap = "overlap"   # emitter's: two sets of tensor-core accumulators, one added while the other runs

    def __str__(self) -> str:
        return self.value


class Bias(Enum):
    none = "none"
    row = "row"        # one value per output row (length M), broadcast along N
    column = "column"  # one value per output column (length N), broadcast along M

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Epilogue:
    activation: Activation = Activation.identity
    bias: Bias = Bias.none
    # clamp bounds (only for activation=clamp); floats, rendered as C++ literals by Python, never pasted text
    clamp_min: float = 0.0
    clamp_max: float = 6.0
    # False: no C operand, D = act(alpha * A @ B (+ bias)) (CUTLASS's ElementC = void, sm90a TMA epilogue):
    # no shared memory or load pipeline for C, and the epilogue's TMA stores are issued late (DelayTmaStore).
    # Such a kernel refuses beta != 0 (cannot implement).
    source: bool = True


@dataclass(frozen=True)
class GemmInstance:
    arch: Arch
    a: DType
    b: DType
    c: DType
    d: DType
    layout_a: Layout
    layout_b: Layout
    layout_c: Layout            # D shares C's layout
    accumulator: DType
    epilogue_compute: DType
    op_class: OpClass
    tile: Shape3                # threadblock (2.x) / CTA (3.x) tile
    warp: Shape3 | None         # 2.x only (None for 3.x)
    cluster: Shape3 | None      # 3.x only (None for 2.x)
    instruction: Shape3 | None  # None until resolved when omitted in the spec
    stages: int                 # AUTO (0) = derive
    kernel_schedule: KernelSchedule
    epilogue_schedule: EpilogueSchedule
    tile_scheduler: TileScheduler
    swizzle: int                # 2.x threadblock swizzle width / 3.x scheduler max_swizzle_size: 1, 2, 4, 8
    alignment_a: int            # elements; AUTO (0) = derived maximum
    alignment_b: int
    alignment_c: int
    epilogue: Epilogue = field(default_factory=Epilogue)
    split_k: SplitK = SplitK.none
    batched: bool = False
    # CUTLASS 3.x fp8 "fast accumulation" (KernelTmaWarpSpecialized*FP8FastAccum): the wgmma accumulates
    # the whole K loop in the tensor core's reduced-precision adder instead of promoting partial sums
    # into f32 registers every few k-blocks. sm90a, fp8 A and B, TMA mainloop only.
    fp8_fast_accum: bool = False
    # Swap A and B (sm90a): the kernel computes D^T = B^T A^T, so a few-row problem (decode, M = 16) gets
    # the 16 rows as the tile's N instead of wasting a 64-row wgmma tile. Dtypes, layouts, alignments and
    # bias are the caller's problem (what every API above the host shim sees); tile and cluster are the
    # kernel's, over (N, M, K). The host shim swaps the operands (cuBLAS's small-M kernels do the same).
    swap_ab: bool = False
    # CUTLASS 3.x tile scheduler arguments, fixed per instance by the host shim (sm90a): `swizzle` (the
    # field above) is then the scheduler's max_swizzle_size, `raster` its raster order (in the caller's
    # terms: a swap_ab kernel walks the other way), `reduction` the stream-K / split-K reduction mode.
    raster: Raster = Raster.heuristic
    reduction: Reduction = Reduction.deterministic
    # CUTLASS 3.x fp8 full accumulation (sm90a, TMA mainloop, no fp8_fast_accum): how many wgmma k-steps the
    # tensor core accumulates before the partial sums are added into the f32 registers (the mainloop's
    # Arguments::mma_promotion_interval). AUTO (0) until resolved: then CUTLASS's 4 on that mainloop, and it
    # stays AUTO everywhere else (no promotion to time).
    promotion_interval: int = AUTO
    # ... and how the promotion runs: CUTLASS's mainloop drains the wgmma pipe before each promotion
    # (`serial`); `overlap` is emitter's collective (templates/gemm/sm90a/fp8_overlap.cu.j2), which adds one
    # set of tensor-core accumulators into f32 while the next interval's wgmma run into another set (same
    # numerics, one more accumulator set in registers).
    promotion: Promotion = Promotion.serial
    # where it came from (not part of identity)
    spec_file: str = field(default="", compare=False)
    spec_index: int = field(default=0, compare=False)
    spec_hash: str = field(default="", compare=False)

    @property
    def family(self) -> str:
        return "gemm"

    def replace(self, **changes: Any) -> "GemmInstance":
        return dataclasses.replace(self, **changes)

    def config(self) -> dict[str, Any]:
        """The full resolved configuration as plain JSON data (the manifest's `config`)."""
        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value[0] if isinstance(v.value, tuple) else v.value
            if isinstance(v, Shape3):
                return v.as_list()
            if isinstance(v, Epilogue):
                out = {"activation": v.activation.value, "bias": v.bias.value}
                if v.activation is Activation.clamp:
                    out["clamp_min"] = v.clamp_min
                    out["clamp_max"] = v.clamp_max
                if not v.source:   # only when set: the configs (and names) of kernels with C stay as they were
                    out["source"] = False
                return out
            return v
        skip = {"spec_file", "spec_index", "spec_hash"}
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}


from emitter.families.base import Rejection  # noqa: E402  (shared by every family; re-exported here)
