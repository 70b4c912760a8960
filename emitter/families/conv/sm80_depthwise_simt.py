"""`kernel: depthwise_simt` (sm80, sm86, sm89; the sm_80 build runs on Hopper): emitter's own SIMT depthwise
convolution (groups = C = K, a channel multiplier of 1), written for memory bandwidth, no CUTLASS kernel under it
(templates/conv/sm80/depthwise_simt_*.cu.j2; cutlass numeric types only).

Every thread owns a vector of 8 channels (16 bytes of f16 / bf16) and f32 accumulators in registers:

* wgrad: dw[c, r, s] = sum over n, p, q of dy[n, p, q, c] * x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c]. The grid is
  channel blocks x slices of the N*P*Q positions x groups of filter rows (a thread keeps at most 80 accumulators:
  3x3 whole, 5x5 two rows at a time, 7x7 and 9x9 one). A CTA walks its slice, reduces its threads' sums (warp
  shuffles, then the warps in order through shared memory) into an f32 partial in the workspace; the last CTA of
  each group of slices (an atomic ticket) adds that group's partials in slice order, and the last group the groups'
  in group order, then writes alpha * sum + beta * source: deterministic (a fixed order of additions whatever
  the CTAs' timing), one launch, every dw element written.
* fprop: y[n, p, q, c] = sum over r, s of x[...] * w[c, r, s]; a thread computes `tile n` output pixels along Q of
  one row, the CTA's taps in shared memory, x read through L1 / L2.
* dgrad (gather, any stride): dx[n, h, w, c] = sum over the taps (r, s) and output pixels (p, q) with
  p * sh - ph + r * dh = h and q * sw - pw + s * dw = w of dy[n, p, q, c] * w[c, r, s]; a thread computes `tile n`
  input pixels along W, checking each tap's divisibility by the stride.

Both ops walk runs of `tile n` output pixels along Q. Where the problem's W stride and dilation are (1, 1) or (2, 1)
the kernel has them compiled in (a branch at the top): each x column a filter row reaches is loaded and converted
once and the (pixel, tap) pairs that read it are resolved at compile time; other steps load per pixel and tap.

`tile` is rows x pixels x channels: rows = threads along the runs, pixels = output pixels a thread computes along Q,
channels = a CTA's channel block (16..256, a multiple of 8 lanes). The filter R x S is compiled in (1..9); stride,
dilation and padding are read at run time.

resolve_simt() checks what the templates build before nvcc; what a problem must satisfy (groups = C = K, C % 8,
the compiled filter) is problem.depthwise_simt_reasons, the shim's EMITTER_CANNOT_IMPLEMENT rules in words.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.conv.common import epilogue_text, reject
from emitter.families.conv.model import (
    AUTO, Activation, ConvGroupMode, ConvInstance, ConvKernelKind, ConvOp, IteratorAlgorithm, Rejection, SplitK,
    StrideSupport,
)

OPS = (ConvOp.wgrad, ConvOp.fprop, ConvOp.dgrad)
CHANNELS = (16, 32, 64, 128, 256)
MAX_FILTER = 9
VECTOR = 8                     # channels a thread: 16 bytes of a 16-bit type
MAX_ACCUMULATORS = 80          # f32 accumulators a wgrad thread keeps (taps of its filter rows x 8 channels)
MAX_PIXELS = 8                 # fprop: output pixels a thread along Q
SLICE_GROUP = 16               # wgrad: partials one ticket's last CTA adds (the first level of the reduction)


def misplaced_keys(inst: ConvInstance) -> Rejection | None:
    """depthwise_simt compiles its filter in and reads stride and dilation at run time."""
    if inst.conv_stride is not None or inst.conv_dilation is not None:
        return reject(inst, "depthwise-simt-stride", "kernel depthwise_simt reads stride and dilation (and padding) "
                                                     "from the problem at run time: remove stride and dilation")
    if inst.arch.cutlass_major != 2:
        return reject(inst, "depthwise-simt-sm80", f"kernel depthwise_simt on {inst.arch}: emitter builds its SIMT "
                                                   f"depthwise kernel for sm80 (no wgmma to use; the sm_80 build runs "
                                                   f"on Hopper): use arch: sm80")
    return None


def tap_rows(r: int, s: int) -> int:
    """Filter rows a wgrad thread accumulates at once: as many as keep rows * S * 8 accumulators <= 80."""
    return max(1, min(r, MAX_ACCUMULATORS // (s * VECTOR)))


def resolve_simt(inst: ConvInstance) -> ConvInstance | Rejection:
    if inst.op not in OPS or inst.dims != 2:
        return reject(inst, "depthwise-simt-op", f"kernel depthwise_simt with {inst.dims}d {inst.op}: emitter's "
                                                 f"SIMT depthwise kernel is built for 2D wgrad, fprop and dgrad: "
                                                 f"use dims: 2")
    if inst.a not in (DType.f16, DType.bf16):
        return reject(inst, "depthwise-simt-dtype", f"{inst.a} inputs: the SIMT depthwise kernel reads 16-byte "
                                                    f"vectors of 8 f16 or bf16 channels: use dtype f16 or bf16")
    if inst.c is not inst.a:
        return reject(inst, "depthwise-simt-output", f"output {inst.c} with {inst.a} inputs: the kernel writes its "
                                                     f"input type: use dtype {inst.a}")
    if inst.accumulator is not DType.f32 or inst.epilogue_compute is not DType.f32:
        return reject(inst, "depthwise-simt-accumulator", f"accumulator {inst.accumulator} / epilogue "
                                                          f"{inst.epilogue_compute}: the kernel accumulates and "
                                                          f"scales in f32: use accumulator f32, epilogue f32")
    if inst.group_mode is not ConvGroupMode.none:
        return reject(inst, "depthwise-simt-group-mode", f"group_mode {inst.group_mode}: the kernel is depthwise by "
                                                         f"construction (groups = C = K): remove group_mode")
    # stride_support: the spec's dgrad default is unity; the kernel runs any stride, so either value means that
    if (inst.iterator is not IteratorAlgorithm.optimized or inst.split_k is not SplitK.none or inst.swizzle != 1 or inst.warp is not None
            or inst.instruction is not None or inst.stages not in (AUTO, 1)):
        return reject(inst, "depthwise-simt-keys", "iterator / split_k / swizzle / warp / "
                                                   "instruction / stages: the SIMT depthwise kernel has none of "
                                                   "them (it splits the wgrad reduction itself): remove them")
    if inst.epilogue.bias or inst.epilogue.activation is not Activation.identity:
        return reject(inst, "depthwise-simt-epilogue", f"epilogue {epilogue_text(inst)}: the kernel writes alpha * "
                                                       f"acc + beta * C only: remove the activation and bias")
    if inst.filter is None:
        return reject(inst, "depthwise-simt-filter", "kernel depthwise_simt compiles its filter size in: add "
                                                     "filter: RxS (e.g. filter: 3x3)")
    r, s = inst.filter
    if r > MAX_FILTER or s > MAX_FILTER:
        return reject(inst, "depthwise-simt-filter", f"filter {r}x{s}: emitter builds R, S up to {MAX_FILTER} "
                                                     f"(the taps live in registers): use a smaller filter")
    t = inst.tile                      # rows x pixels x channels
    if t.k not in CHANNELS:
        return reject(inst, "depthwise-simt-tile", f"tile {t}: channels a CTA (the third number) {t.k}: use one of "
                                                   f"{', '.join(map(str, CHANNELS))}")
    threads = t.m * (t.k // VECTOR)
    if threads % 32 or not 64 <= threads <= 512:
        return reject(inst, "depthwise-simt-tile", f"tile {t}: rows {t.m} x {t.k // VECTOR} channel vectors = "
                                                   f"{threads} threads; a CTA needs a multiple of 32 in 64..512: "
                                                   f"change the first number")
    if not 1 <= t.n <= MAX_PIXELS:
        return reject(inst, "depthwise-simt-tile", f"tile {t}: output pixels a thread (the second number) 1.."
                                                   f"{MAX_PIXELS}")
    full = 128 // inst.a.bits
    for which, al in (("a", inst.alignment_a), ("b", inst.alignment_b), ("c", inst.alignment_c)):
        if al not in (AUTO, full):
            return reject(inst, "depthwise-simt-alignment", f"alignment {which}={al}: the kernel moves 16-byte "
                                                            f"vectors of {full} channels: use alignment auto or "
                                                            f"{full} (C = K a multiple of {full})")
    return inst.replace(stages=1, cluster=None, alignment_a=full, alignment_b=full, alignment_c=full,
                        stride_support=StrideSupport.strided)


def template_context(inst: ConvInstance) -> dict:
    """What templates/conv/sm80/depthwise_simt_*.cu.j2 print: enums and integers only."""
    r, s = inst.filter
    rows = tap_rows(r, s) if inst.op is ConvOp.wgrad else r
    threads = inst.tile.m * (inst.tile.k // VECTOR)
    return {
        "arch": inst.arch.yaml,
        "cc": inst.arch.cc,
        "gencode": f"arch=compute_{inst.arch.cc},code=sm_{inst.arch.cc}",
        "op": inst.op.value,
        "wgrad": inst.op is ConvOp.wgrad,
        "dgrad": inst.op is ConvOp.dgrad,
        "element": inst.a.cpp,
        "bf16": inst.a is DType.bf16,
        "filter": [r, s],
        "rows": inst.tile.m,
        "pixels": inst.tile.n,
        "channels": inst.tile.k,
        "threads": threads,
        "tap_rows": rows,
        "row_groups": -(-r // rows),
        "slice_group": SLICE_GROUP,
        "epilogue_text": epilogue_text(inst),
    }
