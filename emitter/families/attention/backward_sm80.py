"""sm80 attention backward: CUTLASS's examples/41_fused_multi_head_attention/kernel_backward.h (the xFormers
backward, `AttentionBackwardKernel<ArchTag, scalar_t, kIsAligned, kApplyDropout, kPreload, kBlockSizeI,
kBlockSizeJ, kMaxK, ...>`), included from the CUTLASS tree (never copied). Runs on sm80 and newer (Hopper
through the same cubin's PTX-compatible SASS for sm_80 is not loadable there: build for the GPU's arch).

Levels (templates/attention/sm80/bwd/):
  kernel      AttentionBackwardKernel instantiated for the instance (aligned, no dropout, preload where dK / dV
              stay in registers, key splits enabled)
  mapping     block -> (key split, query head, batch, KV head = h / (heads_q / heads_kv)); any input strides;
              cu_seqlens; the rows that see no key (bottom-right with seq_q > seq_k, empty key sequences) left out
  preprocess  rowsum(dO * O) and the forward's LSE padded to 32 rows with +inf, per block, before the key loop
  reduce      GQA: each query head's dK / dV of a key block into a buffer, the group's last block sums them
  device      the ABI problem -> Params, can-implement, key splits, workspace layout
  entry       extern "C" __global__ entry (Params by value) + host shim (attention_backward_abi.h)

Every rule mirrors a static_assert or a limit of the CUTLASS header (cutlass 4.2), so an accepted instance
compiles; a rejected one names the rule and the fix.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.model import Arch, Layout, Mask, Rejection

ARCHES = (Arch.sm80,)
LEVELS = ("kernel", "mapping", "preprocess", "reduce", "device", "entry")
DTYPES = (DType.f16, DType.bf16)
HEAD_DIMS = (32, 64, 96, 128, 256)
TILE_Q = (64, 128)
TILE_KV = (64, 128)
ALIGNMENT = 8          # elements: 128-bit accesses (kIsAligned = true)
SMEM_LIMIT = 166912    # sm80's opt-in shared memory per block (sm86/89 have less: 99 KB; sm90 more)

# sizeof(AttentionBackwardKernel<Sm80, T, true, false, kPreload = kOutputInRF, I, J, kMaxK, false, true>
# ::SharedStorage) by (dtype, tile_q, tile_kv, kMaxK), measured with nvcc 13.0 / CUTLASS 4.2; the kernel level
# static_asserts it, so a CUTLASS whose layout differs fails the compile loudly instead of launching with the
# wrong dynamic shared memory.
_SMEM = {
    ("f16", 64, 64, 32): 40192, ("f16", 64, 64, 64): 44288, ("f16", 64, 64, 128): 34048, ("f16", 64, 64, 256): 34048,
    ("f16", 64, 128, 32): 77056, ("f16", 64, 128, 64): 85248, ("f16", 64, 128, 128): 60672, ("f16", 64, 128, 256): 60672,
    ("f16", 128, 64, 32): 83456, ("f16", 128, 64, 64): 87552, ("f16", 128, 64, 128): 91648, ("f16", 128, 64, 256): 60928,
    ("f16", 128, 128, 32): 137728, ("f16", 128, 128, 64): 145920, ("f16", 128, 128, 128): 154112,
    ("f16", 128, 128, 256): 104960,
    ("bf16", 64, 64, 32): 34560, ("bf16", 64, 64, 64): 42240, ("bf16", 64, 64, 128): 34048, ("bf16", 64, 64, 256): 34048,
    ("bf16", 64, 128, 32): 68352, ("bf16", 64, 128, 64): 76544, ("bf16", 64, 128, 128): 60672,
    ("bf16", 64, 128, 256): 60672,
    ("bf16", 128, 64, 32): 65536, ("bf16", 128, 64, 64): 75264, ("bf16", 128, 64, 128): 91648,
    ("bf16", 128, 64, 256): 60928,
    ("bf16", 128, 128, 32): 110080, ("bf16", 128, 128, 64): 118272, ("bf16", 128, 128, 128): 133632,
    ("bf16", 128, 128, 256): 94720,
}


def max_k(inst: AttentionBackwardInstance) -> int:
    """kMaxK: max(head_dim, head_dim_v), 96 rounded up to 128 (as the forward's sm80 module does)."""
    k = max(inst.head_dim, inst.head_dim_v)
    return 128 if k == 96 else k


def output_in_rf(inst: AttentionBackwardInstance) -> bool:
    """upstream's kOutputInRF: dK / dV of the key block stay in registers when kMaxK <= tile_q (16-bit types)."""
    return max_k(inst) <= inst.tile_q


def threads(inst: AttentionBackwardInstance) -> int:
    return inst.tile_q * inst.tile_kv // 32     # kNumWarpsPerBlock = I * J / (32 * 32)


def smem_bytes(inst: AttentionBackwardInstance) -> int | None:
    return _SMEM.get((inst.dtype.yaml, inst.tile_q, inst.tile_kv, max_k(inst)))


def _reject(inst: AttentionBackwardInstance, rule: str, reason: str) -> Rejection:
    return Rejection(inst, rule, reason)


def resolve(inst: AttentionBackwardInstance) -> AttentionBackwardInstance | Rejection:
    if inst.arch not in ARCHES:
        return _reject(inst, "arch", f"attention/backward_sm80.py resolves sm80 backward instances, not {inst.arch}")
    if inst.dq_split:
        return _reject(inst, "backward-dq-split", "dq_split: true splits the sm90a backward's dQ product over its two "
                                                  "MMA warp groups; the sm80 backward (kernel_backward.h) has its own "
                                                  "dQ loop: remove dq_split from this arch sm80 entry")
    if inst.dtype not in DTYPES:
        return _reject(inst, "backward-dtype", f"dtype {inst.dtype} has no sm80 attention backward (kernel_backward.h "
                                               f"runs f16 / bf16 tensor ops): use f16 or bf16")
    for name, d in (("head_dim", inst.head_dim), ("head_dim_v", inst.head_dim_v)):
        if d not in HEAD_DIMS:
            return _reject(inst, "backward-head-dim", f"{name}={d}: the sm80 backward takes "
                                                      f"{', '.join(map(str, HEAD_DIMS))}")
    if inst.head_dim_v != inst.head_dim:
        return _reject(inst, "backward-head-dim-v", f"head_dim_v={inst.head_dim_v} != head_dim={inst.head_dim}: the "
                                                    f"backward is verified for equal head dims only: leave head_dim_v out")
    if inst.tile_q not in TILE_Q:
        return _reject(inst, "backward-tile-q", f"tile_q={inst.tile_q}: AttentionBackwardKernel's kBlockSizeI is a "
                                                f"multiple of its 64-row warp tiles and its LSE / delta rows fit one "
                                                f"thread each: use {', '.join(map(str, TILE_Q))}")
    if inst.tile_kv not in TILE_KV:
        return _reject(inst, "backward-tile-kv", f"tile_kv={inst.tile_kv}: kBlockSizeJ must be 64 or 128 (its warp "
                                                 f"grid is I x J / 1024 warps of 32x32): use "
                                                 f"{', '.join(map(str, TILE_KV))}")
    need = smem_bytes(inst)
    if need is None:
        return _reject(inst, "backward-smem-model", f"no shared-memory model for tile {inst.tile_q}x{inst.tile_kv} "
                                                    f"with head dim {max_k(inst)}")
    if need > SMEM_LIMIT:
        return _reject(inst, "backward-smem-budget", f"tile {inst.tile_q}x{inst.tile_kv} at head dim {max_k(inst)} "
                                                     f"needs {need} bytes of shared memory, sm80 allows {SMEM_LIMIT}: "
                                                     f"use a smaller tile")
    return inst


def gencode(inst: AttentionBackwardInstance) -> str:
    return f"arch=compute_{inst.arch.cc},code=sm_{inst.arch.cc}"


def template_context(inst: AttentionBackwardInstance) -> dict:
    """Everything the sm80 backward templates print, as C++ spellings derived from enums and integers."""
    smem = smem_bytes(inst)
    if smem is None:
        raise ValueError("template_context needs a resolved instance: call backward_sm80.resolve() first")
    rf = output_in_rf(inst)
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
        "gqa": inst.gqa,
        "varlen": inst.varlen,
        "deterministic": inst.deterministic,
        "bhsd": inst.layout is Layout.bhsd,
        "alignment": ALIGNMENT,
        "output_in_rf": rf,
        "preload": rf,                # upstream allows the MMA preload only with dK / dV in registers
        "smem_bytes": smem,
        "threads": threads(inst),
    }


def render(inst: AttentionBackwardInstance, name: str, banner: dict) -> str:
    from emitter.render import render_template
    return render_template("attention/sm80/bwd/instance.cu.j2", inst=inst, name=name, ctx=template_context(inst),
                           banner=banner)


__all__ = ["ARCHES", "LEVELS", "DTYPES", "HEAD_DIMS", "TILE_Q", "TILE_KV", "SMEM_LIMIT", "resolve",
           "template_context", "render", "smem_bytes", "max_k", "output_in_rf", "threads", "gencode"]
