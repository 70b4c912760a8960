"""The conv library's kernel order: the Python twin of its C++ (templates/conv/library/conv_dispatch.h.j2 where the
library holds measured records, else conv_order in templates/conv/library/api.cpp.j2), tested to agree
(tests/conv/test_conv_library_predicted.py compiles the C++ with the host compiler against an exported table).

The rule, for a problem q (op, dtypes, epilogue, geometry) on a device of compute capability cc:

1. candidates: kernels that compute q's operation (op, element and output type (f32 input also on tf32 kernels),
   activation (+ clamp bounds), bias or none, split-K kernels only when the caller asks for slices > 1, 2-D kernels
   only for 2-D problems) and run on the device (sm90a: exactly cc 90; 2.x kernels cc >= theirs), and whose entry
   points are built in;
2. tuned: tuning records of the same filter class (same R, S and stride, the problem's strides equal) whose kernel is
   a candidate, nearest first by the distance |log2 NPQ - log2 N'P'Q'| + |log2 K - log2 K'| + |log2 C - log2 C'|
   (16.16 fixed point, `log2_fixed`), ties by record order; each kernel at its first (nearest) record;
3. the others by the static priority (`static_key`);
4. between profiled problems, with measurements: when no tuning record of the class is at distance 0 (an exact
   record wins outright: steps 2-3 apply), the caller asks for no split (split_k_slices 1) and the library holds
   measured records (every kernel's time on each profiled problem, from the profile.json beside the tuning table),
   the candidates measured at the nearest measured problem of the class (same distance; measured on this GPU
   generation or unknown; ties by record order) come first, by predicted time at q (`predicted_cost`: log2 of the
   measured time + log2 of the kernel's padded work at q - the same at the record's problem, `work_log`: its waves
   of output tiles (x split-K slices) on the record GPU's SMs x the tile-k iterations of one unit, so FLOPs, the
   tiles' padding and the last wave's idle SMs all scale it; a kernel's best split counts; ties by kernel index).
   Each carries its measured record, whose units (output tiles x split-K slices) it runs with (split_at); the other
   candidates follow in the order of steps 2-3.

The implicit GEMM's output tiles (`tile_grid`): fprop M = N*P*Q, N = K; dgrad M = N*H*W, N = C; wgrad M = K,
N = C*R*S, which sm90a's parallel split-K kernels tile along C only (ceil(C / tile_n) * R * S), each side rounded up to
the cluster; the reduction (`reduction_iters`) fprop C*R*S, dgrad K*R*S, wgrad N*P*Q in tile_k steps. A wave holds
one tile per SM, two for the pingpong schedule (`tiles_per_sm`). A parallel split-K kernel run with one slice is
CUTLASS's stream-K over all SMs: no wave term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from emitter.kit.library import log2_fixed

# the static priority's iterator rank (api.cpp.j2's kSmall / kLarge): small or unaligned C (C < 16 or C % 8) first
# fixed-channel, few-channel, analytic, optimized kernels; otherwise the reverse
_SMALL_C = {"analytic": 2, "optimized": 3, "few_channels": 1, "fixed_channels": 0}
_LARGE_C = {"analytic": 1, "optimized": 0, "few_channels": 2, "fixed_channels": 3}
SAT = 1 << 62


@dataclass(frozen=True)
class ConvQuery:
    """A conv problem as the selection sees it (no pointers; alignment is the shims' business)."""

    op: str
    a: str                      # element type of the tensors read
    c: str                      # output type
    n: int
    h: int
    w: int
    ci: int                     # C
    k: int
    r: int
    s: int
    p: int
    q: int
    stride: tuple[int, int] = (1, 1)
    stride_d: int = 1
    activation: str = "identity"
    bias: bool = False
    clamp_min: float = 0.0
    clamp_max: float = 0.0
    split_k: int = 1
    cc: int = 90
    dims2: bool = True          # d = t = 1, no depth padding, depth stride and dilation 1
    groups: int = 1             # F.conv2d's groups; groups = C = K puts the depthwise direct kernels first

    @property
    def npq(self) -> int:
        return self.n * self.p * self.q


@dataclass(frozen=True)
class ConvMeasuredRecord:
    """One kernel's measured time on one profiled problem (the profile.json beside the tuning table: every kernel
    that ran correctly there, at every split-K count timed)."""

    index: int                 # position in the sorted table
    kernel: int
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: int
    p: int
    q: int
    split_k: int = 1
    time_ps: int = 1           # its median, picoseconds
    sms: int = 0               # SM count of the GPU it was measured on; 0 = unknown (no wave model)
    gpu_cc: int = 0            # compute capability x 10 of that GPU; 0 = unknown

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n, self.h, self.w, self.c, self.k, self.r, self.s, self.stride, self.p, self.q, self.gpu_cc)


def measured_records(rows: Iterable[tuple[int, ...]]) -> list[ConvMeasuredRecord]:
    """(kernel, n, h, w, c, k, r, s, stride, p, q, split_k, time_ps, sms, gpu_cc) -> indexed records sorted by
    (shape, gpu_cc, kernel, split_k, time, sms)."""
    out = sorted({tuple(int(v) for v in r) for r in rows}, key=lambda t: (t[1:11], t[14], t[0], t[11], t[12], t[13]))
    return [ConvMeasuredRecord(i, *t) for i, t in enumerate(out)]


@dataclass(frozen=True)
class ConvCandidate:
    kernel: int
    tuning: int                # tuning record that ranked it; -1 static priority
    measured: int = -1         # measured record whose predicted time ranked it (its split-K count runs); -1 none


# ---- step 1: candidates ---------------------------------------------------------------------------------------

def matches(k, q: ConvQuery) -> bool:
    """Mirror of conv_matches (api.cpp.j2)."""
    if k.op != q.op or k.c != q.c or k.activation != q.activation:
        return False
    if not (k.a == q.a or (q.a == "f32" and k.a == "tf32")):
        return False
    if k.activation == "clamp" and (k.clamp_min != q.clamp_min or k.clamp_max != q.clamp_max):
        return False
    if q.bias != k.bias or (q.split_k > 1 and not k.split_k):
        return False
    if k.dims == 2 and not q.dims2:
        return False
    return q.cc == k.cc if k.arch_specific else q.cc >= k.cc


def static_key(k, q: ConvQuery) -> tuple[int, ...]:
    """Mirror of conv_static_key (api.cpp.j2), smaller first."""
    small_c = q.ci < 16 or q.ci % 8 != 0
    it = 0 if k.arch_specific else (_SMALL_C if small_c else _LARGE_C)[k.iterator]
    unit = q.stride == (1, 1) and q.stride_d == 1
    bits = 8 if k.a == "s8" else 32 if k.a in ("f32", "tf32", "s32") else 16     # the C++'s code -> bits
    return (0 if k.a == q.a else 1, -k.cc, it, (0 if k.unity_stride else 1) if unit else 0,
            -(k.alignment_a * bits // 8) * 1000000 - k.tile[0] * k.tile[1], int(k.split_k))


def _class_ok(t, q: ConvQuery) -> bool:
    return t.r == q.r and t.s == q.s and t.stride == q.stride[0] and q.stride[0] == q.stride[1]


def distance(t, q: ConvQuery) -> int:
    return (abs(log2_fixed(t.n * t.p * t.q) - log2_fixed(q.npq)) + abs(log2_fixed(t.k) - log2_fixed(q.k))
            + abs(log2_fixed(t.c) - log2_fixed(q.ci)))


# ---- step 4: the time model ------------------------------------------------------------------------------------

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_grid(k, op: str, n: int, h: int, w: int, c: int, kk: int, r: int, s: int, p: int, q: int) -> tuple[int, int]:
    """The kernel's output tile grid (M tiles, N tiles) on a problem, each side rounded up to the cluster."""
    tm, tn = max(k.tile[0], 1), max(k.tile[1], 1)
    if op == "fprop":
        bm, bn = _ceil_div(n * p * q, tm), _ceil_div(kk, tn)
    elif op == "dgrad":
        bm, bn = _ceil_div(n * h * w, tm), _ceil_div(c, tn)
    elif k.split_k and k.arch_specific:     # sm90a wgrad: N = C*R*S tiled along C only
        bm, bn = _ceil_div(kk, tm), _ceil_div(c, tn) * r * s
    else:
        bm, bn = _ceil_div(kk, tm), _ceil_div(c * r * s, tn)
    cm, cn = max(k.cluster[0], 1), max(k.cluster[1], 1)
    return _ceil_div(bm, cm) * cm, _ceil_div(bn, cn) * cn


def reduction_iters(k, op: str, n: int, h: int, w: int, c: int, kk: int, r: int, s: int, p: int, q: int) -> int:
    """Tile-k iterations of the implicit GEMM's reduction (fprop C*R*S, dgrad K*R*S, wgrad N*P*Q)."""
    red = {"fprop": c * r * s, "dgrad": kk * r * s}.get(op, n * p * q)
    return _ceil_div(red, max(k.tile[2], 1))


def _qdims(q: ConvQuery) -> tuple[int, ...]:
    return (q.n, q.h, q.w, q.ci, q.k, q.r, q.s, q.p, q.q)


def _rdims(r: ConvMeasuredRecord) -> tuple[int, ...]:
    return (r.n, r.h, r.w, r.c, r.k, r.r, r.s, r.p, r.q)


def split_at(k, r: ConvMeasuredRecord, q: ConvQuery) -> int:
    """The split-K count a measured record's kernel runs with at q: no more units (output tiles x slices) than won
    at the record and no more slices -- min(the record's slices, its units // q's tiles), at least 1, at most q's
    tile-k iterations; 1 for a kernel without split-K. The record's slice count alone put 4 slices of 128 tiles
    (four waves) on a 1x1 wgrad whose record had 32 tiles (H200 library bench 2026-11-28, C2048 7^2 K512: 0.0301 ms
    against 0.0223 at one slice, lib / oracle 0.741); its units alone gave 16 slices to 8 tiles, whose partial sums
    the model does not price (0.870 of the oracle on that bench's C128 28^2 K512 1x1 wgrad)."""
    if not k.split_k or r.split_k <= 1:
        return 1
    rm, rn = tile_grid(k, k.op, *_rdims(r))
    qm, qn = tile_grid(k, k.op, *_qdims(q))
    units = min(rm * rn * r.split_k, SAT)
    return max(1, min(units // max(qm * qn, 1), r.split_k, reduction_iters(k, k.op, *_qdims(q))))


def work_log(k, dims: tuple[int, ...], split: int, sms: int) -> int:
    """log2 of the kernel's padded work on a problem (16.16 fixed point), in tile-k iterations of one tile slot: its
    waves x the slots of a wave x the iterations of one unit. A unit is an output tile (x split-K slice, each slice
    ceil(iterations / slices) of them); a wave holds `tiles_per_sm` units per SM, a cluster's CTAs occupying SMs
    together. So the time it predicts grows with the problem's FLOPs, with the tiles' padding of M, N and the
    reduction, and with the last wave's idle slots. A parallel split-K kernel run with one slice is CUTLASS's stream-K
    over every SM (no wave term); an unknown SM count gives no wave term either. Saturates at 2^62."""
    bm, bn = tile_grid(k, k.op, *dims)
    iters = reduction_iters(k, k.op, *dims)
    split = max(split, 1)
    units = min(bm * bn * split, SAT)
    per_unit = _ceil_div(iters, split)
    if sms <= 0 or (k.split_k and k.arch_specific and split <= 1):
        return log2_fixed(min(units * per_unit, SAT))
    cs = max(k.cluster[0], 1) * max(k.cluster[1], 1)
    slots = max(sms // cs, 1) * cs * max(k.tiles_per_sm, 1)
    return log2_fixed(min(min(_ceil_div(units, slots) * slots, SAT) * per_unit, SAT))


def predicted_cost(k, r: ConvMeasuredRecord, q: ConvQuery) -> int:
    """log2 of the kernel's predicted time on q (16.16 fixed point, integers only: bit-identical in both languages):
    its time on r's problem scaled by its padded work at q over its padded work at r (work_log; at q with split_at)."""
    return (log2_fixed(r.time_ps) + work_log(k, _qdims(q), split_at(k, r, q), r.sms)
            - work_log(k, _rdims(r), r.split_k, r.sms))


# ---- the order ---------------------------------------------------------------------------------------------------

def candidate_order(kernels: Sequence, tuning: Sequence, q: ConvQuery,
                    measured: Sequence[ConvMeasuredRecord] = (),
                    available: Callable[[int], bool] | None = None) -> list[ConvCandidate]:
    """The kernels to try for q, in order (the module docstring's rule). `available(i)`: kernel i's entry points are
    built in (default: all)."""
    ok = [matches(k, q) and (available is None or available(k.index)) for k in kernels]
    tuned: list[tuple[int, int]] = []
    for i, t in enumerate(tuning):
        if not 0 <= t.kernel < len(kernels) or not _class_ok(t, q) or not ok[t.kernel]:
            continue
        tuned.append((distance(t, q), i))
    tuned.sort(key=lambda x: x[0])           # stable: ties keep record order
    order: list[ConvCandidate] = []
    taken: set[int] = set()
    for _, i in tuned:
        kk = tuning[i].kernel
        if kk not in taken:
            taken.add(kk)
            order.append(ConvCandidate(kk, i))
    rest = sorted((k.index for k in kernels if ok[k.index] and k.index not in taken),
                  key=lambda i: (static_key(kernels[i], q), i))
    order += [ConvCandidate(i, -1) for i in rest]
    exact = bool(tuned) and tuned[0][0] == 0
    if exact or q.split_k > 1 or not measured:
        return order
    near: tuple[int, int] | None = None
    for r in measured:
        if not ok[r.kernel] or not _class_ok(r, q) or (r.gpu_cc != 0 and r.gpu_cc != q.cc):
            continue
        key = (distance(r, q), r.index)
        if near is None or key < near:
            near = key
    if near is None:
        return order
    shape = measured[near[1]].shape
    cost: dict[int, tuple[int, int]] = {}
    for r in measured:
        if r.shape != shape or not ok[r.kernel]:
            continue
        key = (predicted_cost(kernels[r.kernel], r, q), r.index)
        if r.kernel not in cost or key < cost[r.kernel]:
            cost[r.kernel] = key
    ranked = sorted(cost, key=lambda i: (cost[i][0], i))
    return [ConvCandidate(i, -1, cost[i][1]) for i in ranked] + [c for c in order if c.kernel not in cost]


def default_split_k(k, q: ConvQuery, sms: int) -> int:
    """Mirror of conv_split_k (api.cpp.j2), the profiler's one-wave count (conv.runtime.choose_split_k): slices for a
    split-K kernel no record ranked, each slice keeping >= 8 tile-k iterations, at most 64. Serial (sm80): the fewest
    slices whose CTAs cover the SMs; parallel (sm90a: wgrad tiled along C only, tile counts padded to whole
    clusters): the most slices whose units fit one wave."""
    sms = max(sms, 1)
    if k.op == "fprop":
        m, n, kk = q.npq, q.k, q.r * q.s * q.ci
    elif k.op == "dgrad":
        m, n, kk = q.n * q.h * q.w, q.ci, q.r * q.s * q.k
    else:
        m, n, kk = q.k, q.r * q.s * q.ci, q.npq
    parallel = bool(k.split_k and k.arch_specific)
    tiles = _ceil_div(m, k.tile[0]) * _ceil_div(n, k.tile[1])
    if parallel and k.op == "wgrad":
        cm, cn = max(k.cluster[0], 1), max(k.cluster[1], 1)
        tm, tn = _ceil_div(m, k.tile[0]), _ceil_div(q.ci, k.tile[1]) * q.r * q.s
        tiles = _ceil_div(tm, cm) * cm * _ceil_div(tn, cn) * cn
    tiles = max(tiles, 1)
    most = max(1, min(64, _ceil_div(kk, k.tile[2]) // 8))
    return max(1, min(most, sms // tiles if parallel else _ceil_div(sms, tiles)))


def launch_split_k(kernels: Sequence, tuning: Sequence, measured: Sequence[ConvMeasuredRecord], c: ConvCandidate,
                   q: ConvQuery, sms: int) -> int:
    """The slices the library asks candidate c's shim with (mirror of conv_choose's split): the caller's count when it
    is > 1 or the kernel has no split-K; else the measured record's (split_at), the tuning record's, or
    default_split_k."""
    k = kernels[c.kernel]
    if q.split_k > 1 or not k.split_k:
        return q.split_k
    if c.measured >= 0:
        return split_at(k, measured[c.measured], q)
    if c.tuning >= 0:
        return tuning[c.tuning].split_k
    return default_split_k(k, q, sms)


def depthwise_first(kernels: Sequence, q: ConvQuery, order: list[ConvCandidate]) -> list[ConvCandidate]:
    """Mirror of conv_depthwise_first (api.cpp.j2): for a depthwise problem (groups = C = K > 1) the depthwise direct
    kernels before every other candidate (the grouped implicit GEMMs): emitter's SIMT depthwise kernels before CUTLASS's
    direct ones, then those whose channel block (tile k) divides C, widest first, then the others, each keeping its
    order."""
    if not (q.groups > 1 and q.groups == q.ci == q.k):
        return order
    direct = [c for c in order if getattr(kernels[c.kernel], "depthwise_direct", False)
              or getattr(kernels[c.kernel], "depthwise_simt", False)]

    def key(c: ConvCandidate) -> tuple[int, int, int]:
        simt = 0 if getattr(kernels[c.kernel], "depthwise_simt", False) else 1
        block = kernels[c.kernel].tile[2]
        whole = block > 0 and q.ci % block == 0
        return (simt, 0, -block) if whole else (simt, 1, 0)
    return sorted(direct, key=key) + [c for c in order if c not in direct]


def select(kernels: Sequence, tuning: Sequence, q: ConvQuery, measured: Sequence[ConvMeasuredRecord] = (),
           can_implement: Callable[[int, int], bool] | None = None, sms: int = 132) -> tuple[ConvCandidate, int] | None:
    """The candidate the library launches and its split-K count, given can_implement(kernel, split) (default: all)."""
    for c in depthwise_first(kernels, q, candidate_order(kernels, tuning, q, measured)):
        split = launch_split_k(kernels, tuning, measured, c, q, sms)
        if can_implement is None or can_implement(c.kernel, split):
            return c, split
    return None
