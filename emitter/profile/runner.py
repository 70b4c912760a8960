"""Plan a profile (manifests x selection x problems), shard it over GPUs, run one worker process each.

Each GPU gets its own worker process (CUDA_VISIBLE_DEVICES=<index>), problems balanced by their FLOPs
(largest first, onto the least-loaded GPU; deterministic). A worker that dies (a CUDA fault poisons its
context, or a crash) is restarted without the kernel it was measuring on that problem; that kernel gets
a `fault` record. A worker that stops making progress for `stall_timeout_s` is killed the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emitter.errors import EmitterError, ManifestError
from emitter.families.registry import entry_family
from emitter.profile.config import ProfileConfig, problem_from_json, resolve_manifest
from emitter.profile.records import FAULT, Measurement, op_of
from emitter.profile.worker import EXIT_FAULT

MAX_RESTARTS = 16
FAULTS_BEFORE_DROP = 2


class ProfileError(EmitterError):
    exit_code = 1


@dataclass
class Plan:
    instances: list[dict[str, Any]]         # {"root", "manifest", "entry"}
    problems: list[Any]
    manifests: list[str]
    skipped: list[str] = field(default_factory=list)    # families left out, and why


def _profilable(family: str) -> str | None:
    """None when the family's run-time hooks provide profiling, else why not."""
    from emitter.families.base import PROFILE_HOOKS, VERIFY_HOOKS, FamilyNotRunnable
    from emitter.families.registry import runtime_family

    try:
        runtime_family(family, need=VERIFY_HOOKS + PROFILE_HOOKS)
    except (FamilyNotRunnable, ImportError, EmitterError) as e:
        return str(e)
    return None


def plan(config: ProfileConfig, select: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
         cwd: Path | None = None) -> Plan:
    from emitter.manifest import load
    from emitter.selection import select as select_entries

    instances: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    manifests = []
    profilable: dict[str, str | None] = {}
    skipped: list[str] = []
    for m in config.manifests:
        path = resolve_manifest(config, m, cwd)
        data = load(path)
        manifests.append(str(path))
        for e in data["instances"]:
            fam = entry_family(e)
            if fam not in profilable:
                profilable[fam] = _profilable(fam)
            if profilable[fam] is not None:      # a family without profile hooks: said once, not profiled
                why = f"{fam} instances are not profiled: {profilable[fam]}"
                if why not in skipped:
                    skipped.append(why)
                continue
            if e["name"] in seen:        # the same instance in two manifests: the first one wins
                continue
            seen[e["name"]] = str(path)
            instances.append({"root": str(path.parent), "manifest": str(path), "entry": e})
    # the config's selection first; a command line --select narrows it further (both must match)
    entries = select_entries([i["entry"] for i in instances], tuple(config.select), tuple(config.exclude))
    if select or exclude:
        entries = select_entries(entries, tuple(select), tuple(exclude))
    keep = {e["name"] for e in entries}
    chosen = [i for i in instances if i["entry"]["name"] in keep]
    if not chosen:
        more = "".join(f"\n  note: {w}" for w in skipped)
        raise ProfileError(f"no instance to profile: the manifests ({', '.join(manifests)}) hold {len(instances)} "
                           f"profilable instances and the selection keeps none\n  fix: check `select:` / --select, "
                           f"or run `emitter emit` for the specs you mean{more}")
    return Plan(chosen, list(config.problems), manifests, skipped)


def shard(problems: list[Any], n: int) -> list[list[Any]]:
    """Problems over n GPUs: largest first onto the least-loaded one (ties: lower index)."""
    shards: list[list[Any]] = [[] for _ in range(n)]
    load = [0.0] * n
    for p in sorted(problems, key=lambda p: (-p.flops, p.key)):
        i = min(range(n), key=lambda j: (load[j], j))
        shards[i].append(p)
        load[i] += _work(p)               # FLOPs + a fixed cost per problem (allocation, baseline, checks)
    order = {p: k for k, p in enumerate(problems)}
    return [sorted(s, key=lambda p: order[p]) for s in shards]


def _work(p: Any) -> float:
    return p.flops + 1e9                  # shard()'s estimate of a problem's profiling cost


def shard_balance(problems: list[Any], n: int) -> str | None:
    """One line on how shard() splits the estimated work over n GPUs (None for one GPU), and, where one problem
    holds more than a GPU's fair share, the speed-up bound that sets: a problem is the unit of sharding (its
    buffers, baseline and checks stay on one GPU), so n GPUs finish at most total / largest times sooner.
    Measured on 2 H100s (docs/scale-out.md): 16384^3 was 70% of a 9-problem set, and 2 GPUs took 84 s against
    108 s on one."""
    if n < 2 or not problems:
        return None
    total = sum(_work(p) for p in problems)
    parts = [sum(_work(p) for p in s) / total for s in shard(problems, n)]
    line = "estimated work a GPU: " + ", ".join(f"{100 * f:.0f}%" for f in parts)
    big = max(problems, key=lambda p: (_work(p), p.key))
    share = _work(big) / total
    if share > 1.0 / n * 1.05:
        line += (f"; {big.key} alone is {100 * share:.0f}% of it (a problem runs on one GPU), so {n} GPUs finish "
                 f"at most {1 / share:.2f}x sooner than one: add problems, or profile {big.key} by itself")
    return line


def resolve_gpus(config: ProfileConfig, override: str | None, backend: str) -> list[int]:
    from emitter.profile.device import device_count

    spec: Any = config.gpus
    if override:
        spec = "all" if override == "all" else (tuple(int(x) for x in override.split(",")) if "," in override
                                                 else int(override))
    if backend == "fake":
        count = spec if isinstance(spec, int) else (len(spec) if isinstance(spec, tuple) else 1)
        return list(range(count))
    available = device_count()
    if available == 0:
        raise ProfileError("no CUDA device visible (PyCUDA could not find a GPU)\n  fix: run on the GPU machine "
                           "with `pip install emitter[gpu]`, or replay recorded results with --replay")
    visible = list(range(available))
    env_vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [int(x) for x in env_vis.split(",") if x.strip().isdigit()] if env_vis else visible
    if len(physical) != available:
        physical = visible
    if spec == "all":
        return physical
    if isinstance(spec, int):
        return physical[:spec]
    bad = [i for i in spec if i >= available]
    if bad:
        raise ProfileError(f"gpus: device index {bad[0]} is not visible ({available} devices)")
    return [physical[i] for i in spec]


@dataclass
class RunOutcome:
    measurements: list[Measurement]
    envs: dict[int, dict[str, Any]]
    restarts: int = 0
    fatal: list[str] = field(default_factory=list)


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:      # a line cut by a crash
            pass
    return out


class _Shard:
    def __init__(self, index: int, gpu: int, problems: list[Any], work: Path, top: bool = False) -> None:
        self.index, self.gpu, self.problems, self.work = index, gpu, problems, work
        self.top = top                                   # scheduler `top`: variants are their own pass
        self.skip: list[list[str]] = []
        self.skip_variants: list[list[Any]] = []         # [kernel, problem, options] done in the second pass
        self.ranked: list[list[Any]] = []                # [op, problem, kernel, split, median] at options 0
        self.skip_baselines: list[list[str]] = []
        self.skip_names: list[str] = []
        self.best: dict[tuple[str, str], float] = {}     # (op, problem) -> best median so far (timing.prune)
        self.fault_count: dict[str, int] = {}
        self.attempt = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = work / f"shard{index}.jsonl"
        self.last_size = 0
        self.last_progress = time.monotonic()
        self.done = False

    def job(self, base: dict[str, Any]) -> dict[str, Any]:
        return {**base, "gpu": self.gpu, "problems": [p.as_dict() for p in self.problems], "out": str(self.log_path),
                "skip": self.skip, "skip_baselines": self.skip_baselines, "skip_names": self.skip_names,
                "skip_variants": self.skip_variants, "ranked": self.ranked,
                "best_known": [[o, p, t] for (o, p), t in sorted(self.best.items())]}

    def note(self, m: dict[str, Any]) -> None:
        """A logged measurement: not measured again; an ok one's median is the best so far to prune against."""
        pkey = problem_from_json(m["problem"]).key
        med = (m.get("stats") or {}).get("median_ms")
        if m["kind"] == "kernel":
            self.skip_kernel(m["name"], pkey, int(m.get("options") or 0))
            if self.top and not m.get("options") and m.get("status") == "ok" and med:
                self.ranked.append([m["op"]["key"], pkey, m["name"], int(m.get("split_k") or 1), float(med)])
        else:
            self.skip_baselines.append(["baseline", m["op"]["key"], pkey])
        if m.get("status") == "ok" and med:
            key = (m["op"]["key"], pkey)
            self.best[key] = min(self.best.get(key, med), float(med))

    def skip_kernel(self, name: str, pkey: str, options: int) -> None:
        """Not measured again: the kernel on the problem (with `top`, its first pass or its variants)."""
        if self.top and options:
            if [name, pkey, options] not in self.skip_variants:
                self.skip_variants.append([name, pkey, options])
        elif [name, pkey] not in self.skip:
            self.skip.append([name, pkey])


def run(config: ProfileConfig, the_plan: Plan, out_dir: Path, gpus: list[int], backend: str = "pycuda",
        faults: list[dict[str, Any]] | None = None, model: dict[str, Any] | None = None,
        stall_timeout_s: float = 300.0, isolate: bool = True, resume: bool = False,
        spawn: Any = None) -> RunOutcome:
    """Measure the plan on `gpus` (one worker process per GPU shard, restarted after faults). With `resume`,
    the measurements already in <out>/work from an earlier run of the same config and plan are kept and
    not taken again (a long sweep done in several sittings, or one that was cut short)."""
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    base = {"config": config.to_json(), "instances": the_plan.instances, "backend": backend}
    if faults:
        base["faults"] = faults
    if model:
        base["model"] = model
    top = bool(config.scheduler_top) and len(config.scheduler) > 1
    shards = [_Shard(i, g, ps, work, top) for i, (g, ps) in enumerate(zip(gpus, shard(the_plan.problems, len(gpus))))
              if ps]
    for s in shards:
        if resume:
            _resume(s, base, work)
        elif s.log_path.exists():
            s.log_path.unlink()
    restarts = 0
    fatal: list[str] = []

    if not isolate:     # tests: one in-process worker per shard, no restarts
        from emitter.profile.worker import run_job

        for s in shards:
            (work / f"shard{s.index}.job.json").write_text(json.dumps(s.job(base), indent=1), encoding="utf-8")
            run_job(s.job(base))
            s.done = True
    else:
        def start(s: _Shard) -> None:
            job_path = work / f"shard{s.index}.job.json"
            job_path.write_text(json.dumps(s.job(base), indent=1), encoding="utf-8")
            env = dict(os.environ)
            if backend != "fake":
                env["CUDA_VISIBLE_DEVICES"] = str(s.gpu)
                env.pop("CUDA_DEVICE", None)
            s.proc = spawn(s, job_path) if spawn else subprocess.Popen(    # spawn: ray_runner.py's GPU actors
                [sys.executable, "-m", "emitter.profile.worker", str(job_path)], env=env, stdin=subprocess.DEVNULL)
            s.last_progress = time.monotonic()
            s.attempt += 1

        for s in shards:
            start(s)
        while not all(s.done for s in shards):
            time.sleep(0.2)
            for s in shards:
                if s.done or s.proc is None:
                    continue
                size = s.log_path.stat().st_size if s.log_path.exists() else 0
                if size != s.last_size:
                    s.last_size, s.last_progress = size, time.monotonic()
                code = s.proc.poll()
                if code is None and time.monotonic() - s.last_progress > stall_timeout_s:
                    s.proc.kill()
                    s.proc.wait()
                    code = -9
                    _append(s.log_path, {"type": "stalled", "seconds": stall_timeout_s})
                if code is None:
                    continue
                records = _read_log(s.log_path)
                if any(r.get("type") == "done" for r in records) or code == 0:
                    s.done = True
                    continue
                if any(r.get("type") == "fatal" for r in records):
                    fatal += [f"gpu{s.gpu}: {r['reason']}" for r in records if r.get("type") == "fatal"]
                    s.done = True
                    continue
                culprit = _unfinished(records)
                recorded_fault = code == EXIT_FAULT and _last_result_fault(records)
                if (culprit is None and not recorded_fault) or restarts >= MAX_RESTARTS:
                    fatal.append(f"gpu{s.gpu}: worker exited with code {code}"
                                 + ("" if culprit else " outside any measurement"))
                    s.done = True
                    continue
                if culprit is None:     # the worker recorded its own fault before exiting
                    last = next(r["measurement"] for r in reversed(records) if r.get("type") == "result")
                    culprit = (last["kind"], last["name"], problem_from_json(last["problem"]).key, last["op"]["key"],
                               int(last.get("options") or 0))
                kind, name, pkey, okey, copts = culprit
                reason = ("the worker process died (exit code %s) while measuring it: a CUDA fault or a crash" % code
                          if code != -9 else f"no progress for {stall_timeout_s:.0f} s (a hang?): killed")
                problem = next((p for p in s.problems if p.key == pkey), None)
                op = _op_of(the_plan, name, okey)
                if problem is not None and op is not None and not _has_result(records, kind, name, pkey, okey):
                    _append(s.log_path, {"type": "result", "measurement": Measurement(
                        kind, name, "emitter" if kind == "kernel" else "cuBLAS via torch", op, problem, FAULT,
                        reason, s.gpu, _manifest_of(the_plan, name)).to_json()})
                if kind == "kernel":
                    s.skip_kernel(name, pkey, copts)
                    s.fault_count[name] = s.fault_count.get(name, 0) + 1
                    if s.fault_count[name] >= FAULTS_BEFORE_DROP and name not in s.skip_names:
                        s.skip_names.append(name)
                else:
                    s.skip_baselines.append(["baseline", okey, pkey])
                # results already recorded are not measured again
                for r in records:
                    if r.get("type") == "result":
                        s.note(r["measurement"])
                restarts += 1
                start(s)

    measurements: list[Measurement] = []
    envs: dict[int, dict[str, Any]] = {}
    seen: set[tuple] = set()
    for s in shards:
        for r in _read_log(s.log_path):
            if r.get("type") == "env":
                envs[s.gpu] = r["env"]
            elif r.get("type") == "result":
                m = Measurement.from_json(r["measurement"])
                key = (m.kind, m.label, m.op.key, m.problem.key)
                if key in seen:
                    continue
                seen.add(key)
                measurements.append(m)
            elif r.get("type") == "fatal":
                if f"gpu{s.gpu}: {r['reason']}" not in fatal:
                    fatal.append(f"gpu{s.gpu}: {r['reason']}")
    return RunOutcome(measurements, envs, restarts, fatal)


def _resume(s: "_Shard", base: dict[str, Any], work: Path) -> None:
    """Pre-fill a shard's skip lists from its log of an earlier run; refuse a log of another config/plan."""
    job_path = work / f"shard{s.index}.job.json"
    if not s.log_path.exists():
        return
    if job_path.exists():
        old = json.loads(job_path.read_text(encoding="utf-8"))
        def timing(t: dict[str, Any] | None) -> dict[str, Any]:    # prune decides what is timed, not how
            return {k: v for k, v in (t or {}).items() if k != "prune"}
        same = (old.get("config", {}).get("problems") == base["config"].get("problems")
                and timing(old.get("config", {}).get("timing")) == timing(base["config"].get("timing"))
                and sorted(i["entry"]["name"] for i in old.get("instances", []))
                == sorted(i["entry"]["name"] for i in base["instances"])
                and [p for p in old.get("problems", [])] == [p.as_dict() for p in s.problems])
        if not same:
            raise ProfileError(f"{work}: the recorded run measured other problems, kernels or timing than this "
                               "one\n  fix: drop --resume to start afresh, or give another output directory")
    for r in _read_log(s.log_path):
        if r.get("type") == "result":
            s.note(r["measurement"])


def outcome_from_logs(work: Path) -> tuple[RunOutcome, "ProfileConfig"]:
    """What a run's workers recorded, read back from its work directory (shard<i>.job.json + shard<i>.jsonl):
    the report of a run that was cut short (killed, machine lost) before it wrote profile.json. Every
    measurement a worker finished is in its log; one that was in flight is not."""
    jobs = sorted(work.glob("shard*.job.json"))
    if not jobs:
        raise ProfileError(f"{work}: no shard*.job.json here (a profile run's work/ directory has them)")
    config = None
    measurements: list[Measurement] = []
    envs: dict[int, dict[str, Any]] = {}
    seen: set[tuple] = set()
    for job_path in jobs:
        job = json.loads(job_path.read_text(encoding="utf-8"))
        config = config or ProfileConfig.from_json(job["config"])
        gpu = int(job.get("gpu", 0))
        for r in _read_log(job_path.with_name(job_path.name.replace(".job.json", ".jsonl"))):
            if r.get("type") == "env":
                envs[gpu] = r["env"]
            elif r.get("type") == "result":
                m = Measurement.from_json(r["measurement"])
                key = (m.kind, m.label, m.op.key, m.problem.key)
                if key not in seen:
                    seen.add(key)
                    measurements.append(m)
    assert config is not None
    return RunOutcome(measurements, envs), config


def _append(path: Path, obj: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, sort_keys=True) + "\n")


def _unfinished(records: list[dict[str, Any]]) -> tuple[str, str, str, str, int] | None:
    last = None
    for r in records:
        if r.get("type") == "start":
            last = r
        elif r.get("type") == "result" and last is not None:
            m = r["measurement"]
            if m["name"] == last["name"] and problem_from_json(m["problem"]).key == last["problem"]:
                last = None
    if last is None:
        return None
    return (last.get("kind", "kernel"), last["name"], last["problem"], last["op"], int(last.get("options") or 0))


def _last_result_fault(records: list[dict[str, Any]]) -> bool:
    for r in reversed(records):
        if r.get("type") == "result":
            return r["measurement"]["status"] == FAULT
    return False


def _has_result(records: list[dict[str, Any]], kind: str, name: str, pkey: str, okey: str) -> bool:
    for r in records:
        if r.get("type") == "result":
            m = r["measurement"]
            if m["kind"] == kind and m["name"] == name and m["op"]["key"] == okey and \
                    problem_from_json(m["problem"]).key == pkey:
                return True
    return False


def _op_of(the_plan: Plan, name: str, op_key: str) -> Any | None:
    for i in the_plan.instances:
        op = op_of(i["entry"])
        if op.key == op_key:
            return op
    return None


def _manifest_of(the_plan: Plan, name: str) -> str | None:
    for i in the_plan.instances:
        if i["entry"]["name"] == name:
            return i["manifest"]
    return None


def check_built(the_plan: Plan) -> list[str]:
    """Names of selected instances with no usable build (reported, and they fail as results)."""
    from emitter.runtime.backend import NotBuilt, build_record

    missing = []
    for i in the_plan.instances:
        try:
            build_record(Path(i["root"]), i["entry"]["name"])
        except NotBuilt:
            missing.append(i["entry"]["name"])
    return missing


__all__ = ["plan", "shard", "run", "resolve_gpus", "Plan", "RunOutcome", "ProfileError", "ManifestError"]
