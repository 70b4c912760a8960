"""CUTLASS 2.x GEMM (sm75, sm80, sm86, sm89): resolve + check an instance, and its template context.

The emitted kernel is composed level by level from CUTLASS 2.x building blocks, the same ones
`cutlass::gemm::kernel::DefaultGemmUniversal` uses (the .cu static_asserts that the composition equals
CUTLASS's default, so a reader can trust each named level):

  instruction  InstructionShape, OperatorClass, ArchTag, MathOperator
  warp         WarpShape and the warp-level MMA (`DefaultMmaCore<...>::MmaPolicy::Operator`:
               `gemm::warp::MmaTensorOp` / `MmaSimt` over the shared-memory layouts the core picks)
  threadblock  ThreadblockShape, stages, global->smem iterators, `MmaMultistage` (sm80+) or
               `MmaPipelined` (sm75, 2 stages), threadblock swizzle
  epilogue     thread functor (LinearCombination, ...Relu, GELU, SiLU, Sigmoid, Clamp) +
               `epilogue::threadblock::DefaultEpilogueTensorOp` / `DefaultEpilogueSimt`
  kernel       `gemm::kernel::GemmUniversal<ThreadblockMma, Epilogue, ThreadblockSwizzle>`
  device       host-side Arguments -> Params (what `device::GemmUniversalBase` does)
  entry        extern "C" __global__ entry (Params in device memory) + the C ABI host shim

CUTLASS 2.x epilogues store row-major D only. A column-major D is computed as the transposed problem
D^T = B^T A^T (what `device::GemmUniversal` does for ColumnMajor C): the kernel's A is the user's B with
transposed layout, M and N swap, and the host shim swaps pointers, leading dimensions and batch strides.
The tile shape applies to the kernel's (transposed) problem, as in CUTLASS's own instance library.

Every check here mirrors a static_assert or runtime limit of the CUTLASS 2.x headers (cutlass 4.2), so an
accepted instance compiles and launches; a rejected one names the rule and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emitter.dtypes import DType
from emitter.families.gemm.model import (
    AUTO, Activation, Arch, Bias, EpilogueSchedule, GemmInstance, KernelSchedule, Layout, OpClass,
    Promotion, Raster, Reduction, Rejection, Shape3, SplitK, TileScheduler,
)

ARCHES: tuple[Arch, ...] = (Arch.sm75, Arch.sm80, Arch.sm86, Arch.sm89)
LEVELS: tuple[str, ...] = ("instruction", "warp", "threadblock", "epilogue", "kernel", "device", "entry")

# Largest dynamic shared memory one thread block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin).
SMEM_LIMIT = {Arch.sm75: 65536, Arch.sm80: 166912, Arch.sm86: 101376, Arch.sm89: 101376}
SWIZZLES = (1, 2, 4, 8)
MAX_WARPS = 16          # 512 threads: CUTLASS 2.x kernels are launched with __launch_bounds__(kThreadCount)
MAX_AUTO_STAGES = 10    # the deepest pipeline CUTLASS's generator emits for sm80 (64x64 tiles)
AUTO_MAINLOOP_TARGET = {Arch.sm75: 0, Arch.sm80: 81920, Arch.sm86: 65536, Arch.sm89: 65536}

_FLOAT16 = (DType.f16, DType.bf16)
_FP8 = (DType.e4m3, DType.e5m2)


def _is_multistage(arch: Arch) -> bool:
    return arch.cc >= 80


# ---------------------------------------------------------------------------------------------------
# instruction shapes
# ---------------------------------------------------------------------------------------------------

def _input_kind(a: DType) -> str:
    if a in _FLOAT16:
        return "f16"          # f16 and bf16 share instruction shapes (bf16 from sm80)
    if a in (DType.tf32, DType.f32):
        return "tf32"
    if a in _FP8:
        return "fp8"
    return a.yaml           # f64, s8


def legal_instructions(arch: Arch, op_class: OpClass, a: DType) -> tuple[Shape3, ...]:
    """Instruction shapes CUTLASS 2.x has an `arch::Mma` for, default first; () = no tensor op."""
    if op_class is OpClass.simt:
        return (Shape3(1, 1, 1),)
    kind = _input_kind(a)
    if arch is Arch.sm75:
        return {"f16": (Shape3(16, 8, 8),), "s8": (Shape3(8, 8, 16),)}.get(kind, ()) if a is not DType.bf16 else ()
    table = {
        "f16": (Shape3(16, 8, 16), Shape3(16, 8, 8)),
        "tf32": (Shape3(16, 8, 8), Shape3(16, 8, 4)),
        "f64": (Shape3(8, 8, 4),),       # 16x8x4 f64 is an sm90 instruction
        "s8": (Shape3(16, 8, 32), Shape3(16, 8, 16)),
        "fp8": (Shape3(16, 8, 32),) if arch is Arch.sm89 else (),
    }
    return table.get(kind, ())


# ---------------------------------------------------------------------------------------------------
# the kernel frame (row-major D; column-major D = transposed problem)
# ---------------------------------------------------------------------------------------------------

def _flip(layout: Layout) -> Layout:
    return Layout.col if layout is Layout.row else Layout.row


@dataclass(frozen=True)
class _Operand:
    dtype: DType
    layout: Layout       # in the kernel frame
    alignment: int


def _kernel_operands(inst: GemmInstance) -> tuple[bool, _Operand, _Operand]:
    """(transposed, kernel A, kernel B). Kernel A is M x K, kernel B is K x N, D row-major M x N."""
    if inst.layout_c is Layout.row:
        return False, _Operand(inst.a, inst.layout_a, inst.alignment_a), _Operand(inst.b, inst.layout_b, inst.alignment_b)
    return True, _Operand(inst.b, _flip(inst.layout_b), inst.alignment_b), _Operand(inst.a, _flip(inst.layout_a), inst.alignment_a)


# ---------------------------------------------------------------------------------------------------
# alignments
# ---------------------------------------------------------------------------------------------------

def max_operand_alignment(inst: GemmInstance, dtype: DType) -> int:
    if inst.op_class is OpClass.simt:
        return 1                        # SIMT cores load scalars (kElementsPerAccess = 1)
    if dtype is DType.f64:
        return 1                        # the sm80 f64 cores use 64-bit accesses
    return 128 // dtype.bits


def min_operand_alignment(inst: GemmInstance, dtype: DType) -> int:
    if inst.op_class is OpClass.tensorop and _is_multistage(inst.arch):
        return max(1, 32 // dtype.bits)  # cp.async copies 4, 8 or 16 bytes
    return 1


def _output_alignments(inst: GemmInstance) -> tuple[int, ...]:
    """Legal epilogue vector widths (elements of D), the AUTO choice first."""
    d = inst.d
    if inst.op_class is OpClass.simt or d is DType.f64:
        return (1,)                     # SIMT epilogues operate on scalars; f64 as CUTLASS emits it
    wide_ok = inst.tile.n >= 128
    if d.bits == 8:
        # 8-bit output from 32-bit accumulators: TileIteratorTensorOpMixed takes 16, 8 or 4 elements;
        # CUTLASS's generator stores 16 for tiles with n >= 128 (8 when m = 32 on sm80), else 8
        return ((16, 8, 4) if inst.tile.m != 32 else (8, 16, 4)) if wide_ok else (8, 4)
    auto = 128 // d.bits
    legal = [8, 4, 2, 1]                # up to 256-bit stores (CUTLASS emits 8 x f32 for f16 inputs)
    if inst.a.bits == 8 and wide_ok:
        legal = [16] + legal            # CUTLASS's int8/fp8 kernels store 16 elements per access
    return (auto,) + tuple(x for x in legal if x != auto)


# ---------------------------------------------------------------------------------------------------
# data types
# ---------------------------------------------------------------------------------------------------

def _dtype_rule(inst: GemmInstance) -> tuple[str, str] | None:
    a, b, acc, c, d, comp = inst.a, inst.b, inst.accumulator, inst.c, inst.d, inst.epilogue_compute
    if a.is_fp8 or b.is_fp8:
        if not (a.is_fp8 and b.is_fp8):
            return ("dtype-a-b-mismatch", f"a={a} and b={b}: fp8 GEMMs take fp8 for both operands (e4m3/e5m2 may mix)")
    elif a is not b:
        return ("dtype-a-b-mismatch", f"a={a} and b={b} differ: CUTLASS 2.x GEMMs here take one input type; "
                                      f"use b={a} (mixed-input upcast GEMMs are not emitted)")
    if c is not d:
        return ("dtype-c-d-mismatch", f"c={c} and d={d} differ: the CUTLASS 2.x epilogue reads C with D's "
                                      f"element type; use c={d}")
    if a in _FLOAT16:
        accs = (DType.f32, DType.f16) if a is DType.f16 else (DType.f32,)
        outs = (a, DType.f32)
    elif a in (DType.f32, DType.tf32):
        accs, outs = (DType.f32,), ((DType.f32, DType.tf32) if a is DType.tf32 else (DType.f32,))
    elif a is DType.f64:
        accs, outs = (DType.f64,), (DType.f64,)
    elif a is DType.s8:
        accs, outs = (DType.s32,), (DType.s8, DType.s32)
    elif a.is_fp8:
        accs, outs = (DType.f32,), (DType.f32, DType.f16, DType.bf16, DType.e4m3, DType.e5m2)
    else:
        return ("dtype-unsupported", f"input type {a} is not supported by the CUTLASS 2.x path; "
                                     f"use f16, bf16, tf32, f32, f64, s8 (or e4m3/e5m2 on sm89)")
    if acc not in accs:
        return ("dtype-accumulator", f"accumulator={acc} is not supported for {a} inputs: use "
                                     + " or ".join(x.yaml for x in accs))
    if d not in outs:
        return ("dtype-output", f"d={d} is not supported for {a} inputs with {acc} accumulation: use "
                                + " or ".join(x.yaml for x in outs))
    if acc is DType.f16 and d is not DType.f16:
        return ("dtype-output", f"d={d} with f16 accumulation: use d=f16, or accumulator=f32")
    computes = {DType.f32: (DType.f32,), DType.f16: (DType.f16, DType.f32), DType.f64: (DType.f64,),
                DType.s32: (DType.f32, DType.s32)}[acc]
    if comp not in computes:
        return ("dtype-epilogue-compute", f"epilogue_compute={comp} with {acc} accumulation: use "
                                          + " or ".join(x.yaml for x in computes))
    return None


# ---------------------------------------------------------------------------------------------------
# shared memory
# ---------------------------------------------------------------------------------------------------

def _simt_padding(k: int, bits: int) -> int:
    # cutlass::gemm::threadblock::detail::simt_transpose_padding(32, k, bits), or the sm80 K/32 skew
    pad = (32 // k // (bits // 32)) if bits >= 32 else (32 // k * (32 // bits))
    return max(pad, k // 32, 0)


def mainloop_smem_bytes(inst: GemmInstance, stages: int) -> int:
    t = inst.tile
    _, ka, kb = _kernel_operands(inst)
    if inst.op_class is OpClass.simt:
        pad_a, pad_b = _simt_padding(t.k, ka.dtype.bits), _simt_padding(t.k, kb.dtype.bits)
        per_stage = (t.m + pad_a) * t.k * ka.dtype.bytes + t.k * (t.n + pad_b) * kb.dtype.bytes
    else:
        per_stage = (t.m * t.k * ka.dtype.bits + t.k * t.n * kb.dtype.bits) // 8
    return stages * per_stage


def epilogue_smem_bytes(inst: GemmInstance) -> int:
    """Upper bound of Epilogue::SharedStorage (epilogue_base.h): rows of accumulators per iteration for
    every warp (8 per tensor-op warp row, at most 8 thread rows per SIMT warp), times K-partitions, times
    at most 2 fragments per iteration, over the tile's N plus the padding."""
    t, w = inst.tile, inst.warp
    assert w is not None
    wm, wk = t.m // w.m, t.k // w.k
    acc_bytes = inst.accumulator.bytes
    if inst.op_class is OpClass.simt:
        rows, fragments, pad = wm * 8 * wk, 1, 4 * 4
    else:
        rows, fragments, pad = wm * 8 * wk, 2, 64 // inst.accumulator.bits * 4
    return rows * fragments * (t.n + pad) * acc_bytes


def smem_bytes(inst: GemmInstance, stages: int) -> int:
    """The mainloop and the epilogue share one union in 2.x kernels: the larger one counts."""
    return max(mainloop_smem_bytes(inst, stages), epilogue_smem_bytes(inst))


# ---------------------------------------------------------------------------------------------------
# global -> shared thread maps (pitch_linear_thread_map.h)
# ---------------------------------------------------------------------------------------------------

def _raked_iterations(contiguous: int, strided: int, threads: int, arr_c: int, arr_s: int,
                      elements_per_access: int) -> str | None:
    """None if PitchLinearWarpRakedThreadMap<Shape(contiguous, strided), threads, (arr_c, arr_s), epa> is
    well formed, else what breaks."""
    if arr_c < 1 or arr_s < 1 or arr_c * arr_s != 32:
        return f"a warp cannot be arranged as {arr_c}x{arr_s} accesses"
    if contiguous % elements_per_access:
        return f"{contiguous} is not a multiple of the {elements_per_access}-element vector"
    c_acc = contiguous // elements_per_access
    if c_acc % arr_c or strided % arr_s:
        return (f"the {contiguous}x{strided} tile ({c_acc}x{strided} vectors) does not divide into the "
                f"warp's {arr_c}x{arr_s} access arrangement")
    wai_c, wai_s = c_acc // arr_c, strided // arr_s
    warps = threads // 32
    warps_s = warps if wai_s >= warps else wai_s
    warps_c = warps // warps_s if warps > wai_s else 1
    if wai_c // warps_c == 0 or wai_s // warps_s == 0:
        return (f"the {contiguous}x{strided} tile is too small for {warps} warps to load "
                f"({wai_c * wai_s} warp-wide accesses)")
    return None


def _thread_map_problem(inst: GemmInstance, op: _Operand, rows: int, is_a: bool, threads: int) -> str | None:
    """Checks the global->smem thread map of one operand tile. rows = M (A) or N (B); K is tile k."""
    k = inst.tile.k
    # contiguous extent in memory: A row-major / B column-major are K-contiguous ("crosswise")
    k_contiguous = (op.layout is Layout.row) if is_a else (op.layout is Layout.col)
    contiguous, strided = (k, rows) if k_contiguous else (rows, k)
    if inst.op_class is OpClass.simt:
        total = contiguous * strided
        if total % threads or total < threads:
            return f"the {contiguous}x{strided} operand tile does not split evenly over {threads} threads"
        return None
    if op.dtype is DType.f64:
        if inst.arch.cc < 80:
            return None
        return _raked_iterations(contiguous, strided, threads, 16, 2, 1)
    epa = 128 // op.dtype.bits
    if k_contiguous:
        arr_c = k // epa if k % epa == 0 else 0
        if arr_c < 1 or arr_c > 32 or 32 % arr_c:
            return (f"tile k={k} gives {k * op.dtype.bits // 128 if k % epa == 0 else 'a fraction of'} 128-bit "
                    f"vectors per row; CUTLASS needs 1, 2, 4, 8, 16 or 32")
    else:
        arr_c = min(rows // epa, 8) if rows % epa == 0 else 0
        if arr_c < 1 or 32 % arr_c:
            return f"the {rows}-element contiguous extent is not a whole number of 128-bit vectors"
    return _raked_iterations(contiguous, strided, threads, arr_c, 32 // arr_c, epa)


# ---------------------------------------------------------------------------------------------------
# SIMT warp tiles (default_mma_core_simt.h, default_mma_core_sm80.h)
# ---------------------------------------------------------------------------------------------------

def _simt_problem(inst: GemmInstance, ka: _Operand, kb: _Operand) -> str | None:
    w, k = inst.warp, inst.tile.k
    assert w is not None
    if _is_multistage(inst.arch):
        tm_threads = 4
    else:
        tm_threads = 8 if w.m > w.n else 4
    tn_threads = 32 // tm_threads
    if w.m % tm_threads or w.n % tn_threads:
        return f"warp {w.m}x{w.n} is not divisible by the {tm_threads}x{tn_threads} SIMT thread arrangement"
    ttm, ttn = w.m // tm_threads, w.n // tn_threads
    lane_m, lane_n = min(128 // ka.dtype.bits, ttm), min(128 // kb.dtype.bits, ttn)
    if ttm % lane_m or ttn % lane_n:
        return f"per-thread tile {ttm}x{ttn} is not a multiple of the {lane_m}x{lane_n} lane MMA"
    a_row, b_col = ka.layout is Layout.row, kb.layout is Layout.col
    if _is_multistage(inst.arch):
        pad = k // 32
        if (a_row and pad % lane_m) or (b_col and pad % lane_n):
            return f"tile k={k} breaks the SIMT shared-memory skew (k/32 must be a multiple of {lane_m})"
    else:
        if a_row and _simt_padding_sm50(k, ka.dtype.bits) % lane_m:
            return f"tile k={k} breaks the SIMT transpose padding for A (use k=8)"
        if b_col and _simt_padding_sm50(k, kb.dtype.bits) % lane_n:
            return f"tile k={k} breaks the SIMT transpose padding for B (use k=8)"
    return None


def _simt_padding_sm50(k: int, bits: int) -> int:
    return (32 // k // (bits // 32)) if bits >= 32 else (32 // k * (32 // bits))


# ---------------------------------------------------------------------------------------------------
# resolve
# ---------------------------------------------------------------------------------------------------

def _reject(inst: GemmInstance, rule: str, reason: str) -> Rejection:
    return Rejection(instance=inst, rule=rule, reason=reason)


def _fmt(s: Shape3) -> str:
    return str(s)


def resolve(inst: GemmInstance) -> GemmInstance | Rejection:
    """Fill derived fields (instruction, stages, alignments) and check every CUTLASS 2.x constraint.

    Returns the resolved instance (idempotent: resolving it again gives it back) or the first Rejection."""
    arch = inst.arch
    if arch not in ARCHES:
        return _reject(inst, "arch-not-cutlass2", f"arch {arch} is not a CUTLASS 2.x target (sm75, sm80, sm86, "
                                                  f"sm89): the sm90a module handles it")

    # --- CUTLASS 3.x-only fields must stay at their defaults -----------------------------------
    if inst.kernel_schedule is not KernelSchedule.auto:
        return _reject(inst, "kernel-schedule-3x-only", f"kernel_schedule={inst.kernel_schedule} is a CUTLASS 3.x "
                                                        f"(sm90a) setting: remove it for {arch}, or use arch sm90a")
    if inst.epilogue_schedule is not EpilogueSchedule.auto:
        return _reject(inst, "epilogue-schedule-3x-only", f"epilogue_schedule={inst.epilogue_schedule} is a CUTLASS "
                                                          f"3.x (sm90a) setting: remove it for {arch}, or use arch sm90a")
    if inst.tile_scheduler is not TileScheduler.persistent:
        return _reject(inst, "tile-scheduler-3x-only", f"tile_scheduler={inst.tile_scheduler} is a CUTLASS 3.x "
                                                       f"(sm90a) setting: remove it for {arch}, or use arch sm90a")
    if inst.fp8_fast_accum:
        return _reject(inst, "fp8-fast-accum", f"fp8_fast_accum is a CUTLASS 3.x (sm90a) kernel schedule "
                                               f"(KernelTmaWarpSpecialized*FP8FastAccum): remove it for {arch}, "
                                               f"or use arch sm90a with e4m3/e5m2 inputs")
    if inst.raster is not Raster.heuristic or inst.reduction is not Reduction.deterministic:
        what = (f"raster={inst.raster}" if inst.raster is not Raster.heuristic else f"reduction={inst.reduction}")
        return _reject(inst, "scheduler-3x-only", f"{what} is an argument of CUTLASS 3.x's (sm90a) persistent / "
                                                  f"stream-K tile scheduler: remove it for {arch} (2.x orders "
                                                  f"tiles with `swizzle`), or use arch sm90a")
    if inst.promotion_interval != AUTO:
        return _reject(inst, "promotion-interval-fp8-only",
                       f"promotion_interval={inst.promotion_interval} is an argument of CUTLASS 3.x's (sm90a) fp8 "
                       f"mainloop (how often partial sums are promoted into f32): remove it for {arch}, or use "
                       f"arch sm90a with e4m3/e5m2 inputs")
    if inst.promotion is not Promotion.serial:
        return _reject(inst, "promotion-overlap-fp8-only",
                       f"promotion: {inst.promotion} is emitter's fp8 mainloop for CUTLASS 3.x (sm90a): remove it "
                       f"for {arch}, or use arch sm90a with e4m3/e5m2 inputs")
    if not inst.epilogue.source:
        return _reject(inst, "sourceless-3x-only", f"epilogue source: false (no C operand, CUTLASS's ElementC = void) "
                                                   f"is a CUTLASS 3.x (sm90a) TMA epilogue: remove it for {arch} "
                                                   f"(beta = 0 already skips reading C there), or use arch sm90a")
    if inst.swap_ab:
        return _reject(inst, "swap-ab-3x-only", f"swap_ab is a CUTLASS 3.x (sm90a) option of emitter's host shim: "
                                                f"remove it for {arch} (CUTLASS 2.x's GemmUniversal already "
                                                f"transposes a column-major-output problem internally), or use "
                                                f"arch sm90a")
    if inst.cluster is not None:
        return _reject(inst, "cluster-3x-only", f"cluster {inst.cluster} needs thread block clusters (sm90a): "
                                                f"remove it for {arch}, or use arch sm90a")
    if inst.warp is None:
        return _reject(inst, "warp-shape-required", "CUTLASS 2.x kernels need a warp tile: set warp, e.g. "
                                                    f"{min(64, inst.tile.m)}x{min(64, inst.tile.n)}x{inst.tile.k}")

    # --- data types, arch and operator class -----------------------------------------------------
    if inst.a.is_fp8 or inst.b.is_fp8:
        if arch is not Arch.sm89:
            return _reject(inst, "fp8-needs-sm89", f"fp8 ({inst.a}/{inst.b}) tensor-op GEMMs need sm89 in CUTLASS "
                                                   f"2.x: use arch sm89, or sm90a for Hopper")
    bad = _dtype_rule(inst)
    if bad:
        return _reject(inst, *bad)
    a = inst.a
    if inst.op_class is OpClass.simt:
        if a not in (DType.f32, DType.f64):
            return _reject(inst, "simt-dtype", f"op_class simt supports f32 and f64 inputs, not {a}: use "
                                               f"op_class tensorop")
    else:
        if a is DType.f64 and arch.cc < 80:
            return _reject(inst, "f64-tensorop-needs-sm80", f"f64 tensor cores need sm80 or newer: use arch sm80, "
                                                            f"or op_class simt on {arch}")
        if a is DType.bf16 and arch.cc < 80:
            return _reject(inst, "bf16-needs-sm80", f"bf16 tensor cores need sm80 or newer: use arch sm80, or f16")
        if a in (DType.f32, DType.tf32) and arch.cc < 80:
            return _reject(inst, "tf32-needs-sm80", f"tf32 tensor cores (f32 inputs) need sm80 or newer: use arch "
                                                    f"sm80, or op_class simt on {arch}")
    legal = legal_instructions(arch, inst.op_class, a)
    if not legal:
        return _reject(inst, "instruction-unavailable", f"no {inst.op_class} instruction for {a} on {arch}")
    instr = inst.instruction or legal[0]
    if instr not in legal:
        hint = "16x8x4 f64 is an sm90 instruction; " if a is DType.f64 and instr == Shape3(16, 8, 4) else ""
        return _reject(inst, "instruction-shape", f"instruction {instr} is not available for {a} "
                                                  f"{inst.op_class} on {arch}: {hint}use "
                                                  + " or ".join(_fmt(s) for s in legal))

    # --- layouts -----------------------------------------------------------------------------------
    transposed, ka, kb = _kernel_operands(inst)
    if inst.op_class is OpClass.tensorop and (a is DType.s8 or a.is_fp8):
        if not (inst.layout_a is Layout.row and inst.layout_b is Layout.col):
            return _reject(inst, "layout-8bit-requires-tn", f"{a} tensor-op GEMMs need A row-major and B "
                                                            f"column-major (layout tn), got "
                                                            f"{inst.layout_a.letter}{inst.layout_b.letter}: "
                                                            f"transpose the operands, or use layout tn")

    # --- shapes ------------------------------------------------------------------------------------
    t, w = inst.tile, inst.warp
    if t.k % instr.k:
        lo, hi = (t.k // instr.k) * instr.k, (t.k // instr.k + 1) * instr.k
        return _reject(inst, "tile-k-multiple-of-instruction-k", f"tile k={t.k} is not a multiple of instruction "
                                                                 f"k={instr.k}: use " + (f"{lo} or {hi}" if lo else f"{hi}"))
    if inst.op_class is OpClass.tensorop and a.bits <= 32:
        # DefaultMmaCore (tensor op, sm75/sm80) keeps a K-major operand in shared memory as
        # TensorOpMultiplicandCrosswise<bits, tile k>, which static_asserts that tile k spans at most one
        # 128-byte line ("kCrosswise should be no large than one shared memory cache line"). Found by the
        # accepted-means-compiles test (seed 700304: f32 tn 128x64x64).
        max_k = 1024 // a.bits
        for side, op, k_major in (("A", ka, ka.layout is Layout.row), ("B", kb, kb.layout is Layout.col)):
            if k_major and t.k > max_k:
                return _reject(inst, "tile-k-crosswise",
                               f"tile k={t.k} of {op.dtype} with the kernel's {side} K-major: CUTLASS keeps a K-major "
                               f"tensor-op operand in shared memory in lines of at most 128 bytes along K "
                               f"(TensorOpMultiplicandCrosswise), i.e. tile k <= {max_k} for {op.dtype}; use tile k="
                               f"{max_k} (and warp k={max_k}), or an M/N-major layout for that operand")
    for dim in ("m", "n", "k"):
        tv, wv, iv = getattr(t, dim), getattr(w, dim), getattr(instr, dim)
        if tv <= 0 or wv <= 0:
            return _reject(inst, "shape-positive", f"tile {t} and warp {w} must be positive")
        if tv % wv:
            options = [x for x in (wv // 2, wv // 4, tv, tv // 2) if x > 0 and tv % x == 0]
            return _reject(inst, "tile-multiple-of-warp", f"tile {dim}={tv} is not a multiple of warp {dim}={wv}: "
                                                          f"use a warp {dim} that divides {tv}"
                                                          + (f", e.g. {options[0]}" if options else ""))
        if wv % iv:
            return _reject(inst, "warp-multiple-of-instruction", f"warp {dim}={wv} is not a multiple of instruction "
                                                                 f"{dim}={iv} ({instr}): use a multiple of {iv}")
    warps = (t.m // w.m) * (t.n // w.n) * (t.k // w.k)
    if not 1 <= warps <= MAX_WARPS:
        return _reject(inst, "warp-count", f"tile {t} / warp {w} gives {warps} warps; a 2.x thread block holds 1 to "
                                           f"{MAX_WARPS} warps (CUTLASS's defaults use 4 or 8): use a larger warp tile")
    # threadblock::MmaBase: kWarpGemmIterations = warp k / instruction k must be > 1 and even
    # (the mainloop double-buffers warp fragments); found by the accepted-means-compiles property test.
    iters = w.k // instr.k
    if iters < 2 or iters % 2:
        good = [x * instr.k for x in (2, 4) if x * instr.k <= max(t.k, 2 * instr.k)]
        return _reject(inst, "warp-k-iterations", f"warp k={w.k} over instruction k={instr.k} gives {iters} "
                                                  f"warp-level MMA step(s) per k-tile; CUTLASS 2.x needs an even "
                                                  f"number of at least 2: use warp k (and tile k) "
                                                  f"{' or '.join(map(str, good))}")
    if inst.op_class is OpClass.tensorop and a is DType.f64 and warps < 2:
        return _reject(inst, "f64-tensorop-min-warps", f"the sm80 f64 tensor-op core needs at least 2 warps, tile {t} "
                                                       f"/ warp {w} gives 1: halve the warp m or n")
    threads = warps * 32

    # --- swizzle, split-K, batching, epilogue ------------------------------------------------------
    if inst.swizzle not in SWIZZLES:
        return _reject(inst, "swizzle-width", f"swizzle={inst.swizzle}: GemmIdentityThreadblockSwizzle takes "
                                              f"1, 2, 4 or 8")
    if inst.split_k is SplitK.parallel:
        return _reject(inst, "split-k-parallel-unsupported", "parallel split-K (with a separate reduction kernel) "
                                                             "is not supported yet: use split_k serial")
    if inst.split_k is SplitK.serial and inst.batched:
        return _reject(inst, "split-k-batched-exclusive", "a 2.x GemmUniversal runs either batched or serial "
                                                          "split-K (both use grid z): pick one")
    if inst.split_k is SplitK.serial and inst.d.bits == 8:
        return _reject(inst, "split-k-8bit-output", f"serial split-K stores partial sums in D; d={inst.d} would "
                                                    f"round and saturate them: use d=s32/f32 or split_k none")
    ep = inst.epilogue
    if ep.bias is not Bias.none:
        return _reject(inst, "bias-unsupported", f"bias {ep.bias} on {arch} is not supported yet: use sm90a or fold "
                                                 f"it into C with beta=1")
    if ep.activation in (Activation.gelu, Activation.silu, Activation.sigmoid) and not inst.epilogue_compute.is_float:
        return _reject(inst, "activation-needs-float-compute", f"{ep.activation} needs a floating-point "
                                                               f"epilogue_compute, got {inst.epilogue_compute}: "
                                                               f"use epilogue_compute f32")
    if ep.activation is Activation.clamp:
        lo, hi = ep.clamp_min, ep.clamp_max
        if lo != lo or hi != hi or lo in (float("inf"), float("-inf")) or hi in (float("inf"), float("-inf")):
            return _reject(inst, "clamp-bounds", f"clamp bounds must be finite, got [{lo}, {hi}]")
        if lo > hi:
            return _reject(inst, "clamp-bounds", f"clamp_min={lo} is above clamp_max={hi}: swap them")

    # --- alignments --------------------------------------------------------------------------------
    changes: dict[str, Any] = {}
    for field, dtype in (("alignment_a", inst.a), ("alignment_b", inst.b)):
        hi, lo = max_operand_alignment(inst, dtype), min_operand_alignment(inst, dtype)
        v = getattr(inst, field)
        if v == AUTO:
            changes[field] = hi
            continue
        if v < lo or v > hi or v & (v - 1):
            legal_a = [x for x in (16, 8, 4, 2, 1) if lo <= x <= hi]
            why = (f" ({inst.op_class} {arch} loads at least 32 bits per access)" if v < lo else "")
            return _reject(inst, f"{field.replace('_', '-')}", f"{field}={v} elements of {dtype} is not legal{why}: "
                                                               f"use " + ", ".join(map(str, legal_a)))
    outs = _output_alignments(inst)
    if inst.alignment_c == AUTO:
        changes["alignment_c"] = outs[0]
    elif inst.alignment_c not in outs:
        return _reject(inst, "alignment-c", f"alignment_c={inst.alignment_c} elements of {inst.d} is not legal for "
                                            f"this epilogue (tile {t}, {inst.op_class}): use "
                                            + ", ".join(map(str, outs)))
    inst2 = inst.replace(instruction=instr, **changes)
    transposed, ka, kb = _kernel_operands(inst2)

    # --- global->smem thread maps and SIMT warp arrangement ----------------------------------------
    for op, rows, is_a, label in ((ka, t.m, True, "A"), (kb, t.n, False, "B")):
        problem = _thread_map_problem(inst2, op, rows, is_a, threads)
        if problem:
            user = label if not transposed else ("B" if label == "A" else "A")
            return _reject(inst, "operand-thread-map", f"operand {user} cannot be loaded by the thread block: "
                                                       f"{problem}; change the tile or the warp count")
    if inst.op_class is OpClass.simt:
        problem = _simt_problem(inst2, ka, kb)
        if problem:
            return _reject(inst, "simt-warp-tile", f"{problem}: CUTLASS's SIMT defaults are warp 32x64x8 or "
                                                   f"64x32x8 with tile k=8")

    # --- stages and shared memory ------------------------------------------------------------------
    limit = SMEM_LIMIT[arch]
    if _is_multistage(arch):
        if inst.stages == AUTO:
            fits = [s for s in range(3, MAX_AUTO_STAGES + 1) if smem_bytes(inst2, s) <= limit]
            if not fits:
                return _reject(inst, "smem-budget", f"even 3 stages of tile {t} need {smem_bytes(inst2, 3)} bytes of "
                                                    f"shared memory, {arch} allows {limit}: use a smaller tile "
                                                    f"(e.g. halve k)")
            target = [s for s in fits if mainloop_smem_bytes(inst2, s) <= AUTO_MAINLOOP_TARGET[arch]]
            stages = max(target) if target else min(fits)
        else:
            stages = inst.stages
            if stages < 3:
                return _reject(inst, "stages-multistage-min", f"stages={stages}: the {arch} multistage (cp.async) "
                                                              f"mainloop needs 3 or more stages")
    else:
        if inst.stages not in (AUTO, 2):
            return _reject(inst, "stages-sm75-pipelined", f"stages={inst.stages}: sm75 uses the 2-stage pipelined "
                                                          f"mainloop (no cp.async): use stages 2")
        stages = 2
    need = smem_bytes(inst2, stages)
    if need > limit:
        fit = [s for s in range(2 if not _is_multistage(arch) else 3, stages) if smem_bytes(inst2, s) <= limit]
        fix = f"use stages {max(fit)}" if fit else "use a smaller tile"
        return _reject(inst, "smem-budget", f"tile {t} with {stages} stages needs {need} bytes of shared memory, "
                                            f"{arch} allows {limit} per block: {fix}")
    return inst2.replace(stages=stages)


# ---------------------------------------------------------------------------------------------------
# template context: C++ spellings derived from enums and ints only
# ---------------------------------------------------------------------------------------------------

_ARCH_TAG = {Arch.sm75: "cutlass::arch::Sm75", Arch.sm80: "cutlass::arch::Sm80", Arch.sm86: "cutlass::arch::Sm80",
             Arch.sm89: "cutlass::arch::Sm80"}

_FUNCTOR = {
    Activation.identity: ("cutlass::epilogue::thread::LinearCombination", "cutlass/epilogue/thread/linear_combination.h"),
    Activation.relu: ("cutlass::epilogue::thread::LinearCombinationRelu", "cutlass/epilogue/thread/linear_combination_relu.h"),
    Activation.gelu: ("cutlass::epilogue::thread::LinearCombinationGELU", "cutlass/epilogue/thread/linear_combination_gelu.h"),
    Activation.silu: ("cutlass::epilogue::thread::LinearCombinationSilu", "cutlass/epilogue/thread/linear_combination_silu.h"),
    Activation.sigmoid: ("cutlass::epilogue::thread::LinearCombinationSigmoid", "cutlass/epilogue/thread/linear_combination_sigmoid.h"),
}


def gencode(inst: GemmInstance) -> str:
    """The nvcc -gencode value for this instance (sm86 -> compute_86/sm_86...)."""
    return f"arch=compute_{inst.arch.cc},code=sm_{inst.arch.cc}"


def template_context(inst: GemmInstance) -> dict:
    """Everything the sm80 templates print, as C++ spellings derived from enums and integers."""
    if inst.instruction is None or inst.warp is None or inst.stages == AUTO or AUTO in (
            inst.alignment_a, inst.alignment_b, inst.alignment_c):
        raise ValueError("template_context needs a resolved instance: call sm80.resolve() first")
    transposed, ka, kb = _kernel_operands(inst)
    simt = inst.op_class is OpClass.simt
    arch_tag = _ARCH_TAG[inst.arch]
    if inst.a.is_fp8:
        arch_tag = "cutlass::arch::Sm89"
    s8 = inst.a is DType.s8
    math_op = "cutlass::arch::OpMultiplyAddSaturate" if s8 and not simt else "cutlass::arch::OpMultiplyAdd"

    ep = inst.epilogue
    generic_clamp = ep.activation is Activation.clamp
    if generic_clamp:
        functor = "cutlass::epilogue::thread::LinearCombinationGeneric"
        functor_header = "cutlass/epilogue/thread/linear_combination_generic.h"
        functor_args = ["cutlass::epilogue::thread::Clamp"]
    elif ep.activation is Activation.identity and inst.d is DType.s8:
        functor = "cutlass::epilogue::thread::LinearCombinationClamp"    # saturates to int8's range
        functor_header = "cutlass/epilogue/thread/linear_combination_clamp.h"
        functor_args = []
    else:
        functor, functor_header = _FUNCTOR[ep.activation]
        functor_args = []

    def cache_op(op: _Operand) -> str:
        # default_mma.h: full 128-bit vectors bypass L1 (cp.async.cg), narrower ones go through it
        full = op.dtype.bits * op.alignment == 128
        return "cutlass::arch::CacheOperation::" + ("Global" if full else "Always")

    multistage = _is_multistage(inst.arch)
    t, w = inst.tile, inst.warp
    warp_count = [t.m // w.m, t.n // w.n, t.k // w.k]
    return {
        "arch": inst.arch.yaml,
        "cc": inst.arch.cc,
        "gencode": gencode(inst),
        "smem_limit": SMEM_LIMIT[inst.arch],
        "transposed": transposed,
        "user_layouts": inst.layout_a.letter + inst.layout_b.letter + inst.layout_c.letter,
        "user_layout_a": inst.layout_a.value,
        "user_layout_b": inst.layout_b.value,
        "user_layout_c": inst.layout_c.value,
        # the kernel frame (A: M x K, B: K x N, C/D: M x N row-major)
        "element_a": ka.dtype.cpp, "layout_a": ka.layout.cpp, "alignment_a": ka.alignment,
        "element_b": kb.dtype.cpp, "layout_b": kb.layout.cpp, "alignment_b": kb.alignment,
        "a_row_major": ka.layout is Layout.row, "b_row_major": kb.layout is Layout.row,
        "cache_op_a": cache_op(ka), "cache_op_b": cache_op(kb),
        "element_c": inst.d.cpp, "layout_c": Layout.row.cpp, "alignment_c": inst.alignment_c,
        "element_accumulator": inst.accumulator.cpp,
        "element_compute": inst.epilogue_compute.cpp,
        "op_class": "cutlass::arch::OpClassSimt" if simt else "cutlass::arch::OpClassTensorOp",
        "simt": simt,
        "arch_tag": arch_tag,
        "math_operator": math_op,
        "instruction": inst.instruction.as_list(),
        "warp": w.as_list(),
        "tile": t.as_list(),
        "warp_count": warp_count,
        "threads": 32 * warp_count[0] * warp_count[1] * warp_count[2],
        "partitions_k": warp_count[2],
        "stages": inst.stages,
        "multistage": multistage,
        "mainloop": "cutlass::gemm::threadblock::MmaMultistage" if multistage else "cutlass::gemm::threadblock::MmaPipelined",
        "swizzle": inst.swizzle,
        "epilogue_functor": functor,
        "epilogue_functor_args": functor_args,
        "epilogue_functor_header": functor_header,
        "epilogue_default": "cutlass::epilogue::threadblock::DefaultEpilogueSimt" if simt
                            else "cutlass::epilogue::threadblock::DefaultEpilogueTensorOp",
        "epilogue_header": "cutlass/epilogue/threadblock/default_epilogue_simt.h" if simt
                           else "cutlass/epilogue/threadblock/default_epilogue_tensor_op.h",
        "activation": ep.activation.value,
        "clamp": generic_clamp,
        "clamp_min": float(ep.clamp_min),
        "clamp_max": float(ep.clamp_max),
        "split_k_serial": inst.split_k is SplitK.serial,
        "batched": inst.batched,
        "mode": "cutlass::gemm::GemmUniversalMode::kBatched" if inst.batched
                else "cutlass::gemm::GemmUniversalMode::kGemm",
        "mainloop_smem_estimate": mainloop_smem_bytes(inst, inst.stages),
    }


__all__ = ["ARCHES", "LEVELS", "resolve", "template_context", "gencode", "legal_instructions", "smem_bytes",
           "SMEM_LIMIT"]
