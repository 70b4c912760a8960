"""`kernel: depthwise_direct` (sm80, sm86, sm89; the sm_80 build runs on Hopper): CUTLASS 2.x's depthwise direct
convolution, conv::kernel::DefaultDepthwiseDirect2dConvFprop -> conv::kernel::DirectConvolution (example 46).

A CTA computes a P x Q output tile of one image for `tile n` channels (the spec's `tile` is P x Q x channels): it
keeps the tile's R x S filter taps in shared memory, loads the tile's input window (cp.async) and accumulates in SIMT
registers -- no GEMM, so nothing of the implicit GEMM's one-channel K loop. One CTA an output tile (the shim's grid):
a CTA walking several raced in CUTLASS's fused epilogue (templates/conv/sm80/depthwise_device.cu.j2 says how).
The filter size is compiled in; so are stride and dilation (IteratorAlgorithm::kFixedStrideDilation) unless the
spec says `any` (kOptimized: read at run time, the input window's shared memory sized at launch).

CUTLASS reads the filter as [R*S][K] (its device::DirectConvolution launches a reorder kernel first); emitter's
entry is one launch, so each CTA writes the [R*S] x tile-n block of the reordered filter it reads into the
workspace itself before the main loop (`run` in templates/conv/sm80/depthwise_kernel.cu.j2).

resolve_direct() checks what these templates build (their static_asserts and can_implement's static part) before
nvcc; what a problem must satisfy (groups = C = K, R x S, stride, dilation) is problem.depthwise_direct_reasons.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.conv.common import epilogue_text, reject
from emitter.families.conv.model import (
    AUTO, Activation, ConvGroupMode, ConvInstance, ConvKernelKind, ConvOp, IteratorAlgorithm, Rejection, Shape3, SplitK,
    StrideSupport,
)

# CUTLASS's SimtWarpShape<pixels a warp, thread rows>: the pixel block (P x Q) one thread computes; a warp's
# threads split tile n channels two a thread (16-bit types), so channels >= 64 leave 1 thread row, 32 two, 16 four
SIMT_WARP_SHAPE = {(4, 4): (1, 1), (4, 2): (2, 1), (4, 1): (2, 2), (8, 1): (2, 4), (8, 2): (2, 2), (8, 4): (1, 2),
                   (16, 1): (4, 4), (16, 2): (2, 4), (16, 4): (2, 2), (25, 1): (5, 5), (32, 1): (4, 8),
                   (32, 2): (4, 4), (32, 4): (2, 4)}
CHANNELS = (16, 32, 64, 128)
MAX_FILTER = 9
MAX_AUTO_STAGES = 4


def misplaced_keys(inst: ConvInstance) -> Rejection | None:
    """The depthwise keys (`filter`, `stride`, `dilation`) mean nothing to the other kernels; depthwise_direct is
    a CUTLASS 2.x kernel."""
    direct = inst.kernel is ConvKernelKind.depthwise_direct
    if inst.kernel is ConvKernelKind.depthwise_simt:
        from emitter.families.conv.sm80_depthwise_simt import misplaced_keys as simt_keys
        return simt_keys(inst)
    if not direct and (inst.filter is not None or inst.conv_stride is not None or inst.conv_dilation is not None):
        return reject(inst, "depthwise-keys", f"filter / stride / dilation are compiled into `kernel: depthwise_direct` "
                                              f"instances only; kernel {inst.kernel} reads them from the problem at run "
                                              f"time: remove them, or add kernel: depthwise_direct")
    if direct and inst.arch.cutlass_major != 2:
        return reject(inst, "depthwise-direct-sm80", f"kernel depthwise_direct on {inst.arch}: CUTLASS's depthwise "
                                                     f"direct convolution is a 2.x (SIMT, cp.async) kernel: use arch: "
                                                     f"sm80 (its sm_80 build runs on Hopper)")
    return None


def _step_text(v: tuple[int, int]) -> str:
    return "any" if v == (0, 0) else f"{v[0]}x{v[1]}"


def smem_bytes(tile: tuple[int, int, int], flt: tuple[int, int], warp_m: int, stride: tuple[int, int],
               dilation: tuple[int, int], stages: int, a_bytes: int, acc_bytes: int) -> int:
    """The dynamic shared memory CUTLASS's DirectConvolutionParams::get_smem_size asks: stages x the larger of the
    input window (its thread map's loads: every thread moves 128 bits a load, so the window rounds up to whole
    rounds of the CTA's threads) and the epilogue's staging (the P*Q x channels accumulators), + the filter (its
    R*S x channels, rounded the same way). Measured from a built shim: 8x8x64, 3x3, stride 1, f16 / f32, 4 stages:
    67584 bytes (tests/conv/test_conv_depthwise_direct_nvcc.py)."""
    tp, tq, ch = tile
    threads = 32 * (tp * tq // warp_m)
    per_load = 16 // a_bytes                     # 128-bit loads
    lanes = ch // per_load                       # threads along one pixel's channels
    rows = max(threads // lanes, 1)              # pixels one round of loads covers

    def rounds(pixels: int) -> int:
        return -(-pixels // rows) * per_load * threads * a_bytes

    window = ((tp - 1) * stride[0] + (flt[0] - 1) * dilation[0] + 1) * ((tq - 1) * stride[1] + (flt[1] - 1) * dilation[1] + 1)
    return stages * max(rounds(window), tp * tq * ch * acc_bytes) + rounds(flt[0] * flt[1])


def _smem(inst: ConvInstance, stages: int) -> int:
    """smem_bytes of an instance; `any` stride / dilation sized for stride 2, dilation 2 (the shim refuses a larger
    run-time window that does not fit the arch)."""
    st = inst.conv_stride if inst.conv_stride != (0, 0) else (2, 2)
    dl = inst.conv_dilation if inst.conv_dilation != (0, 0) else (2, 2)
    return smem_bytes((inst.tile.m, inst.tile.n, inst.tile.k), inst.filter or (1, 1), inst.warp.m, st, dl, stages, inst.a.bytes, inst.accumulator.bytes)


def resolve_direct(inst: ConvInstance, smem_limit: int) -> ConvInstance | Rejection:
    if inst.op is not ConvOp.fprop or inst.dims != 2:
        return reject(inst, "depthwise-fprop-2d", f"kernel depthwise_direct with {inst.dims}d {inst.op}: CUTLASS's "
                                                  f"direct convolution is 2D depthwise fprop only; use op: fprop, "
                                                  f"dims: 2 (the library runs depthwise dgrad as this fprop of dy)")
    if inst.a not in (DType.f16, DType.bf16):
        return reject(inst, "depthwise-dtype", f"{inst.a} inputs: emitter builds the depthwise direct kernel for f16 "
                                               f"and bf16 (128-bit loads of 8 channels): use dtype f16 or bf16")
    if inst.c is not inst.a:
        return reject(inst, "depthwise-output", f"output {inst.c} with {inst.a} inputs: the direct kernel writes its "
                                                f"input type: use dtype {inst.a}")
    acc = inst.accumulator
    if acc is not DType.f32:
        # CUTLASS's own depthwise instances accumulate f16 in half2 FMAs (they build here: 8x8x64 3x3, 253
        # registers); emitter has verified the f32 path only, so that is the one it offers
        return reject(inst, "dtype-accumulator", f"accumulator {acc} with {inst.a} inputs: the direct kernel is "
                                                 f"built and verified with f32 accumulation here: use accumulator f32")
    if inst.group_mode is not ConvGroupMode.none:
        return reject(inst, "depthwise-group-mode", f"group_mode {inst.group_mode} with kernel depthwise_direct: the "
                                                    f"direct kernel is depthwise by construction (groups = C = K): "
                                                    f"remove group_mode")
    if inst.iterator is not IteratorAlgorithm.optimized or inst.stride_support is not StrideSupport.strided:
        return reject(inst, "depthwise-iterator", f"iterator {inst.iterator} / stride_support {inst.stride_support}: "
                                                  f"the direct kernel's iterators follow `stride` and `dilation` (fixed "
                                                  f"or `any`): remove iterator and stride_support")
    if inst.split_k is not SplitK.none or inst.swizzle != 1:
        return reject(inst, "depthwise-split-swizzle", f"split_k {inst.split_k} / swizzle {inst.swizzle}: the direct "
                                                       f"kernel spreads output tiles over CTAs itself (the shim picks the "
                                                       f"count): remove split_k and swizzle")
    if inst.instruction is not None and inst.instruction != Shape3(1, 1, 1):
        return reject(inst, "depthwise-instruction", f"instruction {inst.instruction}: the direct kernel is SIMT "
                                                     f"(1x1x1 FMAs): remove instruction")
    if inst.epilogue.bias or inst.epilogue.activation is not Activation.identity:
        return reject(inst, "depthwise-epilogue", f"epilogue {epilogue_text(inst)}: emitter builds the direct kernel "
                                                  f"with the linear combination alpha * acc + beta * C only: remove "
                                                  f"the activation and bias (apply them after the convolution)")
    if inst.filter is None:
        return reject(inst, "depthwise-filter", "kernel depthwise_direct compiles its filter size in: add filter: RxS "
                                                "(e.g. filter: 3x3)")
    r, s = inst.filter
    if r > MAX_FILTER or s > MAX_FILTER:
        return reject(inst, "depthwise-filter", f"filter {r}x{s}: the direct kernel keeps every tap of a thread's "
                                                f"pixels in registers; emitter builds R, S up to {MAX_FILTER}: use a "
                                                f"smaller filter, or a group_mode: multiple instance")
    t = inst.tile                         # P x Q x channels
    if t.k not in CHANNELS:
        return reject(inst, "depthwise-tile-channels", f"tile {t}: channels a CTA (the third number) {t.k}: use one "
                                                       f"of {', '.join(map(str, CHANNELS))}")
    pixels = t.m * t.n
    warp = inst.warp
    if warp is None:
        warp_m = next((m for m in (16, 25, 8, 4, 32) if pixels % m == 0 and pixels // m <= 16
                       and _thread_tile(m, t.k) is not None), 0)
        warp = Shape3(warp_m or 16, t.k, r * s)
    if warp.n != t.k or warp.k != r * s:
        return reject(inst, "depthwise-warp", f"warp {warp}: the direct kernel's warps cover all tile channels and "
                                              f"taps: warp n = {t.k}, k = R*S = {r * s}; choose warp m (output pixels "
                                              f"a warp)")
    thread = _thread_tile(warp.m, t.k)
    if thread is None:
        ok = sorted({m for (m, rows) in SIMT_WARP_SHAPE if rows == _thread_rows(t.k)})
        return reject(inst, "depthwise-warp", f"warp m {warp.m} with {t.k} channels a CTA: CUTLASS's SIMT depthwise "
                                              f"warp splits into thread tiles for warp m in {ok} only")
    if pixels % warp.m or not 1 <= pixels // warp.m <= 16:
        return reject(inst, "depthwise-tile", f"tile {t.m}x{t.n} output pixels with warp m {warp.m}: warp m must "
                                              f"divide P*Q = {pixels} into 1..16 warps")
    if t.m % thread[0] or t.n % thread[1]:
        return reject(inst, "depthwise-tile", f"tile P x Q {t.m}x{t.n}: a thread computes {thread[0]}x{thread[1]} "
                                              f"output pixels (warp m {warp.m}, {t.k} channels), which must tile it: "
                                              f"use P, Q multiples of them (8x8, 4x4, 10x10 with warp m 25 are "
                                              f"CUTLASS's tested tiles)")
    full = 128 // inst.a.bits
    for which, al in (("a", inst.alignment_a), ("b", inst.alignment_b), ("c", inst.alignment_c)):
        if al not in (AUTO, full):
            return reject(inst, "depthwise-alignment", f"alignment {which}={al}: the direct kernel reads and writes "
                                                       f"128-bit vectors ({full} {inst.a} channels): use alignment "
                                                       f"auto or {full} (C = K a multiple of {full})")
    inst = inst.replace(warp=warp)
    stages = inst.stages
    if stages == AUTO:
        stages = max([2] + [n for n in range(2, MAX_AUTO_STAGES + 1) if _smem(inst, n) <= smem_limit])
    if stages < 2:
        return reject(inst, "stages", "at least 2 stages")
    smem = _smem(inst, stages)
    if smem > smem_limit:
        return reject(inst, "smem", f"{stages} stages of a {t.m}x{t.n} output tile's input window ({t.k} channels, "
                                    f"filter {r}x{s}, stride {_step_text(inst.conv_stride)}) and the filter need "
                                    f"{smem} bytes of shared memory, more than the {smem_limit} bytes of {inst.arch}: "
                                    f"use fewer stages or a smaller tile")
    return inst.replace(warp=warp, stages=stages, instruction=Shape3(1, 1, 1), cluster=None,
                        alignment_a=full, alignment_b=full, alignment_c=full)


def _thread_rows(channels: int) -> int:
    return 32 // min(channels // 2, 32)


def _thread_tile(warp_m: int, channels: int) -> tuple[int, int] | None:
    return SIMT_WARP_SHAPE.get((warp_m, _thread_rows(channels)))


def template_context(inst: ConvInstance, base: dict) -> dict:
    """The sm80 context (`base`: dtypes, arch, epilogue functor) plus the direct kernel's shapes."""
    r, s = inst.filter
    fixed = inst.conv_stride != (0, 0) and inst.conv_dilation != (0, 0)
    st = inst.conv_stride if fixed else (-1, -1)
    dl = inst.conv_dilation if fixed else (-1, -1)
    out = dict(base)
    out.update({
        "direct_filter": [r, s],
        "direct_fixed": fixed,
        "direct_stride": list(st),
        "direct_dilation": list(dl),
        "direct_output_tile": [1, inst.tile.m, inst.tile.n, inst.tile.k],
        "direct_threadblock": [inst.tile.m * inst.tile.n, inst.tile.k, r * s],
        "direct_iterator_cpp": "cutlass::conv::IteratorAlgorithm::" + ("kFixedStrideDilation" if fixed else "kOptimized"),
        "direct_stride_support_cpp": "cutlass::conv::StrideSupport::" + ("kFixed" if fixed else "kStrided"),
        "direct_stride_text": _step_text(inst.conv_stride),
        "direct_dilation_text": _step_text(inst.conv_dilation),
        "direct_warp_count": inst.tile.m * inst.tile.n // inst.warp.m,
    })
    return out
