"""CUTLASS 3.x (sm90a) GEMM: resolve and check a candidate, and give the templates their C++ spellings.

The kernel is composed the way CUTLASS's own sm90 instances are (level by level, see LEVELS):
wgmma instruction -> collective epilogue -> collective mainloop (TMA or cp.async, warp-specialized
cooperative / ping-pong, cluster, stages) -> GemmUniversal kernel with a tile scheduler (persistent,
stream-K) -> host half of GemmUniversalAdapter -> C ABI entry points.

resolve() is the gate in front of nvcc: every rule below mirrors a static_assert or a can_implement
check in the CUTLASS 4.2 headers (cutlass_library/source/include) or the pruning in CUTLASS's own
generator (cutlass_library/sm90_utils.py), so an accepted instance compiles and a rejected one says
which rule it broke and what to change. Everything CUTLASS's generator emits for sm90 by default is
accepted (tests/gemm/test_sm90a.py enumerates them with cutlass_library), except mixed-width inputs
(e.g. s8 x f16) and f64, which are rejected with a reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from emitter.dtypes import DType
from emitter.families.gemm.model import (
    AUTO, Activation, Arch, Bias, EpilogueSchedule, GemmInstance, KernelSchedule, Layout, OpClass,
    Promotion, Raster, Reduction, Rejection, Shape3, SplitK, TileScheduler,
)

ARCHES = (Arch.sm90a,)
# Template stems in composition order. The epilogue comes before the mainloop because the mainloop's
# automatic stage count is "whatever shared memory the epilogue leaves" (StageCountAutoCarveout).
LEVELS = ("mma", "epilogue", "mainloop", "kernel", "device", "entry")

SMEM_CAPACITY = 232448          # cutlass::gemm::collective::detail::sm90_smem_capacity_bytes (227 KiB)
TMA_ALIGNMENT_BITS = 128        # TMA: global addresses and strides are 16-byte aligned
CP_ASYNC_MIN_BYTES = 4          # detail::cp_async_min_alignment_bytes
MAX_CLUSTER_CTAS = 8            # portable cluster size (16 needs a non-portable launch attribute)
# wgmma N sizes the CollectiveBuilder picks from, largest first (cute::GMMA::ss_op_selector without
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED): the first one that divides the tile N.
_GMMA_N = (256, 192, 128, 96, 64, 32, 16, 8)

_FLOAT32 = (DType.f32, DType.tf32)
_SIXTEEN = (DType.f16, DType.bf16)
_FP8 = (DType.e4m3, DType.e5m2)
_OUTPUTS = (DType.f16, DType.bf16, DType.f32, DType.e4m3, DType.e5m2, DType.s8, DType.s32)

_ACTIVATION_CPP = {
    Activation.relu: "cutlass::epilogue::thread::ReLu",
    Activation.gelu: "cutlass::epilogue::thread::GELU",      # erf form, as LinearCombinationGELU (2.x)
    Activation.silu: "cutlass::epilogue::thread::SiLu",
    Activation.sigmoid: "cutlass::epilogue::thread::Sigmoid",
    Activation.clamp: "cutlass::epilogue::thread::Clamp",
}


# --------------------------------------------------------------------------------------------------
# Derived facts shared by resolve() and template_context()
# --------------------------------------------------------------------------------------------------

# per consumer thread (32-bit accumulators). 160 = cooperative 256x160 (cuBLASLt's fp8 320x128 tile holds as many),
# which nvcc 13.0 compiles with no spill and no serialized wgmma (bf16, and e4m3 with fast accumulation; 2026-11-25,
# tests/gemm/test_sm90a.py COMPILED); 256 (cooperative 256x256, ping-pong 128x256) serializes (C7510 / C7511).
MAX_ACCUMULATOR_REGISTERS = 160
# three accumulator sets (f32 + two tensor-core sets) per consumer thread. 216 = cooperative 128x144 (72 a set),
# which nvcc 13.0 compiles with no spill and no serialized wgmma (2026-11-24; tests/gemm/test_sm90a.py COMPILED);
# 128x256 (128 a set) spills.
FP8_OVERLAP_REGISTERS = 216
FP8_PROMOTION_INTERVAL = 4      # CollectiveMma<MainloopSm90TmaGmmaWarpSpecializedFP8>::Arguments::mma_promotion_interval
RMEM_A_REGISTERS = 160           # accumulators + A fragments a thread, register-sourced A (tf32 M-major)


def _instruction_k(a: DType) -> int:
    """wgmma K: 32 bytes of A per instruction (16 for 16-bit, 8 for tf32, 32 for 8-bit)."""
    return 256 // a.bits


def _base_gmma_n(tile_n: int) -> int:
    """The wgmma N the builder picks without the extended shapes: the largest of _GMMA_N that divides the tile N."""
    return next((g for g in _GMMA_N if tile_n % g == 0), 8)


def _extended_mma(inst: GemmInstance) -> bool:
    """Whether the tile N needs CUTLASS's extended wgmma shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: every
    multiple of 8 up to 256 for the floating-point types): without them the builder would split a tile N such as
    112 or 144 into wgmmas of N = 16, each re-reading A from shared memory. cuBLAS's own Hopper kernels use such
    tiles (nvjet_sm90_tst_112x128 on 128x14336x4096: 128 tiles, one wave) to fit the tile count to the SMs."""
    n = inst.tile.n
    return _base_gmma_n(n) < n <= 256 and n % 8 == 0 and inst.a.is_float and inst.b.is_float


def _instruction(inst: GemmInstance) -> Shape3:
    n = inst.tile.n if _extended_mma(inst) else _base_gmma_n(inst.tile.n)
    return Shape3(64, n, _instruction_k(inst.a))


def _is_16bit(inst: GemmInstance) -> bool:
    return inst.a.bits == 16 and inst.b.bits == 16


def _k_major_a(inst: GemmInstance) -> bool:
    return inst.layout_a is Layout.row


def _k_major_b(inst: GemmInstance) -> bool:
    return inst.layout_b is Layout.col


def _builder_swaps_ab(inst: GemmInstance) -> bool:
    """8/32-bit wgmma reads K-major operands only; with A K-major and B MN-major CUTLASS swaps A and B
    (computes D^T) and needs the transposed epilogue (cutlass::gemm::EpilogueTransposed)."""
    return not _is_16bit(inst) and _k_major_a(inst) and not _k_major_b(inst)


def _transpose_b(inst: GemmInstance) -> bool:
    """A and B both MN-major (8/32-bit): B is transposed in shared memory by the mainloop."""
    return not _is_16bit(inst) and not _k_major_a(inst) and not _k_major_b(inst)


def _tma_capable(elements: int, dtype: DType) -> bool:
    return elements * dtype.bits % TMA_ALIGNMENT_BITS == 0


def _cp_async(inst: GemmInstance) -> bool:
    """A or B narrower than 16 bytes: TMA cannot load it; CUTLASS uses the cp.async mainloop."""
    return not (_tma_capable(inst.alignment_a, inst.a) and _tma_capable(inst.alignment_b, inst.b))


def _cooperative(inst: GemmInstance) -> bool:
    return inst.kernel_schedule is KernelSchedule.cooperative


def _fused(inst: GemmInstance) -> bool:
    return inst.epilogue.activation is not Activation.identity or inst.epilogue.bias is not Bias.none


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@dataclass(frozen=True)
class _EpilogueTile:
    m: int
    n: int
    stages_c: int
    stages_d: int
    reuse_c: bool


def _epilogue_tile(inst: GemmInstance) -> _EpilogueTile:
    """detail::sm90_compute_tile_shape_or_override + sm90_get_tma_dispatch_policy (EpilogueTileAuto)."""
    t = inst.tile
    if _cooperative(inst):
        em, en = min(128, t.m), math.gcd(min(32, t.n), t.n)
    else:
        n_perf = 64 if inst.d.bits == 8 and t.n % 64 == 0 else 32
        em, en = min(64, t.m), math.gcd(min(n_perf, t.n), t.n)
    tiles = (t.m // em) * (t.n // en)
    # sizeof_bits<void> is 0: a source-less epilogue (ElementC = void) never reuses C's buffers
    reuse = inst.epilogue.source and inst.c.bits == inst.d.bits and inst.d.bits > 8
    stages_d = min(tiles, 2)
    stages_c = max(min(tiles, 4), stages_d + 1) if reuse else min(tiles, 4)
    return _EpilogueTile(em, en, stages_c, stages_d, reuse)


def _swizzle_alignment(row_bytes: int) -> int:
    """Byte alignment of a GMMA shared-memory atom (cutlass::detail::alignment_for_swizzle) chosen by
    ss_smem_selector for rows of `row_bytes` bytes: SW128 1024, SW64 512, SW32 256, interleaved 128."""
    for width, align in ((128, 1024), (64, 512), (32, 256)):
        if row_bytes % width == 0:
            return align
    return 128


def _epilogue_layout(inst: GemmInstance) -> tuple[int, int]:
    """(alignment, bytes) of the epilogue's TensorStorage: smem_C / smem_D (+ fusion storage)."""
    if inst.epilogue_schedule is not EpilogueSchedule.tma:
        return 16, 1  # the no-smem / transposed epilogue keeps nothing in shared memory
    e = _epilogue_tile(inst)
    row = e.n if inst.layout_c is Layout.row else e.m   # contiguous extent of the C/D sub-tile
    align = max(_swizzle_alignment(row * inst.c.bits // 8), _swizzle_alignment(row * inst.d.bits // 8))
    tile = e.m * e.n
    c = tile * e.stages_c * inst.c.bits // 8
    d = tile * (e.stages_c if e.reuse_c else e.stages_d) * inst.d.bits // 8
    if not inst.epilogue.source:   # CollectiveStorageWithoutC: a union of an empty C array and D's stages
        collective = d
    elif e.reuse_c:
        collective = max(c, d)
    else:
        collective = _round_up(c, _swizzle_alignment(row * inst.d.bits // 8)) + d
    fusion = 1  # scalar-broadcast / compute nodes are empty structs
    if inst.epilogue.bias is Bias.column:  # Sm90RowBroadcast stages one row of bias per CTA tile
        fusion = _round_up(inst.tile.n * inst.c.bits // 8, 16)
    return align, _round_up(collective + fusion, align)


def _epilogue_smem(inst: GemmInstance) -> int:
    """sizeof(CollectiveEpilogue::SharedStorage): tensors + C-load pipeline barriers (matches nvcc)."""
    align, tensors = _epilogue_layout(inst)
    if inst.epilogue_schedule is not EpilogueSchedule.tma:
        return 1
    return _round_up(tensors + 16 * _epilogue_tile(inst).stages_c, align)


def _stage_bytes(inst: GemmInstance) -> int:
    t = inst.tile
    return (inst.a.bits * t.m * t.k + inst.b.bits * t.n * t.k) // 8


def _auto_stages(inst: GemmInstance) -> int:
    """detail::compute_stage_count_or_override(StageCountAutoCarveout<sizeof(epilogue storage)>)."""
    stage = _round_up(_stage_bytes(inst), 128) + 16   # + one full/empty barrier pair per stage
    return (SMEM_CAPACITY - _round_up(_epilogue_smem(inst), 128)) // stage


def _kernel_smem(inst: GemmInstance, stages: int) -> int:
    """sizeof(GemmKernel::SharedStorage): pipeline barriers and scheduler, then the epilogue's and the
    mainloop's tiles, each at its swizzle alignment. Matches nvcc for the configurations in
    tests/gemm/test_sm90a.py (checked by the nvcc-marked probe test); never below it."""
    epi_align, epi_tensors = _epilogue_layout(inst)
    tma_epi = inst.epilogue_schedule is EpilogueSchedule.tma
    # the register-A / transposed-B mainloops align each stage to the operand swizzle (up to 1 KiB)
    ml_align = 128 if _is_16bit(inst) or (_k_major_a(inst) and _k_major_b(inst)) else 1024
    barriers = 16 * stages + (16 * _epilogue_tile(inst).stages_c if tma_epi else 16)
    barriers += 16 if _cooperative(inst) else 48      # load order (+ math warp-group order, ping-pong)
    barriers += 16                                     # tile scheduler storage
    align = max(epi_align, ml_align, 128)
    offset = _round_up(barriers, align) + epi_tensors
    end = _round_up(offset, ml_align) + stages * _round_up(_stage_bytes(inst), 128)
    return _round_up(end, align)


def _resolved_stages(inst: GemmInstance) -> int:
    return inst.stages if inst.stages != AUTO else _auto_stages(inst)


# --------------------------------------------------------------------------------------------------
# resolve
# --------------------------------------------------------------------------------------------------

class _Reject(Exception):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule, self.reason = rule, reason


def _fail(rule: str, reason: str) -> None:
    raise _Reject(rule, reason)


_FLIP = {Layout.row: Layout.col, Layout.col: Layout.row}
_FLIP_BIAS = {Bias.none: Bias.none, Bias.row: Bias.column, Bias.column: Bias.row}
_FLIP_RASTER = {Raster.heuristic: Raster.heuristic, Raster.along_m: Raster.along_n, Raster.along_n: Raster.along_m}


def kernel_view(inst: GemmInstance) -> GemmInstance:
    """For a swap_ab instance, the GEMM CUTLASS builds: D^T = B^T A^T (A and B swap dtypes and alignments,
    every layout flips, a per-row bias becomes per-column, walking the caller's M is walking the kernel's N).
    An involution: it toggles swap_ab, so kernel_view(kernel_view(x)) == x and a resolved view maps back to
    the caller's instance."""
    return inst.replace(
        a=inst.b, b=inst.a, raster=_FLIP_RASTER[inst.raster],
        layout_a=_FLIP[inst.layout_b], layout_b=_FLIP[inst.layout_a], layout_c=_FLIP[inst.layout_c],
        alignment_a=inst.alignment_b, alignment_b=inst.alignment_a,
        epilogue=dataclasses.replace(inst.epilogue, bias=_FLIP_BIAS[inst.epilogue.bias]),
        swap_ab=not inst.swap_ab)


def resolve(inst: GemmInstance) -> GemmInstance | Rejection:
    """Fill derived fields and check every sm90a constraint; a Rejection names the rule and the fix.

    swap_ab instances are checked as the kernel CUTLASS builds (kernel_view) and returned in the caller's
    terms, so every rule (tile, smem, registers, layouts) sees the real kernel."""
    if inst.swap_ab:
        r = resolve(kernel_view(inst))
        if isinstance(r, Rejection):
            return Rejection(inst, r.rule, f"swap_ab (the kernel computes D^T = B^T A^T over (N, M, K), so its "
                                           f"layouts and tile are the swapped ones): {r.reason}")
        return kernel_view(r)
    try:
        return _resolve(inst)
    except _Reject as r:
        return Rejection(inst, r.rule, r.reason)


def _resolve(inst: GemmInstance) -> GemmInstance:
    if inst.arch not in ARCHES:
        _fail("arch", f"arch {inst.arch} is not handled by the CUTLASS 3.x module; use arch: sm90a")
    if inst.op_class is not OpClass.tensorop:
        _fail("sm90a-op-class",
              "op_class simt: the CUTLASS 3.x sm90a path builds wgmma tensor-op kernels only; use "
              "op_class: tensorop, or arch: sm80 for a SIMT kernel (it runs on Hopper too)")
    if inst.warp is not None:
        _fail("sm90a-warp-shape",
              f"warp {inst.warp}: CUTLASS 3.x has no warp tile (the schedule sets the warp groups); "
              "remove `warp` from the sm90a spec")
    _check_dtypes(inst)
    inst = inst.replace(cluster=inst.cluster or Shape3(1, 1, 1))
    _check_tile(inst)
    inst = _resolve_alignments(inst)
    _check_layouts(inst)
    _check_fast_accum(inst)
    inst = _resolve_promotion(inst)
    inst = _resolve_schedules(inst)
    _check_cluster(inst)
    _check_epilogue(inst)
    inst = _resolve_instruction(inst)
    _check_shared_memory(inst)
    return inst


def _check_dtypes(inst: GemmInstance) -> None:
    a, b, acc, cmp_ = inst.a, inst.b, inst.accumulator, inst.epilogue_compute
    for side, t in (("a", a), ("b", b)):
        if t is DType.f64:
            _fail("sm90a-f64",
                  f"{side}=f64: Hopper wgmma has no f64 form and CUTLASS 3.x has no sm90 f64 GEMM; use "
                  "arch: sm80 (its DMMA kernels run on H100/H200)")
        if t is DType.s32:
            _fail("input-dtype", f"{side}=s32 is not a wgmma input type: use s8 inputs with an s32 accumulator")
    if a.bits != b.bits:
        _fail("mixed-input",
              f"a={a} and b={b} have different widths: the mixed-input (convert-in-mainloop) kernels "
              "are not supported by emitter; convert one operand first, or use the same width for both")
    if a in _FP8:
        if b not in _FP8:
            _fail("input-dtype", f"a={a} pairs only with an fp8 b, not b={b}: use b: e4m3 or b: e5m2")
    elif a in _FLOAT32:
        if b is not a:
            _fail("input-dtype", f"a={a} with b={b}: use the same 32-bit type (f32 or tf32) for both")
    elif a is not b:
        _fail("input-dtype", f"a={a} with b={b}: wgmma multiplies f16 x f16 or bf16 x bf16; use the same "
              "16-bit type for a and b")
    allowed_acc = {
        DType.f16: (DType.f32, DType.f16), DType.bf16: (DType.f32,), DType.f32: (DType.f32,),
        DType.tf32: (DType.f32,), DType.e4m3: (DType.f32,), DType.e5m2: (DType.f32,), DType.s8: (DType.s32,),
    }[a]
    if acc not in allowed_acc:
        _fail("accumulator",
              f"accumulator {acc} with {a} inputs: wgmma accumulates {a} in "
              f"{' or '.join(t.yaml for t in allowed_acc)}; use accumulator: {allowed_acc[0]}")
    if cmp_ not in (DType.f32, acc):
        _fail("epilogue-compute",
              f"epilogue_compute {cmp_}: use f32 or the accumulator type ({acc})")
    for side, t in (("c", inst.c), ("d", inst.d)):
        if t not in _OUTPUTS:
            _fail("output-dtype",
                  f"{side}={t} is not an epilogue type on sm90a: use one of "
                  f"{', '.join(x.yaml for x in _OUTPUTS)}")
    if inst.d is DType.s8 and not cmp_.is_float:
        _fail("int8-output-compute",
              "d=s8 with an integer epilogue_compute: the s32 -> s8 conversion would wrap around; use "
              "epilogue_compute: f32 (saturating round-to-nearest conversion)")
    act = inst.epilogue.activation
    if act not in (Activation.identity, Activation.relu) and cmp_ is not DType.f32:
        _fail("activation-compute",
              f"activation {act} is computed in float: use epilogue_compute: f32 (it is {cmp_})")
    if act is Activation.clamp:
        lo, hi = inst.epilogue.clamp_min, inst.epilogue.clamp_max
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            _fail("clamp-bounds", f"clamp bounds [{lo}, {hi}]: use finite bounds with clamp_min <= clamp_max")


def _check_tile(inst: GemmInstance) -> None:
    t, ik = inst.tile, _instruction_k(inst.a)
    if t.m < 64 or t.m % 64:
        ms = sorted({max(64, t.m // 64 * 64), _round_up(max(t.m, 1), 64)})
        _fail("tile-m-multiple-of-64",
              f"tile m={t.m} is not a multiple of 64 (the wgmma M): use {' or '.join(map(str, ms))}")
    if t.m > 256:
        _fail("tile-m-max", f"tile m={t.m} is above 256: the accumulators would not fit in registers; use 64, 128 or 256")
    if t.n < 8 or t.n % 8:
        _fail("tile-n-multiple-of-8", f"tile n={t.n} is not a multiple of 8 (the wgmma N step): use e.g. "
              f"{max(8, t.n // 8 * 8)} or {_round_up(max(t.n, 1), 8)}")
    if t.n % 16 and inst.d.bits <= 16 and inst.layout_c is Layout.row:
        # CUTLASS's automatic epilogue sub-tile is gcd(32, n) columns: 8 for these tiles, and with row-major C/D
        # nvcc stops in the epilogue's layouts (cute "Stride Divisibility Condition"; seen on 64x88x64 bf16
        # ping-pong, TN, 2026-11-28); column-major C/D (128x40 TNN) compiles
        _fail("tile-n-multiple-of-16", f"tile n={t.n} with row-major {inst.d} output gives 8-column epilogue "
              f"sub-tiles, which CUTLASS's sm90 epilogue does not compile: use tile n="
              f"{' or '.join(str(v) for v in (t.n - 8, t.n + 8) if 16 <= v <= 256)}, or "
              f"column-major C/D")
    if t.n > 256:
        _fail("tile-n-max", f"tile n={t.n} is above 256 (the largest wgmma N): use 64, 128, 192 or 256")
    if t.k < ik or t.k % ik:
        _fail("tile-k-multiple-of-instruction-k",
              f"tile k={t.k} is not a multiple of the wgmma K for {inst.a} ({ik}): use "
              f"{max(ik, t.k // ik * ik)} or {_round_up(max(t.k, 1), ik)} (a 128-byte row is "
              f"k={1024 // inst.a.bits})")


def _resolve_alignments(inst: GemmInstance) -> GemmInstance:
    full = {t: TMA_ALIGNMENT_BITS // t.bits for t in (inst.a, inst.b, inst.c)}
    al_a = inst.alignment_a or full[inst.a]
    al_b = inst.alignment_b or full[inst.b]
    al_c = inst.alignment_c or full[inst.c]
    for side, al, t in (("a", al_a, inst.a), ("b", al_b, inst.b), ("c", al_c, inst.c)):
        if al < 1 or al & (al - 1):
            _fail(f"alignment-{side}", f"alignment_{side}={al} is not a power of two: use {full[t]}")
    for side, al, t in (("a", al_a, inst.a), ("b", al_b, inst.b)):
        if al * t.bits // 8 < CP_ASYNC_MIN_BYTES:
            _fail(f"alignment-{side}",
                  f"alignment_{side}={al} ({al * t.bits // 8} bytes of {t}) is below the 4-byte minimum of "
                  f"cp.async: use {full[t]} (16 bytes, TMA) or at least {max(1, 32 // t.bits)}")
    return inst.replace(alignment_a=al_a, alignment_b=al_b, alignment_c=al_c)


def _check_layouts(inst: GemmInstance) -> None:
    if _is_16bit(inst):
        return  # 16-bit wgmma reads K-major or MN-major A and B from shared memory
    t = inst.tile
    tn = _k_major_a(inst) and _k_major_b(inst)
    if inst.a.bits == 8 and not tn:
        _fail("layout-8bit-k-major",
              f"layout {inst.layout_a.letter}{inst.layout_b.letter} with {inst.a}: 8-bit wgmma reads A and B "
              "K-major only; use layout tn (A row-major, B column-major), as CUTLASS's own sm90 "
              "int8/fp8 kernels do")
    if inst.a.bits == 8:
        return
    # tf32 (32-bit): K-major directly (TN); otherwise CUTLASS loads A through registers (NN),
    # transposes B in shared memory (NT) or swaps A and B (TT). Tiles as CUTLASS's generator prunes them.
    if _transpose_b(inst):
        if t.k * inst.b.bits // 8 != 128:
            _fail("tf32-nt-tile-k",
                  f"layout nt with {inst.a}: B is transposed in shared memory in 128-byte rows, so tile k "
                  f"must be {1024 // inst.b.bits} (it is {t.k}): use tile k={1024 // inst.b.bits}, or layout tn")
    if not _builder_swaps_ab(inst) and t.n % t.k:
        _fail("tf32-tile-n-multiple-of-k",
              f"{inst.a} tile n={t.n} is not a multiple of tile k={t.k} (the 32-bit shared-memory layout of "
              f"B needs it): use tile n={_round_up(t.n, t.k)} or tile k={math.gcd(t.n, t.k)}")
    if _builder_swaps_ab(inst) and t.m % t.k:
        _fail("tf32-tile-n-multiple-of-k",
              f"layout tt with {inst.a}: A and B are swapped, so tile m={t.m} must be a multiple of tile "
              f"k={t.k}")


def _fp8_promoting(inst: GemmInstance) -> bool:
    """The mainloop is MainloopSm90TmaGmmaWarpSpecializedFP8: fp8 A and B, TMA, full accumulation."""
    return inst.a in _FP8 and inst.b in _FP8 and not inst.fp8_fast_accum and not _cp_async(inst)


def _resolve_promotion(inst: GemmInstance) -> GemmInstance:
    """Without fp8_fast_accum, fp8 on the TMA path runs MainloopSm90TmaGmmaWarpSpecializedFP8, which adds the
    tensor core's partial sums into f32 registers every `promotion_interval` wgmma k-steps
    (GmmaFP8Accumulation; each promotion first waits for every wgmma in flight). CUTLASS's default is 4;
    a longer interval waits less often and keeps more k-steps in the tensor core's narrower adder."""
    promoting = _fp8_promoting(inst)
    if not promoting and (inst.promotion is Promotion.overlap or inst.promotion_interval != AUTO):
        why = ("fp8_fast_accum accumulates the whole K loop in the tensor core (nothing is promoted)"
               if inst.fp8_fast_accum else
               f"a={inst.a}, b={inst.b} with alignment {inst.alignment_a}/{inst.alignment_b}: only CUTLASS's fp8 "
               "TMA mainloop (fp8 A and B, 16-byte alignment, no fp8_fast_accum) promotes partial sums")
        if inst.promotion is Promotion.overlap:
            _fail("promotion-overlap-fp8-only", f"promotion: overlap: {why}; remove `promotion`")
        _fail("promotion-interval-fp8-only",
              f"promotion_interval={inst.promotion_interval}: {why}; remove promotion_interval")
    if not promoting:
        return inst
    interval = inst.promotion_interval or FP8_PROMOTION_INTERVAL
    ik = _instruction_k(inst.a)
    steps = max(inst.tile.k // ik, 1)
    if interval % steps:
        # MainloopSm90TmaGmmaWarpSpecializedFP8::can_implement: the interval must be a multiple of the k-steps
        # of one k-block, or every problem is refused at run time (found by a swap_ab 64x16x256 instance on
        # an H200: accepted, built, and could run nothing)
        _fail("fp8-promotion-interval",
              f"{inst.a} tile k={inst.tile.k} is {steps} wgmma k-steps of {ik}: CUTLASS's fp8 mainloop promotes the "
              f"partial sums into f32 every {interval} k-steps"
              f"{' (its default)' if not inst.promotion_interval else ''} and refuses (can_implement) an "
              f"interval that is not a multiple of one k-block's k-steps; use tile k={interval * ik} or a "
              f"divisor of it, or promotion_interval: {steps} (or a multiple), or fp8_fast_accum: true "
              "(no promotion)")
    if inst.promotion is Promotion.overlap and interval != steps:
        # emitter's overlapped collective promotes one set of accumulators per k-tile
        _fail("fp8-overlap-interval",
              f"promotion: overlap promotes once per k-tile: tile k={inst.tile.k} is {steps} wgmma k-steps of "
              f"{ik}, and promotion_interval is {interval}"
              f"{' (CUTLASS' + chr(39) + 's default)' if not inst.promotion_interval else ''}; use tile "
              f"k={interval * ik}, or promotion_interval: {steps} (promotes more often than CUTLASS's default)")
    return inst.replace(promotion_interval=interval)


def _check_fast_accum(inst: GemmInstance) -> None:
    """fp8_fast_accum selects KernelTmaWarpSpecialized{Cooperative,Pingpong}FP8FastAccum. Its collective
    builder (GMMA_TMA_WS_FP8_FAST_ACCUM_SS in sm90_gmma_builder.inl) static_asserts fp8 A and B
    (is_input_fp8), TMA alignment (16 bytes) and K-major operands (no register-sourced A); the layout is
    checked by layout-8bit-k-major before this. It pairs with the cooperative and ping-pong kernels and,
    cooperative only, with the stream-K scheduler (CUTLASS's generator emits that combination too)."""
    if not inst.fp8_fast_accum:
        return
    if inst.a not in _FP8 or inst.b not in _FP8:
        _fail("fp8-fast-accum",
              f"fp8_fast_accum with a={inst.a}, b={inst.b}: fast accumulation is a mode of the fp8 wgmma "
              "(KernelTmaWarpSpecialized*FP8FastAccum needs e4m3/e5m2 A and B); remove fp8_fast_accum, or "
              "use e4m3/e5m2 inputs")
    if _cp_async(inst):
        _fail("fp8-fast-accum-tma",
              f"fp8_fast_accum with alignment a={inst.alignment_a}, b={inst.alignment_b} "
              f"({inst.alignment_a * inst.a.bits // 8} / {inst.alignment_b * inst.b.bits // 8} bytes): the "
              "FP8FastAccum schedules exist for the TMA mainloop only, which needs 16-byte aligned A and B; "
              f"use alignment {TMA_ALIGNMENT_BITS // inst.a.bits} for a and b (or leave it auto), or remove "
              "fp8_fast_accum")


def _resolve_schedules(inst: GemmInstance) -> GemmInstance:
    changes: dict[str, Any] = {}
    if inst.split_k is SplitK.parallel:
        _fail("split-k-parallel",
              "split_k: parallel (partial sums to a workspace, then a separate reduction kernel) has no "
              "sm90 CUTLASS 3.x form: use split_k: serial (stream-K scheduler in split-K mode) or "
              "tile_scheduler: stream_k")
    scheduler = inst.tile_scheduler
    if inst.split_k is SplitK.serial:
        scheduler = TileScheduler.stream_k   # CUTLASS 3.x split-K is the stream-K scheduler, SplitK mode
    needs_coop = scheduler is TileScheduler.stream_k
    if inst.reduction is Reduction.nondeterministic and scheduler is not TileScheduler.stream_k:
        _fail("reduction-needs-stream-k",
              "reduction: nondeterministic is how CUTLASS's stream-K scheduler adds the partial tiles of one "
              "output tile; this instance has none (persistent scheduler, no split-K): remove it, or add "
              "split_k: serial or tile_scheduler: stream_k")
    schedule = inst.kernel_schedule
    if schedule is KernelSchedule.auto:
        schedule = KernelSchedule.cooperative if inst.tile.m % 128 == 0 else KernelSchedule.pingpong
    if schedule is KernelSchedule.cooperative and inst.tile.m % 128:
        _fail("cooperative-tile-m",
              f"kernel schedule cooperative splits the tile M over two warp groups of 64 rows: tile m="
              f"{inst.tile.m} must be 128 or 256" + (" (stream-K / split-K need the cooperative schedule)"
                                                      if needs_coop else "; or use kernel: pingpong"))
    if needs_coop and schedule is not KernelSchedule.cooperative:
        what = "split_k: serial" if inst.split_k is SplitK.serial else "tile_scheduler: stream_k"
        _fail("stream-k-needs-cooperative",
              f"{what} runs on CUTLASS's stream-K scheduler, which the ping-pong kernel does not support: "
              "use kernel: cooperative (tile m 128 or 256)")
    # Accumulators live in the consumer warp groups' registers: cooperative splits the tile over 256
    # threads, ping-pong gives each tile to one warp group of 128. Up to MAX_ACCUMULATOR_REGISTERS (160) a
    # thread compiles clean; at 256 ptxas serializes the wgmma pipeline (C7510/C7511; found by the
    # accepted-means-compiles test: e5m2 256x256x128 cooperative; checked by hand: bf16 128x256x64
    # ping-pong, which CUTLASS's own generator emits, serializes too).
    consumers = 256 if schedule is KernelSchedule.cooperative else 128
    limit = MAX_ACCUMULATOR_REGISTERS
    acc_regs = inst.tile.m * inst.tile.n * max(1, inst.accumulator.bits // 32) // consumers
    if acc_regs > limit:
        _fail("accumulator-registers",
              f"tile {inst.tile.m}x{inst.tile.n} with the {schedule} schedule holds {acc_regs} accumulator "
              f"registers per thread (more than {limit}): ptxas would serialize the wgmma "
              "pipeline; use a smaller tile (cooperative up to 128x256, 256x128 or 256x160, ping-pong up to "
              "64x256, 128x128 or 128x160)")
    if inst.promotion is Promotion.overlap and 3 * acc_regs > FP8_OVERLAP_REGISTERS:
        # emitter's overlapped promotion holds the f32 accumulators and two tensor-core sets (3 x acc_regs)
        _fail("fp8-overlap-registers",
              f"promotion: overlap holds three accumulator sets: tile {inst.tile.m}x{inst.tile.n} with the "
              f"{schedule} schedule is {acc_regs} registers a set, {3 * acc_regs} a thread (more than "
              f"{FP8_OVERLAP_REGISTERS}); use cooperative up to 128x144 or ping-pong 64x128 (72 / 64 a set), or "
              "promotion: serial")
    # 32-bit (tf32) A in M-major order (layout n*, B K-major) is read by the register-sourced mainloop, which
    # holds a stage of A's fragments (tile m x tile k over the consumer threads) in registers besides the
    # accumulators. Checked with nvcc 13.0: f32 nn 256x64x64 ping-pong (128 + 128 registers) serializes its
    # wgmma (C7510; found by the accepted-means-compiles test, seed 801566) with and without a fused
    # epilogue, while tf32 nn 128x128x32 ping-pong and 256x128x32 cooperative (128 + 32) compile clean.
    a_frag = inst.tile.m * inst.tile.k * inst.a.bits // 32 // consumers
    if inst.a.bits == 32 and not _k_major_a(inst) and _k_major_b(inst) and acc_regs + a_frag > RMEM_A_REGISTERS:
        _fail("accumulator-registers-rmem-a",
              f"{inst.a} A in column-major order (layout {inst.layout_a.letter}{inst.layout_b.letter}) is read "
              f"through registers: tile {inst.tile} with the {schedule} schedule holds {acc_regs} accumulators "
              f"and {a_frag} registers of A a thread (more than {RMEM_A_REGISTERS} together): ptxas would "
              f"serialize the wgmma pipeline; use tile k={max(8, inst.tile.k // 2)} or a smaller tile, or "
              "row-major A (layout t*)")
    changes.update(kernel_schedule=schedule, tile_scheduler=scheduler)
    inst = inst.replace(**changes)
    return inst.replace(epilogue_schedule=_pick_epilogue(inst))


def _tma_epilogue_problem(inst: GemmInstance) -> str | None:
    """Why the TMA (shared-memory) epilogue cannot be built for this instance, or None."""
    if _cp_async(inst):
        return ("A or B is aligned below 16 bytes (cp.async mainloop); CUTLASS pairs that path with the "
                "no-smem epilogue: use alignment 16 bytes for A and B")
    if _builder_swaps_ab(inst):
        return (f"layout tt with {inst.a} swaps A and B, which needs the transposed (no-smem) epilogue; "
                "use layout tn or nn")
    if not _tma_capable(inst.alignment_c, inst.c):
        return (f"alignment_c={inst.alignment_c} ({inst.alignment_c * inst.c.bits // 8} bytes) is below "
                f"TMA's 16 bytes: use alignment_c={TMA_ALIGNMENT_BITS // inst.c.bits}")
    e = _epilogue_tile(inst.replace(epilogue_schedule=EpilogueSchedule.tma))
    for side, t, lay in (("c", inst.c, inst.layout_c), ("d", inst.d, inst.layout_c)):
        atom = 128 // t.bits
        if lay is Layout.row and e.n % atom:
            return (f"{side}={t} row-major needs epilogue sub-tiles of a multiple of {atom} columns; tile "
                    f"n={inst.tile.n} gives {e.n}: use a tile n that is a multiple of {atom}")
    return None


def _pick_epilogue(inst: GemmInstance) -> EpilogueSchedule:
    why_not_tma = _tma_epilogue_problem(inst)
    want = inst.epilogue_schedule
    if want is EpilogueSchedule.tma and why_not_tma:
        _fail("epilogue-tma", f"epilogue: tma cannot be built: {why_not_tma}")
    if not inst.epilogue.source:
        if want is EpilogueSchedule.no_smem:
            _fail("sourceless-needs-tma",
                  "epilogue source: false (ElementC = void) is built with the TMA epilogue only: use epilogue: tma "
                  "(or auto), or drop `source: false` (beta = 0 already skips reading C)")
        if why_not_tma:
            _fail("sourceless-needs-tma",
                  f"epilogue source: false needs the TMA epilogue, which cannot be built: {why_not_tma}")
        return EpilogueSchedule.tma
    if want is EpilogueSchedule.no_smem and _fused(inst):
        _fail("epilogue-fusion-needs-tma",
              f"activation {inst.epilogue.activation} / bias {inst.epilogue.bias} are epilogue fusions, "
              "which CUTLASS builds only with the TMA epilogue: use epilogue: tma (or auto)")
    if want is EpilogueSchedule.auto:
        if why_not_tma is None:
            tma = inst.replace(epilogue_schedule=EpilogueSchedule.tma)
            if inst.stages != AUTO or _auto_stages(tma) >= 2 or _fused(inst):
                return EpilogueSchedule.tma
        if _fused(inst):
            _fail("epilogue-fusion-needs-tma",
                  f"activation {inst.epilogue.activation} / bias {inst.epilogue.bias} need the TMA epilogue, "
                  f"which cannot be built: {why_not_tma}")
        return EpilogueSchedule.no_smem
    return want


def _check_cluster(inst: GemmInstance) -> None:
    c = inst.cluster
    assert c is not None
    if c.k != 1:
        _fail("cluster-k", f"cluster {c}: clusters share A/B tiles along M and N only; use cluster {c.m}x{c.n}x1")
    if c.m not in (1, 2, 4, 8) or c.n not in (1, 2, 4, 8):
        _fail("cluster-shape", f"cluster {c}: use 1, 2, 4 or 8 for each of m and n (TMA multicast masks)")
    if c.m * c.n > MAX_CLUSTER_CTAS:
        _fail("cluster-size", f"cluster {c} has {c.m * c.n} CTAs; the portable maximum on Hopper is 8: "
              "use e.g. 2x2x1, 4x2x1 or 2x4x1")
    if _cp_async(inst) and c.m * c.n != 1:
        _fail("cluster-cp-async",
              f"cluster {c} with alignment below 16 bytes: the cp.async mainloop cannot multicast; use "
              "cluster 1x1x1, or alignment 16 bytes for A and B (TMA)")


def _check_epilogue(inst: GemmInstance) -> None:
    if inst.epilogue.bias is not Bias.none and inst.epilogue_schedule is not EpilogueSchedule.tma:
        _fail("epilogue-fusion-needs-tma", "bias needs the TMA epilogue (epilogue: tma)")


def _resolve_instruction(inst: GemmInstance) -> GemmInstance:
    derived = _instruction(inst)
    if inst.instruction is not None and inst.instruction != derived:
        _fail("instruction-shape",
              f"instruction {inst.instruction}: CUTLASS's sm90 builder picks the wgmma from the tile, and for "
              f"tile {inst.tile} with {inst.a} it is {derived}; use instruction {derived} or leave it out")
    return inst.replace(instruction=derived)


def _check_shared_memory(inst: GemmInstance) -> None:
    if inst.stages != AUTO and inst.a.bits == 32 and not (_k_major_a(inst) and _k_major_b(inst)):
        # CUTLASS 4.2's register-sourced-A builder (32-bit inputs other than TN) reads StageCountType::bytes,
        # which only StageCountAutoCarveout has: a fixed StageCount<N> does not compile (found by the
        # accepted-means-compiles test, seed 232904: f32 ntt 256x64x32 with stages 2).
        _fail("stages-rmem-a",
              f"stages={inst.stages} with {inst.a} inputs in layout {inst.layout_a.letter}{inst.layout_b.letter}: "
              "this mainloop (A read through registers) takes only an automatic stage count in CUTLASS 4.2; "
              "use stages: auto, or layout tn")
    if inst.stages != AUTO:
        if inst.stages < 2:
            _fail("stages-min", f"stages={inst.stages}: the mainloop pipeline needs at least 2 stages; use stages >= 2 "
                  "or stages: auto")
        need = _kernel_smem(inst, inst.stages)
        if need > SMEM_CAPACITY:
            fit = max(0, (SMEM_CAPACITY - _kernel_smem(inst, 0)) // _round_up(_stage_bytes(inst), 128))
            hint = f"use stages <= {fit} or stages: auto" if fit >= 2 else "use a smaller tile"
            _fail("shared-memory",
                  f"{inst.stages} stages of {_stage_bytes(inst)} bytes (tile {inst.tile}) plus "
                  f"{_epilogue_smem(inst)} bytes of epilogue need about {need} bytes of shared memory; an "
                  f"sm90 CTA has {SMEM_CAPACITY}: {hint}")
        return
    stages = _auto_stages(inst)
    if stages >= 2 and _kernel_smem(inst, stages) > SMEM_CAPACITY:
        _fail("shared-memory",
              f"CUTLASS's automatic stage count ({stages}) for tile {inst.tile} leaves the kernel at about "
              f"{_kernel_smem(inst, stages)} bytes of shared memory, above {SMEM_CAPACITY}: use stages: {stages - 1}")
    if stages < 2:
        _fail("shared-memory",
              f"tile {inst.tile} needs {_stage_bytes(inst)} bytes per stage and the epilogue "
              f"{_epilogue_smem(inst)}: not even 2 stages fit in {SMEM_CAPACITY} bytes; use a smaller tile "
              "k or n" + (", or epilogue: no_smem" if inst.epilogue_schedule is EpilogueSchedule.tma
                         and not _fused(inst) else ""))


# --------------------------------------------------------------------------------------------------
# template context
# --------------------------------------------------------------------------------------------------

def _shape(s: Shape3) -> str:
    return f"cute::Shape<cute::Int<{s.m}>, cute::Int<{s.n}>, cute::Int<{s.k}>>"


def _kernel_schedule_cpp(inst: GemmInstance) -> str:
    coop = _cooperative(inst)
    if _cp_async(inst):
        return ("cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative" if coop
                else "cutlass::gemm::KernelCpAsyncWarpSpecializedPingpong")
    fast = "FP8FastAccum" if inst.fp8_fast_accum else ""   # resolve() allows it on the TMA path only
    return (f"cutlass::gemm::KernelTmaWarpSpecializedCooperative{fast}" if coop
            else f"cutlass::gemm::KernelTmaWarpSpecializedPingpong{fast}")


def _epilogue_schedule_cpp(inst: GemmInstance) -> str:
    if inst.epilogue_schedule is EpilogueSchedule.tma:
        return ("cutlass::epilogue::TmaWarpSpecializedCooperative" if _cooperative(inst)
                else "cutlass::epilogue::TmaWarpSpecialized")
    if _builder_swaps_ab(inst):
        return "cutlass::gemm::EpilogueTransposed"
    return "cutlass::epilogue::NoSmemWarpSpecialized"


def _fusion_cpp(inst: GemmInstance) -> str:
    ns = "cutlass::epilogue::fusion::"
    act, bias = inst.epilogue.activation, inst.epilogue.bias
    types = "ElementD, ElementCompute"
    if bias is Bias.none:
        if act is Activation.identity:
            return f"{ns}LinearCombination<{types}, ElementC, ElementCompute>"
        return f"{ns}LinCombEltAct<{_ACTIVATION_CPP[act]}, {types}, ElementC, ElementCompute>"
    # CUTLASS "per-row" bias = one value per output row (length M) = emitter bias: row.
    kind = "PerRowBias" if bias is Bias.row else "PerColBias"
    tail = f"{types}, ElementBias, ElementC, ElementCompute, AlignmentBias"
    if act is Activation.identity:
        return f"{ns}LinComb{kind}<{tail}>"
    return f"{ns}LinComb{kind}EltAct<{_ACTIVATION_CPP[act]}, {tail}>"


def _ld_facts(inst: GemmInstance) -> dict[str, Any]:
    """Which stride mode carries the leading dimension, packed leading dimensions and batch strides.

    CUTLASS 3.x strides: A (M,K,L), B (N,K,L), C/D (M,N,L); the unit-stride mode is cute::Int<1>."""
    a_row, b_col, c_row = inst.layout_a is Layout.row, inst.layout_b is Layout.col, inst.layout_c is Layout.row
    return {
        # index of the runtime (non-unit) stride in StrideA / StrideB / StrideC
        "a_ld_mode": 0 if a_row else 1, "b_ld_mode": 0 if b_col else 1, "c_ld_mode": 0 if c_row else 1,
        # packed leading dimension and the extent the leading dimension must cover
        "a_ld_packed": "K" if a_row else "M", "b_ld_packed": "K" if b_col else "N",
        "c_ld_packed": "N" if c_row else "M",
        # number of leading-dimension lines per batch (packed batch stride = ld * lines)
        "a_lines": "M" if a_row else "K", "b_lines": "N" if b_col else "K", "c_lines": "M" if c_row else "N",
    }


def template_context(inst: GemmInstance) -> dict[str, Any]:
    """C++ spellings for the templates, all derived from enums and integers of a resolved instance.

    swap_ab: everything describes the kernel CUTLASS builds (kernel_view); `swap_ab` tells the host shim to
    swap the caller's operands (m <-> n, A <-> B) before it fills the kernel's Arguments."""
    if inst.swap_ab:
        ctx = template_context(kernel_view(inst))
        ctx["swap_ab"] = True
        ctx["mainloop_kind"] += "; swap_ab: the caller's A and B swapped by the host shim (D^T = B^T A^T)"
        return ctx
    assert inst.cluster is not None and inst.instruction is not None, "template_context needs a resolved instance"
    cp_async = _cp_async(inst)
    tma_epi = inst.epilogue_schedule is EpilogueSchedule.tma
    stream_k = inst.tile_scheduler is TileScheduler.stream_k
    act = inst.epilogue.activation
    compute = inst.epilogue_compute
    if compute.is_float:
        scalar = "ElementCompute(p->{0})"
    else:  # integer epilogue: alpha/beta are rounded to the nearest integer
        scalar = "static_cast<ElementCompute>(std::lrint(p->{0}))"
    mainloop_kind = ("cp.async (alignment below 16 bytes)" if cp_async else "TMA") + (
        ", fp8 fast accumulation (no f32 promotion)" if inst.fp8_fast_accum else
        ", fp8 promotion overlapped with the next wgmma (emitter's collective)"
        if inst.promotion is Promotion.overlap else "") + (
        ", A and B swapped (D^T = B^T A^T)" if _builder_swaps_ab(inst) else
        ", B transposed in shared memory" if _transpose_b(inst) else
        ", A through registers" if not _is_16bit(inst) and not _k_major_a(inst) else "")
    stages = _resolved_stages(inst)
    return {
        "element_a": inst.a.cpp, "element_b": inst.b.cpp, "element_d": inst.d.cpp,
        # spec `epilogue: {source: false}`: no C operand (CUTLASS's void C); bias keeps C's type either way
        "element_c": inst.c.cpp if inst.epilogue.source else "void", "element_bias": inst.c.cpp,
        "has_source": inst.epilogue.source,
        "element_accumulator": inst.accumulator.cpp, "element_compute": compute.cpp,
        "layout_a": inst.layout_a.cpp, "layout_b": inst.layout_b.cpp, "layout_c": inst.layout_c.cpp,
        "alignment_a": inst.alignment_a, "alignment_b": inst.alignment_b, "alignment_c": inst.alignment_c,
        "alignment_d": TMA_ALIGNMENT_BITS // inst.d.bits,
        "alignment_bias": TMA_ALIGNMENT_BITS // inst.c.bits,
        "tile_shape": _shape(inst.tile), "cluster_shape": _shape(inst.cluster),
        "instruction_shape": _shape(inst.instruction),
        "extended_mma": _extended_mma(inst),
        "tile": inst.tile, "cluster": inst.cluster, "instruction": inst.instruction,
        "dtypes_text": f"{inst.a} x {inst.b} -> {inst.accumulator}",
        "majors_text": f"A {'K' if _k_major_a(inst) else 'M'}-major, B {'K' if _k_major_b(inst) else 'N'}-major",
        "mainloop_kind": mainloop_kind,
        "kernel_schedule_cpp": _kernel_schedule_cpp(inst),
        "epilogue_schedule_cpp": _epilogue_schedule_cpp(inst),
        "stage_count_cpp": (
            "cutlass::gemm::collective::StageCountAutoCarveout<"
            "static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>"
            if inst.stages == AUTO else f"cutlass::gemm::collective::StageCount<{inst.stages}>"),
        "stages_text": (f"auto (about {stages} with this epilogue)" if inst.stages == AUTO else str(stages)),
        "smem_estimate": _kernel_smem(inst, stages),
        "epilogue_smem_estimate": _epilogue_smem(inst),
        "tile_scheduler_cpp": ("emitter_sk::StreamKSchedulerResettingLocks" if stream_k
                               else "cutlass::gemm::PersistentScheduler"),
        "fusion_cpp": _fusion_cpp(inst),
        "has_bias": inst.epilogue.bias is not Bias.none,
        "bias_text": {Bias.none: "none", Bias.row: "one per row of D (length M)",
                      Bias.column: "one per column of D (length N)"}[inst.epilogue.bias],
        "activation": act.value,
        "is_clamp": act is Activation.clamp,
        "clamp_min": inst.epilogue.clamp_min, "clamp_max": inst.epilogue.clamp_max,
        "scalar_from_alpha": scalar.format("alpha"), "scalar_from_beta": scalar.format("beta"),
        "is_stream_k": stream_k,
        "fp8_fast_accum": inst.fp8_fast_accum,
        "is_split_k_serial": inst.split_k is SplitK.serial,
        # tile scheduler arguments the host shim sets (CUTLASS's defaults otherwise: 1, Heuristic, Deterministic)
        "max_swizzle_size": inst.swizzle,
        "raster_cpp": {Raster.heuristic: "", Raster.along_m: "AlongM", Raster.along_n: "AlongN"}[inst.raster],
        "reduction_nondeterministic": inst.reduction is Reduction.nondeterministic,
        # fp8 full accumulation: k-steps between promotions into f32 (AUTO: no promoting mainloop)
        "promotion_interval": inst.promotion_interval,
        "fp8_overlap": inst.promotion is Promotion.overlap,
        "batched": inst.batched,
        "swap_ab": False,
        "tma_epilogue": tma_epi,
        "cp_async": cp_async,
        # pointer alignment (bytes) the kernel relies on; checked by the host shim
        "align_bytes_a": 16 if not cp_async else inst.alignment_a * inst.a.bits // 8,
        "align_bytes_b": 16 if not cp_async else inst.alignment_b * inst.b.bits // 8,
        "align_bytes_c": 16 if tma_epi else max(1, inst.c.bits // 8),
        "align_bytes_d": 16 if tma_epi else max(1, inst.d.bits // 8),
        "align_bytes_bias": 16,
        **_ld_facts(inst),
    }
