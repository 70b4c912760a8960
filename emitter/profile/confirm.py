"""Head-to-head confirmation of a finished profile: each (op, problem)'s chosen kernel against the baseline,
timed head to head, launch by launch, on the same operands.

    python -m emitter.profile.confirm RESULTS/profile --rounds 5         # writes RESULTS/profile/confirm.json
    python -m emitter.profile.confirm --tuning docs/perf/tuning.json --manifest gen --out confirm.json
                                    # a tuning table's entries against the baseline on the GPU at hand

Why: a sweep times the baseline once per (op, problem), then every kernel and variant after it, seconds to
minutes later. On a GPU at its power cap the clock follows the load and the card's temperature, so that one
baseline figure and the best of many kernel figures were taken at different clocks; and the best of many
noisy figures is biased low. Between two full H200 runs (2026-11-23d-top3 and 2026-11-24-c7517) the same
kernel on the same shape moved by up to 9% while cuBLAS moved by 2%, and per-shape ratios by up to +-10%.
Here the winner and the baseline are timed head to head, `rounds` times: in each round their launches
alternate one by one (kernel, baseline, baseline, kernel, ...; EventTimer.interleave), each between its own event
pair, after a common warm-up, with the profile's inputs rotated past L2 over the whole sequence, so both sides
see the same clock to within one launch. (Until 2026-11-24 each round timed one side and then the other, the
profile's whole method apiece: back to back, the rounds' ratios still spread by 4-7% on an H200.) The figure is
the median of the per-round ratios (the baseline's median launch time / the kernel's), with their range beside it.
The check is off: every winner passed it in the sweep, on these problems. Around each row nvidia-smi is read
(read-only): SM clock, power and temperature before and after, and any other process holding the GPU; a row
timed beside another process is marked `shared_with` and a warning is printed (a 2026-11-24 run showed what
such a neighbour does to a baseline timing: 2.64x in the sweep, 0.978x head to head).

Output (confirm.json, rewritten atomically after every (op, problem), so a run cut short keeps what it did and
`--resume` goes on): {"rounds": R, "method": ..., "rows": [{op, m, n, k, batch, kernel, split_k, options, status, reason,
kernel_ms, baseline_ms, ratio, ratio_min, ratio_max, samples: [[kernel_ms, baseline_ms], ...], gpu: {before, after}
(nvidia-smi readings), shared_with (only when another process was on the GPU)}]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from emitter.fsutil import atomic_write_json
from emitter.profile.config import Problem, ProfileConfig, Timing
from emitter.profile.records import OK, Measurement, Op
from emitter.profile.worker import _short

CONFIRM_FILE = "confirm.json"
METHODS = {
    "launch": ("median over rounds of baseline_ms / kernel_ms; in each round the kernel and the baseline are "
               "launched one by one, alternating (the lead swapped every pair), each launch between its own event "
               "pair, and each side's figure is the median of its launches; check off"),
    # the method until 2026-11-24, kept to compare with: each side's whole measurement (warm-up, repeats), back to back
    "round": ("median over rounds of baseline_ms / kernel_ms; in each round one side's whole measurement (warm-up, "
              "repeats) and then the other's, the order swapped each round (baseline first in even rounds); check off"),
}
METHOD = METHODS["launch"]


class ConfirmError(Exception):
    """The profile directory cannot be confirmed (no profile.json, no worker jobs)."""


def winners(profile_dir: Path) -> list[dict[str, Any]]:
    """The chosen kernel of each (op, problem) in profile.json, with its split-K count and scheduler options."""
    pj = profile_dir / "profile.json"
    if not pj.is_file():
        raise ConfirmError(f"{pj}: not found (run `emitter profile` first, or give its output directory)")
    rows = json.loads(pj.read_text(encoding="utf-8"))["rows"]
    out = [{"op": r["op"], "m": r["m"], "n": r["n"], "k": r["k"], "batch": r.get("batch", 1), "kernel": r["name"],
            "split_k": int(r.get("split_k") or 1), "options": int(r.get("options") or 0)}
           for r in rows if r.get("best") and r["kind"] == "kernel"]
    return sorted(out, key=lambda w: (w["m"], w["n"], w["k"], w["batch"], w["op"]))


def tuning_winners(tuning: Path) -> list[dict[str, Any]]:
    """The entries of a tuning table (emitter profile's tuning.json, or a library's): each (op, problem)'s kernel
    with its split-K count and scheduler options, in winners()'s form."""
    try:
        entries = json.loads(Path(tuning).read_text(encoding="utf-8"))["entries"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfirmError(f"{tuning}: not a tuning table with entries ({e})") from None
    out = [{"op": e["op"]["key"], "m": e["problem"]["m"], "n": e["problem"]["n"], "k": e["problem"]["k"],
            "batch": e["problem"].get("batch", 1), "kernel": e["kernel"], "split_k": int(e.get("split_k") or 1),
            "options": int(e.get("options") or 0)} for e in entries]
    return sorted(out, key=lambda w: (w["m"], w["n"], w["k"], w["batch"], w["op"]))


# the timing of the benchmark's runs (benchmarks/profile_sm90a.py) for a confirmation that has no profile config
TUNING_TIMING = Timing(warmup=10, warmup_ms=25.0, min_duration_ms=10.0, max_iterations=400, repeats=3)


def _manifest_jobs(manifests: list[Path]) -> tuple[ProfileConfig, dict[str, dict[str, Any]]]:
    from emitter.errors import EmitterError
    from emitter.profile.runner import plan

    config = ProfileConfig(file="<confirm --tuning>", manifests=tuple(str(m) for m in manifests), problems=(),
                           timing=TUNING_TIMING)
    try:
        instances = plan(config).instances       # the profiler's own loading: the first manifest holding a name wins
    except EmitterError as e:
        raise ConfirmError(str(e)) from None
    return config, {i["entry"]["name"]: i for i in instances}


def _jobs(profile_dir: Path) -> tuple[ProfileConfig, dict[str, dict[str, Any]]]:
    jobs = sorted((profile_dir / "work").glob("shard*.job.json"))
    if not jobs:
        raise ConfirmError(f"{profile_dir / 'work'}: no worker jobs (shard*.job.json) to load the kernels from")
    job = json.loads(jobs[0].read_text(encoding="utf-8"))
    return ProfileConfig.from_json(job["config"]), {i["entry"]["name"]: i for i in job["instances"]}


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def run(profile_dir: Path | None, rounds: int = 5, backend: str = "pycuda", gpu: int = 0, resume: bool = False,
        engine_factory: Callable[[ProfileConfig, int], Any] | None = None,
        say: Callable[[str], None] | None = None,
        watch: Callable[[], dict[str, Any]] | None = None,
        grain: str = "launch", match: str | None = None, out: Path | None = None,
        tuning: Path | None = None, manifests: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Confirm every winner of `profile_dir` (see module doc); returns what confirm.json holds.

    grain: "launch" (the kernel and the baseline alternate launch by launch) or "round" (each side's whole
    measurement in turn, the method before 2026-11-24, to compare with); match: a regular expression that the
    row's "<op> <m>x<n>x<k>" must contain, to confirm some rows only; out: the output file (default
    PROFILE_DIR/confirm.json, which the benchmark report reads). With `tuning` (a tuning table) and `manifests`
    (where its kernels were emitted and built) in place of a profile directory, the table's entries are
    confirmed on the GPU at hand, with the benchmark's timing; `out` is then required."""
    if rounds < 1:
        raise ConfirmError(f"rounds must be at least 1 (got {rounds})")
    if grain not in METHODS:
        raise ConfirmError(f"grain must be one of {', '.join(METHODS)} (got {grain!r})")
    try:
        pattern = re.compile(match) if match else None
    except re.error as e:
        raise ConfirmError(f"--match {match!r} is not a regular expression: {e}") from None
    say = say or (lambda s: print(s, file=sys.stderr, flush=True))
    if (profile_dir is None) == (tuning is None):
        raise ConfirmError("give a profile directory, or a tuning table (--tuning) with its manifests (--manifest)")
    if tuning is not None and (not manifests or out is None):
        raise ConfirmError("--tuning needs --manifest (where its kernels were built) and --out")
    source = profile_dir / "profile.json" if profile_dir is not None else Path(tuning)
    found = winners(profile_dir) if profile_dir is not None else tuning_winners(Path(tuning))
    todo = [w for w in found if pattern is None or pattern.search(f"{w['op']} {_pkey(w)}")]
    if not todo:
        raise ConfirmError(f"no winner of {source} matches {match!r}")
    config, instances = _jobs(profile_dir) if profile_dir is not None else _manifest_jobs(list(manifests))
    config = config.replace(check=False)
    baseline = (config.baselines or ("cublas",))[0]
    out_path = Path(out) if out else profile_dir / CONFIRM_FILE
    done: dict[tuple, dict[str, Any]] = {}
    if resume and out_path.is_file():
        old = json.loads(out_path.read_text(encoding="utf-8"))
        if old.get("rounds") == rounds and old.get("method") == METHODS[grain]:
            done = {_key(r): r for r in old.get("rows", []) if r.get("status") == OK}
    result: dict[str, Any] = {"rounds": rounds, "method": METHODS[grain], "rows": []}
    if engine_factory is not None:
        engine = engine_factory(config, gpu)
    elif backend == "fake":
        from emitter.profile.worker import FakeEngine
        engine = FakeEngine(config, gpu)
    else:
        from emitter.profile.worker import GpuEngine
        engine = GpuEngine(config, gpu)
    loaded: dict[str, Any] = {}
    if watch is None:
        from emitter.profile.device import nvidia_smi, other_compute_processes

        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = int(visible) if visible.strip().isdigit() else gpu     # nvidia-smi counts physical GPUs

        def watch() -> dict[str, Any]:   # clock, power, temperature and other GPU processes, around each row
            return {"smi": nvidia_smi(index), "others": other_compute_processes(index)}
    for w in todo:
        if _key(w) in done:
            result["rows"].append(done[_key(w)])
            continue
        row = {**w, "status": OK, "reason": None}
        before = watch()
        try:
            row.update(_one(engine, config, instances, loaded, w, baseline, rounds, grain))
            after = watch()
            row["gpu"] = {"before": before["smi"], "after": after["smi"]}
            others = {p["pid"]: p for p in (before["others"] or []) + (after["others"] or [])}
            if others:   # another process had the GPU: its timings are not the card's
                row["shared_with"] = list(others.values())
                say(f"confirm: WARNING: {', '.join(p['pid'] + ' ' + p['name'] for p in others.values())} also "
                    f"on the GPU while {_pkey(w)} was timed: its ratio is not the card's")
        except Exception as e:      # noqa: BLE001 - recorded per row; a poisoned context ends the run below
            status, fatal = engine.classify(e)
            row.update(status=status, reason=_short(e))
            result["rows"].append(row)
            atomic_write_json(out_path, result)
            if fatal:
                say(f"confirm: CUDA fault on {w['kernel']} {_pkey(w)}: {row['reason']}; stopping (rerun with --resume)")
                break
            continue
        result["rows"].append(row)
        atomic_write_json(out_path, result)
        say(f"confirm {_pkey(w):>20} {w['op'][:28]:<28} ratio {row['ratio']:.3f} "
            f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]  {row['kernel_ms'] * 1e3:9.1f} us vs "
            f"{row['baseline_ms'] * 1e3:9.1f} us")
    atomic_write_json(out_path, result)
    return result


def _key(r: dict[str, Any]) -> tuple:
    return (r["op"], r["m"], r["n"], r["k"], r.get("batch", 1), r["kernel"], r["split_k"], r["options"])


def _pkey(w: dict[str, Any]) -> str:
    return f"{w['m']}x{w['n']}x{w['k']}" + (f"x{w['batch']}" if w.get("batch", 1) != 1 else "")


def _one(engine: Any, config: ProfileConfig, instances: dict[str, dict[str, Any]], loaded: dict[str, Any],
         w: dict[str, Any], baseline: str, rounds: int, grain: str = "launch") -> dict[str, Any]:
    inst = instances.get(w["kernel"])
    if inst is None:
        raise ConfirmError(f"{w['kernel']}: not among the profiled instances")
    if w["kernel"] not in loaded:
        loaded[w["kernel"]] = engine.load(Path(inst["root"]), inst["entry"])
    kernel = loaded[w["kernel"]]
    op = Op.from_config(inst["entry"]["config"])
    problem = Problem(w["m"], w["n"], w["k"], w.get("batch", 1))
    data = engine.prepare(op, problem)
    m = Measurement("kernel", w["kernel"], "emitter", op, problem, split_k=w["split_k"], options=w["options"])
    samples: list[list[float]] = []
    try:
        for r in range(rounds):
            if grain == "launch":
                k, b = engine.head_to_head(kernel, data, m, baseline)
                samples.append([k.median_ms, b.median_ms])
                continue
            pair: dict[str, float] = {}
            for who in (("baseline", "kernel") if r % 2 == 0 else ("kernel", "baseline")):
                got = engine.baseline(data, baseline) if who == "baseline" else engine.kernel(kernel, data, m)
                if not got.ok:
                    raise RuntimeError(f"{who} {got.status}: {got.reason}")
                pair[who] = got.stats.median_ms
            samples.append([pair["kernel"], pair["baseline"]])
    finally:
        try:
            engine.release(data)
        except Exception:       # noqa: BLE001
            pass
    ratios = [b / k for k, b in samples]
    return {"kernel_ms": _median([k for k, _ in samples]), "baseline_ms": _median([b for _, b in samples]),
            "ratio": _median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), "samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emitter.profile.confirm", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile_dir", type=Path, nargs="?",
                    help="an `emitter profile` output directory (profile.json, work/); or give --tuning")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per (op, problem) (default 5)")
    ap.add_argument("--backend", choices=("pycuda", "fake"), default="pycuda")
    ap.add_argument("--resume", action="store_true", help="keep the rows the output file already has")
    ap.add_argument("--grain", choices=sorted(METHODS), default="launch",
                    help="launch: kernel and baseline alternate launch by launch (default); round: each side's "
                         "whole measurement in turn (the method before 2026-11-24, to compare with)")
    ap.add_argument("--match", metavar="REGEX", help="confirm only the rows whose '<op> <m>x<n>x<k>' matches")
    ap.add_argument("--out", type=Path, help=f"output file (default PROFILE_DIR/{CONFIRM_FILE}, which the report reads)")
    ap.add_argument("--tuning", type=Path, help="confirm a tuning table's entries (tuning.json) instead of a profile's "
                                                "winners, on this GPU; needs --manifest and --out")
    ap.add_argument("--manifest", type=Path, action="append", default=[],
                    help="with --tuning: an emitted and built library (its directory or manifest.json); repeatable")
    a = ap.parse_args(argv)
    try:
        res = run(a.profile_dir, a.rounds, a.backend, resume=a.resume, grain=a.grain, match=a.match, out=a.out,
                  tuning=a.tuning, manifests=tuple(a.manifest))
    except ConfirmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = [r for r in res["rows"] if r["status"] != OK]
    print(f"confirmed {len(res['rows']) - len(bad)} of {len(res['rows'])} (op, problem) winners, "
          f"{res['rounds']} rounds each -> {a.out or a.profile_dir / CONFIRM_FILE}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
