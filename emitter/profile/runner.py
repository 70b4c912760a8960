"""Plan a profile (manifests x selection x problems) and run it on GPUs: one worker process per GPU, fed from one queue.

Each GPU gets its own worker process (CUDA_VISIBLE_DEVICES=<index>). The problems wait in one queue, the
largest estimated cost first (emitter/profile/cost.py: seconds measured by an earlier run, else a model of
FLOPs x measurements); a worker that finishes a problem is handed the next (LPT list scheduling), so the GPUs
finish close together whatever the problems cost. A problem is the unit of work: its operand sets, baselines,
checks and pruning stay on one GPU, so what is measured, and the winners, do not depend on the split.

A worker that dies (a CUDA fault poisons its context, or a crash) loses only the measurement in flight: that
kernel gets a `fault` record, the rest of its problem goes back to the head of the queue, for another GPU when
one is running, and the worker is restarted to take the next; a kernel that faults twice is not measured on
further problems. A worker that stops making progress for `stall_timeout_s` is killed the same way. The run's
events (which GPU, which problem, re-queued or lost) are in RunOutcome.run and profile.json's `run`.
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
from emitter.profile.cost import Estimate, balance_line, estimate, lpt, model_seconds, queue_order
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


def _flops_estimate(problems: list[Any]) -> Estimate:
    """The model's seconds for problems alone (one measurement each): the order FLOPs give, without a plan."""
    from emitter.profile.config import Timing

    return Estimate({p.key: model_seconds(p, 1, Timing()) for p in problems}, {p.key: "model" for p in problems})


def shard(problems: list[Any], n: int, est: Estimate | None = None) -> list[list[Any]]:
    """Problems over n GPUs as the queue would hand them out if every estimate were exact (largest first, to the
    GPU free first; ties: lower index), each GPU's in plan order. The in-process runner (isolate=False) uses it;
    worker processes take from the queue itself. `est`: the estimate (default: the model on FLOPs alone)."""
    shards, _load = lpt(problems, n, est or _flops_estimate(problems))
    order = {p: k for k, p in enumerate(problems)}
    return [sorted(s, key=lambda p: order[p]) for s in shards]


def shard_balance(problems: list[Any], n: int, est: Estimate | None = None) -> str | None:
    """One line on how the queue is expected to split the estimated work over n GPUs (None for one GPU), and,
    where one problem holds more than a GPU's fair share, the speed-up bound that sets: a problem is the unit of
    work (its buffers, baseline, checks and pruning stay on one GPU), so n GPUs finish at most total / largest
    times sooner. Measured on 2 H100s (docs/scale-out.md): 16384^3 was 70% of a 9-problem set, and 2 GPUs took
    84 s against 108 s on one."""
    return balance_line(problems, n, est or _flops_estimate(problems))


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
    # how the work went: per GPU busy / start-up seconds and problems, per problem wall seconds and estimate,
    # the events of the fault path (profile.json's `run`; its problems' wall_s feed the next run's --cost-from)
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> list[str]:
        return list(self.run.get("events", []))


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


class _Item:
    """One problem in the queue, with what is known of it from earlier attempts (on any GPU)."""

    def __init__(self, problem: Any, cost: float, source: str, top: bool) -> None:
        self.problem, self.cost, self.source, self.top = problem, cost, source, top
        self.key: str = problem.key
        self.skip: list[list[str]] = []
        self.skip_variants: list[list[Any]] = []         # [kernel, problem, options] done in the second pass
        self.ranked: list[list[Any]] = []                # [op, problem, kernel, split, median] at options 0
        self.skip_baselines: list[list[str]] = []
        self.best: dict[tuple[str, str], float] = {}     # (op, problem) -> best median so far (timing.prune)
        self.died_on: list[int] = []                     # GPUs whose worker died on it
        self.outside: int = 0                            # deaths outside any measurement (a second one: lost)
        self.gpus: list[int] = []                        # GPUs that took it, in order
        self.wall_s = 0.0                                # seconds it held a GPU, all attempts
        self.done = False
        self.lost: str | None = None

    def note(self, m: dict[str, Any]) -> None:
        """A logged measurement: not measured again; an ok one's median is the best so far to prune against."""
        pkey = problem_from_json(m["problem"]).key
        med = (m.get("stats") or {}).get("median_ms")
        if m["kind"] == "kernel":
            self.skip_kernel(m["name"], pkey, int(m.get("options") or 0))
            row = [m["op"]["key"], pkey, m["name"], int(m.get("split_k") or 1), float(med or 0)]
            if self.top and not m.get("options") and m.get("status") == "ok" and med and row not in self.ranked:
                self.ranked.append(row)
        elif ["baseline", m["op"]["key"], pkey] not in self.skip_baselines:
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

    def message(self, skip_names: list[str]) -> dict[str, Any]:
        """The queue item a worker reads (worker.py's module doc)."""
        return {"problem": self.problem.as_dict(), "skip": self.skip, "skip_baselines": self.skip_baselines,
                "skip_variants": self.skip_variants, "ranked": self.ranked, "skip_names": list(skip_names),
                "best_known": [[o, p, t] for (o, p), t in sorted(self.best.items())]}


class _LocalProc:
    """A local worker process as runner.run drives it: poll / kill / wait, and its queue on stdin."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.p = popen

    def poll(self) -> int | None:
        return self.p.poll()

    def kill(self) -> None:
        self.p.kill()

    def wait(self, timeout: float | None = None) -> int:
        return self.p.wait(timeout)

    def send(self, text: str) -> None:
        try:
            assert self.p.stdin is not None
            self.p.stdin.write(text.encode("utf-8"))
            self.p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):     # the worker died: poll() says so next
            pass

    def close_input(self) -> None:
        try:
            if self.p.stdin is not None:
                self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass


class _Slot:
    """One GPU's worker (restarted after faults) and its log, work/shard<index>.jsonl."""

    def __init__(self, index: int, gpu: int, work: Path) -> None:
        self.index, self.gpu, self.work = index, gpu, work
        self.log_path = work / f"shard{index}.jsonl"
        self.proc: Any = None
        self.attempt = 0
        self.offset = 0                    # bytes of the log read so far
        self.attempt_offset = 0            # where this attempt's records begin
        self.last_progress = time.monotonic()
        self.spawned_at = time.monotonic()
        self.ready = False                 # the worker wrote its env record
        self.current: _Item | None = None
        self.handed_at = 0.0
        self.busy_s = 0.0
        self.startup_s = 0.0
        self.taken: list[str] = []         # problem keys handed to it, in order
        self.stalled = False               # the runner killed its worker for want of progress
        self.early_deaths = 0              # deaths in a row before the worker wrote its env record
        self.done = False

    def tail(self) -> list[dict[str, Any]]:
        """The log's complete lines since the last call."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in data[:end + 1].decode("utf-8", "replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    def since_spawn(self) -> list[dict[str, Any]]:
        """This attempt's records (a death is judged by them, not by an earlier attempt's or sitting's)."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(self.attempt_offset)
            data = f.read()
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out


def run(config: ProfileConfig, the_plan: Plan, out_dir: Path, gpus: list[int], backend: str = "pycuda",
        faults: list[dict[str, Any]] | None = None, model: dict[str, Any] | None = None,
        stall_timeout_s: float = 300.0, isolate: bool = True, resume: bool = False,
        spawn: Any = None, cost: Estimate | None = None) -> RunOutcome:
    """Measure the plan on `gpus`: one worker process per GPU, each taking the next problem from one queue (the
    largest estimated cost first, `cost`: emitter.profile.cost.estimate, default the model) when it finishes
    one, restarted after faults. With `resume`, the measurements already in <out>/work from an earlier run of
    the same config and plan are kept and not taken again (a long sweep done in several sittings, or one that
    was cut short). `spawn(slot, job_path)`: where a worker runs (ray_runner.py's GPU actors)."""
    t_run = time.monotonic()
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    base = {"config": config.to_json(), "instances": the_plan.instances, "backend": backend}
    if faults:
        base["faults"] = faults
    if model:
        base["model"] = model
    est = cost or estimate(the_plan, config)
    top = bool(config.scheduler_top) and len(config.scheduler) > 1
    items = {p.key: _Item(p, est.of(p), est.source.get(p.key, "model"), top) for p in the_plan.problems}
    if resume:
        _resume(items, base, the_plan, work)
    else:
        for old in list(work.glob("shard*.jsonl")) + list(work.glob("shard*.job.json")):
            old.unlink()
    events: list[str] = []
    fatal: list[str] = []
    restarts = 0
    todo = [items[p.key] for p in queue_order(the_plan.problems, est) if not items[p.key].done]
    slots = [_Slot(i, g, work) for i, g in enumerate(gpus[:max(len(todo), 1)])] if todo else []
    schedule = "queue, largest estimated cost first"

    if not isolate:     # tests: one in-process worker a GPU, the queue's schedule fixed up front, no restarts
        from emitter.profile.worker import run_job

        schedule = "in-process, the queue's schedule from the estimates"
        for s, ps in zip(slots, shard([i.problem for i in todo], len(slots), est)):
            if not ps:
                continue
            job = {**base, "gpu": s.gpu, "problems": [p.as_dict() for p in ps], "out": str(s.log_path)}
            for key in ("skip", "skip_baselines", "skip_variants", "ranked"):
                job[key] = [x for p in ps for x in getattr(items[p.key], key)]
            job["best_known"] = [x for p in ps for x in items[p.key].message([])["best_known"]]
            (work / f"shard{s.index}.job.json").write_text(json.dumps(job, indent=1), encoding="utf-8")
            s.taken = [p.key for p in ps]
            s.offset = s.log_path.stat().st_size if s.log_path.exists() else 0
            t0 = time.monotonic()
            run_job(job)
            s.busy_s = time.monotonic() - t0
            for r in s.tail():
                if r.get("type") == "problem_done" and r.get("problem") in items:
                    items[r["problem"]].done = True
                    items[r["problem"]].wall_s += float(r.get("wall_s") or 0)
                    items[r["problem"]].gpus.append(s.gpu)
            s.done = True
    else:
        restarts = _run_queue(slots, todo, items, base, the_plan, work, backend, stall_timeout_s, spawn, events,
                              fatal)

    measurements, envs = _merge(work)
    for k, it in items.items():
        if not it.done and not it.lost and slots:
            it.lost = "not finished: no worker was left to take it"
            events.append(f"{k}: {it.lost}")
    lost = [k for k, it in items.items() if it.lost]
    if lost:
        fatal.append(f"{len(lost)} problem(s) not finished: {', '.join(lost)} (see the run's events)")
    info = {
        "schedule": schedule, "gpus": list(gpus), "wall_s": round(time.monotonic() - t_run, 3),
        "estimate": {"from": est.prior or "model", "notes": est.notes},
        "per_gpu": {str(s.gpu): {"busy_s": round(s.busy_s, 3), "startup_s": round(s.startup_s, 3),
                                 "problems": len(s.taken), "taken": s.taken,
                                 "estimated_s": round(sum(items[k].cost for k in s.taken), 3)} for s in slots},
        "problems": [{"problem": it.key, "family": getattr(it.problem, "FAMILY", None), "gpus": it.gpus,
                      "wall_s": round(it.wall_s, 4) if it.done else None, "estimate_s": round(it.cost, 4),
                      "estimate_from": it.source, **({"lost": it.lost} if it.lost else {})}
                     for it in (items[p.key] for p in the_plan.problems)],
        "restarts": restarts, "events": events,
    }
    return RunOutcome(measurements, envs, restarts, fatal, info)


def _run_queue(slots: list[_Slot], queue: list[_Item], items: dict[str, _Item], base: dict[str, Any],
               the_plan: Plan, work: Path, backend: str, stall_timeout_s: float, spawn: Any, events: list[str],
               fatal: list[str]) -> int:
    """The queue loop: each worker that is free takes the next item; deaths are recorded and the rest of the
    problem goes back to the queue (to another GPU when there is one). Returns the restart count."""
    skip_names: list[str] = []
    fault_count: dict[str, int] = {}
    restarts = 0
    closing = False
    all_problems = [p.as_dict() for p in the_plan.problems]

    def start(s: _Slot) -> None:
        job_path = work / f"shard{s.index}.job.json"
        job = {**base, "gpu": s.gpu, "problems": all_problems, "out": str(s.log_path), "queue": True,
               "skip_names": list(skip_names)}
        job_path.write_text(json.dumps(job, indent=1), encoding="utf-8")
        env = dict(os.environ)
        if backend != "fake":
            env["CUDA_VISIBLE_DEVICES"] = str(s.gpu)
            env.pop("CUDA_DEVICE", None)
        s.attempt_offset = s.log_path.stat().st_size if s.log_path.exists() else 0
        s.offset = s.attempt_offset
        s.proc = spawn(s, job_path) if spawn else _LocalProc(subprocess.Popen(
            [sys.executable, "-m", "emitter.profile.worker", str(job_path)], env=env, stdin=subprocess.PIPE))
        s.spawned_at = s.last_progress = time.monotonic()
        s.ready = False
        s.attempt += 1

    def live() -> list[_Slot]:
        return [s for s in slots if not s.done]

    def take(s: _Slot) -> _Item | None:
        """The first queued item for this GPU: one whose worker did not die here, unless it died on every GPU
        still running."""
        others = [o.gpu for o in live()]
        for it in queue:
            if s.gpu not in it.died_on or all(g in it.died_on for g in others):
                return it
        return None

    def hand(s: _Slot, it: _Item) -> None:
        queue.remove(it)
        it.gpus.append(s.gpu)
        s.current, s.handed_at, s.last_progress = it, time.monotonic(), time.monotonic()
        s.taken.append(it.key)
        s.proc.send(json.dumps(it.message(skip_names)) + "\n")

    def put_back(s: _Slot, died: bool) -> None:
        """The slot's item returns to the head of the queue (its measurements so far kept)."""
        it = s.current
        if it is None:
            return
        spent = time.monotonic() - s.handed_at
        it.wall_s += spent
        s.busy_s += spent
        s.current = None
        if died:
            it.died_on.append(s.gpu)
        if not it.lost:
            queue.insert(0, it)

    def read(s: _Slot) -> None:
        records = s.tail()
        if records:
            s.last_progress = time.monotonic()
        for r in records:
            t = r.get("type")
            if t == "env" and not s.ready:
                s.ready, s.early_deaths = True, 0
                s.startup_s += time.monotonic() - s.spawned_at
                if s.current is not None:          # handed out at the spawn: its time starts now
                    s.handed_at = time.monotonic()
            elif t == "result":
                m = r["measurement"]
                it = items.get(problem_from_json(m["problem"]).key)
                if it is not None:
                    it.note(m)
            elif t == "problem_done" and s.current is not None and r.get("problem") == s.current.key:
                it = s.current
                it.done = True
                it.wall_s += float(r.get("wall_s") or 0)
                s.busy_s += time.monotonic() - s.handed_at
                s.current = None

    def exited(s: _Slot, code: int) -> None:
        nonlocal restarts
        read(s)
        records = s.since_spawn()
        if any(r.get("type") == "done" for r in records) or (code == 0 and s.current is None):
            s.done = True
            return
        if closing and s.current is None:
            s.done = True                          # nothing in flight: nothing lost
            return
        if any(r.get("type") == "fatal" for r in records):
            fatal.extend(f"gpu{s.gpu}: {r['reason']}" for r in records if r.get("type") == "fatal")
            put_back(s, died=False)
            s.done = True
            events.append(f"gpu{s.gpu}: the worker could not start; its GPU takes no more work")
            return
        culprit = _unfinished(records)
        recorded_fault = code == EXIT_FAULT and _last_result_fault(records)
        if restarts >= MAX_RESTARTS:
            fatal.append(f"gpu{s.gpu}: worker exited with code {code}; {MAX_RESTARTS} restarts already, no more")
            put_back(s, died=True)
            s.done = True
            return
        if culprit is None and not recorded_fault:
            if not s.ready:                        # died while starting: once may be chance, twice is the GPU
                s.early_deaths += 1
                put_back(s, died=False)
                if s.early_deaths >= 2:
                    fatal.append(f"gpu{s.gpu}: worker exited with code {code} before it started, twice")
                    events.append(f"gpu{s.gpu}: the worker died twice while starting; its GPU takes no more work")
                    s.done = True
                    return
                events.append(f"gpu{s.gpu}: the worker died (exit code {code}) while starting; restarted")
                restarts += 1
                start(s)
                return
            it = s.current
            if it is not None:
                it.outside += 1
                if it.outside >= 2:
                    it.lost = (f"the worker died outside any measurement on it twice (last: gpu{s.gpu}, exit code "
                               f"{code}): not taken again")
                    events.append(f"gpu{s.gpu}: {it.key} lost: {it.lost}")
                else:
                    events.append(f"gpu{s.gpu}: the worker died (exit code {code}) on {it.key} outside any "
                                  "measurement; the problem goes back to the queue")
            else:
                events.append(f"gpu{s.gpu}: the worker died (exit code {code}) between problems; restarted")
            put_back(s, died=True)
            restarts += 1
            start(s)
            return
        if culprit is None:     # the worker recorded its own fault before exiting
            last = next(r["measurement"] for r in reversed(records) if r.get("type") == "result")
            culprit = (last["kind"], last["name"], problem_from_json(last["problem"]).key, last["op"]["key"],
                       int(last.get("options") or 0))
        kind, name, pkey, okey, copts = culprit
        stalled, s.stalled = s.stalled, False
        reason = ("the worker process died (exit code %s) while measuring it: a CUDA fault, a crash or a kill" % code
                  if not stalled else f"no progress for {stall_timeout_s:.0f} s (a hang?): killed")
        it = items.get(pkey)
        op = _op_of(the_plan, name, okey)
        if it is not None and op is not None and not _has_result(records, kind, name, pkey, okey):
            fault = Measurement(kind, name, "emitter" if kind == "kernel" else "cuBLAS via torch", op, it.problem,
                                FAULT, reason, s.gpu, _manifest_of(the_plan, name)).to_json()
            _append(s.log_path, {"type": "result", "measurement": fault})
        read(s)                                    # the fault record: noted, so it is not measured again
        if it is not None:
            if kind == "kernel":
                it.skip_kernel(name, pkey, copts)
            elif ["baseline", okey, pkey] not in it.skip_baselines:
                it.skip_baselines.append(["baseline", okey, pkey])
        if kind == "kernel":
            fault_count[name] = fault_count.get(name, 0) + 1
            if fault_count[name] >= FAULTS_BEFORE_DROP and name not in skip_names:
                skip_names.append(name)
                events.append(f"{name}: faulted {fault_count[name]} times; not measured on further problems")
        where = s.current.key if s.current is not None else None
        what = "was killed after no progress" if stalled else f"died (exit code {code})"
        if where is not None:
            others = [o.gpu for o in live() if o is not s]
            events.append(f"gpu{s.gpu}: the worker {what} measuring {name} on {pkey}: recorded as a fault; the rest "
                          f"of {where} went back to the queue" + (" for another GPU" if others else ""))
        else:
            events.append(f"gpu{s.gpu}: the worker {what} measuring {name} on {pkey}: recorded as a fault")
        put_back(s, died=where == pkey)      # a kernel that failed to load is not the problem's doing
        restarts += 1
        start(s)

    for s in slots:
        start(s)
    while live():
        for s in slots:
            if s.done or s.proc is None:
                continue
            code = s.proc.poll()
            read(s)
            if code is None and s.current is not None and time.monotonic() - s.last_progress > stall_timeout_s:
                s.proc.kill()
                s.proc.wait()
                code = -9
                s.stalled = True
                _append(s.log_path, {"type": "stalled", "seconds": stall_timeout_s})
            if code is not None:
                exited(s, code)
                continue
            if s.current is None and not closing:
                it = take(s)
                if it is not None:
                    hand(s, it)
        if not closing and not queue and all(s.current is None for s in live()):
            closing = True                         # nothing queued, nothing in flight: the workers may end
            for s in live():
                s.proc.close_input()
        time.sleep(0.05)
    return restarts


def _merge(work: Path) -> tuple[list[Measurement], dict[int, dict[str, Any]]]:
    """Every worker log of the work directory: the measurements (a launch's first record kept) and each GPU's env."""
    measurements: list[Measurement] = []
    envs: dict[int, dict[str, Any]] = {}
    seen: set[tuple] = set()
    for job_path in sorted(work.glob("shard*.job.json"), key=lambda p: (len(p.name), p.name)):
        job = json.loads(job_path.read_text(encoding="utf-8"))
        gpu = int(job.get("gpu", 0))
        for r in _read_log(job_path.with_name(job_path.name.replace(".job.json", ".jsonl"))):
            if r.get("type") == "env":
                envs[int(r.get("gpu", gpu))] = r["env"]
            elif r.get("type") == "result":
                m = Measurement.from_json(r["measurement"])
                key = (m.kind, m.label, m.op.key, m.problem.key)
                if key not in seen:
                    seen.add(key)
                    measurements.append(m)
    return measurements, envs


def _resume(items: dict[str, _Item], base: dict[str, Any], the_plan: Plan, work: Path) -> None:
    """What the work directory's logs of an earlier run hold: measurements not taken again, problems finished
    not queued again; a log of another config or plan is refused."""
    for job_path in sorted(work.glob("shard*.job.json")):
        old = json.loads(job_path.read_text(encoding="utf-8"))

        def timing(t: dict[str, Any] | None) -> dict[str, Any]:    # prune decides what is timed, not how
            return {k: v for k, v in (t or {}).items() if k != "prune"}
        same = (old.get("config", {}).get("problems") == base["config"].get("problems")
                and timing(old.get("config", {}).get("timing")) == timing(base["config"].get("timing"))
                and sorted(i["entry"]["name"] for i in old.get("instances", []))
                == sorted(i["entry"]["name"] for i in base["instances"]))
        if not same:
            raise ProfileError(f"{work}: the recorded run measured other problems, kernels or timing than this "
                               "one\n  fix: drop --resume to start afresh, or give another output directory")
    for log in sorted(work.glob("shard*.jsonl")):
        for r in _read_log(log):
            if r.get("type") == "result":
                it = items.get(problem_from_json(r["measurement"]["problem"]).key)
                if it is not None:
                    it.note(r["measurement"])
            elif r.get("type") == "problem_done" and r.get("problem") in items:
                items[r["problem"]].done = True
                items[r["problem"]].wall_s += float(r.get("wall_s") or 0)


def outcome_from_logs(work: Path) -> tuple[RunOutcome, "ProfileConfig"]:
    """What a run's workers recorded, read back from its work directory (shard<i>.job.json + shard<i>.jsonl):
    the report of a run that was cut short (killed, machine lost) before it wrote profile.json. Every
    measurement a worker finished is in its log; one that was in flight is not."""
    jobs = sorted(work.glob("shard*.job.json"))
    if not jobs:
        raise ProfileError(f"{work}: no shard*.job.json here (a profile run's work/ directory has them)")
    config = ProfileConfig.from_json(json.loads(jobs[0].read_text(encoding="utf-8"))["config"])
    measurements, envs = _merge(work)
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


__all__ = ["plan", "shard", "shard_balance", "run", "resolve_gpus", "Plan", "RunOutcome", "ProfileError", "ManifestError"]
