"""Best kernel per problem, chosen so that a rerun picks the same one or reports the two as within noise.

Never one noisy minimum: kernels are compared by their medians, and a kernel whose median is within
the noise of the fastest one is a tie. Noise between two measurements x (the fastest) and y is

    max(tie_tolerance * median_x,            # a floor: clocks and power move a few tenths of a percent
        (iqr_x + iqr_y) / 2,                 # launch-to-launch spread of both
        run_spread_x, run_spread_y)          # range of per-repeat medians: the run-to-run drift

capped at TIE_CAP x median_x (5%): a kernel measured that noisily is no evidence of being as fast (seen on an
H200: a ping-pong kernel at 16384^3 with repeat medians 17.4 / 13.2 / 17.7 ms tied the steady 12.8 ms kernel
and, under the name-order tie-break of the time, won).

Among the tied kernels the winner is the fastest by median, and the others are reported as its ties: a
rerun may swap two kernels within noise of each other, and says so. (Until 2026-11-23 the tie-break was name
order, for reruns that pick the same name; on an H200, whose power cap moves a kernel's repeat medians by up to
5%, that reported a kernel 2-4% slower than the fastest for most of the large shapes: the 2026-11-23 sweep's
bf16 TN 512x4096x4096 took a 30.3 us stream-K kernel over a 29.6 us ping-pong one by name.)
The tuning table (problem -> kernel with its figures) feeds the exported library's dispatch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from emitter.profile.config import problem_ident
from emitter.profile.records import Measurement
from emitter.profile.stats import TimingStats

TUNING_SCHEMA_VERSION = 1
TIE_CAP = 0.05                  # the widest tie window, as a fraction of the fastest median
RULE = ("median of all launches; ties: within max(tie_tolerance x best median, mean IQR of the two, "
        f"run-to-run spread of either), at most {TIE_CAP:.0%} of the fastest median, of the fastest median; "
        "tie-break: the smallest median (name order on equal medians)")


def noise_ms(best: TimingStats, other: TimingStats, tie_tolerance: float) -> float:
    spread = max(tie_tolerance * best.median_ms, (best.iqr_ms + other.iqr_ms) / 2,
                 best.run_spread_ms, other.run_spread_ms)
    return min(spread, max(TIE_CAP, tie_tolerance) * best.median_ms)


@dataclass(frozen=True)
class Choice:
    winner: Measurement
    fastest: Measurement                      # smallest median (the winner; kept for the tuning table's field)
    ties: tuple[str, ...]                     # labels within noise of the fastest, winner included, sorted
    candidates: int                           # kernels that ran correctly on this problem
    margin_ms: float | None                   # next non-tied kernel's median minus the fastest's (None: no other)


def choose(candidates: Iterable[Measurement], tie_tolerance: float = 0.01) -> Choice | None:
    """The stable best of `candidates` (kernels on one op and problem); None if none ran correctly."""
    ok = [c for c in candidates if c.ok]
    if not ok:
        return None
    # fastest by median; name order breaks exact equality so the choice never depends on input order
    ok.sort(key=lambda c: (c.stats.median_ms, c.label))  # type: ignore[union-attr]
    fastest = ok[0]
    fs = fastest.stats
    assert fs is not None
    tied = [c for c in ok if c.stats.median_ms - fs.median_ms <= noise_ms(fs, c.stats, tie_tolerance)]  # type: ignore[union-attr]
    tied_ids = {id(c) for c in tied}
    rest = [c for c in ok if id(c) not in tied_ids]
    winner = fastest           # the smallest median; `tied` are the kernels within noise of it
    margin = (rest[0].stats.median_ms - fs.median_ms) if rest else None  # type: ignore[union-attr]
    return Choice(winner=winner, fastest=fastest, ties=tuple(sorted(c.label for c in tied)), candidates=len(ok),
                  margin_ms=margin)


def group_key(m: Measurement) -> tuple[str, tuple[int, int, int, int]]:
    return (m.op.key, problem_ident(m.problem))


def choose_all(measurements: Iterable[Measurement], tie_tolerance: float = 0.01) -> dict[tuple, Choice]:
    """(op key, problem) -> Choice, over the kernel measurements."""
    groups: dict[tuple, list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.kind == "kernel":
            groups[group_key(m)].append(m)
    out = {}
    for key in sorted(groups):
        ch = choose(groups[key], tie_tolerance)
        if ch is not None:
            out[key] = ch
    return out


def measurement_key(m: Measurement) -> tuple:
    return (m.kind, m.label, m.op.key, problem_ident(m.problem))


def tuning_table(choices: dict[tuple, Choice], figures: dict[tuple, dict[str, Any]], env: dict[str, Any],
                 tie_tolerance: float) -> dict[str, Any]:
    """The tuning table JSON. `figures` maps measurement_key(m) -> derived figures (tflops, ratio, ...)."""
    entries = []
    for key in sorted(choices):
        ch = choices[key]
        w = ch.winner
        f = figures.get(measurement_key(w), {})
        entries.append({
            "op": w.op.to_json(),
            "problem": w.problem.as_dict(),
            "kernel": w.name,
            "split_k": w.split_k,        # slices to launch it with (1 = no split)
            "options": w.options,        # run-time scheduler options to launch it with (0 = none)
            "scheduler": w.options_label,
            "manifest": w.manifest,
            "median_ms": w.stats.median_ms if w.stats else None,
            "iqr_ms": w.stats.iqr_ms if w.stats else None,
            "tflops": f.get("tflops"),
            "gbs": f.get("gbs"),
            "pct_peak": f.get("pct_peak"),
            "baseline": f.get("baseline"),
            "baseline_ms": f.get("baseline_ms"),
            "ratio_to_baseline": f.get("ratio"),
            "fastest": ch.fastest.label,
            "ties": list(ch.ties),
            "candidates": ch.candidates,
            "margin_ms": ch.margin_ms,
            # timing.workspace_reset the winner was timed with (library: its shim's workspace memset included)
            "workspace_reset": (w.extra or {}).get("workspace_reset_mode"),
        })
    return {
        "schema_version": TUNING_SCHEMA_VERSION,
        "kind": "emitter.tuning_table",
        "gpu": {k: env.get(k) for k in ("name", "sm_count", "cc")} if env else {},
        "emitter_version": env.get("emitter_version") if env else None,
        "selection": {"rule": RULE, "tie_tolerance": tie_tolerance},
        "entries": entries,
    }
