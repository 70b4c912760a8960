"""Timing statistics: median and spread of many event-timed launches (pure, no GPU).

A measurement is `repeats` blocks of `iterations` launches, each launch timed by its own event pair.
The median of all samples is the figure; the IQR (q75 - q25) is the launch-to-launch spread; the range
of the per-repeat medians is the run-to-run spread, which is what threatens a rerun's ranking.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    q25_ms: float
    q75_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    samples: int
    repeats: int
    iterations: int
    repeat_medians_ms: tuple[float, ...] = field(default=())

    @property
    def iqr_ms(self) -> float:
        return self.q75_ms - self.q25_ms

    @property
    def run_spread_ms(self) -> float:
        """max - min of the per-repeat medians (0 with one repeat)."""
        return (max(self.repeat_medians_ms) - min(self.repeat_medians_ms)) if self.repeat_medians_ms else 0.0

    @property
    def rel_spread(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0

    @classmethod
    def from_samples(cls, groups: Sequence[Sequence[float]]) -> "TimingStats":
        """Stats from per-repeat lists of per-launch times (ms)."""
        groups = [list(map(float, g)) for g in groups if len(g)]
        if not groups:
            raise ValueError("no timing samples")
        allv = np.asarray([x for g in groups for x in g], dtype=np.float64)
        if not np.all(np.isfinite(allv)) or np.any(allv < 0):
            raise ValueError("timing samples must be finite and non-negative")
        q25, med, q75 = np.percentile(allv, [25, 50, 75])
        return cls(median_ms=float(med), q25_ms=float(q25), q75_ms=float(q75), min_ms=float(allv.min()),
                   max_ms=float(allv.max()), mean_ms=float(allv.mean()), samples=int(allv.size),
                   repeats=len(groups), iterations=max(len(g) for g in groups),
                   repeat_medians_ms=tuple(float(np.median(g)) for g in groups))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["repeat_medians_ms"] = list(self.repeat_medians_ms)
        d["iqr_ms"] = self.iqr_ms
        d["run_spread_ms"] = self.run_spread_ms
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TimingStats":
        keys = ("median_ms", "q25_ms", "q75_ms", "min_ms", "max_ms", "mean_ms", "samples", "repeats", "iterations")
        return cls(**{k: d[k] for k in keys}, repeat_medians_ms=tuple(d.get("repeat_medians_ms", ())))
