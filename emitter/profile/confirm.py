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

With `candidates` K > 1 the sweep's choice is not taken as given: a sweep times each kernel alone, and at the
power cap those standalone times are off by up to 10% (2026-11-24, an H100: the sweep chose a 128x256 tile for bf16
512x14336x4096, 0.980x head to head, over a 128x112 tile that is 1.046x). Each (op, problem)'s K fastest kernels of
the sweep (distinct kernel, split-K count and options; only those within `within` of the fastest's median) are
each confirmed head to head, the one with the best ratio is chosen, and the chosen one is timed head to head once
more, `rounds` rounds: that fresh figure is the row's, so the figure that picked the kernel is not the figure
reported for it (the best of K noisy ratios is biased high). With one candidate in range there is nothing to pick
and no re-timing. The profile's tuning table (tuning.json) is then rewritten to follow the confirmed choices, each
entry with its head-to-head figure ("confirm"); the sweep's own table is kept as tuning.sweep.json.

Output (confirm.json, rewritten atomically after every (op, problem), so a run cut short keeps what it did and
`--resume` goes on): {"rounds": R, "method": ..., "candidates": K, "within": W, "rows": [{op, m, n, k, batch, kernel,
split_k, options, status, reason, kernel_ms, baseline_ms, ratio, ratio_min, ratio_max, samples: [[kernel_ms,
baseline_ms], ...], gpu: {before, after} (nvidia-smi readings), shared_with (only when another process was on the
GPU), sweep_kernel (the sweep's choice, when the row's kernel is another), candidates (K > 1: [{kernel, split_k,
options, sweep_ms, status, reason, kernel_ms, baseline_ms, ratio, ratio_min, ratio_max}], fastest in the sweep
first)}]}.
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
from emitter.profile.config import ProfileConfig, Timing, problem_from_json, problem_ident
from emitter.profile.records import OK, Measurement, launch_label, op_of
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


def candidates(profile_dir: Path, k: int, within: float) -> list[list[dict[str, Any]]]:
    """Per (op, problem) of profile.json, in winners()'s order: its sweep's winner, then the next fastest kernels
    that ran correctly (distinct kernel, split-K count and options) whose median is within `within` (a fraction)
    of the winner's, `k` in all at most. Each in winners()'s form, with its sweep median (sweep_ms)."""
    rows = json.loads((profile_dir / "profile.json").read_text(encoding="utf-8"))["rows"]
    out = []
    for w in winners(profile_dir):
        group = [r for r in rows if r["kind"] == "kernel" and r.get("status") == OK and r.get("median_ms")
                 and (r["op"], r["m"], r["n"], r["k"], r.get("batch", 1)) == (w["op"], w["m"], w["n"], w["k"], w["batch"])]
        ident = (w["kernel"], w["split_k"], w["options"])
        best = next((r for r in group if (r["name"], int(r.get("split_k") or 1), int(r.get("options") or 0)) == ident), None)
        first = {**w, "sweep_ms": best["median_ms"] if best else None}
        picked, seen = [first], {ident}
        limit = best["median_ms"] * (1.0 + within) if best else None
        for r in sorted(group, key=lambda r: (r["median_ms"], r["name"], r.get("split_k") or 1, r.get("options") or 0)):
            i = (r["name"], int(r.get("split_k") or 1), int(r.get("options") or 0))
            if len(picked) >= k or limit is None or r["median_ms"] > limit:
                break
            if i in seen:
                continue
            seen.add(i)
            picked.append({**w, "kernel": i[0], "split_k": i[1], "options": i[2], "sweep_ms": r["median_ms"]})
        out.append(picked)
    return out


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
        tuning: Path | None = None, manifests: tuple[Path, ...] = (), candidates_k: int = 1,
        within: float = 0.10) -> dict[str, Any]:
    """Confirm every winner of `profile_dir` (see module doc); returns what confirm.json holds.

    grain: "launch" (the kernel and the baseline alternate launch by launch) or "round" (each side's whole
    measurement in turn, the method before 2026-11-24, to compare with); match: a regular expression that the
    row's "<op> <m>x<n>x<k>" must contain, to confirm some rows only; out: the output file (default
    PROFILE_DIR/confirm.json, which the benchmark report reads). With `tuning` (a tuning table) and `manifests`
    (where its kernels were emitted and built) in place of a profile directory, the table's entries are
    confirmed on the GPU at hand, with the benchmark's timing; `out` is then required. candidates_k, within: the
    sweep's K fastest kernels within that fraction of the fastest are confirmed and the best is chosen (module
    doc); a profile directory only."""
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
    if candidates_k < 1 or within < 0:
        raise ConfirmError(f"candidates must be at least 1 and within at least 0 (got {candidates_k}, {within})")
    if tuning is not None and candidates_k > 1:
        raise ConfirmError("--candidates needs a profile directory: a tuning table holds one kernel per problem")
    source = profile_dir / "profile.json" if profile_dir is not None else Path(tuning)
    if profile_dir is not None and candidates_k > 1:
        found_groups = candidates(profile_dir, candidates_k, within)
    else:
        found_groups = [[w] for w in (winners(profile_dir) if profile_dir is not None else tuning_winners(Path(tuning)))]
    todo = [g for g in found_groups if pattern is None or pattern.search(f"{g[0]['op']} {_pkey(g[0])}")]
    if not todo:
        raise ConfirmError(f"no winner of {source} matches {match!r}")
    config, instances = _jobs(profile_dir) if profile_dir is not None else _manifest_jobs(list(manifests))
    config = config.replace(check=False)
    baseline = (config.baselines or ("cublas",))[0]
    out_path = Path(out) if out else profile_dir / CONFIRM_FILE
    done: dict[tuple, dict[str, Any]] = {}
    if resume and out_path.is_file():
        old = json.loads(out_path.read_text(encoding="utf-8"))
        if (old.get("rounds") == rounds and old.get("method") == METHODS[grain]
                and old.get("candidates", 1) == candidates_k and old.get("within", within) == within):
            done = {_key(r.get("sweep_kernel", r)) if candidates_k == 1 else _gkey(r): r
                    for r in old.get("rows", []) if r.get("status") == OK}
    result: dict[str, Any] = {"rounds": rounds, "method": METHODS[grain], "candidates": candidates_k,
                              "within": within, "rows": []}
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
    for group in todo:
        w = group[0]
        key = _key(w) if candidates_k == 1 else _gkey(w)
        if key in done:
            result["rows"].append(done[key])
            continue
        row = {**_ident(w), "status": OK, "reason": None}
        before = watch()
        try:
            if len(group) == 1:
                row.update(_one(engine, config, instances, loaded, w, baseline, rounds, grain))
            else:
                row = _choose(engine, config, instances, loaded, group, baseline, rounds, grain, say)
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
            f"{row['baseline_ms'] * 1e3:9.1f} us" + (f"  (chose {_what(row)} over the sweep's "
                                                     f"{_what(row['sweep_kernel'])})" if "sweep_kernel" in row else ""))
    atomic_write_json(out_path, result)
    if profile_dir is not None and out is None:
        write_tuning(profile_dir, result)
    return result


def _what(w: dict[str, Any]) -> str:
    return launch_label(w["kernel"], w["split_k"], w["options"])


def _ident(w: dict[str, Any]) -> dict[str, Any]:
    return {k: w[k] for k in ("op", "m", "n", "k", "batch", "kernel", "split_k", "options")}


def _gkey(r: dict[str, Any]) -> tuple:
    return (r["op"], r["m"], r["n"], r["k"], r.get("batch", 1))


def _choose(engine: Any, config: ProfileConfig, instances: dict[str, dict[str, Any]], loaded: dict[str, Any],
            group: list[dict[str, Any]], baseline: str, rounds: int, grain: str,
            say: Callable[[str], None]) -> dict[str, Any]:
    """Each candidate of `group` head to head with the baseline; the best ratio is chosen and timed again (its
    row's figures are that second timing's). A candidate that fails is recorded and passed over; a CUDA fault,
    or every candidate failing, raises (the sweep's winner's error)."""
    tried: list[dict[str, Any]] = []
    first_error: BaseException | None = None
    for c in group:
        entry = {**{k: c[k] for k in ("kernel", "split_k", "options")}, "sweep_ms": c.get("sweep_ms"),
                 "status": OK, "reason": None}
        try:
            fig = _one(engine, config, instances, loaded, c, baseline, rounds, grain)
        except Exception as e:      # noqa: BLE001 - a fault ends the group (and the run); others pass it over
            status, fatal = engine.classify(e)
            if fatal:
                raise
            first_error = first_error or e
            entry.update(status=status, reason=_short(e))
        else:
            entry.update({k: v for k, v in fig.items() if k != "samples"})
            say(f"  candidate {_pkey(c):>20} {_what(c)[-70:]:<70} ratio {fig['ratio']:.3f}")
        tried.append(entry)
    ok = [t for t in tried if t["status"] == OK]
    if not ok:
        assert first_error is not None
        raise first_error
    pick = max(ok, key=lambda t: t["ratio"])          # max() keeps the first of equals: the sweep's order
    chosen = {**group[0], "kernel": pick["kernel"], "split_k": pick["split_k"], "options": pick["options"]}
    row = {**_ident(chosen), "status": OK, "reason": None}
    row.update(_one(engine, config, instances, loaded, chosen, baseline, rounds, grain))
    if (pick["kernel"], pick["split_k"], pick["options"]) != (group[0]["kernel"], group[0]["split_k"], group[0]["options"]):
        row["sweep_kernel"] = {k: group[0][k] for k in ("kernel", "split_k", "options")}
    row["candidates"] = tried
    return row


def write_tuning(profile_dir: Path, result: dict[str, Any]) -> Path:
    """Rewrites PROFILE_DIR/tuning.json to follow the confirmed choices of `result` (a kernel the confirmation
    chose over the sweep's replaces it), each entry with its head-to-head figure under "confirm"; the sweep's
    own table is kept as tuning.sweep.json (written once, so a second confirmation does not overwrite it)."""
    from dataclasses import replace

    from emitter.version import __version__
    from emitter.profile.report import build, from_json
    from emitter.profile.selection import group_key, tuning_table

    data = json.loads((profile_dir / "profile.json").read_text(encoding="utf-8"))
    measurements, envs, config = from_json(data)
    report = build(measurements, envs, config)
    tuning_path = profile_dir / config.output.tuning
    kept = profile_dir / (Path(config.output.tuning).stem + ".sweep.json")
    if tuning_path.is_file() and not kept.is_file():
        atomic_write_json(kept, json.loads(tuning_path.read_text(encoding="utf-8")))
    by_ident = {(m.op.key, problem_ident(m.problem), m.name, m.split_k, m.options): m
                for m in measurements if m.kind == "kernel" and m.ok}
    confirmed: dict[tuple, dict[str, Any]] = {}
    choices = dict(report.choices)
    for r in result["rows"]:
        if r.get("status") != OK:
            continue
        gk = (r["op"], (r["m"], r["n"], r["k"], r.get("batch", 1)))
        m = by_ident.get((*gk, r["kernel"], r["split_k"], r["options"]))
        if m is None or gk not in choices:
            continue
        if choices[gk].winner is not m:
            choices[gk] = replace(choices[gk], winner=m)
        confirmed[gk] = {"ratio": r["ratio"], "ratio_min": r["ratio_min"], "ratio_max": r["ratio_max"],
                         "kernel_ms": r["kernel_ms"], "baseline_ms": r["baseline_ms"], "rounds": result["rounds"],
                         "method": result["method"], "candidates": len(r.get("candidates") or [1]),
                         **({"sweep_kernel": r["sweep_kernel"]} if "sweep_kernel" in r else {})}
    table = tuning_table(choices, report.figures, {**report.env, "emitter_version": __version__},
                         config.tie_tolerance)
    for e in table["entries"]:
        p = e["problem"]
        c = confirmed.get((e["op"]["key"], (p["m"], p["n"], p["k"], p.get("batch", 1))))
        if c:
            e["confirm"] = c
    atomic_write_json(tuning_path, table)
    return tuning_path


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
    op = op_of(inst["entry"])
    problem = problem_from_json({"m": w["m"], "n": w["n"], "k": w["k"], "batch": w.get("batch", 1)})
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
    ap.add_argument("--candidates", type=int, default=1, metavar="K",
                    help="confirm each problem's K fastest kernels of the sweep and keep the best head to head "
                         "(default 1: the sweep's winner only)")
    ap.add_argument("--within", type=float, default=0.10, metavar="FRACTION",
                    help="with --candidates: only kernels whose sweep median is within this fraction of the "
                         "fastest's (default 0.10)")
    ap.add_argument("--manifest", type=Path, action="append", default=[],
                    help="with --tuning: an emitted and built library (its directory or manifest.json); repeatable")
    a = ap.parse_args(argv)
    try:
        res = run(a.profile_dir, a.rounds, a.backend, resume=a.resume, grain=a.grain, match=a.match, out=a.out,
                  tuning=a.tuning, manifests=tuple(a.manifest), candidates_k=a.candidates, within=a.within)
    except ConfirmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = [r for r in res["rows"] if r["status"] != OK]
    print(f"confirmed {len(res['rows']) - len(bad)} of {len(res['rows'])} (op, problem) winners, "
          f"{res['rounds']} rounds each -> {a.out or a.profile_dir / CONFIRM_FILE}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
