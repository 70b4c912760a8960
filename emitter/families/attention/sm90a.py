"""sm90a attention: CUTLASS's Hopper FMHA collectives (examples/88_hopper_fmha) with emitter's own levels.

What the instance compiles (templates/attention/sm90a/, level by level):
  1 types      element, TileShape (BlockQ x BlockKV x HeadDim), (seq, dim, (batch, head)) strides, options
  2 mask       emitter's fusion: causal top-left / bottom-right and the key tail, in one struct shaped like
               upstream's CausalFusion / ResidualFusion (which cannot combine them or shift the diagonal)
  3 mainloop   upstream FmhaMainloopTmaWarpSpecialized, derived: run-time softmax scale, K/V TMA descriptors
               over heads_kv heads and the KV head h / (heads_q / heads_kv) for query head h (GQA, MQA)
  4 epilogue   upstream FmhaFwdEpilogue's TMA store of O; the LSE write optional (upstream always writes
               it) and -inf for a row that sees no key
  5 kernel     FmhaKernelTmaWarpSpecialized + IndividualTileScheduler or PersistentTileScheduler
  6 device     the host shim: problem -> Arguments, every TMA stride / alignment rule checked first
  7 entry      extern "C" __global__ with Params by value (__grid_constant__), the C ABI

Schedules: `cooperative` (the consumer warp groups share a 64 x warp_groups-row Q tile -- two, 128 rows, unless
the spec's `warp_groups` says 3 or 4 -- persistent optional),
`pingpong` (upstream's builder spelling of it: persistent, Q loaded by its own producer warp) and `split_kv`
(decode: cooperative, a query block's keys shared by several CTAs whose partial results the last one
combines in the epilogue level; one query row packs a KV head's query heads into one tile; split_plan). `tma`
(FmhaKernelTma, no warp specialization) is refused: slower, and not emitted here. Variable sequence
lengths (varlen: true): cooperative, non-persistent, key tail on, packed [total, heads, dim]; the loads
read each sequence through descriptors offset per sequence (rows past its end clipped), the epilogue
stores O with predicated stores (templates/attention/sm90a/varlen_mainloop.cu.j2, epilogue.cu.j2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emitter.dtypes import DType
from emitter.families.attention.model import (AUTO, Arch, AttentionInstance, Layout, Mask, Rejection,
                                              Schedule)

SMEM_CAPACITY = 232448          # bytes of shared memory one CTA may use on sm90 (227 KiB)
HEAD_DIMS = (32, 64, 128, 256)  # the head dims upstream builds and checks its collectives with
ROWS_PER_WARP_GROUP = 64        # a consumer warp group's query rows (wgmma M = 64; upstream's TileShapeQK M)
MMA_WARP_GROUPS = 2             # the default consumer warp group count (the spec's `warp_groups`)
WARP_GROUPS = (2, 3, 4)         # upstream's roles Consumer0..Consumer3; one would get 488 registers (above 255)
TILE_Q = ROWS_PER_WARP_GROUP * MMA_WARP_GROUPS   # the default tile_q, 128
TILES_KV = (64, 128, 256)
MAX_STAGES = 8
LOAD_REGISTERS = 40 - 2 * 8     # upstream's LoadRegisterRequirement (the producer warp group's setmaxnreg)
ACC_HEADROOM = 48               # consumer registers besides the S and O accumulators (P, softmax state, addresses):
                                # 240 - 384 / 2, the margin of the largest 2-group tiles that compile without spills;
                                # 3 groups: d64 192x128 (96 + 48 <= 160) builds clean, d64 192x192 (128 + 48) makes
                                # ptxas serialize the wgmma (C7511, insufficient registers)


def mma_registers(warp_groups: int) -> int:
    """Registers a consumer thread gets (upstream's MmaRegisterRequirement, FmhaKernelTmaWarpSpecialized): the
    65,536 of an SM over (warp_groups + 1) x 128 threads, rounded down to 8 a thread, times the warp groups, less
    the producer's LoadRegisterRequirement (24), split over the consumer warp groups, rounded down to 8: 2 -> 240,
    3 -> 160, 4 -> 112."""
    threads = (warp_groups + 1) * 128
    supply = (64 * 1024 // threads // 8) * 8 * threads // 128
    return (supply - LOAD_REGISTERS) // warp_groups // 8 * 8


def max_acc_columns(warp_groups: int) -> int:
    """tile_kv + head_dim a consumer thread can hold as f32 S and O accumulators (64 rows x columns / 128
    threads, i.e. columns / 2 registers) next to ACC_HEADROOM: 384 with 2 warp groups, 224 with 3, 128 with 4."""
    return 2 * (mma_registers(warp_groups) - ACC_HEADROOM)


MAX_ACC_COLUMNS = max_acc_columns(MMA_WARP_GROUPS)   # 384: tile_kv + head_dim with the default 2 warp groups
AUTO_STAGES_MAX = 5             # upstream's default K/V stage count (kStagesKV)

_ELEMENT = {DType.f16: "cutlass::half_t", DType.bf16: "cutlass::bfloat16_t"}


class _Reject(Exception):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule
        self.reason = reason


def _fail(rule: str, reason: str) -> None:
    raise _Reject(rule, reason)


@dataclass(frozen=True)
class SmemBreakdown:
    q: int
    kv: int
    epilogue: int
    barriers: int
    total: int


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def smem_bytes(inst: AttentionInstance, stages: int) -> SmemBreakdown:
    """sizeof(Kernel::SharedStorage), from the collectives' storage:
    Q: StagesQ (= warp groups) buffers of (tile_q / warp groups) x head_dim; K and V: `stages` buffers of
    tile_kv x head_dim (K and V share them, a union); the epilogue: per consumer warp group a 64 x 32 D tile
    in 2 stages (EpilogueTileAuto, TmaWarpSpecialized) after an empty, 512-byte-aligned C array; the mainloop and the epilogue storage overlap
    (a union) unless the kernel is persistent. Barriers: a full/empty pair per stage plus the Q, reducer,
    warp-group order, load-warp and epilogue-load barriers, the whole rounded to 512 bytes. Matches the
    shims' reports: 29,184 (f16 d32 64-wide, 5 stages), 116,224 (f16 d64 pingpong, 5), 197,120 (f16 d128
    128-wide, 5), 214,528 (bf16 d256 64-wide persistent, 4); 393,728 for f16 d256 with a 128-wide KV tile and
    5 stages, the figure the issue reports."""
    es = inst.dtype.bits // 8
    d = max(inst.head_dim, inst.head_dim_v)
    q = _round_up(inst.tile_q * inst.head_dim * es, 128)
    kv = _round_up(inst.tile_kv * d * es, 128) * stages
    epi_tile_n = min(32, inst.head_dim_v)
    epi_stages = min(inst.head_dim_v // epi_tile_n, 2)
    # CollectiveStorageWithoutC: an empty C array at D's swizzle alignment (512 bytes for 64-byte rows), then D
    epi_align = 512 if epi_tile_n * es % 64 == 0 else 256
    epilogue = inst.warp_groups * (epi_align + _round_up(64 * epi_tile_n * epi_stages * es, epi_align))
    tensors = q + kv + epilogue if inst.persistent else max(q + kv, epilogue)
    # K/V (a full/empty pair per stage), Q (one per warp group: StagesQ = warp groups), reducer (2 stages),
    # warp-group order (2 x warp groups), load-warp and epilogue-load barriers (16-byte aligned each); the
    # struct is 512-byte aligned (the epilogue's swizzled D tile). 144 bytes besides K/V at 2 warp groups.
    total = _round_up(tensors + 16 * stages + 80 + 32 * inst.warp_groups, 512)
    return SmemBreakdown(q, kv, epilogue, total - tensors, total)


def _auto_stages(inst: AttentionInstance) -> int:
    for stages in range(AUTO_STAGES_MAX, 1, -1):
        if smem_bytes(inst, stages).total <= SMEM_CAPACITY:
            return stages
    return 2


def resolve(inst: AttentionInstance) -> AttentionInstance | Rejection:
    try:
        return _resolve(inst)
    except _Reject as r:
        return Rejection(inst, r.rule, r.reason)


def _resolve(inst: AttentionInstance) -> AttentionInstance:
    if inst.arch is not Arch.sm90a:
        _fail("arch-sm90a", f"attention/sm90a.py resolves sm90a instances, not {inst.arch.yaml}")
    if inst.dtype not in _ELEMENT:
        if inst.dtype is DType.e4m3:
            _fail("sm90a-e4m3-v-layout",
                  "e4m3 attention needs V stored transposed (K-major for the fp8 wgmma of P @ V) and an fp8 "
                  "P conversion; this version emits f16 and bf16 only: use dtype f16 or bf16")
        _fail("sm90a-dtype", f"dtype {inst.dtype.yaml} is not an sm90a attention type: use f16 or bf16")
    if inst.head_dim not in HEAD_DIMS:
        _fail("sm90a-head-dim",
              f"head_dim {inst.head_dim} is not one the Hopper FMHA collectives are built for "
              f"({', '.join(map(str, HEAD_DIMS))}): use one of those")
    if inst.head_dim_v != inst.head_dim:
        _fail("sm90a-head-dim-v",
              f"head_dim_v {inst.head_dim_v} != head_dim {inst.head_dim}: the Hopper FMHA tile has one head "
              f"dim for Q, K, V and O; use head_dim_v = head_dim, or arch sm80")
    if inst.layout not in (Layout.bshd, Layout.bhsd):
        _fail("sm90a-layout", f"layout {inst.layout} is not supported: use bshd or bhsd")

    schedule, persistent = inst.schedule, inst.persistent
    if schedule is Schedule.auto:
        schedule = Schedule.cooperative
    if schedule is Schedule.tma:
        _fail("sm90a-schedule-tma",
              "schedule tma (FmhaKernelTma, no warp specialization) is not emitted: use cooperative or pingpong")
    if schedule not in (Schedule.cooperative, Schedule.pingpong, Schedule.split_kv):
        _fail("sm90a-schedule", f"schedule {schedule} is not an sm90a attention schedule: use cooperative, pingpong "
                                f"or split_kv")
    if schedule is Schedule.pingpong:
        persistent = True      # upstream's FmhaBuilder: ping-pong = persistent + Q loaded by its own warp
    if schedule is Schedule.split_kv:
        if persistent:
            _fail("sm90a-split-kv-persistent",
                  "schedule split_kv runs one CTA per (query block, key split): use persistent false")
        if inst.varlen:
            _fail("sm90a-split-kv-varlen",
                  "schedule split_kv splits the keys of fixed-length problems (decode); varlen instances keep "
                  "schedule cooperative: use one or the other")

    wgs = inst.warp_groups
    if wgs not in WARP_GROUPS:
        _fail("sm90a-warp-groups",
              f"warp_groups {wgs}: FmhaKernelTmaWarpSpecialized runs {', '.join(map(str, WARP_GROUPS))} consumer "
              f"warp groups (roles Consumer0..Consumer3; with one, its register split asks for more than 255 "
              f"registers a thread): use warp_groups 2 (the default) or 3")
    if wgs != MMA_WARP_GROUPS and schedule is Schedule.split_kv:
        _fail("sm90a-warp-groups-split-kv",
              f"schedule split_kv with warp_groups {wgs}: its combine counts finished rows per (query block, 64-row "
              f"half) and its packed decode tiles are planned for {MMA_WARP_GROUPS} warp groups "
              f"(split_kv_epilogue.cu.j2, device.cu.j2 split_layout, sm90a.split_plan): use warp_groups "
              f"{MMA_WARP_GROUPS} with split_kv, or schedule cooperative / pingpong")
    tile_q = ROWS_PER_WARP_GROUP * wgs
    if inst.tile_q != tile_q:
        fix = (f"use tile_q {tile_q}" + (f", or warp_groups {inst.tile_q // ROWS_PER_WARP_GROUP}"
                                          if inst.tile_q % ROWS_PER_WARP_GROUP == 0
                                          and inst.tile_q // ROWS_PER_WARP_GROUP in WARP_GROUPS else ""))
        _fail("sm90a-tile-q",
              f"tile_q {inst.tile_q}: the warp-specialized kernel gives each of its {wgs} consumer "
              f"warp groups 64 query rows (wgmma M = 64): {fix}")
    if inst.tile_kv not in TILES_KV:
        _fail("sm90a-tile-kv", f"tile_kv {inst.tile_kv} is not one of {', '.join(map(str, TILES_KV))}")
    acc = inst.tile_kv + inst.head_dim
    limit = max_acc_columns(wgs)
    if acc > limit:
        fits = [t for t in TILES_KV if t + inst.head_dim <= limit]
        fix = (f"e.g. tile_kv {fits[-1]}" if fits else f"no tile_kv fits head_dim {inst.head_dim}") + (
            "" if wgs == MMA_WARP_GROUPS else
            f"; or warp_groups {MMA_WARP_GROUPS}, {mma_registers(MMA_WARP_GROUPS)} registers a thread")
        _fail("sm90a-registers",
              f"tile_kv {inst.tile_kv} + head_dim {inst.head_dim} = {acc} accumulator columns: each consumer "
              f"thread would hold {acc // 2} f32 accumulators (S and O) plus P, more than the "
              f"{mma_registers(wgs)} registers a consumer thread gets"
              + ("" if wgs == MMA_WARP_GROUPS else f" with {wgs} consumer warp groups (65,536 over {wgs + 1} x 128 "
                                                    f"threads, the producer's {LOAD_REGISTERS} taken out)")
              + f"; keep tile_kv + head_dim <= {limit} ({fix})")

    if inst.varlen:
        if persistent:
            _fail("sm90a-varlen-persistent",
                  f"varlen with a persistent schedule ({schedule}): a block past its sequence's end is skipped, "
                  f"which only the one-CTA-per-tile scheduler allows; use schedule cooperative, persistent false")
        if not inst.key_tail:
            _fail("sm90a-varlen-key-tail",
                  "varlen needs key_tail: true: each sequence's last KV tile reads past its end and is masked")
        if inst.layout is not Layout.bshd:
            _fail("sm90a-varlen-layout",
                  f"varlen tensors are packed [total, heads, dim] (layout bshd), not {inst.layout}: use layout bshd")

    resolved = inst.replace(schedule=schedule, persistent=persistent)
    if inst.stages != AUTO:
        if not 2 <= inst.stages <= MAX_STAGES:
            _fail("sm90a-stages", f"stages {inst.stages}: the K/V pipeline needs 2 to {MAX_STAGES} stages")
        stages = inst.stages
    else:
        stages = _auto_stages(resolved)
    smem = smem_bytes(resolved, stages)
    if smem.total > SMEM_CAPACITY:
        fix = ("use fewer stages, a smaller tile_kv" + ("" if not persistent else ", or a non-persistent schedule"))
        _fail("sm90a-shared-memory",
              f"{inst.dtype.yaml} head_dim {inst.head_dim} with tile {inst.tile_q}x{inst.tile_kv} and {stages} "
              f"K/V stages needs {smem.total:,} bytes of shared memory (Q {smem.q:,}, K/V {smem.kv:,}, epilogue "
              f"{smem.epilogue:,}{' added: persistent' if persistent else ' overlapping the mainloop'}, barriers "
              f"{smem.barriers:,}), more than the {SMEM_CAPACITY:,} an sm90 CTA has: {fix}")
    return resolved.replace(stages=stages)


SPLIT_SMS = 132                 # split_kv: an H100's / H200's SMs, one split_kv CTA each (its shared memory)
SPLIT_MIN_TILES = 4             # key tiles a share runs at least
SPLIT_MAX = 64
SPLIT_FIXED_TILES = 2           # a CTA's fixed cost (Q load, prologue, partial store and combine) in key tiles


def split_count(ctas: int, tiles: int) -> int:
    """How many CTAs share a query block's `tiles` key tiles when `ctas` blocks run (the shim's split_count): the
    count whose launch finishes first -- waves of SPLIT_SMS CTAs, each wave as long as a share's key tiles plus
    SPLIT_FIXED_TILES -- the fewest shares on a tie, at least SPLIT_MIN_TILES tiles a share, at most SPLIT_MAX.
    Decode is bound by the K/V bytes each wave streams, so a launch of 2.06 waves (272 CTAs: the former
    "two waves' worth" rule at 16 query blocks) runs three and streams at two thirds of the rate one full wave
    of 128 does (H200 library bench 2026-11-28: 3.3 TB/s against cuDNN's 4.3)."""
    most = max(1, min(tiles // SPLIT_MIN_TILES, SPLIT_MAX))
    best = (0, 1)
    for s in range(1, most + 1):
        cost = -(-ctas * s // SPLIT_SMS) * (-(-tiles // s) + SPLIT_FIXED_TILES)
        if s == 1 or cost < best[0]:
            best = (cost, s)
    return best[1]


@dataclass(frozen=True)
class SplitPlan:
    pack: int                   # > 1: the query heads of a KV head packed into the rows of one tile, `pack` rows
                                # a query position (row r: position r // pack, query head kv * group + r % pack)
    splits: int                 # CTAs sharing a query block's keys
    workspace_bytes: int
    rows: int = 0               # the tile rows of one (batch, head) in the kernel's view (packed: seq_q * pack)
    group: int = 1              # query heads a KV head has (rows with r % pack >= group are padding)

    @property
    def nested(self) -> bool:
        """seq_q > 1 packed: rows (position, head in group) are a 2-level mode, loaded by the shim's own 5-d
        Q descriptor (D, group, seq_q, batch, heads_kv) with a (64, pack, 64 / pack) box per warp group."""
        return self.pack > 1 and self.rows > self.pack


def pack_of(inst: AttentionInstance, heads_q: int, heads_kv: int, seq_q: int) -> tuple[int, int]:
    """(pack, rows) of a split_kv instance's shim (device.cu.j2 split_shape). One query row: the group's query
    heads are the rows (pack = group, the query-head stride their row stride). 2..16 rows with grouped heads:
    rows (position s, head g) at r = s * pack + g with pack the group rounded up to a power of two, so that a
    warp group's 64 rows are a whole (pack, 64 / pack) box of the 5-d Q descriptor (g >= group: zero-filled,
    never stored); only where seq_q * pack fits one tile and the head dim fills 128-byte swizzled rows (the
    box is 64 columns; d32 stays unpacked). Else one query head a tile (pack = 1)."""
    group = heads_q // heads_kv
    if seq_q == 1 and 1 < group <= inst.tile_q:
        return group, group
    if seq_q > 1 and group > 1 and inst.head_dim % 64 == 0:
        pack = 1 << (group - 1).bit_length()
        if seq_q * pack <= inst.tile_q:
            return pack, seq_q * pack
    return 1, seq_q


def packed_rows(plan: SplitPlan, seq_q: int) -> list[tuple[int, int, int]]:
    """The kernel's row -> (position, head in group) map (the Q box, the mask's position row // pack, the O /
    LSE stores and the combine): (row, s, g) for every row that is stored, in row order."""
    if plan.pack == 1:
        return [(r, r, 0) for r in range(seq_q)]
    return [(r, r // plan.pack, r % plan.pack) for r in range(plan.rows) if r % plan.pack < plan.group]


def nested_q_view(plan: SplitPlan, stride_q: tuple[int, int, int], batch: int, heads_kv: int, seq_q: int,
                  head_dim: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shim's 5-d view of Q for nested packing (device.cu.j2 encode_nested_q): dims (D, group, seq_q, batch,
    heads_kv), strides in elements from Q's (batch, seq, head) strides, the box one warp group's 64 rows of
    64 columns. Element (c, g, s, b, kv) is Q[b, s, kv * group + g, c] in either layout."""
    sb, ss, sh = stride_q
    return ((head_dim, plan.group, seq_q, batch, heads_kv), (1, sh, ss, sb, sh * plan.group),
            (64, plan.pack, ROWS_PER_WARP_GROUP // plan.pack, 1, 1))


def split_plan(inst: AttentionInstance, batch: int, heads_q: int, heads_kv: int, seq_q: int, seq_k: int) -> SplitPlan:
    """What a split_kv instance's shim does with a problem (templates/attention/sm90a/device.cu.j2, split_shape,
    split_count, split_layout; tests/attention/test_attention_anylen.py compares them): grouped heads pack the
    query heads of a KV head into one tile's rows (pack_of); the shares as split_count says; the workspace holds
    a counter per (batch, head, 16 rows) and per share the LSE and the normalized O (f32) of every row."""
    group = heads_q // heads_kv
    pack, rows_q = pack_of(inst, heads_q, heads_kv, seq_q)
    heads = heads_kv if pack > 1 else heads_q
    group = group if pack > 1 else 1
    ctas = -(-rows_q // inst.tile_q) * batch * heads
    tiles = -(-seq_k // inst.tile_kv)
    splits = split_count(ctas, tiles)
    if splits == 1:
        return SplitPlan(pack, 1, 0, rows_q, group)
    pairs = batch * heads
    halves = 2 * -(-rows_q // inst.tile_q)
    rows = pairs * splits * rows_q
    lse = _round_up(pairs * halves * 4 * 4, 256)          # a counter per 16 rows (a consumer warp's)
    o = lse + _round_up(rows * 4, 256)
    return SplitPlan(pack, splits, o + rows * inst.head_dim * 4, rows_q, group)


def _mask_text(inst: AttentionInstance) -> str:
    parts = []
    if inst.mask is Mask.causal_top_left:
        parts.append("causal from the top-left (key j <= query i)")
    elif inst.mask is Mask.causal_bottom_right:
        parts.append("causal from the bottom-right (key j <= query i + seq_k - seq_q)")
    else:
        parts.append("no causal mask")
    parts.append("key tail masked (keys >= seq_k in the last tile)" if inst.key_tail
                 else "no key tail (seq_k a multiple of tile_kv)")
    return "; ".join(parts)


def template_context(inst: AttentionInstance) -> dict[str, Any]:
    """What the templates print: C++ spellings from enums and checked integers only."""
    if inst.stages == AUTO or inst.schedule not in (Schedule.cooperative, Schedule.pingpong, Schedule.split_kv):
        raise ValueError("template_context needs a resolved sm90a instance (attention/sm90a.py resolve)")
    pingpong = inst.schedule is Schedule.pingpong
    split_kv = inst.schedule is Schedule.split_kv
    persistent = bool(inst.persistent)
    scheduler = "PersistentTileScheduler" if persistent else "IndividualTileScheduler"
    return {
        "element": _ELEMENT[inst.dtype],
        "tile_q": int(inst.tile_q),
        "tile_kv": int(inst.tile_kv),
        "head_dim": int(inst.head_dim),
        "stages": int(inst.stages),
        "mma_warp_groups": int(inst.warp_groups),
        "schedule": inst.schedule.value,
        "persistent": persistent,
        # upstream's ping-pong loads Q in its own warp; GQA needs that too (Q and K/V index different heads),
        # and so do varlen and split_kv (their own K/V loads)
        "loads_q_separately": pingpong or bool(inst.gqa) or bool(inst.varlen) or split_kv,
        "causal": inst.mask is not Mask.none,
        "bottom_right": inst.mask is Mask.causal_bottom_right,
        "key_tail": bool(inst.key_tail),
        "lse": bool(inst.lse),
        "gqa": bool(inst.gqa),
        "varlen": bool(inst.varlen),
        "split_kv": split_kv,
        "layout": inst.layout.value,
        "vector_elements": 16 // (inst.dtype.bits // 8),
        "mask_text": _mask_text(inst),
        "scheduler_cpp": f"cutlass::fmha::kernel::{scheduler}",
        "scheduler_text": (f"{scheduler}: " + ("a grid of SM-count CTAs walking (q block, batch, head) tiles"
                                               if persistent else "one CTA per (q block, key split, batch, head)"
                                               if split_kv else "one CTA per (q block, batch, head)")),
        "smem_bytes": smem_bytes(inst, inst.stages).total,
    }


__all__ = ["resolve", "template_context", "smem_bytes", "split_plan", "SplitPlan", "pack_of", "packed_rows",
           "nested_q_view", "SMEM_CAPACITY", "HEAD_DIMS", "TILES_KV", "TILE_Q", "WARP_GROUPS", "mma_registers",
           "max_acc_columns"]
