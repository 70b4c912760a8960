"""Timing on the GPU: device events around each launch, warm-up first, inputs rotated past L2.

How one measurement goes (EventTimer.measure):
  1. warm-up: `warmup` launches and at least `warmup_ms` of GPU time, cycling the input sets, so module
     load, cuBLAS handle and workspace creation and clock ramp-up stay out of the numbers. It is enqueued
     in chunks with a synchronize after each (warm_up), so it lasts what was asked: a loop that only
     watched the host's clock filled the launch queue (about a thousand launches) before the host ever
     waited, which for a 13 ms kernel was 13 s of warm-up per measurement (91% of a 2026-11-23 sweep);
  2. a probe: a few launches give the GPU time per launch and the host's cost to enqueue one timed launch
     (two event records + the launch); `min_duration_ms` turns the GPU time into an iteration count;
  3. `repeats` blocks of `iterations` launches, each between its own event pair, the inputs rotated so the
     working set of consecutive launches exceeds the L2 cache (read off the device; 50 MB on H100, 60 MB on
     H200): a launch never finds its operands in L2 because its predecessor left them there.
     Launches are enqueued in chunks behind a *blocking kernel* (one thread spinning on %globaltimer for
     the time the host needs to enqueue the chunk), so small kernels queue back to back and the events
     time the GPU's work, not Python's launch overhead (nvbench does the same).
Samples go to emitter.profile.stats.TimingStats (median, IQR, per-repeat medians).

PyCUDA is imported inside functions only; everything runs on the primary context (shared with torch).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from emitter.profile.config import Timing
from emitter.profile.stats import TimingStats

# A one-thread kernel that spins until `ns` nanoseconds of %globaltimer have passed. PTX, so the driver
# JIT-compiles it for whatever GPU is there and no nvcc is needed at run time.
SPIN_PTX = """\
.version 7.0
.target sm_70
.address_size 64

.visible .entry emitter_profile_spin(.param .u64 emitter_profile_spin_ns)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [emitter_profile_spin_ns];
	mov.u64 	%rd2, %globaltimer;
$L_spin:
	mov.u64 	%rd3, %globaltimer;
	sub.s64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$L_spin;
	ret;
}
"""

CHUNK = 128               # launches queued behind one blocking kernel (3 queue entries each)
MAX_SPIN_MS = 50.0
PROBE_LAUNCHES = 8
MAX_SETS = 64


def rotation_sets(bytes_per_set: int, l2_bytes: int, rotate: int | str | bool, free_bytes: int | None = None,
                  budget_fraction: float = 0.4) -> int:
    """How many input sets to cycle so consecutive launches' working set exceeds L2.

    auto: enough sets to cover twice the L2 size, at least 2 (so even a huge problem does not re-read
    the tail its predecessor left in L2), within `budget_fraction` of the free device memory."""
    if rotate is False or bytes_per_set <= 0:
        return 1
    target = 2 * l2_bytes if rotate == "auto" else int(rotate)
    sets = max(2, math.ceil(target / bytes_per_set) + 1)
    sets = min(sets, MAX_SETS)
    if free_bytes is not None:
        fit = int(free_bytes * budget_fraction) // max(bytes_per_set, 1)
        sets = max(1, min(sets, fit))
    return sets


@dataclass
class Measured:
    stats: TimingStats
    iterations: int
    warmup_launches: int
    host_us_per_launch: float
    spin_ms: float

    def extra(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "warmup_launches": self.warmup_launches,
                "host_us_per_launch": round(self.host_us_per_launch, 3), "spin_ms": round(self.spin_ms, 4)}


MAX_WARMUP_CHUNK = 512


def warm_up(launch: Callable[[int], None], synchronize: Callable[[], None], warmup: int, warmup_ms: float | None,
            sets: int = 1, clock: Callable[[], float] = time.perf_counter, limit: int = 1_000_000) -> int:
    """Enqueue warm-up launches until at least `warmup` have run and at least `warmup_ms` milliseconds have
    passed with the GPU busy; returns how many were launched.

    Launches go in chunks, each followed by a synchronize, so the host's clock tracks the GPU's: the next
    chunk is sized from the time per launch seen so far to end near `warmup_ms` (at most MAX_WARMUP_CHUNK
    launches, so a chunk never fills the launch queue)."""
    sets = max(sets, 1)
    n = 0
    t0 = clock()
    chunk = max(1, warmup)
    while n < limit:
        for _ in range(min(chunk, limit - n)):
            launch(n % sets)
            n += 1
        synchronize()
        elapsed_ms = (clock() - t0) * 1e3
        if n >= warmup and (not warmup_ms or elapsed_ms >= warmup_ms):
            break
        if n < warmup:
            chunk = warmup - n
        else:
            per_ms = max(elapsed_ms / n, 1e-4)
            chunk = int(min(MAX_WARMUP_CHUNK, max(1, math.ceil((warmup_ms - elapsed_ms) / per_ms))))
    return n


def iterations_for(timing: Timing, est_ms: float) -> int:
    if timing.iterations is not None:
        return min(timing.iterations, timing.max_iterations)
    est_ms = max(est_ms, 1e-4)
    return int(max(10, min(timing.max_iterations, math.ceil((timing.min_duration_ms or 0.0) / est_ms))))


class EventTimer:
    """Times `launch(i)` (which enqueues one launch on `stream` using input set i) with event pairs."""

    def __init__(self, stream: Any, timing: Timing) -> None:
        import pycuda.driver as drv

        self.drv = drv
        self.stream = stream
        self.timing = timing
        self._events: list[tuple[Any, Any]] = []
        self._spin = None
        if timing.blocking_kernel:
            mod = drv.module_from_buffer(SPIN_PTX.encode() + b"\0")   # PTX text must end in NUL
            self._spin_module = mod
            self._spin = mod.get_function("emitter_profile_spin")
            self._spin.prepare("Q")

    def _pairs(self, n: int) -> list[tuple[Any, Any]]:
        while len(self._events) < n:
            self._events.append((self.drv.Event(), self.drv.Event()))
        return self._events[:n]

    def _block(self, ms: float) -> None:
        if self._spin is not None and ms > 0:
            self._spin.prepared_async_call((1, 1, 1), (1, 1, 1), self.stream, np.uint64(int(ms * 1e6)))

    def _timed_chunk(self, launch: Callable[[int], None], first: int, count: int, spin_ms: float) -> tuple[list[float], float]:
        pairs = self._pairs(count)
        self._block(spin_ms)
        t0 = time.perf_counter()
        stream = self.stream
        for j in range(count):
            start, end = pairs[j]
            start.record(stream)
            launch(first + j)
            end.record(stream)
        host_s = time.perf_counter() - t0
        pairs[count - 1][1].synchronize()
        return [end.time_since(start) for start, end in pairs[:count]], host_s

    def probe(self, launch: Callable[[int], None], sets: int = 1, launches: int = 2) -> float:
        """Milliseconds of the fastest of a few event-timed launches (the kernel already ran once: its
        check), for pruning: a kernel this slow cannot win, whatever its full measurement would say."""
        times, _host = self._timed_chunk(lambda i: launch(i % max(sets, 1)), 1, launches, 0.0)
        return float(min(times))

    def measure(self, launch: Callable[[int], None], sets: int = 1) -> Measured:
        t = self.timing
        # 1. warm-up
        n = warm_up(launch, self.stream.synchronize, t.warmup, t.warmup_ms, sets)
        # 2. probe: GPU time per launch and the host's enqueue cost, behind a generous blocking kernel
        probe, host_s = self._timed_chunk(lambda i: launch(i % max(sets, 1)), n, PROBE_LAUNCHES, 5.0)
        est_ms = float(np.median(probe))
        host_us = host_s / PROBE_LAUNCHES * 1e6
        iters = iterations_for(t, est_ms)
        chunk = min(CHUNK, iters)
        # hold the stream while the host queues a chunk, unless the GPU work alone outlasts the enqueue
        spin_ms = 0.0
        if self._spin is not None and est_ms * 1e3 < 2 * host_us:
            spin_ms = min(MAX_SPIN_MS, 1.3 * chunk * host_us / 1e3 + 0.05)
        # 3. repeats x iterations
        groups: list[list[float]] = []
        idx = n + PROBE_LAUNCHES
        for _ in range(t.repeats):
            samples: list[float] = []
            left = iters
            while left > 0:
                c = min(chunk, left)
                got, _host = self._timed_chunk(lambda i: launch(i % max(sets, 1)), idx, c, spin_ms)
                samples += got
                idx += c
                left -= c
            groups.append(samples)
        return Measured(TimingStats.from_samples(groups), iters, n, host_us, spin_ms)

    def interleave(self, launches: Sequence[Callable[[int], None]], sets: int = 1) -> list[TimingStats]:
        """Time several launch functions launch by launch, alternating, the lead rotated every tuple (a b, b a,
        a b, ...), each launch between its own event pair; returns one TimingStats per function.

        Why: at a GPU's power cap the clock follows load and temperature over tens of milliseconds, so two
        measurements taken one after the other (even in alternating rounds) see different clocks; launches
        alternated one by one see the same. The input sets rotate over the whole sequence, so no launch finds
        its operands in L2 because the launch before it (of either function) read them. Warm-up runs the
        interleaved sequence, so every function (kernel and baselines alike) gets `warmup` launches of its own
        before any is timed; the blocking kernel and the count of launches are `measure`'s; `iterations`
        counts pairs (tuples)."""
        t = self.timing
        fns = list(launches)
        if not fns:
            raise ValueError("nothing to interleave")
        sets = max(sets, 1)
        width = len(fns)

        def order(j: int) -> list[int]:          # pair j's launch order: rotated by one each pair
            return [(j + w) % width for w in range(width)]

        def one(g: int) -> None:                 # the g-th launch of the interleaved sequence
            j, w = divmod(g, width)
            fns[order(j)[w]](g % sets)

        # warm-up: the interleaved sequence itself, so every function gets the same launches (t.warmup each,
        # and as many more as warmup_ms takes), completed to a whole tuple
        n = warm_up(one, self.stream.synchronize, max(t.warmup, 1) * width, t.warmup_ms, sets=1 << 62)
        g0 = n + (-n) % width                     # start on a tuple boundary
        for g in range(n, g0):
            one(g)
        self.stream.synchronize()
        # probe: per-tuple GPU time and the host's cost per launch, behind a generous blocking kernel
        probe, host_s = self._timed_chunk(one, g0, PROBE_LAUNCHES * width, 5.0)
        est_ms = float(np.median(probe)) * width
        host_us = host_s / (PROBE_LAUNCHES * width) * 1e6
        tuples = iterations_for(t, est_ms)
        chunk = max(1, min(CHUNK // width, tuples))
        spin_ms = 0.0
        if self._spin is not None and est_ms / width * 1e3 < 2 * host_us:
            spin_ms = min(MAX_SPIN_MS, 1.3 * chunk * width * host_us / 1e3 + 0.05)
        groups: list[list[list[float]]] = [[] for _ in fns]
        g = g0 + PROBE_LAUNCHES * width
        for _ in range(t.repeats):
            per: list[list[float]] = [[] for _ in fns]
            left = tuples
            while left > 0:
                c = min(chunk, left)
                got, _host = self._timed_chunk(one, g, c * width, spin_ms)
                for i, ms in enumerate(got):      # back to the function that launch g + i ran
                    j, w = divmod(g + i, width)
                    per[order(j)[w]].append(ms)
                g += c * width
                left -= c
            for f in range(width):
                groups[f].append(per[f])
        return [TimingStats.from_samples(gs) for gs in groups]
