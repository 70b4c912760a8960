"""One deterministic, readable name per resolved GEMM instance: file name, C symbol, manifest key.

gemm_<arch>_<a><b>_<c><d>_acc<acc>[_ep<compute>]_<la><lb><lc>_<tile>_<w..|c..>_i<instr>_s<stages>
    [_<schedule>[_fastacc]_<epilogue schedule>_<tile scheduler>[_swz<N>][_raster<m|n>][_nondet][_promo<N>][_promoovl]] [_swz<N>]
    [_swapab] _al<a>x<b>x<c>
    _<activation>[_bias<row|col>] [_splitk<serial|parallel>] [_batched] [_simt]
Every configuration field appears (or is at its stated default), so different configs get different names.
`fastacc` (fp8_fast_accum) appears only when set, so names of instances without it are unchanged; so do the
3.x scheduler tokens (swizzle other than 1, raster other than heuristic, nondeterministic reduction) and
the fp8 promotion interval other than CUTLASS's 4.
"""

from __future__ import annotations

from emitter.families.gemm.model import (
    Activation, Bias, EpilogueSchedule, GemmInstance, KernelSchedule, OpClass, Promotion, Raster, Reduction, SplitK,
    TileScheduler,
)
from emitter.spec import numbers

_SCHED = {KernelSchedule.auto: "auto", KernelSchedule.cooperative: "coop", KernelSchedule.pingpong: "pingpong"}
_EPI = {EpilogueSchedule.auto: "epiauto", EpilogueSchedule.tma: "epitma", EpilogueSchedule.no_smem: "epinosmem"}
_TS = {TileScheduler.persistent: "persistent", TileScheduler.stream_k: "streamk"}


_float_token = numbers.name_token


def instance_name(inst: GemmInstance) -> str:
    parts = ["gemm", inst.arch.yaml, f"{inst.a}{inst.b}", f"{inst.c}{inst.d}", f"acc{inst.accumulator}"]
    if inst.epilogue_compute != inst.accumulator:
        parts.append(f"ep{inst.epilogue_compute}")
    parts.append(inst.layout_a.letter + inst.layout_b.letter + inst.layout_c.letter)
    parts.append(str(inst.tile))
    if inst.warp is not None:
        parts.append(f"w{inst.warp}")
    if inst.cluster is not None:
        parts.append(f"c{inst.cluster}")
    if inst.instruction is not None:
        parts.append(f"i{inst.instruction}")
    parts.append(f"s{inst.stages}" if inst.stages else "sauto")
    if inst.arch.cutlass_major == 3:
        parts.append(_SCHED[inst.kernel_schedule])
        if inst.fp8_fast_accum:
            parts.append("fastacc")
        parts += [_EPI[inst.epilogue_schedule], _TS[inst.tile_scheduler]]
        if inst.swizzle != 1:
            parts.append(f"swz{inst.swizzle}")
    else:
        parts.append(f"swz{inst.swizzle}")
        if inst.fp8_fast_accum:   # rejected on 2.x; named anyway so a rejected config stays distinct
            parts.append("fastacc")
    if inst.raster is not Raster.heuristic:   # 3.x only (rejected on 2.x, named there too)
        parts.append("raster" + ("m" if inst.raster is Raster.along_m else "n"))
    if inst.reduction is Reduction.nondeterministic:
        parts.append("nondet")
    if inst.promotion_interval not in (0, 4):   # fp8 full accumulation, other than CUTLASS's 4 (sm90a only)
        parts.append(f"promo{inst.promotion_interval}")
    if inst.promotion is Promotion.overlap:     # emitter's overlapped fp8 promotion (sm90a only)
        parts.append("promoovl")
    if inst.swap_ab:   # rejected on 2.x; named there too, like fastacc
        parts.append("swapab")
    parts.append(f"al{inst.alignment_a}x{inst.alignment_b}x{inst.alignment_c}")
    ep = inst.epilogue
    act = ep.activation.value
    if ep.activation is Activation.clamp:
        act += f"{_float_token(ep.clamp_min)}to{_float_token(ep.clamp_max)}"
    parts.append(act)
    if ep.bias is not Bias.none:
        parts.append(f"bias{ep.bias.value}")
    if not ep.source:
        parts.append("nosrc")
    if inst.split_k is not SplitK.none:
        parts.append(f"splitk{inst.split_k.value}")
    if inst.batched:
        parts.append("batched")
    if inst.op_class is OpClass.simt:
        parts.append("simt")
    return "_".join(parts).lower()
