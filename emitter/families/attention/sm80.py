"""sm80 attention: CUTLASS's examples/41_fused_multi_head_attention (the xFormers kernel,
`AttentionKernel<scalar_t, ArchTag, isAligned, kQueriesPerBlock, kKeysPerBlock, kMaxK, ...>`), included from
the CUTLASS tree (never copied). Runs on sm80 and newer (sm86, sm89, sm90: the same fatbin).

Levels (templates/attention/sm80/):
  kernel    AttentionKernel instantiated for the instance (isAligned, no dropout, no bias)
  mapping   emitter's problem mapping: block -> (batch, query head, KV head = h / (heads_q / heads_kv), rows),
            any (batch, seq, head) strides, cu_seqlens, causal alignment without empty rows
  epilogue  the LSE from the kernel's softmax state; rows that see no key (output 0, LSE -inf)
  device    emitter_attention_problem -> Params, can-implement, launch dims, workspace
  entry     extern "C" __global__ entry (Params by value) + host shim (attention_abi.h)

Every rule below mirrors a static_assert or a run-time limit of the CUTLASS headers (cutlass 4.2), so an
accepted instance compiles; a rejected one names the rule and the fix.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.attention.model import (
    AUTO, DTYPES, Arch, AttentionInstance, Layout, Mask, Rejection, Schedule,
)

ARCHES = (Arch.sm80,)
LEVELS = ("kernel", "mapping", "epilogue", "device", "entry")
HEAD_DIMS = (32, 64, 96, 128, 256)
TILE_Q = (32, 64, 128)
TILE_KV = (64, 128)
STAGES = 4            # AttentionKernel's mainloops: 4 stages for 16-bit types on sm80+ (fixed upstream)
ALIGNMENT = 8         # elements (128-bit accesses of f16/bf16): isAligned = true
# Largest dynamic shared memory one block may opt in to: an sm80 instance also runs on sm86/sm89/sm90, the
# check uses the sm80 limit (163 KB), which the others meet or exceed (sm90: 227 KB).
SMEM_LIMIT = {Arch.sm80: 166912, Arch.sm90a: 232448}

# sizeof(AttentionKernel<16-bit, Sm80, true, Q, KV, kMaxK, false, false>::SharedStorage), by (tile_q, tile_kv,
# single value iteration = kMaxK <= tile_kv). The size does not depend on the head dim otherwise, nor on f16 vs
# bf16. Measured with nvcc 13.0 / CUTLASS 4.2 (tests/attention/test_attention_render.py re-measures it when nvcc is
# there), and the kernel level static_asserts it, so a CUTLASS whose layout differs fails the compile loudly.
# The parts: the softmax state (4 * tile_q + tile_q * tile_kv / 32 floats) plus the union of the Q.K^T
# pipeline, the P tile + V pipeline and the epilogue; the f32 output accumulator of multi-pass kernels
# (kMaxK > tile_kv) adds its epilogue staging.
_SMEM = {
    (32, 64, True): 13568, (32, 64, False): 25344,
    (32, 128, True): 42496, (32, 128, False): 51200,
    (64, 64, True): 18944, (64, 64, False): 34304,
    (64, 128, True): 52224, (64, 128, False): 69632,
    (128, 64, True): 29696, (128, 64, False): 52224,
    (128, 128, True): 71680, (128, 128, False): 106496,
}


def _reject(inst: AttentionInstance, rule: str, reason: str) -> Rejection:
    return Rejection(inst, rule, reason)


def single_pass(inst: AttentionInstance) -> bool:
    """kMaxK <= tile_kv: the output stays in registers (no f32 accumulator in global memory)."""
    return max_k(inst) <= inst.tile_kv


def threads(inst: AttentionInstance) -> int:
    return inst.tile_q * inst.tile_kv // 32      # kNumWarpsPerBlock = tile_q * tile_kv / (32 * 32)


def max_k(inst: AttentionInstance) -> int:
    """AttentionKernel's kMaxK: max(head_dim, head_dim_v), with 96 rounded up to 128 -- xFormers instantiates
    kMaxK 64 / 128 / unbounded and runs d96 on the 128 kernel (the run-time head dim stays 96); the shared
    memory and the single-pass rule are the same either way (96 and 128 both fit or both exceed tile_kv)."""
    k = max(inst.head_dim, inst.head_dim_v)
    return 128 if k == 96 else k


def smem_bytes(inst: AttentionInstance) -> int | None:
    return _SMEM.get((inst.tile_q, inst.tile_kv, single_pass(inst)))


def resolve(inst: AttentionInstance) -> AttentionInstance | Rejection:
    arch = inst.arch
    if arch not in ARCHES:
        return _reject(inst, "arch", f"attention/sm80.py resolves sm80 instances, not {arch}")
    if inst.dtype not in DTYPES[Arch.sm80]:
        return _reject(inst, "dtype-arch", f"dtype {inst.dtype} is not supported by the sm80 kernel (AttentionKernel "
                                           f"has f16/bf16 tensor-op paths; fp8 attention is sm90a): use f16 or bf16")
    for field, d in (("head_dim", inst.head_dim), ("head_dim_v", inst.head_dim_v)):
        if d not in HEAD_DIMS:
            return _reject(inst, "head-dim", f"{field}={d}: the sm80 kernel takes {', '.join(map(str, HEAD_DIMS))}")
    if inst.tile_q not in TILE_Q:
        return _reject(inst, "tile-q", f"tile_q={inst.tile_q}: AttentionKernel needs kQueriesPerBlock a multiple of 32 and "
                                       f"the K tile loader ({inst.tile_kv} keys x 32 by {max(threads(inst), 1)} threads, "
                                       f"8 elements each) at least one access per thread: use {', '.join(map(str, TILE_Q))}")
    if inst.tile_kv not in TILE_KV:
        return _reject(inst, "tile-kv", f"tile_kv={inst.tile_kv}: AttentionKernel needs kKeysPerBlock dividing 1024 and above "
                                        f"32, and its Q tile loader ({inst.tile_q} queries x 32 by tile_q * tile_kv / 32 "
                                        f"threads, 8 elements each) at least one access per thread, i.e. tile_kv <= 128: "
                                        f"use {', '.join(map(str, TILE_KV))}")
    if inst.schedule not in (Schedule.auto, Schedule.multistage):
        return _reject(inst, "schedule-arch", f"schedule {inst.schedule} is a Hopper (sm90a) schedule; the sm80 kernel "
                                              f"runs its cp.async multistage mainloops: use schedule auto or multistage")
    if inst.warp_groups != 2:
        return _reject(inst, "warp-groups-arch", f"warp_groups {inst.warp_groups}: consumer warp groups are the sm90a "
                                                 f"warp-specialized kernel's; the sm80 kernel sizes its warps from the "
                                                 f"tile: leave warp_groups out (or use arch sm90a)")
    if inst.persistent:
        return _reject(inst, "persistent-arch", "the sm80 kernel launches one block per (query tile, head, batch) and has "
                                                "no persistent tile scheduler: use persistent false (or arch sm90a)")
    if inst.stages not in (AUTO, STAGES):
        return _reject(inst, "stages-fixed", f"stages={inst.stages}: AttentionKernel fixes its pipelines at {STAGES} stages "
                                             f"for 16-bit types on sm80: use stages auto or {STAGES}")
    if not inst.key_tail:
        return _reject(inst, "key-tail-always", "the sm80 kernel masks the keys past seq_k in the last tile at run time "
                                                "(no cost on full tiles), so key_tail false buys nothing: use key_tail true")
    need = smem_bytes(inst)
    if need is None:   # a tile pair the table lacks (cannot happen with the vocabularies above)
        return _reject(inst, "smem-model", f"no shared-memory model for tile {inst.tile_q}x{inst.tile_kv}")
    limit = SMEM_LIMIT[Arch.sm80]
    if need > limit:
        return _reject(inst, "smem-budget", f"tile {inst.tile_q}x{inst.tile_kv} with head dim {max(inst.head_dim, inst.head_dim_v)} "
                                            f"needs {need} bytes of shared memory, sm80 allows {limit} per block: use a "
                                            f"smaller tile")
    return inst.replace(schedule=Schedule.multistage, stages=STAGES, persistent=False)


def gencode(inst: AttentionInstance) -> str:
    return f"arch=compute_{inst.arch.cc},code=sm_{inst.arch.cc}"


def template_context(inst: AttentionInstance) -> dict:
    """Everything the sm80 templates print, as C++ spellings derived from enums and integers."""
    if inst.stages == AUTO or inst.schedule is Schedule.auto:
        raise ValueError("template_context needs a resolved instance: call sm80.resolve() first")
    return {
        "arch": inst.arch.yaml,
        "cc": inst.arch.cc,
        "gencode": gencode(inst),
        "arch_tag": "cutlass::arch::Sm80",
        "element": {DType.f16: "cutlass::half_t", DType.bf16: "cutlass::bfloat16_t"}[inst.dtype],
        "tile_q": inst.tile_q,
        "tile_kv": inst.tile_kv,
        "head_dim": inst.head_dim,
        "head_dim_v": inst.head_dim_v,
        "max_k": max_k(inst),
        "causal": inst.mask is not Mask.none,
        "bottom_right": inst.mask is Mask.causal_bottom_right,
        "lse": inst.lse,
        "gqa": inst.gqa,
        "varlen": inst.varlen,
        "bhsd": inst.layout is Layout.bhsd,
        "alignment": ALIGNMENT,
        "needs_accumulator": not single_pass(inst),
        "smem_bytes": smem_bytes(inst),
        "threads": threads(inst),
    }


def include_dirs(arch=None) -> list:
    """Extra include directories an sm80 attention instance compiles with: emitter's stand-in for
    <curand_kernel.h> (templates/attention/sm80/include, see that file). The kernel itself is included as
    "../examples/41_fused_multi_head_attention/kernel_forward.h", relative to CUTLASS's include/ directory,
    which every build already puts on the include path (the wheel's and a CUTLASS_PATH checkout's trees both
    hold include/ and examples/ side by side)."""
    from emitter.render import templates_root
    return [templates_root() / "attention" / "sm80" / "include"]


__all__ = ["ARCHES", "LEVELS", "HEAD_DIMS", "TILE_Q", "TILE_KV", "SMEM_LIMIT", "resolve", "template_context",
           "smem_bytes", "single_pass", "threads", "gencode", "include_dirs"]
