"""Dispatch data of an exported library, and the Python mirror of its C++ selection logic.

The exported library carries two generated tables (src/<lib>_table.cpp):

* kernel records, sorted by name: what each kernel computes (dtypes, layouts, epilogue), what it needs
  (alignment, arch), its tile, and its `fallback_rank` (a fixed priority computed here);
* tuning records: (kernel, m, n, k, batch) from the tuning table, sorted, with log2 of the shape
  precomputed in 16.16 fixed point.

The selection rule, implemented twice -- `candidate_order` below and `<lib>_detail::candidate_order` in
templates/gemm/library/dispatch.h.j2 -- and tested to agree (tests/gemm/test_gemm_library.py compiles the C++ with g++):

1. candidates: kernels whose operation matches the problem exactly (A/B/C/D types, accumulator unless
   the problem says "any", layouts, activation (+ clamp bounds), bias kind), that run on the device
   (sm_90a kernels: exactly compute capability 9.0; 2.x kernels: cc >= their arch, through PTX), batched
   when batch > 1, split-K when split_k_slices > 1. Fast accumulation (sm90a fp8 `fp8_fast_accum`) is
   part of a kernel's operation, and in a query `Op.fast_accum` is the caller's opt-in (C:
   problem.fast_accum, like cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM): a fast-accum kernel is a
   candidate only for a caller who opted in; a normal kernel is one for every caller;
2. tuned order: every tuning record whose kernel is a candidate gets the key
   (measured on another GPU generation, distance, not fast-accum, record index), where "another
   generation" means the record's GPU compute capability is known and differs from the device's, and
   the distance is
   |log2 m - log2 m'| + |log2 n - log2 n'| + |log2 k - log2 k'| + |log2 batch - log2 batch'|
   (integers in 16.16 fixed point: bit-identical in both languages); each candidate's key is the
   smallest among its records; candidates with records come first, by key. So the kernel that won
   the nearest profiled shape on this kind of GPU is tried first, then the winner of the next nearest
   shape, ..., then winners measured on other GPUs. "not fast-accum" only matters to an opted-in
   caller: at equal distance the fast-accum op's winner comes before the normal op's (the caller asked
   for speed); without the opt-in every candidate is a normal kernel;
3. the remaining candidates follow by `fallback_rank` (newest arch first, widest alignment, largest
   tile, fast-accum before normal, then name).
4. between profiled shapes, with measurements: when no candidate has a record at exactly q's shape on this
   GPU generation (an exact record still wins outright: steps 2-3 apply), the caller asks for no split
   (split_k <= 1), and the library holds measured records (every kernel's time on each profiled shape, from
   the profile.json beside the tuning table), the candidates measured at the nearest measured shape (same
   distance; this GPU generation or unknown; ties by record order) come first, by predicted time at q
   (`predicted_cost`: log2 of the measured time + log2 FLOPs(q) - log2 FLOPs(record) + the wave
   quantization of the kernel's tile grid (cluster-rounded, x batch x split-K slices) on the record GPU's
   SMs at q minus the same at the record's shape, all in 16.16 fixed point; a kernel's best variant (split,
   options) counts; ties by kernel index); each such candidate carries the measured record (`measured`)
   whose split-K count and options it runs with, and as `tuning` the first tuning record at that shape
   (-1 if none). The other candidates follow in the order of steps 2-3.

The library then asks each candidate's host shim (can_implement: alignment, strides, shape) in that
order and launches the first that accepts; if none does it returns NOT_SUPPORTED. When the problem's
layouts have no direct candidates, it also tries the transposed problem D^T = B^T A^T (see
`transpose`), after the direct candidates.
A kernel the caller names (problem.kernel; `forced`) skips the order: it runs when it computes the
problem's operation (directly or transposed), whether or not it is a fast-accum kernel and the caller
opted in.

A record's run-time scheduler options (swizzle, raster, ...) are launched with a candidate it ranked only
where they cost no tile padding at the problem (`options_fit`; at the record's own m x n always): CUTLASS's
sm90 schedulers round the tile grid up to swizzle x cluster, so a swizzle-8 record at 4096^3 ran a 128x256
kernel on 512 tiles instead of 288 at 3000^3 (0.184 ms against 0.106 ms with its compiled-in options).

Each candidate is asked (and launched) with one split-K slice count, `effective_split_k` (C++:
`<lib>_detail::effective_split_k`): the caller's split_k_slices when it is > 1 (explicit wins) or when the
candidate was not ranked by a tuning record (fallback order, or forced by name); otherwise the count the
candidate's tuning record was timed with, if the kernel is a split-K instance, clamped to k / tile_k
(every slice keeps at least one whole k-block) and at least 1. The workspace query asks the shims with
the same counts, so the size it returns covers the launch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from emitter.kit.library import ACTIVATIONS, ARCHES, DTYPE_ANY, DTYPE_BITS, DTYPES
from emitter.kit.library import LOG2_FRAC_BITS, log2_fixed  # noqa: F401 (the dispatch rule's distance, shared with the families)

# ---- GEMM's enum codes (the C header's values; append only) -------------------------------------
FAMILY = "gemm"
LAYOUTS = {"row": 1, "col": 2}
BIASES = {"none": 0, "row": 1, "column": 2}

def f32(x: float) -> float:
    """x rounded to float32 (what the C++ table holds)."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


@dataclass(frozen=True)
class Op:
    """What a kernel computes (the part a problem must match exactly)."""

    a: int
    b: int
    c: int
    d: int
    acc: int
    la: int
    lb: int
    lc: int
    act: int
    bias: int
    clamp_min: float = 0.0
    clamp_max: float = 0.0
    # kernel: accumulates fp8 with fast accumulation (fp8_fast_accum); query: the caller allows such kernels
    fast_accum: bool = False


@dataclass(frozen=True)
class KernelRecord:
    index: int                 # position in the table (sorted by name)
    name: str
    arch: str                  # "sm80", "sm90a", ...
    op: Op
    align_a: int               # elements
    align_b: int
    align_c: int
    batched: bool
    split_k: bool
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    fallback_rank: int = 0
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # the tile grid, for the time model and the options rule: swap_ab (tile and cluster run over (N, M)),
    # stream_k (on the stream-K scheduler; in the table for the C++ side's kernel info), swizzle (compiled-in
    # max_swizzle_size)
    swap_ab: bool = False
    stream_k: bool = False
    swizzle: int = 1

    @property
    def cc(self) -> int:
        return ARCHES[self.arch][0]

    @property
    def arch_specific(self) -> bool:
        return ARCHES[self.arch][1]

    @property
    def cutlass_major(self) -> int:
        return ARCHES[self.arch][2]

    @property
    def fast_accum(self) -> bool:
        return self.op.fast_accum

    def runs_on(self, cc: int) -> bool:
        return cc == self.cc if self.arch_specific else cc >= self.cc


@dataclass(frozen=True)
class TuningRecord:
    index: int                 # position in the sorted table
    kernel: int                # kernel record index
    m: int
    n: int
    k: int
    batch: int = 1
    gpu_cc: int = 0            # compute capability x 10 of the GPU it was measured on; 0 = unknown
    split_k: int = 1           # split-K slices the kernel was timed with there (1 = no split)
    options: int = 0           # run-time scheduler options it was timed with there (emitter.kit.scheduler)

    @property
    def logs(self) -> tuple[int, int, int, int]:
        return (log2_fixed(self.m), log2_fixed(self.n), log2_fixed(self.k), log2_fixed(self.batch))


@dataclass(frozen=True)
class MeasuredRecord:
    """One kernel's measured time on one profiled shape (profile.json beside the tuning table: every kernel that
    ran correctly there, not just the winner)."""

    index: int                 # position in the sorted table
    kernel: int
    m: int
    n: int
    k: int
    batch: int = 1
    gpu_cc: int = 0
    split_k: int = 1
    options: int = 0
    time_ps: int = 1           # its median, picoseconds (an integer: both languages read the same value)
    sms: int = 0               # SM count of the GPU it was measured on; 0 = unknown (no wave model)

    @property
    def logs(self) -> tuple[int, int, int, int]:
        return (log2_fixed(self.m), log2_fixed(self.n), log2_fixed(self.k), log2_fixed(self.batch))

    @property
    def log_time(self) -> int:
        return log2_fixed(self.time_ps)

    def wave_self(self, k: "KernelRecord") -> int:
        """wave_log of its kernel at its own shape and split (the C++ table holds it precomputed)."""
        return wave_log(k, self.m, self.n, self.batch, self.split_k, self.sms)


@dataclass(frozen=True)
class Query:
    """A problem as the selection sees it (no pointers; alignment is the shims' business)."""

    op: Op
    m: int
    n: int
    k: int
    batch: int = 1
    split_k: int = 1
    cc: int = 90


class ExportError(ValueError):
    pass


FP8 = ("e4m3", "e5m2")
FAST_ACCUM_ARCHES = ("sm90a",)


def config_fast_accum(cfg: dict[str, Any], name: str = "", arch: str | None = None) -> bool:
    """A manifest config's `fp8_fast_accum`, checked: a bool, and set only where CUTLASS has fast
    accumulation (sm90a, fp8 A and B) -- anything else is a hand-edited or foreign manifest, and exporting
    it would label a kernel with numerics it does not have."""
    value = cfg.get("fp8_fast_accum", False)
    where = f"{name}: " if name else ""
    if not isinstance(value, bool):
        raise ExportError(f"{where}fp8_fast_accum must be true or false, got {value!r} (was the manifest edited?)")
    if value:
        arch = arch or cfg.get("arch")
        if arch not in FAST_ACCUM_ARCHES or cfg.get("a") not in FP8 or cfg.get("b") not in FP8:
            raise ExportError(f"{where}fp8_fast_accum is set on a {arch} kernel with a={cfg.get('a')}, b={cfg.get('b')}: "
                              f"fast accumulation is a mode of the sm90a fp8 wgmma (e4m3/e5m2 A and B) only; the "
                              f"manifest was edited or is not emitter's (re-run `emitter emit`)")
    return value


def kernel_op(cfg: dict[str, Any]) -> Op:
    ep = cfg.get("epilogue") or {}
    act = ep.get("activation", "identity")
    cmin, cmax = (f32(ep.get("clamp_min", 0.0)), f32(ep.get("clamp_max", 0.0))) if act == "clamp" else (0.0, 0.0)
    return Op(a=DTYPES[cfg["a"]], b=DTYPES[cfg["b"]], c=DTYPES[cfg["c"]], d=DTYPES[cfg["d"]],
              acc=DTYPES[cfg["accumulator"]], la=LAYOUTS[cfg["layout_a"]], lb=LAYOUTS[cfg["layout_b"]],
              lc=LAYOUTS[cfg["layout_c"]], act=ACTIVATIONS[act], bias=BIASES[ep.get("bias", "none")],
              clamp_min=cmin, clamp_max=cmax, fast_accum=bool(cfg.get("fp8_fast_accum", False)))


def fallback_key(r: KernelRecord) -> tuple:
    """Fixed priority among kernels that no tuning record ranks: newest arch first, then the widest
    alignment in bytes (fastest loads; narrower kernels take over when it cannot implement), then the
    largest tile (most work per CTA), then fast accumulation before full precision (only opted-in
    callers ever see fast-accum kernels, and they asked for speed), then name (deterministic)."""
    bits = DTYPE_BITS
    cfg = r.config
    align_bytes = min(r.align_a * bits[cfg["a"]], r.align_b * bits[cfg["b"]], r.align_c * bits[cfg["c"]]) // 8
    return (-r.cc, -align_bytes, -(r.tile[0] * r.tile[1]), -r.tile[2], not r.fast_accum, r.name)


def kernel_records(entries: Sequence[dict[str, Any]]) -> list[KernelRecord]:
    """Manifest instance entries -> kernel records, sorted by name, with fallback ranks."""
    recs = []
    for e in sorted(entries, key=lambda e: e["name"]):
        cfg = e["config"]
        if e.get("family", FAMILY) != FAMILY:      # GEMM's table: the library stage hands each family its own
            raise ExportError(f"{e['name']}: family {e.get('family')!r} is not a {FAMILY} kernel")
        arch = e.get("arch") or cfg["arch"]
        if arch not in ARCHES:
            raise ExportError(f"{e['name']}: arch {arch!r} is not supported by `emitter library` "
                              f"(known: {', '.join(ARCHES)})")
        config_fast_accum(cfg, e["name"], arch)
        cluster = tuple(cfg.get("cluster") or (1, 1, 1))
        recs.append(KernelRecord(
            index=len(recs), name=e["name"], arch=arch, op=kernel_op(cfg),
            align_a=int(cfg["alignment_a"]), align_b=int(cfg["alignment_b"]), align_c=int(cfg["alignment_c"]),
            batched=bool(cfg.get("batched", False)), split_k=cfg.get("split_k", "none") != "none",
            tile=tuple(cfg["tile"]), cluster=cluster, config=cfg,  # type: ignore[arg-type]
            swap_ab=bool(cfg.get("swap_ab", False)),
            stream_k=cfg.get("tile_scheduler") == "stream_k" or cfg.get("split_k") == "serial",
            swizzle=int(cfg.get("swizzle") or 1)))
    ranked = sorted(recs, key=fallback_key)
    rank = {r.name: i for i, r in enumerate(ranked)}
    return [replace(r, fallback_rank=rank[r.name]) for r in recs]


def tuning_records(rows: Iterable[tuple[int, ...]]) -> list[TuningRecord]:
    """(kernel index, m, n, k, batch[, gpu_cc[, split_k[, options]]]) -> indexed tuning records sorted by
    (m, n, k, batch, gpu_cc, kernel, split_k, options)."""
    defaults = (0, 1, 0)   # gpu_cc unknown, no split, no run-time scheduler options
    full = {tuple(r) + defaults[len(r) - 5:] for r in rows}
    out = sorted(full, key=lambda p: (p[1], p[2], p[3], p[4], p[5], p[0], p[6], p[7]))
    return [TuningRecord(i, *p) for i, p in enumerate(out)]


def measured_records(rows: Iterable[tuple[int, ...]]) -> list[MeasuredRecord]:
    """(kernel index, m, n, k, batch, gpu_cc, split_k, options, time_ps, sms) -> indexed measured records sorted by
    (m, n, k, batch, gpu_cc, kernel, split_k, options, time_ps, sms)."""
    out = sorted({tuple(r) for r in rows}, key=lambda p: (p[1], p[2], p[3], p[4], p[5], p[0], p[6], p[7], p[8], p[9]))
    return [MeasuredRecord(i, *p) for i, p in enumerate(out)]


# ---- the selection rule (mirror of dispatch.h.j2) ----------------------------------------------------

def op_matches(k: KernelRecord, q: Query) -> bool:
    o, p = k.op, q.op
    if (o.a, o.b, o.c, o.d, o.la, o.lb, o.lc, o.act, o.bias) != (p.a, p.b, p.c, p.d, p.la, p.lb, p.lc, p.act, p.bias):
        return False
    if p.acc != DTYPE_ANY and p.acc != o.acc:
        return False
    if o.act == ACTIVATIONS["clamp"] and (o.clamp_min != p.clamp_min or o.clamp_max != p.clamp_max):
        return False
    if o.fast_accum and not p.fast_accum:   # a fast-accum kernel only for a caller who opted in
        return False
    return True


def matches(k: KernelRecord, q: Query) -> bool:
    if not op_matches(k, q) or not k.runs_on(q.cc):
        return False
    if q.batch > 1 and not k.batched:
        return False
    if q.split_k > 1 and not k.split_k:
        return False
    return True


@dataclass(frozen=True)
class Candidate:
    kernel: int
    tuning: int          # tuning record index that ranked it, -1 = fallback order
    transposed: bool = False
    measured: int = -1   # measured record whose predicted time ranked it (its split-K count and options run); -1: none


SAT = 1 << 62            # the tile-count arithmetic saturates here (both languages): waves no longer matter there


def _sat_mul(a: int, b: int) -> int:
    return min(a * b, SAT)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_grid(k: KernelRecord, m: int, n: int) -> tuple[int, int]:
    """The kernel's tile grid on an m x n problem (its own terms: a swap_ab kernel's tile runs over (N, M)),
    each side rounded up to the cluster (what CUTLASS's sm90 schedulers launch)."""
    km, kn = (n, m) if k.swap_ab else (m, n)
    cm, cn = max(k.cluster[0], 1), max(k.cluster[1], 1)
    return (_ceil_div(_ceil_div(km, max(k.tile[0], 1)), cm) * cm, _ceil_div(_ceil_div(kn, max(k.tile[1], 1)), cn) * cn)


def wave_log(k: KernelRecord, m: int, n: int, batch: int, split: int, sms: int) -> int:
    """log2(work units the kernel's waves could hold / work units it has), 16.16 fixed point: how much of its
    last wave a data-parallel launch wastes, log2(1 / (tiles / (ceil(tiles / sms) * sms))). A unit is a tile
    (x batch x split-K slice); a cluster's CTAs occupy SMs together, so the SMs round down to whole clusters.
    Stream-K kernels get the same model: CUTLASS's stream-K scheduler runs the full waves data-parallel and
    splits only what is left (the 2026-11-27 H200 record: 128x256 stream-K within 4% of its persistent twin at
    every shape, 3000^3 included). Unknown SM count: 0."""
    if sms <= 0:
        return 0
    bm, bn = tile_grid(k, m, n)
    units = _sat_mul(_sat_mul(_sat_mul(bm, bn), max(batch, 1)), max(split, 1))
    cs = max(k.cluster[0], 1) * max(k.cluster[1], 1)
    slots = max(sms // cs, 1) * cs
    return log2_fixed(_sat_mul(_ceil_div(units, slots), slots)) - log2_fixed(units)


def pad_log(k: KernelRecord, m: int, n: int) -> int:
    """log2(the kernel's tile-padded m x n / m x n), 16.16 fixed point: the share of its MMAs that fall outside the
    problem. A 64x32 swap_ab tile on M = 16 does the work of M = 32, so its time does not double from M = 16 to 32
    as the FLOPs do (the 2026-11-28 H100 library bench: scaled by FLOPs alone, 32x4096x4096 went to the 128x16
    split-K kernel, 0.91 of the best exported one)."""
    km, kn = (n, m) if k.swap_ab else (m, n)
    tm, tn = max(k.tile[0], 1), max(k.tile[1], 1)
    return (log2_fixed(_ceil_div(max(km, 1), tm) * tm) + log2_fixed(_ceil_div(max(kn, 1), tn) * tn)
            - log2_fixed(max(km, 1)) - log2_fixed(max(kn, 1)))


def clamp_split(k: KernelRecord, split: int, kk: int) -> int:
    return max(1, min(split, kk // max(k.tile[2], 1)))


def predicted_cost(k: KernelRecord, r: MeasuredRecord, q: Query) -> int:
    """log2 of the kernel's predicted time on q (16.16 fixed point, integers only: bit-identical in both
    languages), from its time on r's shape: scaled by the FLOPs (m n k batch) its tiles do (the problem's, padded
    to whole tiles: pad_log) and by the wave quantization of its tile grid at both shapes (wave_log), with r's
    split-K count (clamped to q's k) at q."""
    ql = (log2_fixed(q.m), log2_fixed(q.n), log2_fixed(q.k), log2_fixed(max(q.batch, 1)))
    split_q = clamp_split(k, r.split_k, q.k) if k.split_k and r.split_k > 1 else 1
    return (r.log_time + sum(ql) - sum(r.logs) + pad_log(k, q.m, q.n) - pad_log(k, r.m, r.n)
            + wave_log(k, q.m, q.n, q.batch, split_q, r.sms) - r.wave_self(k))


def candidate_order(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord], q: Query,
                    measured: Sequence[MeasuredRecord] = ()) -> list[Candidate]:
    """The kernels to try for `q`, in order (see the module docstring)."""
    ok = [matches(k, q) for k in kernels]
    ql = (log2_fixed(q.m), log2_fixed(q.n), log2_fixed(q.k), log2_fixed(max(q.batch, 1)))
    best: dict[int, tuple[int, int, int, int]] = {}
    for t in tuning:
        if not ok[t.kernel]:
            continue
        tl = t.logs
        dist = sum(abs(a - b) for a, b in zip(ql, tl))
        key = (int(t.gpu_cc != 0 and t.gpu_cc != q.cc), dist, int(not kernels[t.kernel].fast_accum), t.index)
        if t.kernel not in best or key < best[t.kernel]:
            best[t.kernel] = key
    tuned = sorted(best, key=lambda i: best[i])
    rest = sorted((k.index for k in kernels if ok[k.index] and k.index not in best),
                  key=lambda i: (kernels[i].fallback_rank, i))
    order = [Candidate(i, best[i][3]) for i in tuned] + [Candidate(i, -1) for i in rest]
    exact = any(b[0] == 0 and b[1] == 0 for b in best.values())
    if exact or q.split_k > 1 or not measured:
        return order
    # predicted times: every candidate measured at the nearest measured shape of this GPU generation (or unknown)
    near: tuple[int, int] | None = None
    for r in measured:
        if not ok[r.kernel] or (r.gpu_cc != 0 and r.gpu_cc != q.cc):
            continue
        key = (sum(abs(a - b) for a, b in zip(ql, r.logs)), r.index)
        if near is None or key < near:
            near = key
    if near is None:
        return order
    s = measured[near[1]]
    shape = (s.m, s.n, s.k, s.batch, s.gpu_cc)
    cost: dict[int, tuple[int, int]] = {}
    for r in measured:
        if (r.m, r.n, r.k, r.batch, r.gpu_cc) != shape or not ok[r.kernel]:
            continue
        key = (predicted_cost(kernels[r.kernel], r, q), r.index)
        if r.kernel not in cost or key < cost[r.kernel]:
            cost[r.kernel] = key
    anchor = next((t.index for t in tuning if ok[t.kernel] and (t.m, t.n, t.k, t.batch, t.gpu_cc) == shape), -1)
    ranked = sorted(cost, key=lambda i: (cost[i][0], i))
    return ([Candidate(i, anchor, False, cost[i][1]) for i in ranked]
            + [c for c in order if c.kernel not in cost])


def _source(tuning: Sequence[TuningRecord], measured: Sequence[MeasuredRecord], c: Candidate):
    if c.measured >= 0:
        return measured[c.measured]
    return tuning[c.tuning] if c.tuning >= 0 else None


def effective_split_k(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord], c: Candidate, q: Query,
                      measured: Sequence[MeasuredRecord] = ()) -> int:
    """The split-K slice count the library asks candidate `c`'s shim with and launches it with (mirror of
    effective_split_k in dispatch.h.j2): an explicit q.split_k > 1 as given; the caller's count (normally 1)
    for a fallback or forced candidate; else the count of the record that ranked it (its measured record if
    a predicted time ranked it, else its tuning record) when the kernel is split-K, clamped to k // tile_k (at
    least one k-block per slice), at least 1. Transposition keeps k, so it does not matter."""
    requested = max(q.split_k, 1)
    src = _source(tuning, measured, c)
    if requested > 1 or src is None:
        return requested
    k = kernels[c.kernel]
    if not k.split_k or src.split_k <= 1:
        return 1
    return clamp_split(k, src.split_k, q.k)


def _padded_tiles(k: KernelRecord, m: int, n: int, max_swizzle: int) -> int:
    from emitter.families.gemm.options import _log_swizzle

    bm, bn = tile_grid(k, m, n)
    cm, cn = max(k.cluster[0], 1), max(k.cluster[1], 1)
    log = _log_swizzle(bm, bn, max_swizzle)
    return _sat_mul(_ceil_div(bm, (1 << log) * cm) * (1 << log) * cm, _ceil_div(bn, (1 << log) * cn) * (1 << log) * cn)


def options_fit(k: KernelRecord, options: int, m: int, n: int) -> bool:
    """Whether run-time scheduler `options` cost the kernel no tile padding on an m x n problem beyond what its
    compiled-in swizzle costs: CUTLASS's sm90 schedulers round the tile grid up to swizzle x cluster on each
    side (tile_scheduler_params.h), so a swizzle of 8 timed at 4096^3 launches 32 x 16 = 512 tiles for the 24 x 12
    = 288 of a 128x256 tile at 3000^3. Only the swizzle bits (0-3) pad; the raster order, reduction and
    promotion do not."""
    code = options & 0xF
    if code == 0:
        return True
    return _padded_tiles(k, m, n, 1 << (code - 1)) <= _padded_tiles(k, m, n, max(k.swizzle, 1))


def effective_options(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord], c: Candidate, q: Query,
                      measured: Sequence[MeasuredRecord] = ()) -> int:
    """The run-time scheduler options candidate `c` is asked and launched with (mirror of effective_options in
    dispatch.h.j2): those of the record that ranked it (as effective_split_k), where they fit q (options_fit:
    at the record's own m x n always), else none (the compiled-in choices); none for a fallback or forced one.
    `q` is the problem as the candidate computes it (transposed for a transposed candidate)."""
    src = _source(tuning, measured, c)
    if src is None or src.options == 0:
        return 0
    if (src.m, src.n) == (q.m, q.n) or options_fit(kernels[c.kernel], src.options, q.m, q.n):
        return src.options
    return 0


def transpose(q: Query) -> Query:
    """D^T = B^T A^T: the same GEMM on the transposed output (swap A/B and m/n, flip every layout;
    a per-row bias becomes per-column). Never the problem itself: C's layout flips."""
    o = q.op
    flip = {1: 2, 2: 1}
    bias = {0: 0, 1: 2, 2: 1}[o.bias]
    t = replace(o, a=o.b, b=o.a, la=flip[o.lb], lb=flip[o.la], lc=flip[o.lc], bias=bias)
    return replace(q, op=t, m=q.n, n=q.m)


def dispatch_order(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord], q: Query,
                   allow_transpose: bool = True, measured: Sequence[MeasuredRecord] = ()) -> list[Candidate]:
    """Direct candidates, then (if allowed) candidates of the transposed problem."""
    out = candidate_order(kernels, tuning, q, measured)
    if allow_transpose:
        out += [replace(c, transposed=True) for c in candidate_order(kernels, tuning, transpose(q), measured)]
    return out


def forced(kernels: Sequence[KernelRecord], index: int, q: Query, allow_transpose: bool = True) -> Candidate | None:
    """A kernel the caller named (problem.kernel): runs when it computes the problem's operation, directly or
    (if allowed) transposed, whatever the caller's fast-accumulation opt-in -- naming a fast-accum kernel is
    the opt-in. None: it does not compute the problem (the library answers NOT_SUPPORTED)."""
    k = kernels[index]
    q = replace(q, op=replace(q.op, fast_accum=True))
    if matches(k, q):
        return Candidate(index, -2, False)
    if allow_transpose and matches(k, transpose(q)):
        return Candidate(index, -2, True)
    return None


def select(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord], q: Query,
           can_implement: Callable[[KernelRecord, Query], bool] | None = None,
           measured: Sequence[MeasuredRecord] = ()) -> Candidate | None:
    """The kernel the library would launch, given a can_implement predicate (default: all can)."""
    for c in dispatch_order(kernels, tuning, q, measured=measured):
        qq = transpose(q) if c.transposed else q
        if can_implement is None or can_implement(kernels[c.kernel], qq):
            return c
    return None


def packed_can_implement(k: KernelRecord, q: Query) -> bool:
    """A model of can_implement for packed operands on aligned pointers: every leading dimension must
    be a multiple of the kernel's alignment (used for export-time previews only; the library asks the
    real host shim)."""
    o = q.op
    lda = q.k if o.la == LAYOUTS["row"] else q.m
    ldb = q.n if o.lb == LAYOUTS["row"] else q.k
    ldc = q.n if o.lc == LAYOUTS["row"] else q.m
    return lda % k.align_a == 0 and ldb % k.align_b == 0 and ldc % k.align_c == 0
