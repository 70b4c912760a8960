"""What a problem costs to profile, in seconds of one GPU: the order the GPUs take work in, and how well it splits.

The runner hands problems to GPUs from one queue, the most expensive first (LPT list scheduling: each GPU that
finishes takes the next). The order comes from an estimate per problem:

  measured  the problem's wall seconds in an earlier run's profile.json (`run.problems[].wall_s`, which every
            run records): `--cost-from results/x/profile.json`, or the output directory's own profile.json
            when there is one. Problems the earlier run did not have are modelled, scaled by how the earlier
            run's measured seconds compare with the model on the problems both know.
  model     per problem, the launches its measurements take (each kernel of each op the problem applies to, at
            each split-K count and scheduler variant, plus the op's baselines) times the seconds one launch takes
            at MODEL_TFLOPS on the family's FLOP count, plus MEASUREMENT_S a measurement (check, launch set-up)
            and PROBLEM_S a problem (operand sets). The constants are fitted to one GEMM run (below), not to
            attention or convolution: the measured estimate replaces them after one run.

A problem is the unit of work: its operand sets, baseline and checks stay on one GPU, and pruning and the
scheduler's `top` pass rank a problem's kernels against the best time so far on that problem, in order. So a
problem cannot be split over GPUs without changing what is measured, and n GPUs finish no sooner than the
largest problem alone (balance_line says when that bounds the speed-up).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The 2026-11-25 2 x H100 run (docs/scale-out.md): 9 GEMM problems, 12.6 TFLOP a launch in all, 5 measurements
# of ~516 launches each, took 108 s on one GPU: ~300 TFLOP/s of launches, everything else included; 16384^3
# alone (70% of the FLOPs) was ~70% of the time, so the fixed costs were small beside it.
MODEL_TFLOPS = 300.0       # the rate the model's launches run at, all per-launch costs included
MEASUREMENT_S = 0.05       # a measurement's fixed cost: check launch + reference + compare, launch set-up
PROBLEM_S = 0.2            # a problem's fixed cost: operand sets allocated and filled
LAUNCH_S = 5e-6            # a launch's fixed cost (small problems)
DEFAULT_SM_COUNT = 132     # split-K counts are chosen from the SM count; H100 SXM's for the model
# A family's run-time hooks may scale the model by PROFILE_COST_FACTOR (measured / modelled one-GPU seconds of its
# problems, from a run of scripts/multigpu_check.sh): only the queue's order depends on it, and a run's own
# measured seconds replace the model from the next run on.


@dataclass
class Estimate:
    """Estimated seconds of one GPU per problem key, and where each figure comes from."""

    seconds: dict[str, float]
    source: dict[str, str]                     # key -> "measured" | "model" | "model x<scale>"
    prior: str | None = None                   # the profile.json the measured figures come from
    notes: list[str] = field(default_factory=list)

    def of(self, p: Any) -> float:
        return self.seconds.get(p.key, 0.0)

    def total(self, problems: list[Any]) -> float:
        return sum(self.of(p) for p in problems)

    def describe(self, problems: list[Any]) -> str:
        measured = sum(1 for p in problems if self.source.get(p.key) == "measured")
        if not measured:
            return "modelled: FLOPs x measurements"
        rest = len(problems) - measured
        return f"{measured} measured in {self.prior}" + (f", {rest} modelled" if rest else "")


def queue_order(problems: list[Any], est: Estimate) -> list[Any]:
    """The order the queue hands problems out: largest estimate first, ties by key (deterministic)."""
    return sorted(problems, key=lambda p: (-est.of(p), p.key))


def lpt(problems: list[Any], n: int, est: Estimate) -> tuple[list[list[Any]], list[float]]:
    """The queue's schedule if every estimate were exact: each problem, largest first, to the GPU that is free
    first (ties: lower index). Returns (problems per GPU in the order taken, estimated busy seconds per GPU)."""
    shards: list[list[Any]] = [[] for _ in range(n)]
    load = [0.0] * n
    for p in queue_order(problems, est):
        i = min(range(n), key=lambda j: (load[j], j))
        shards[i].append(p)
        load[i] += est.of(p)
    return shards, load


def balance_line(problems: list[Any], n: int, est: Estimate) -> str | None:
    """One line on the estimated work and how the queue splits it over n GPUs (None for one GPU), naming the
    problem that bounds the speed-up when one problem is more than a GPU's fair share."""
    if n < 2 or not problems:
        return None
    total = est.total(problems)
    if total <= 0:
        return None
    _shards, load = lpt(problems, n, est)
    span = max(load)
    line = (f"estimated work {total:.0f} s ({est.describe(problems)}); queue, largest first, over {n} GPUs: "
            + ", ".join(f"{100 * x / total:.0f}%" for x in load) + f" -> {total / span:.2f}x of one GPU")
    big = max(problems, key=lambda p: (est.of(p), p.key))
    share = est.of(big) / total
    if share > 1.0 / n * 1.05:
        line += (f"; {big.key} alone is {100 * share:.0f}% of it (a problem runs on one GPU), so {n} GPUs finish "
                 f"at most {1 / share:.2f}x sooner than one: add problems, or profile {big.key} by itself")
    return line


# ------------------------------------------------------------------------------------------ the model
def _launches(timing: Any, launch_s: float) -> float:
    """Launches (or their time, as launches of launch_s) one timed measurement takes under `timing`."""
    warm = timing.warmup
    if timing.warmup_ms:
        warm = max(warm, timing.warmup_ms * 1e-3 / max(launch_s, 1e-9))
    if timing.iterations:
        per_repeat = timing.iterations
    else:
        per_repeat = min(timing.max_iterations, max(1.0, (timing.min_duration_ms or 0) * 1e-3 / max(launch_s, 1e-9)))
    return warm + timing.repeats * per_repeat + 3        # + the check, the probe and the check after timing


def _family_hooks(family: str) -> Any:
    from emitter.families.registry import runtime_family

    try:
        return runtime_family(family, need=())
    except Exception:  # noqa: BLE001 - a family that does not import: the model counts no variants for it
        return None


class _Kernels:
    """Per instance of the plan: its family, op, config (parsed once), run-time hooks."""

    def __init__(self, the_plan: Any) -> None:
        from emitter.families.registry import entry_family
        from emitter.profile.records import op_of

        self.items = []
        for inst in the_plan.instances:
            entry = inst["entry"]
            fam = entry_family(entry)
            hooks = _family_hooks(fam)
            try:
                op = op_of(entry)
                cfg = hooks.config_from_entry(entry, Path(inst["root"])) if hooks is not None else None
            except Exception:  # noqa: BLE001 - the worker reports it; the model counts it as one measurement
                op, cfg = None, None
            self.items.append((fam, op, cfg, hooks))


def measurements(kernels: "_Kernels", problem: Any, config: Any) -> int:
    """How many measurements the worker takes on `problem`: each applicable op's kernels at each split-K count and
    scheduler variant, and the op's baselines."""
    fam = getattr(problem, "FAMILY", None)
    count = 0
    ops_seen: dict[str, Any] = {}
    for kfam, op, cfg, hooks in kernels.items:
        if kfam != fam:
            continue
        if op is not None and hooks is not None:
            applies = getattr(hooks, "profile_applies", None)
            try:
                if applies is not None and not applies(op, problem):
                    continue
            except Exception:  # noqa: BLE001
                pass
            ops_seen.setdefault(op.key, hooks)
        splits, variants = 1, 1
        if cfg is not None and hooks is not None:
            try:
                hook = getattr(hooks, "profile_splits", None)
                splits = len(hook(cfg, problem, DEFAULT_SM_COUNT)) if hook else 1
                vh = getattr(hooks, "profile_variants", None)
                variants = len(vh(cfg, problem, list(config.scheduler))) if vh else 1
            except Exception:  # noqa: BLE001
                splits, variants = 1, 1
        count += max(splits, 1) * max(variants, 1)
    for hooks in ops_seen.values():
        count += sum(1 for b in config.baselines if b in tuple(getattr(hooks, "BASELINES", ())))
    return count


def model_seconds(problem: Any, n_measurements: int, timing: Any) -> float:
    launch_s = problem.flops / (MODEL_TFLOPS * 1e12) + LAUNCH_S
    hooks = _family_hooks(getattr(problem, "FAMILY", None) or "")
    factor = float(getattr(hooks, "PROFILE_COST_FACTOR", 1.0) or 1.0)
    return factor * (PROBLEM_S + n_measurements * (MEASUREMENT_S + _launches(timing, launch_s) * launch_s))


# ------------------------------------------------------------------------------------------ measured
def recorded_walls(path: Path) -> dict[str, float]:
    """Problem key -> wall seconds its measurements took, from a profile.json's `run` section ({} for a
    profile.json written before runs recorded it)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[str, float] = {}
    for r in (data.get("run") or {}).get("problems", []):
        w = r.get("wall_s")
        if isinstance(w, (int, float)) and w > 0 and math.isfinite(w):
            out[str(r["problem"])] = float(w)
    return out


def estimate(the_plan: Any, config: Any, prior: Path | None = None) -> Estimate:
    """Seconds per problem of the plan: measured in `prior` (a profile.json) where it has the problem, else the
    model (scaled to the prior's measured seconds where both know some problems)."""
    kernels = _Kernels(the_plan)
    model = {p.key: model_seconds(p, measurements(kernels, p, config), config.timing) for p in the_plan.problems}
    est = Estimate(dict(model), {k: "model" for k in model})
    if prior is None:
        return est
    try:
        walls = recorded_walls(prior)
    except (OSError, ValueError, KeyError, TypeError) as e:
        est.notes.append(f"cost estimate: {prior} not read ({type(e).__name__}: {e}); the model orders the queue")
        return est
    if not walls:
        est.notes.append(f"{prior} records no per-problem wall seconds (written before runs recorded them); "
                         "the model orders the queue")
        return est
    both = [k for k in model if k in walls]
    scale = (sum(walls[k] for k in both) / sum(model[k] for k in both)) if both and sum(model[k] for k in both) > 0 \
        else 1.0
    for k in model:
        if k in walls:
            est.seconds[k], est.source[k] = walls[k], "measured"
        else:
            est.seconds[k], est.source[k] = model[k] * scale, f"model x{scale:.2g}"
    est.prior = str(prior)
    return est


__all__ = ["Estimate", "estimate", "queue_order", "lpt", "balance_line", "model_seconds", "recorded_walls"]
