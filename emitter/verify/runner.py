"""Fault-isolated verification runner: every instance x problem, each kernel in a worker process.

A kernel that faults (illegal address, launch failure), kills its process, or runs past the launch
timeout is reported FAILED with the CUDA error text (and the worker's output), the worker is replaced by
a fresh one, and the run goes on. Instances that were never built, and problems an instance cannot
implement (alignment, can_implement), are SKIPPED with the reason, never PASSED.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from emitter.errors import EmitterError
from emitter.runtime import create_backend
from emitter.runtime.backend import (
    BackendUnavailable, CudaFault, NotBuilt, RuntimeBackendError, family_config, host_memory_available,
)
from emitter.verify.check import case_seed, run_case, too_large_reason
from emitter.verify.problems import VerifyProblem, plan_problems

Progress = Callable[[dict[str, Any]], None]


@dataclass
class VerifyOptions:
    backend: str = "pycuda"
    backend_options: dict[str, Any] = field(default_factory=dict)
    isolation: bool = True            # run kernels in worker processes (False: in this process; fake backend only)
    launch_timeout_s: float = 60.0    # one kernel launch, from launch to completion
    prep_timeout_s: float = 900.0     # loading, inputs and reference of one case
    seed: int | None = None           # base seed; None draws a fresh one (reported)
    quick: bool = False               # leave out the largest default problems
    data: str = "both"                # default problems: int, normal or both
    scheduler: int = 0                # run-time scheduler options on every problem (emitter.kit.scheduler)
    replay: str = ""                  # the command line that replays this run (the CLI sets it)


class ProblemTooLarge(EmitterError):
    """A user problem whose buffers cannot fit this machine's memory: refused before anything is allocated."""

    exit_code = 2


@dataclass
class VerifyRun:
    root: str
    backend: str
    device: str
    seed: int
    results: list[dict[str, Any]]
    instances: list[str]
    wall_s: float = 0.0
    started_at: str = ""
    replay: str = ""                  # the command line that replays this run ("" = root and seed only)

    @property
    def failed(self) -> int:
        return sum(r["status"] == "FAILED" for r in self.results)


class _WorkerGone(Exception):
    def __init__(self, reason: str, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class _Worker:
    """One worker process (spawned: a fresh interpreter, no CUDA state inherited)."""

    count = 0

    def __init__(self, options: VerifyOptions, log_dir: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        _Worker.count += 1
        self.options = options
        self.log_path = os.path.join(log_dir, f"worker{_Worker.count}.log")
        from emitter.verify.worker import worker_main

        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, name=f"emitter-verify-{_Worker.count}",
                                args=(child, options.backend, options.backend_options, self.log_path), daemon=True)
        self.proc.start()
        child.close()
        self.loaded: str | None = None
        msg = self.wait()
        if msg[0] == "error":
            self.kill()
            raise BackendUnavailable(f"the {options.backend} backend cannot start: {msg[1]}: {msg[2]}")
        self.device = msg[1]

    def wait(self) -> tuple:
        deadline = time.monotonic() + self.options.prep_timeout_s
        phase = "prepare"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                limit = self.options.launch_timeout_s if phase == "launch" else self.options.prep_timeout_s
                what = "kernel launch" if phase == "launch" else phase
                raise _WorkerGone(f"timeout: {what} did not finish within {limit:g} s (worker killed)", timed_out=True)
            if self.conn.poll(min(remaining, 0.25)):
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    self.proc.join(5)
                    raise _WorkerGone(self._death())
                if msg[0] == "phase":
                    phase = msg[1]
                    limit = self.options.launch_timeout_s if phase == "launch" else self.options.prep_timeout_s
                    deadline = time.monotonic() + limit
                    continue
                return msg
            if not self.proc.is_alive():
                if self.conn.poll(0):
                    continue
                raise _WorkerGone(self._death())

    def _death(self) -> str:
        self.proc.join(5)
        text = f"worker process died ({_exit_text(self.proc.exitcode)})"
        tail = _tail(self.log_path)
        return f"{text}; its output:\n{tail}" if tail else text

    def send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            raise _WorkerGone(self._death()) from None

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        try:
            self.conn.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(10)
        self.kill()


class _Inline:
    """The same protocol in this process (no isolation; for the fake backend and debugging)."""

    def __init__(self, options: VerifyOptions) -> None:
        self.options = options
        self.backend = create_backend(options.backend, options.backend_options)
        self.device = self.backend.device_name()
        self.kernel = None
        self.loaded: str | None = None

    def load(self, root: str, entry: Mapping[str, Any]) -> tuple:
        try:
            self.kernel = self.backend.load(Path(root), entry)
            return ("loaded", self.kernel.name)
        except NotBuilt as e:
            return ("error", "NotBuilt", f"{e}" + (" [build failed]" if e.build_failed else ""))
        except RuntimeBackendError as e:
            return ("error", type(e).__name__, str(e))

    def run(self, pdict: dict[str, Any], seed: int) -> dict[str, Any]:
        return run_case(self.backend, self.kernel, VerifyProblem.from_dict(pdict, self.kernel.family), seed)

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        self.backend.close()


def _skip(name: str, vp: VerifyProblem, seed: int, reason: str, status: str = "SKIPPED") -> dict[str, Any]:
    return {"instance": name, "problem": vp.label, "problem_spec": vp.as_dict(), "seed": seed, "status": status,
            "reason": reason}


def verify(root: str | Path, entries: Sequence[Mapping[str, Any]], user_problems: Sequence[VerifyProblem] | None = None,
           options: VerifyOptions | None = None, progress: Progress | None = None) -> VerifyRun:
    """Verify each manifest entry on its problems; returns every result (never raises for a kernel's fault)."""
    options = options or VerifyOptions()
    root = str(Path(root))
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results: list[dict[str, Any]] = []
    # every instance's config and problems first: a user problem that cannot fit this machine is refused
    # (exit 2) before a worker starts or anything is allocated
    plans: list[tuple[Mapping[str, Any], Any]] = []
    host_available = host_memory_available()
    for entry in entries:
        name = str(entry.get("name"))
        try:
            hooks, cfg = family_config(entry)
        except Exception as e:  # noqa: BLE001 - a manifest entry verify cannot read
            plans.append((entry, f"cannot read the manifest entry: {e}"))
            continue
        plan = plan_problems(cfg, user_problems, quick=options.quick, data=options.data)
        if options.scheduler:
            probe = hooks.with_options(cfg, plan[0][0].problem, options.scheduler) if plan else None
            if isinstance(probe, str):   # asked for every instance; one this instance does not have is not its failure
                plans.append((entry, ("SKIPPED", f"--scheduler: {probe}")))
                continue
            plan = plan_problems(cfg, user_problems, quick=options.quick, data=options.data,
                                 scheduler=options.scheduler)
        if user_problems:
            for vp, why_not in plan:
                if why_not:
                    continue
                fp = hooks.footprint(cfg, hooks.resolve_problem(cfg, vp.problem))
                # the fake backend's "device" buffers are host memory; a GPU's free memory is known to its worker
                too_big = too_large_reason(fp, None if options.backend == "fake" else 1 << 62, host_available)
                if too_big:
                    raise ProblemTooLarge(f"problem {vp.label} (instance {name}) {too_big}")
            if not any(vp.family == hooks.NAME for vp in user_problems):
                known = ", ".join(sorted({vp.family for vp in user_problems}))
                plans.append((entry, ("SKIPPED", f"none of the user problems is for the {hooks.NAME} family (they "
                                                 f"are {known}); give one with --problem")))
                continue
        plans.append((entry, plan))

    log_dir = tempfile.mkdtemp(prefix="emitter-verify-")
    worker: Any = None
    device = "?"

    def emit(res: dict[str, Any]) -> None:
        results.append(res)
        if progress:
            progress(res)

    def get_worker() -> Any:
        nonlocal worker, device
        if worker is None or not worker.alive():
            if worker is not None:
                worker.kill() if hasattr(worker, "kill") else None
            worker = _Worker(options, log_dir) if options.isolation else _Inline(options)
            device = worker.device
        return worker

    try:
        get_worker()   # fail fast (exit 2) when the backend cannot start at all
        for entry, plan in plans:
            name = str(entry.get("name"))
            if isinstance(plan, str):
                emit({"instance": name, "problem": "(instance)", "seed": seed, "status": "FAILED", "reason": plan})
                continue
            if isinstance(plan, tuple):
                emit({"instance": name, "problem": "(instance)", "seed": seed, "status": plan[0], "reason": plan[1]})
                continue
            loaded = False
            abandon: str | None = None
            statuses: list[str] = []
            for vp, why_not in plan:
                cs = case_seed(seed, name, vp.label)
                if abandon:
                    res = _skip(name, vp, cs, abandon)
                elif why_not:
                    res = _skip(name, vp, cs, why_not)
                else:
                    res = _run_one(get_worker, root, entry, vp, cs, loaded)
                    loaded = res.pop("_loaded", False)
                    if res.pop("_restart", False):
                        _drop(worker)
                        worker = None
                        loaded = False
                    if res.pop("_abandon", None):
                        abandon = res.get("_abandon_reason") or res["reason"]
                    res.pop("_abandon_reason", None)
                statuses.append(res["status"])
                emit(res)
            if (not user_problems and statuses and all(s == "SKIPPED" for s in statuses)
                    and not any("not built" in r.get("reason", "") or "build failed" in r.get("reason", "")
                                for r in results[-len(statuses):])):
                emit({"instance": name, "problem": "(default set)", "seed": seed, "status": "FAILED",
                      "reason": "no default problem could run: every one was skipped (see the reasons above); "
                                "a kernel that can run nothing is not verified"})
    finally:
        if worker is not None:
            worker.close()
        shutil.rmtree(log_dir, ignore_errors=True)
    return VerifyRun(root=root, backend=options.backend, device=device, seed=seed, results=results,
                     instances=[str(e.get("name")) for e in entries], wall_s=time.perf_counter() - t0,
                     started_at=started, replay=options.replay.replace("{seed}", str(seed)) if options.replay else "")


def _drop(worker: Any) -> None:
    if worker is not None:
        if hasattr(worker, "kill"):
            worker.kill()
        else:
            worker.close()


def _run_one(get_worker: Callable[[], Any], root: str, entry: Mapping[str, Any], vp: VerifyProblem, seed: int,
             loaded: bool) -> dict[str, Any]:
    """Run one case; the result carries private flags (_loaded, _restart, _abandon) for the loop."""
    name = str(entry.get("name"))
    w = get_worker()
    inline = isinstance(w, _Inline)
    try:
        if not loaded or w.loaded != name:
            msg = w.load(root, entry) if inline else (w.send(("load", root, dict(entry))) or w.wait())
            if msg[0] == "error":
                kind, text = msg[1], msg[2]
                w.loaded = None
                if kind == "NotBuilt":
                    res = _skip(name, vp, seed, text)
                    res["_abandon"] = True
                    return res
                res = _skip(name, vp, seed, f"cannot load the instance: {kind}: {text}", status="FAILED")
                res["_abandon"] = True
                res["_restart"] = kind == "CudaFault"
                return res
            w.loaded = name
        if inline:
            res = w.run(vp.as_dict(), seed)
        else:
            w.send(("run", vp.as_dict(), seed))
            msg = w.wait()
            if msg[0] != "result":
                res = _skip(name, vp, seed, f"worker protocol error: {msg!r}", status="FAILED")
                res["_restart"] = True
                return res
            res = msg[1]
    except _WorkerGone as e:
        res = _skip(name, vp, seed, e.reason, status="FAILED")
        res["_restart"] = True
        if e.timed_out:
            res["_abandon"] = True
            res["_abandon_reason"] = "not run: an earlier problem of this instance timed out"
        return res
    except CudaFault as e:  # inline mode
        res = _skip(name, vp, seed, f"CUDA fault: {e}", status="FAILED")
        res["_restart"] = True
        return res
    if res.get("fatal"):
        res["_restart"] = True
    else:
        res["_loaded"] = True
    return res
