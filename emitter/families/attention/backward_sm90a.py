"""sm90a attention backward: CUTLASS's Hopper FMHA backward (examples/88_hopper_fmha: the main collective
`FmhaBwdMainloopTmaWarpSpecialized`, its epilogue `FmhaBwdEpilogueKV` and kernel `FmhaKernelTmaWarpSpecialized`;
included from the CUTLASS tree, never copied), run as ONE launch.

Upstream's device layer (device/fmha_device_bwd.hpp) chains three launches and a memset: sum_OdO
(rowsum(dO * O) into a workspace), a memset of the f32 dQ accumulator, the main kernel (dK / dV per key block
in registers, dQ partials TMA-reduce-added into the accumulator), the dQ conversion. An emitted instance is one
cuLaunchKernel (the launch record and every runner take one), so the entry runs the three steps as phases of one
grid: each block takes a ticket (an atomic counter), so the blocks that hold lower tickets are already running;
tickets [0, A) are the preprocessing blocks (rowsum(dO * O), the forward's LSE copied with -inf -> +inf, the dQ
accumulator rows zeroed), [A, A + B) upstream's main kernel on one key block each (waiting only for its (batch,
head)'s preprocessing blocks), the rest the dQ conversion (waiting for its (batch, head)'s key blocks). A block
only ever waits for lower tickets, so the grid cannot deadlock whatever the GPU runs at once. Counters reset
themselves (the last block of each (batch, head) and the last ticket), so the workspace is zeroed once by the
shim's initialize and every later launch (profile loops, CUDA graphs) finds it zero.

Levels (templates/attention/sm90a/bwd/):
  types      element, TileShape (BlockQ x BlockKV x HeadDim), upstream's mainloop / epilogue / kernel
  mask       emitter's backward fusion: causal top-left or bottom-right (upstream's CausalFusion is top-left and
             floors seq_q / BlockQ, dropping a partial query tile), upstream's ResidualFusion otherwise
  mainloop   upstream's collective, or (dq_split: true) emitter's compute() over it: upstream gives the whole
             dQ = dS K of a query tile to its second MMA warp group (12 of the tile's 20 wgmma units on one group,
             a 64-register dQ accumulator beside dK, dV, S, dP and P); dq_split gives each group half (query
             rows at BlockQ 128, head-dim columns at BlockQ 64 / d128) over all BlockKV keys, two named barriers
             of the MMA groups guarding the shared dS
  schedule   the ticket scheduler: the main kernel's block coordinate from the block's ticket
  phases     emitter's preprocessing and dQ conversion (upstream's sum_OdO / convert kernels take blockIdx and
             a 2-D block of their own, so they cannot run inside another grid), and the phase waits / signals
  device     problem -> upstream Arguments, run-time scale, workspace layout, every TMA stride / alignment rule
  entry      extern "C" __global__ (Params by value, __grid_constant__) + the host shim

What upstream lacks and emitter adds here: any seq_q (upstream's can_implement wants seq_q % 8 and its causal
trip count floors seq_q / BlockQ), run-time scale (upstream fixes 1/sqrt(d)), causal bottom-right, the forward's
LSE (-inf rows that see no key become +inf, so P = 0 there), GQA / MQA (gqa: true): upstream's kernel runs per KV
head over one query sequence made of the group's query heads (Q and dO copied by the preprocessing into
[batch * heads_q, q_pad, head_dim], q_pad a multiple of BlockQ, the mask taking the row modulo q_pad), so dK / dV
come out summed over the group with no reduction pass. What it rejects (before nvcc, with the rule): variable
lengths (upstream's descriptors span whole sequences: use arch sm80), deterministic dQ (upstream adds dQ partials
by TMA reduce in arrival order), dtypes other than f16 / bf16. bf16: upstream's collective assigns the f32 dS to
a register fragment of the element type, which cutlass::bfloat16_t refuses; a bf16 instance's translation unit
alone specializes CuTe's register-fragment engine for bfloat16_t (bf16_fragment.cu.j2) so its elements also
take a float, rounded as bfloat16_t(float) rounds, with upstream's storage and value type.
"""

from __future__ import annotations

from emitter.dtypes import DType
from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.model import Arch, Layout, Mask, Rejection

ARCHES = (Arch.sm90a,)
LEVELS = ("types", "mask", "mainloop", "schedule", "phases", "device", "entry")
# upstream's collective assigns the f32 dS to an Element (acc_DS(i) = float expression), which cutlass::half_t
# takes and cutlass::bfloat16_t refuses (no assignment from float): a bf16 instance's translation unit gives
# bfloat16_t register fragments elements that take a float (templates/attention/sm90a/bwd/bf16_fragment.cu.j2)
DTYPES = (DType.f16, DType.bf16)
HEAD_DIMS = (32, 64, 128)     # the head dims examples/88 instantiates its backward for
TILE_KV = 128                 # two MMA warp groups of 64 key rows each (wgmma M = 64 per warp group)
# BlockQ per head dim: upstream's instantiations (88_hopper_fmha.cu run_bwd_32/64/128); d128 at BlockQ 128
# does not fit shared memory (K, V, Q, dO stages, dS and the f32 dQ staging)
TILE_Q = {32: (64, 128), 64: (64, 128), 128: (64,)}
# dq_split (mainloop.cu.j2): (BlockQ, head_dim) pairs it runs at: query-row halves at BlockQ 128 (d64), head-dim
# halves at BlockQ 64 (d128); both verified on an H200 (2026-11-28)
DQ_SPLIT = {(128, 64), (64, 128)}
THREADS = 384                 # one load warp group + two MMA warp groups
SMEM_CAPACITY = 232448        # sm90's 227 KiB per CTA
PRE_ROWS = 128                # query rows per preprocessing block
CONVERT_ROWS = 64             # query rows per dQ conversion block
ALIGNMENT = 8                 # elements: TMA needs 16-byte aligned addresses and strides

_ELEMENT = {DType.f16: "cutlass::half_t", DType.bf16: "cutlass::bfloat16_t"}


def _reject(inst: AttentionBackwardInstance, rule: str, reason: str) -> Rejection:
    return Rejection(inst, rule, reason)


def resolve(inst: AttentionBackwardInstance) -> AttentionBackwardInstance | Rejection:
    if inst.arch not in ARCHES:
        return _reject(inst, "arch", f"attention/backward_sm90a.py resolves sm90a backward instances, not {inst.arch}")
    if inst.dtype not in DTYPES:
        return _reject(inst, "sm90a-backward-dtype", f"dtype {inst.dtype}: examples/88's backward is built for 16-bit "
                                                     f"floats (its GMMA operands and TMA tiles): use dtype f16 or bf16")
    if inst.head_dim not in HEAD_DIMS:
        return _reject(inst, "sm90a-backward-head-dim", f"head_dim={inst.head_dim}: examples/88's backward is built for "
                                                        f"head dims {', '.join(map(str, HEAD_DIMS))}: use one of them "
                                                        f"(or arch sm80, which also takes 96 and 256)")
    if inst.head_dim_v != inst.head_dim:
        return _reject(inst, "backward-head-dim-v", f"head_dim_v={inst.head_dim_v} != head_dim={inst.head_dim}: "
                                                    f"the sm90a backward's tiles share one head dim: leave head_dim_v out")
    if inst.tile_kv != TILE_KV:
        return _reject(inst, "sm90a-backward-tile-kv", f"tile_kv={inst.tile_kv}: the backward's two MMA warp groups "
                                                       f"hold 64 key rows each (wgmma M = 64), so BlockKV is "
                                                       f"{TILE_KV}: use tile {TILE_Q[inst.head_dim][0]}x{TILE_KV}")
    allowed_q = TILE_Q[inst.head_dim]
    if inst.tile_q not in allowed_q:
        why = (" (128 does not fit shared memory at d128: K / V / Q / dO stages, dS and the f32 dQ staging)"
               if inst.head_dim == 128 else "")
        return _reject(inst, "sm90a-backward-tile-q", f"tile_q={inst.tile_q} at head_dim {inst.head_dim}: "
                                                      f"BlockQ must be {' or '.join(map(str, allowed_q))}{why}: use "
                                                      f"tile {allowed_q[0]}x{TILE_KV}")
    if inst.varlen:
        return _reject(inst, "sm90a-backward-varlen", "varlen: true: examples/88's backward has fixed sequence "
                                                      "lengths only (its TMA descriptors span whole sequences): "
                                                      "use varlen: false here, or arch sm80 for cu_seqlens")
    if inst.deterministic:
        return _reject(inst, "sm90a-backward-deterministic",
                       "deterministic: true (the default): examples/88's backward adds each key block's dQ partial "
                       "into an f32 accumulator by TMA reduce-add in arrival order, so the last bits vary run to "
                       "run: add `deterministic: false` to this entry, or use arch sm80 for a deterministic dQ")
    if inst.dq_split and (inst.tile_q, inst.head_dim) not in DQ_SPLIT:
        return _reject(inst, "sm90a-backward-dq-split",
                       f"dq_split: true at tile {inst.tile_q}x{inst.tile_kv}, head_dim {inst.head_dim}: the two MMA "
                       f"warp groups split dQ by query rows (BlockQ 128: 64 each, wgmma M = 64; head_dim 64) or by "
                       f"head-dim columns (BlockQ 64: D / 2 each, whole 64-column swizzle atoms of K: head_dim "
                       f"128), the two kinds verified on the GPU; use tile 64x{TILE_KV} at head_dim 128 or "
                       f"128x{TILE_KV} at head_dim 64, or leave dq_split out")
    return inst


def gencode(inst: AttentionBackwardInstance) -> str:
    return "arch=compute_90a,code=sm_90a"


def template_context(inst: AttentionBackwardInstance) -> dict:
    """Everything the sm90a backward templates print, as C++ spellings derived from enums and integers."""
    if isinstance(resolve(inst), Rejection):
        raise ValueError("template_context needs a resolved instance: call backward_sm90a.resolve() first")
    return {
        "arch": inst.arch.yaml,
        "gencode": gencode(inst),
        "element": _ELEMENT[inst.dtype],
        "bf16": inst.dtype is DType.bf16,   # bf16_fragment.cu.j2: fragments of bfloat16_t that take a float
        "tile_q": inst.tile_q,
        "tile_kv": inst.tile_kv,
        "head_dim": inst.head_dim,
        "causal": inst.mask is not Mask.none,
        "bottom_right": inst.mask is Mask.causal_bottom_right,
        "bhsd": inst.layout is Layout.bhsd,
        "gqa": inst.gqa,
        "alignment": ALIGNMENT,
        "threads": THREADS,
        "smem_capacity": SMEM_CAPACITY,
        "pre_rows": PRE_ROWS,
        "convert_rows": CONVERT_ROWS,
        "dq_split": inst.dq_split,         # mainloop.cu.j2: emitter's compute() with dQ over both MMA warp groups
    }


def include_dirs(arch) -> list:
    return []


def render(inst: AttentionBackwardInstance, name: str, banner: dict) -> str:
    from emitter.render import render_template
    return render_template("attention/sm90a/bwd/instance.cu.j2", inst=inst, name=name, ctx=template_context(inst),
                           banner=banner)


__all__ = ["ARCHES", "LEVELS", "DTYPES", "HEAD_DIMS", "TILE_Q", "TILE_KV", "THREADS", "resolve", "template_context",
           "render", "gencode"]
