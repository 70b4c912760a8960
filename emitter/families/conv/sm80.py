"""CUTLASS 2.x (sm80, sm86, sm89) convolution: conv::kernel::DefaultConv{2,3}d{Fprop,Dgrad,Wgrad} (multistage
cp.async mainloop over the implicit-GEMM tile iterators) -> conv::kernel::ImplicitGemmConvolution, launched by
emitter's entry with the host half of conv::device::ImplicitGemmConvolution. resolve() checks the constraints
of these templates (and their can_implement's static part) before nvcc.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.conv import sm80_depthwise, sm80_depthwise_simt
from emitter.families.conv.common import GEMM_TEXT, epilogue_text, reject, tensor_text
from emitter.families.conv.model import (
    AUTO, Activation, Arch, ConvGroupMode, ConvInstance, ConvKernelKind, ConvOp, IteratorAlgorithm, Rejection, Shape3, SplitK, StrideSupport,
)

ARCHES = (Arch.sm80, Arch.sm86, Arch.sm89)
LEVELS = ("instruction", "warp", "threadblock", "epilogue", "kernel", "device", "entry")
SMEM_LIMIT = {Arch.sm80: 166912, Arch.sm86: 101376, Arch.sm89: 101376}
MAX_AUTO_STAGES = 5
AUTO_TARGET = 98304            # bytes of mainloop shared memory AUTO stages aim for (3 stages of 128x128x64 f16)

_INSTRUCTION = {DType.f16: Shape3(16, 8, 16), DType.bf16: Shape3(16, 8, 16), DType.tf32: Shape3(16, 8, 8),
                DType.s8: Shape3(16, 8, 32)}
_OUTPUTS = {DType.f16: (DType.f16, DType.f32), DType.bf16: (DType.bf16, DType.f32), DType.tf32: (DType.f32,),
            DType.s8: (DType.s8, DType.s32)}
_FUNCTOR = {
    Activation.identity: ("cutlass::epilogue::thread::LinearCombination", "cutlass/epilogue/thread/linear_combination.h"),
    Activation.relu: ("cutlass::epilogue::thread::LinearCombinationRelu", "cutlass/epilogue/thread/linear_combination_relu.h"),
    Activation.gelu: ("cutlass::epilogue::thread::LinearCombinationGELU", "cutlass/epilogue/thread/linear_combination_gelu.h"),
    Activation.silu: ("cutlass::epilogue::thread::LinearCombinationSilu", "cutlass/epilogue/thread/linear_combination_silu.h"),
    Activation.sigmoid: ("cutlass::epilogue::thread::LinearCombinationSigmoid", "cutlass/epilogue/thread/linear_combination_sigmoid.h"),
}
_DEFAULT = {(ConvOp.fprop, 2): "DefaultConv2dFprop", (ConvOp.dgrad, 2): "DefaultConv2dDgrad",
            (ConvOp.wgrad, 2): "DefaultConv2dWgrad", (ConvOp.fprop, 3): "DefaultConv3dFprop",
            (ConvOp.dgrad, 3): "DefaultConv3dDgrad", (ConvOp.wgrad, 3): "DefaultConv3dWgrad"}


def _header(name: str) -> str:
    return "cutlass/conv/kernel/" + {"DefaultConv2dFprop": "default_conv2d_fprop.h", "DefaultConv2dDgrad": "default_conv2d_dgrad.h",
                                     "DefaultConv2dWgrad": "default_conv2d_wgrad.h", "DefaultConv3dFprop": "default_conv3d_fprop.h",
                                     "DefaultConv3dDgrad": "default_conv3d_dgrad.h", "DefaultConv3dWgrad": "default_conv3d_wgrad.h",
                                     "DefaultConv2dGroupFprop": "default_conv2d_group_fprop.h"}[name]


def stage_bytes(inst: ConvInstance, a: DType) -> int:
    return (inst.tile.m + inst.tile.n) * inst.tile.k * a.bytes


def epilogue_bytes(inst: ConvInstance, acc: DType) -> int:
    # the tensor-op epilogue stages one warp-row of accumulators per iteration through shared memory
    wc = (inst.tile.m // inst.warp.m) * (inst.tile.n // inst.warp.n) if inst.warp else 4
    return wc * 32 * 8 * acc.bytes * 8 // 4 + (inst.tile.n + 8) * acc.bytes * 8


def resolve(inst: ConvInstance) -> ConvInstance | Rejection:
    if inst.arch not in ARCHES:
        return reject(inst, "arch", f"the CUTLASS 2.x conv module builds {', '.join(a.yaml for a in ARCHES)}, "
                                    f"not {inst.arch} (sm75 has no cp.async multistage conv here)")
    if inst.kernel is ConvKernelKind.depthwise_simt:
        return sm80_depthwise_simt.resolve_simt(inst)
    direct = inst.kernel is ConvKernelKind.depthwise_direct
    if direct and inst.schedule.value == "auto" and inst.scheduler.value == "auto" and not inst.swap_ab:
        return sm80_depthwise.resolve_direct(inst, SMEM_LIMIT[inst.arch])
    if (inst.kernel.value != "implicit" or inst.schedule.value != "auto" or inst.scheduler.value != "auto"
            or inst.swap_ab):
        return reject(inst, "gemm-1x1-sm90a-only", f"kernel {inst.kernel} / schedule {inst.schedule} / scheduler "
                                                   f"{inst.scheduler} / swap_ab: the persistent 1x1 GEMM route is built for "
                                                   f"arch: sm90a only: use arch: sm90a, or remove kernel/schedule/"
                                                   f"scheduler")
    a = DType.tf32 if inst.a is DType.f32 else inst.a
    if a not in _INSTRUCTION:
        return reject(inst, "dtype-input", f"{inst.a} inputs: 2.x tensor-op convolution takes f16, bf16, f32 "
                                           f"(tf32 math) or s8")
    acc_ok = DType.s32 if a is DType.s8 else DType.f32
    acc = inst.accumulator
    if acc is not acc_ok and not (a is DType.f16 and acc is DType.f16):
        return reject(inst, "dtype-accumulator", f"accumulator {acc} with {a} inputs: use {acc_ok}")
    if inst.c not in _OUTPUTS[a]:
        return reject(inst, "dtype-output", f"output {inst.c} with {a} inputs: use one of "
                                            f"{', '.join(map(str, _OUTPUTS[a]))}")
    compute = inst.epilogue_compute
    if a is DType.s8 and compute is not DType.f32:
        return reject(inst, "dtype-epilogue", "s8 convolution scales in float: use epilogue: f32")
    if inst.cluster is not None and inst.cluster != Shape3(1, 1, 1):
        return reject(inst, "cluster-is-3x", "thread block clusters are sm90 (CUTLASS 3.x): remove `cluster` or use arch: sm90a")
    if inst.epilogue.bias:
        return reject(inst, "bias-2x", "the 2.x conv epilogue has no per-channel bias here: use arch: sm90a for a "
                                       "fused bias, or add the bias as beta * C")
    if inst.epilogue.activation is not Activation.identity and a is DType.s8:
        return reject(inst, "activation-s8", "s8 outputs saturate through LinearCombinationClamp; activations are for "
                                             "float outputs")
    if inst.split_k is SplitK.parallel:
        return reject(inst, "split-k-parallel", "parallel split-K writes partial sums for a second (reduction) kernel, "
                                                "which one instance cannot launch: use split_k: serial")
    dims = inst.dims
    it = inst.iterator
    if inst.group_mode is not ConvGroupMode.none:
        why = _group_rejection(inst, dims, it)
        if why is not None:
            return why
    if it in (IteratorAlgorithm.few_channels, IteratorAlgorithm.fixed_channels):
        if inst.op is not ConvOp.fprop or dims != 2:
            return reject(inst, "iterator-channels", f"iterator {it} exists for 2D fprop only (first layers): use "
                                                     f"optimized or analytic for {dims}d {inst.op}")
        if inst.split_k is not SplitK.none:
            return reject(inst, "iterator-channels-split-k", f"iterator {it} with split-K: a first layer's K = R*S*C "
                                                             f"is short; use split_k: none")
    if inst.op is ConvOp.dgrad:
        why = _dgrad_rejection(inst, dims, it)
        if why is not None:
            return why
    inst_shape = inst.instruction or _INSTRUCTION[a]
    if inst_shape != _INSTRUCTION[a]:
        return reject(inst, "instruction", f"instruction {inst_shape}: the sm80 mma.sync for {a} is {_INSTRUCTION[a]}")
    t, w = inst.tile, inst.warp or Shape3(64, 64, inst.tile.k)
    for name, v in (("m", t.m), ("n", t.n)):
        if v % 16 or v < 16 or v > 256:
            return reject(inst, f"tile-{name}", f"tile {name}={v}: use a multiple of 16 in 16..256 (64, 128, 256 usual)")
    if t.m % w.m or t.n % w.n:
        return reject(inst, "warp-divides-tile", f"warp {w} must divide tile {t} in m and n")
    if w.k != t.k:
        return reject(inst, "warp-k", f"warp k={w.k} differs from tile k={t.k}: CUTLASS's conv kernels use one warp "
                                      f"slice of K; set warp k = {t.k}")
    if w.m % inst_shape.m or w.n % inst_shape.n or t.k % inst_shape.k:
        return reject(inst, "warp-instruction", f"warp {w} / tile k {t.k} must be multiples of the instruction {inst_shape}")
    if w.m < 16 or w.n < 8 or w.m > 128 or w.n > 128:
        return reject(inst, "warp-shape", f"warp {w}: m in 16..128 and n in 8..128")
    warps = (t.m // w.m) * (t.n // w.n)
    if warps > 16 or warps < 1:
        return reject(inst, "warp-count", f"tile {t} / warp {w} = {warps} warps: at most 16 (512 threads)")
    kbytes = t.k * a.bytes
    if kbytes not in (32, 64, 128):
        return reject(inst, "tile-k", f"tile k={t.k} is {kbytes} bytes of {a} a row: use 32, 64 or 128 bytes "
                                      f"(k = {64 // a.bytes} is CUTLASS's usual)")
    full = 128 // a.bits
    out_full = 128 // inst.c.bits
    al_a = inst.alignment_a or full
    al_b = inst.alignment_b or al_a
    al_c = inst.alignment_c or out_full
    if dims == 3 and (al_a != full or al_b != full):
        return reject(inst, "alignment-3d", f"DefaultConv3d* kernels read 128-bit accesses: alignment a/b must be "
                                            f"{full} for {a} (channels multiples of {full})")
    if al_a > full or al_b > full or al_c > out_full:
        return reject(inst, "alignment-max", f"alignment {al_a}x{al_b}x{al_c}: at most 128 bits an access "
                                             f"({full} {a}, {out_full} {inst.c})")
    if it is IteratorAlgorithm.optimized and (al_a != full or al_b != full) and inst.op is not ConvOp.fprop:
        return reject(inst, "alignment-optimized", f"the optimized {inst.op} iterators read full 128-bit rows: "
                                                   f"alignment a/b {full}, or use iterator: analytic for narrower channels")
    for which, al, dt in (("a", al_a, a), ("b", al_b, a), ("c", al_c, inst.c)):
        if al * dt.bits < 32 and (which != "c" and inst.stages != 2):
            return reject(inst, "alignment-cp-async", f"alignment {which}={al} is a {al * dt.bits // 8}-byte access of {dt}; "
                                                      f"the multistage mainloop copies with cp.async (4, 8 or 16 bytes): "
                                                      f"use alignment >= {32 // dt.bits} (a C = 3 f16 first layer: pad C to 4 "
                                                      f"and use iterator: fixed_channels with alignment 4, as cuDNN does; "
                                                      f"f32/tf32 reads C = 3 with few_channels and alignment 1)")
    if al_a != al_b and it in (IteratorAlgorithm.few_channels, IteratorAlgorithm.fixed_channels):
        return reject(inst, "alignment-channels", f"iterator {it}: x and w share the channel count, so alignment a and "
                                                  f"b must be equal (got {al_a}, {al_b})")
    if inst.swizzle not in (1, 2, 4, 8):
        return reject(inst, "swizzle", f"swizzle {inst.swizzle}: use 1, 2, 4 or 8")
    per_stage = stage_bytes(inst, a)
    limit = SMEM_LIMIT[inst.arch]
    stages = inst.stages
    if stages == AUTO:
        stages = max(3, min(MAX_AUTO_STAGES, AUTO_TARGET // per_stage))
    if stages < 2:
        return reject(inst, "stages", "at least 2 stages")
    if (stages == 2 and inst.op is ConvOp.dgrad and dims == 2 and inst.stride_support is StrideSupport.strided
            and (al_a != full or al_b != full)):
        # measured on an H100 and an H200: CUTLASS 2.x's strided-dgrad kernel on the two-stage (pipelined) mainloop
        # with sub-128-bit loads of dy or w leaves most of dx unwritten on every problem (alignment 1, 2 and 4
        # alike); at 128-bit loads, or on the multistage mainloop at any alignment it accepts, it is right
        return reject(inst, "dgrad-strided-pipelined", f"stages 2 with alignment a/b {al_a}/{al_b}: the two-stage "
                                                       f"strided-dgrad kernel with loads narrower than 128 bits computes "
                                                       f"a wrong dx (verified on the GPU); use stages >= 3 with "
                                                       f"alignment a/b >= {32 // a.bits}, or alignment a/b {full}")
    if stages == 2 and it in (IteratorAlgorithm.few_channels, IteratorAlgorithm.fixed_channels):
        return reject(inst, "stages-channels", f"iterator {it} has no two-stage (pipelined) kernel: use stages >= 3")
    smem = per_stage * stages
    if smem > limit:
        return reject(inst, "smem", f"{stages} stages of tile {t} ({a}) need {smem} bytes of shared memory, more than "
                                    f"the {limit} bytes of {inst.arch}: use stages <= {limit // per_stage} or a smaller tile")
    return inst.replace(a=a, accumulator=acc, instruction=inst_shape, warp=w, stages=stages, cluster=None,
                        alignment_a=al_a, alignment_b=al_b, alignment_c=al_c)


def _group_rejection(inst: ConvInstance, dims: int, it: IteratorAlgorithm) -> Rejection | None:
    """What CUTLASS 2.x's DefaultConv2dGroupFprop builds and its can_implement's static part accepts: 2D NHWC
    fprop, analytic (single or multiple groups a CTA) or optimized (single only) iterators, no split-K. The
    run-time part (C and K multiples of groups, K/groups against tile n) is problem.group_reasons."""
    mode = inst.group_mode
    if inst.op is not ConvOp.fprop or dims != 2:
        return reject(inst, "group-fprop-2d", f"group_mode {mode} with {dims}d {inst.op}: CUTLASS 2.x builds grouped "
                                              f"convolution as 2D fprop only (DefaultConv2dGroupFprop); use op: fprop "
                                              f"and dims: 2, or group_mode: none")
    if it in (IteratorAlgorithm.few_channels, IteratorAlgorithm.fixed_channels):
        return reject(inst, "group-iterator", f"iterator {it} with group_mode {mode}: grouped fprop has analytic and "
                                              f"optimized iterators only: use iterator: analytic or optimized")
    if it is IteratorAlgorithm.optimized and mode is ConvGroupMode.multiple:
        return reject(inst, "group-optimized-single", "group_mode multiple with the optimized iterator: CUTLASS's "
                                                      "can_implement refuses it (the optimized iterators follow one "
                                                      "group a CTA): use iterator: analytic, or group_mode: single")
    if inst.split_k is not SplitK.none:
        return reject(inst, "group-split-k", f"split_k {inst.split_k} with group_mode {mode}: CUTLASS's grouped "
                                             f"fprop refuses split-K slices: use split_k: none")
    if inst.stride_support is StrideSupport.unity:
        return reject(inst, "group-stride", "stride_support unity with a group_mode: the grouped fprop kernels are "
                                            "built for any stride: use stride_support: strided")
    return None


def _dgrad_rejection(inst: ConvInstance, dims: int, it: IteratorAlgorithm) -> Rejection | None:
    """What CUTLASS 2.x builds for dgrad. Unity stride: analytic or optimized iterators (3D: optimized). Strided
    (any stride; dx = sum over the taps r with (h + pad - r) divisible by the stride): 2D is
    ImplicitGemmConvolutionStridedDgrad, which runs one stride phase of dx per group of CTAs with only that phase's
    filter taps (no MMA on the taps a phase skips) and needs the strided-dgrad threadblock swizzle; 3D is the
    analytic iterator of the plain kernel, which tests every tap (redundant MMAs)."""
    strided = inst.stride_support is StrideSupport.strided
    if dims == 3 and strided and it is not IteratorAlgorithm.analytic:
        return reject(inst, "dgrad-strided-3d", f"strided 3D dgrad exists in CUTLASS 2.x with the analytic iterator "
                                                f"only, not {it}: use iterator: analytic, or stride_support: unity")
    if dims == 3 and not strided and it is not IteratorAlgorithm.optimized:
        return reject(inst, "dgrad-unity-3d", f"unity-stride 3D dgrad exists in CUTLASS 2.x with the optimized "
                                              f"iterator only, not {it}: use iterator: optimized, or stride_support: "
                                              f"strided with iterator: analytic")
    if strided and dims == 2 and inst.swizzle not in (1, 4, 8):
        return reject(inst, "dgrad-strided-swizzle", f"swizzle {inst.swizzle}: strided dgrad launches through "
                                                     f"CUTLASS's StridedDgradIdentityThreadblockSwizzle, built for 1, 4 "
                                                     f"or 8: use swizzle 1, 4 or 8")
    if strided and inst.split_k is not SplitK.none:
        return reject(inst, "dgrad-strided-split-k", f"split_k {inst.split_k} with strided dgrad: CUTLASS's strided "
                                                     f"dgrad kernel refuses split-K at stride > 1 (a phase's K-dim is "
                                                     f"already the shortest): remove split_k, or use stride_support: "
                                                     f"unity")
    return None


def _swizzle_cpp(inst: ConvInstance) -> str:
    n = int(inst.swizzle)
    if inst.op is ConvOp.dgrad and inst.stride_support is StrideSupport.strided and inst.dims == 2:
        # the strided-dgrad kernel's grid: M tiles per stride phase x phases (get_strided_dgrad_tile_m)
        return f"cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<{n}>"
    return f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{n}>"


def template_context(inst: ConvInstance) -> dict:
    """Everything the sm80 conv templates print, as C++ spellings derived from enums and integers."""
    if inst.kernel is ConvKernelKind.depthwise_simt:
        return sm80_depthwise_simt.template_context(inst)
    base = _template_context(inst)
    return sm80_depthwise.template_context(inst, base) if base["depthwise_direct"] else base


def _template_context(inst: ConvInstance) -> dict:
    a_t, b_t = inst.op.operands
    out = inst.op.output
    ep = inst.epilogue
    if inst.a is DType.s8 and inst.c is DType.s8:
        functor, header = "cutlass::epilogue::thread::LinearCombinationClamp", "cutlass/epilogue/thread/linear_combination_clamp.h"
        fargs: list[str] = []
    elif ep.activation is Activation.clamp:
        functor, header = "cutlass::epilogue::thread::LinearCombinationGeneric", "cutlass/epilogue/thread/linear_combination_generic.h"
        fargs = ["cutlass::epilogue::thread::Clamp"]
    else:
        functor, header = _FUNCTOR[ep.activation]
        fargs = []
    grouped = inst.group_mode is not ConvGroupMode.none
    default = "DefaultConv2dGroupFprop" if grouped else _DEFAULT[(inst.op, inst.dims)]
    t, w = inst.tile, inst.warp
    wc = (max(t.m // w.m, 1), max(t.n // w.n, 1), max(t.k // w.k, 1))
    align = {a_t: inst.alignment_a, b_t: inst.alignment_b, out: inst.alignment_c}
    return {
        "arch": inst.arch.yaml,
        "cc": inst.arch.cc,
        "gencode": f"arch=compute_{inst.arch.cc},code=sm_{inst.arch.cc}",
        "arch_tag": "cutlass::arch::Sm80",
        "op": inst.op.value,
        "op_cpp": inst.op.cpp,
        "dims": inst.dims,
        "gemm_text": GEMM_TEXT[inst.op],
        "layout_cpp": inst.layout.cpp,
        "element_a": inst.a.cpp,
        "element_b": inst.a.cpp,
        "element_c": inst.c.cpp,
        "element_accumulator": inst.accumulator.cpp,
        "element_compute": inst.epilogue_compute.cpp,
        "tensor_a": tensor_text(inst, a_t),
        "tensor_b": tensor_text(inst, b_t),
        "tensor_c": tensor_text(inst, out),
        "alignment_a": inst.alignment_a,
        "alignment_b": inst.alignment_b,
        "alignment_c": inst.alignment_c,
        "align_x": align["x"], "align_w": align["w"], "align_y": align["y"],
        "math_operator": "cutlass::arch::OpMultiplyAddSaturate" if inst.a is DType.s8 else "cutlass::arch::OpMultiplyAdd",
        "instruction": inst.instruction.as_list(),
        "warp": w.as_list(),
        "tile": t.as_list(),
        "warp_count": list(wc),
        "threads": 32 * wc[0] * wc[1] * wc[2],
        "stages": inst.stages,
        "iterator": inst.iterator.value,
        "iterator_cpp": f"cutlass::conv::IteratorAlgorithm::{inst.iterator.cpp}",
        "stride_support": inst.stride_support.value,
        "stride_support_cpp": "cutlass::conv::StrideSupport::k" + ("Unity" if inst.stride_support is StrideSupport.unity else "Strided"),
        "unity_stride": inst.stride_support is StrideSupport.unity,
        "swizzle_cpp": _swizzle_cpp(inst),
        "strided_dgrad": inst.op is ConvOp.dgrad and inst.stride_support is StrideSupport.strided,
        "epilogue_text": epilogue_text(inst),
        "epilogue_functor": functor,
        "epilogue_functor_header": header,
        "epilogue_functor_args": fargs,
        "is_clamp": ep.activation is Activation.clamp,
        "clamp_min": ep.clamp_min,
        "clamp_max": ep.clamp_max,
        "default_kernel": default,
        "default_kernel_header": _header(default),
        "grouped": grouped,
        "group_mode": inst.group_mode.value,
        "group_mode_cpp": f"cutlass::conv::GroupMode::{inst.group_mode.cpp}",
        "problem_size_cpp": "Conv2dProblemSize" if inst.dims == 2 else "Conv3dProblemSize",
        "split_k_serial": inst.split_k is SplitK.serial,
        "smem_limit": SMEM_LIMIT[inst.arch],
        "output_ptr": out,
        "ptr_a": a_t,
        "ptr_b": b_t,
        "depthwise_direct": inst.kernel is ConvKernelKind.depthwise_direct,
    }
