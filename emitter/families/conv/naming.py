"""One deterministic, readable name per resolved conv instance: file name, C symbol, manifest key.

conv<dims>d_<op>_<arch>_<a>_<c>_acc<acc>[_ep<compute>]_<layout>_<tile>_<w..|c..>[_i<instr>]_s<stages>
    [_<iterator>_<stride>_swz<N>] _al<a>x<b>x<c> _<activation>[_bias] [_splitk<serial|parallel>]
    [_gemm1x1_<coop|pingpong>_<persistent|streamk>[_swapab]]      (kernel: gemm_1x1 only; implicit kernels keep their names)
    [_group<single|multiple>]                                       (grouped kernels only)
kernel: depthwise_direct replaces `_<iterator>_<stride>_swz<N>` with `_dwdirect_f<R>x<S>_st<HxW|any>_dl<HxW|any>`
(its tile is P x Q x channels); kernel: depthwise_simt with `_dwsimt_f<R>x<S>` (stride and dilation read at run time).
Every configuration field appears (or is at its stated default), so different configs get different names.
"""

from __future__ import annotations

from emitter.families.conv.model import Activation, ConvGroupMode, ConvInstance, ConvKernelKind, ConvSchedule, ConvTileScheduler, SplitK
from emitter.spec import numbers

_ITER = {"analytic": "analytic", "optimized": "opt", "few_channels": "fewch", "fixed_channels": "fixch"}


# clamp bounds in names: the shared token, distinct for bounds that differ past the 6th digit
_float_token = numbers.name_token


def instance_name(inst: ConvInstance) -> str:
    parts = [f"conv{inst.dims}d", inst.op.value, inst.arch.yaml, str(inst.a), str(inst.c), f"acc{inst.accumulator}"]
    if inst.epilogue_compute != inst.accumulator:
        parts.append(f"ep{inst.epilogue_compute}")
    parts.append(inst.layout.value)
    parts.append(str(inst.tile))
    if inst.warp is not None:
        parts.append(f"w{inst.warp}")
    if inst.cluster is not None:
        parts.append(f"c{inst.cluster}")
    if inst.instruction is not None:
        parts.append(f"i{inst.instruction}")
    parts.append(f"s{inst.stages}" if inst.stages else "sauto")
    if inst.kernel is ConvKernelKind.depthwise_direct:
        step = {(0, 0): "any"}
        parts += ["dwdirect", "f{}x{}".format(*(inst.filter or (0, 0))),
                  "st" + step.get(inst.conv_stride, "{}x{}".format(*(inst.conv_stride or (0, 0)))),
                  "dl" + step.get(inst.conv_dilation, "{}x{}".format(*(inst.conv_dilation or (0, 0))))]
    elif inst.kernel is ConvKernelKind.depthwise_simt:
        parts += ["dwsimt", "f{}x{}".format(*(inst.filter or (0, 0)))]
    elif inst.arch.cutlass_major == 2:
        parts += [_ITER[inst.iterator.value], inst.stride_support.value, f"swz{inst.swizzle}"]
    else:
        parts.append(inst.stride_support.value)
    parts.append(f"al{inst.alignment_a}x{inst.alignment_b}x{inst.alignment_c}")
    ep = inst.epilogue
    act = ep.activation.value
    if ep.activation is Activation.clamp:
        act += f"{_float_token(ep.clamp_min)}to{_float_token(ep.clamp_max)}"
    parts.append(act)
    if ep.bias:
        parts.append("bias")
    if inst.split_k is not SplitK.none:
        parts.append(f"splitk{inst.split_k.value}")
    if inst.kernel is ConvKernelKind.gemm_1x1:
        sched = {ConvSchedule.auto: "auto", ConvSchedule.cooperative: "coop", ConvSchedule.pingpong: "pingpong"}
        tiles = {ConvTileScheduler.auto: "auto", ConvTileScheduler.persistent: "persistent",
                 ConvTileScheduler.stream_k: "streamk"}
        parts += ["gemm1x1", sched[inst.schedule], tiles[inst.scheduler]]
        if inst.swap_ab:
            parts.append("swapab")
    if inst.group_mode is not ConvGroupMode.none:
        parts.append(f"group{inst.group_mode.value}")
    return "_".join(parts).lower()
