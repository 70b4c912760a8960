"""One profiling process on one GPU: `python -m emitter.profile.worker JOB.json`.

A job is self-contained (a file in, a JSON-lines file out), so the runner can start one per GPU here, or
elsewhere (a Ray task on a GPU node) unchanged. The worker appends to `job["out"]`:
    {"type": "env", ...}                               what it runs on
    {"type": "problem", "problem"}                     before each problem
    {"type": "start", "name", "problem", "op"}         before each kernel measurement
    {"type": "result", "measurement": {...}}           after it (any status)
    {"type": "problem_done", "problem", "wall_s"}      after the problem's last measurement
    {"type": "done"}
A CUDA fault poisons the context, so the worker records it and exits (code 3); the runner reads the
last "start" without a "result", and restarts the worker without that kernel for that problem.

Problems come from the job's list, or, with `"queue": true`, one JSON line at a time on stdin (the runner's
queue hands each GPU its next problem when it finishes one; end of input ends the job). A queue item is
{"problem": {...}} plus what is already known of that problem from an earlier attempt on any GPU: the
measurements not to take again (`skip`, `skip_baselines`, `skip_variants`), the `top` ranking (`ranked`),
the best median so far (`best_known`) and the kernels dropped after repeated faults (`skip_names`).

Order: problem by problem; for each op (dtypes + layouts + epilogue) the operand sets are allocated and
filled once, the cuBLAS baseline runs on them, then every kernel of that op (check, then timing).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

import numpy as np

from emitter.profile.config import ProfileConfig, problem_from_json
from emitter.profile.records import (
    CHECK_FAILED, FAILED, FAULT, NOT_APPLICABLE, OK, PRUNED, UNAVAILABLE, Measurement, op_of,
)
from emitter.profile.stats import TimingStats

EXIT_FAULT = 3
MEMORY_FRACTION = 0.9     # of the device memory free: the most one problem's operand sets may take


class ProblemTooLarge(Exception):
    """A problem whose operands cannot fit the device: refused before anything is allocated."""


def refuse_too_large(set_bytes: int, free_bytes: int | None, problem: Any) -> None:
    """ProblemTooLarge when even one operand set of `problem` cannot fit the free device memory."""
    if free_bytes is not None and set_bytes > MEMORY_FRACTION * free_bytes:
        raise ProblemTooLarge(f"does not fit: one operand set of {problem} needs {set_bytes} bytes "
                              f"({set_bytes / 2**30:.1f} GiB) of device memory, {free_bytes} "
                              f"({free_bytes / 2**30:.1f} GiB) are free; refused before allocating")


def _hooks(op: Any) -> Any:
    """The run-time hooks of the family an op (the profile's unit of comparison) belongs to."""
    from emitter.families.base import PROFILE_HOOKS, VERIFY_HOOKS
    from emitter.families.registry import runtime_family

    return runtime_family(type(op).FAMILY, need=VERIFY_HOOKS + PROFILE_HOOKS)


def _provider(hooks: Any, name: str) -> str:
    """What a baseline calls, before it ran (the family's words; its launch then says exactly)."""
    return dict(getattr(hooks, "BASELINE_PROVIDERS", {})).get(name, name)


class JobLog:
    def __init__(self, path: str | Path) -> None:
        self.f: TextIO = open(path, "a", encoding="utf-8")

    def write(self, obj: dict[str, Any]) -> None:
        self.f.write(json.dumps(obj, sort_keys=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def _say(gpu: int, text: str) -> None:
    # one write with its newline: print() writes the text and the newline apart, and the workers of other GPUs
    # share this stderr, so their lines could land between the two
    sys.stderr.write(f"[gpu{gpu}] {text}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------ engines
class GpuEngine:
    """Real measurements: PyCUDA backend, device-resident rotated operands, event timing, torch cuBLAS."""

    def __init__(self, config: ProfileConfig, gpu: int) -> None:
        from emitter.runtime import create_backend

        self.backend = create_backend("pycuda")
        import pycuda.driver as drv

        from emitter.kit.torch_interop import torch_available
        from emitter.profile.timing import EventTimer

        self.drv = drv
        self.config = config
        self.gpu = gpu
        self.stream = drv.Stream()
        self.timer = EventTimer(self.stream, config.timing)
        self.use_torch = torch_available()
        if self.use_torch:
            import torch

            torch.cuda.init()
        self._env: dict[str, Any] | None = None

    def env(self) -> dict[str, Any]:
        from emitter.profile.device import gpu_env

        if self._env is None:
            self._env = gpu_env(self.gpu)
        return self._env

    def load(self, root: Path, entry: dict[str, Any]) -> Any:
        return self.backend.load(root, entry)

    def prepare(self, op: Any, problem: Any) -> Any:
        from emitter.kit.arena import free_memory
        from emitter.profile.timing import rotation_sets

        hooks = _hooks(op)
        nbytes = hooks.profile_set_bytes(op, problem, self.config)
        free = free_memory()
        refuse_too_large(nbytes, free, problem)
        sets = rotation_sets(nbytes, int(self.env()["l2_bytes"]), self.config.timing.rotate, free)
        return hooks.profile_allocate(op, problem, self.config, sets)

    def extra(self, data: Any) -> dict[str, Any]:
        return {"rotation_sets": len(data.sets), "working_set_bytes": data.working_set_bytes,
                "l2_bytes": int(self.env()["l2_bytes"])}

    def baseline(self, data: Any, name: str) -> Measurement:
        from emitter.families.base import BaselineUnavailable

        hooks = _hooks(data.op)
        m = Measurement(kind="baseline", name=name, provider=_provider(hooks, name), op=data.op,
                        problem=data.problem, gpu=self.gpu)
        try:
            b = hooks.baseline(name, data, self.stream)
        except BaselineUnavailable as e:
            m.status, m.reason = UNAVAILABLE, str(e)
            return m
        m.provider = b.provider
        measured = self.timer.measure(b.launch, len(data.sets))
        m.stats = measured.stats
        m.extra = {**self.extra(data), **measured.extra()}
        if self.config.check and self.use_torch:
            # the same check as the kernels', recorded and never failing the baseline: so a report can set the
            # kernels' error beside cuBLAS's own on the same inputs (fp8: how much accuracy a mode trades)
            try:
                hooks.profile_poison(data, 0)
                b.launch(0)
                self.stream.synchronize()
                m.check = hooks.profile_check(data, getattr(data, "cfg", None), self.use_torch, split_k=1)
            except Exception as e:    # noqa: BLE001 - a record, not a gate: the timing above stands
                m.check = {"passed": None, "reason": f"baseline check not run: {_short(e)}", "rel_err": None}
        return m

    def kernel(self, kernel: Any, data: Any, m: Measurement, prune_ms: float | None = None) -> Measurement:
        hooks = kernel.hooks

        def check() -> dict[str, Any]:
            return hooks.profile_check(data, kernel.config, self.use_torch, split_k=m.split_k, options=m.options)

        launch = hooks.kernel_launch(kernel, data, self.stream, split_k=m.split_k, options=m.options,
                                     workspace_reset=self.config.timing.workspace_reset)
        try:
            # the check: poison the outputs of set 0, one launch, compare with the reference
            hooks.profile_poison(data, 0)
            launch(0)
            self.stream.synchronize()
            if self.config.check:
                m.check = check()
                if not m.check["passed"]:
                    m.status, m.reason = CHECK_FAILED, m.check["reason"]
                    return m
            if prune_ms:
                probe_ms = self.timer.probe(launch, len(data.sets))
                if probe_ms > prune_ms:
                    return _pruned(m, probe_ms, prune_ms, self.config.timing.prune)
            measured = self.timer.measure(launch, len(data.sets))
            m.stats = measured.stats
            resets = [r[1] for r in getattr(launch, "resets", ()) if r]
            # workspace_reset_mode: timing.workspace_reset, what the timed launches paid for the workspace
            # (library: initialize()'s memset before each, emitter/kit/workspace.py)
            m.extra = {**self.extra(data), **measured.extra(), "launch": launch.info,
                       "workspace_reset_mode": self.config.timing.workspace_reset,
                       "workspace_reset_bytes": max(resets) if resets else 0}
            if self.config.check:
                # again after hundreds of launches: catches state (workspace, semaphores) that goes stale
                hooks.profile_poison(data, 0)
                launch(0)
                self.stream.synchronize()
                after = check()
                m.check["after_timing"] = {k: after[k] for k in ("passed", "rel_err", "nonfinite", "unwritten", "mismatches")}
                if not after["passed"]:
                    m.status, m.reason = CHECK_FAILED, "wrong after the timed launches: " + str(after["reason"])
            return m
        finally:
            launch.free()

    def head_to_head(self, kernel: Any, data: Any, m: Measurement, baseline: str) -> tuple[TimingStats, TimingStats]:
        """The kernel (at m's split-K count and options) and the baseline timed launch by launch, alternating
        (EventTimer.interleave): (kernel's stats, baseline's stats), taken under the same clock."""
        hooks = kernel.hooks
        if baseline not in hooks.BASELINES:
            raise ValueError(f"no head-to-head for baseline {baseline!r}")
        launch = hooks.kernel_launch(kernel, data, self.stream, split_k=m.split_k, options=m.options,
                                     workspace_reset=self.config.timing.workspace_reset)
        try:
            base = hooks.baseline(baseline, data, self.stream)
            k, b = self.timer.interleave([launch, base.launch], len(data.sets))
            return k, b
        finally:
            launch.free()

    def release(self, data: Any) -> None:
        data.free()

    def classify(self, e: BaseException) -> tuple[str, bool]:
        """(status, fatal) for an exception raised while measuring."""
        from emitter.runtime.backend import CannotImplement, CudaFault, NotBuilt, RuntimeBackendError
        from emitter.kit.launcher import DriverError
        from emitter.runtime.pycuda_backend import is_sticky

        if isinstance(e, CannotImplement):
            return NOT_APPLICABLE, False
        if isinstance(e, CudaFault):
            return FAULT, True
        if isinstance(e, (self.drv.Error, DriverError)):
            return (FAULT, True) if is_sticky(str(e)) or not self._context_ok() else (FAILED, False)
        if isinstance(e, (NotBuilt, RuntimeBackendError)):
            return FAILED, False
        if type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower():
            return FAILED, False
        return FAILED, not self._context_ok()

    def _context_ok(self) -> bool:
        try:
            self.drv.Context.synchronize()
            return True
        except self.drv.Error:
            return False


def _pruned(m: Measurement, probe_ms: float, prune_ms: float, factor: float) -> Measurement:
    m.status = PRUNED
    m.reason = (f"probe launch {probe_ms:.4g} ms > {factor:g}x the best so far ({prune_ms / factor:.4g} ms): "
                "cannot win here, not timed (timing.prune: 0 times every kernel)")
    m.extra = {**(m.extra or {}), "probe_ms": probe_ms, "prune_ms": prune_ms}
    return m


def _unit(*parts: Any) -> float:
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") / 2 ** 64


class FakeEngine:
    """CI: no GPU. The numpy FakeBackend runs each kernel once (on the problem shrunk to at most 64^3, so its
    planted faults fire) for the check; times come from a deterministic model with seeded noise."""

    def __init__(self, config: ProfileConfig, gpu: int, faults: list[dict[str, Any]] | None = None,
                 model: dict[str, Any] | None = None) -> None:
        from emitter.runtime import create_backend

        self.backend = create_backend("fake", {"faults": faults or []})
        self.config = config
        self.gpu = gpu
        self.model = {"tflops": 700.0, "baseline_tflops": 700.0, "spread": 0.004, "launch_us": 4.0,
                      "hbm_tbs": 3.35, **(model or {})}

    def env(self) -> dict[str, Any]:
        from emitter.profile.device import fake_env

        return fake_env()

    def load(self, root: Path, entry: dict[str, Any]) -> Any:
        return self.backend.load(root, entry)

    def prepare(self, op: Any, problem: Any) -> Any:
        # model["prepare_s"][problem key]: seconds the operand sets take (tests: problems that cost what they say,
        # whatever their FLOPs, for the work queue to balance)
        delay = float(self.model.get("prepare_s", {}).get(problem.key, 0.0))
        if delay:
            time.sleep(delay)
        return {"op": op, "problem": problem}

    def extra(self, data: Any) -> dict[str, Any]:
        return {"rotation_sets": 2, "working_set_bytes": 0, "l2_bytes": 50 * 1024 * 1024}

    def _stats(self, rate_tflops: float, data: Any, *seed: Any) -> TimingStats:
        from emitter.profile.records import min_bytes

        p: Any = data["problem"]
        t_ms = p.flops / (rate_tflops * 1e12) * 1e3 + (min_bytes(data["op"], p, self.config.beta) or 0) / (
            self.model["hbm_tbs"] * 1e12) * 1e3 + self.model["launch_us"] * 1e-3
        rng = np.random.default_rng(int(_unit(*seed) * 2 ** 63))
        it = self.config.timing.iterations or 50
        groups = [list(t_ms * (1 + self.model["spread"] * rng.standard_normal(it))) for _ in range(self.config.timing.repeats)]
        return TimingStats.from_samples([[abs(x) for x in g] for g in groups])

    def baseline(self, data: Any, name: str) -> Measurement:
        m = Measurement(kind="baseline", name=name, provider="fake cuBLAS (model)", op=data["op"],
                        problem=data["problem"], gpu=self.gpu)
        m.stats = self._stats(self.model["baseline_tflops"], data, "baseline", data["problem"].key, data["op"].key)
        m.extra = self.extra(data)
        return m

    def kernel(self, kernel: Any, data: Any, m: Measurement, prune_ms: float | None = None) -> Measurement:
        from emitter.runtime.backend import CannotImplement, CudaFault, LaunchFailed
        from emitter.verify.check import case_seed, run_case
        from emitter.verify.problems import VerifyProblem

        p: Any = data["problem"]
        if self.config.check:
            # emitter.verify's own case (fresh inputs, poison, reference, compare) on the problem shrunk to 64^3
            small = kernel.hooks.profile_fake_problem(kernel.config, p, self.config, 64, split_k=m.split_k,
                                                      options=m.options)
            vp = VerifyProblem(small, "normal", p.key)
            r = run_case(self.backend, kernel, vp, case_seed(0, kernel.name, p.key))
            if r["status"] == "SKIPPED":
                raise CannotImplement(r["reason"])
            if r.get("fatal"):
                raise CudaFault(r["reason"])
            if r["status"] != "PASSED" and r["reason"].startswith("launch failed"):
                raise LaunchFailed(r["reason"])
            m.check = {"passed": r["status"] == "PASSED", "reason": r["reason"] or None, "rel_err": r.get("rel_err"),
                       "tolerance": r.get("tol"), "unwritten": r.get("unwritten"), "nonfinite": r.get("nonfinite"),
                       "mismatches": r.get("mismatches"),
                       "reference": f"emitter.verify run_case on {vp.label} (fake backend)"}
            if not m.check["passed"]:
                m.status, m.reason = CHECK_FAILED, r["reason"]
                return m
        factor = 0.75 + 0.5 * _unit("rate", m.label)        # each kernel (and split count) its own speed
        factor *= float(self.model.get("slow", {}).get(kernel.name, 1.0))   # tests: a hopeless kernel
        stats = self._stats(self.model["tflops"] * factor, data, kernel.name, p.key, data["op"].key)
        if prune_ms and stats.median_ms > prune_ms:
            return _pruned(m, stats.median_ms, prune_ms, self.config.timing.prune)
        m.stats = stats
        m.extra = {**self.extra(data), "workspace_reset_mode": self.config.timing.workspace_reset}
        return m

    def head_to_head(self, kernel: Any, data: Any, m: Measurement, baseline: str) -> tuple[TimingStats, TimingStats]:
        """The model's kernel and baseline times (no check: confirm turns it off)."""
        k = self.kernel(kernel, data, m)
        if not k.ok:
            raise RuntimeError(f"kernel {k.status}: {k.reason}")
        return k.stats, self.baseline(data, baseline).stats

    def release(self, data: Any) -> None:
        pass

    def classify(self, e: BaseException) -> tuple[str, bool]:
        from emitter.runtime.backend import CannotImplement, CudaFault

        if isinstance(e, CannotImplement):
            return NOT_APPLICABLE, False
        if isinstance(e, CudaFault):
            return FAULT, True
        return FAILED, False


# ------------------------------------------------------------------------------------------ the job
def _baselines_of(op: Any, names: Any) -> list[str]:
    """The config's baselines this op's family has (RuntimeFamily.BASELINES): GEMM's cublas, attention's own."""
    have = tuple(getattr(_hooks(op), "BASELINES", ()))
    return [b for b in names if b in have]


def _placeholder(op: Any, job: dict[str, Any]) -> Any:
    """The problem a record of a kernel that could not load names: its family's profile_placeholder() (GEMM:
    1x1x1), else the job's first problem of the op's family, else the default family's placeholder."""
    from emitter.families.registry import DEFAULT_FAMILY, entry_family, runtime_family

    family = getattr(op, "FAMILY", DEFAULT_FAMILY)
    placeholder = getattr(runtime_family(family, need=()), "profile_placeholder", None)
    if placeholder is None:
        for pd in job.get("problems", []):
            if entry_family(pd) == family:
                return problem_from_json(pd)
        placeholder = runtime_family(DEFAULT_FAMILY, need=()).profile_placeholder
    return placeholder()


def _top(ranked: dict[str, tuple[float, int]], k: int) -> list[str]:
    """The k fastest kernels of `ranked` (name -> (median, split)); equal medians in name order."""
    return sorted(ranked, key=lambda n: (ranked[n][0], n))[:k]


def _second_pass(kernel: Any, name: str, problem: Any, config: ProfileConfig,
                 done: set[tuple[str, str, int]]) -> list[int]:
    """The run-time variants still to time on kernel `name` in a `top` sweep's second pass: every one after
    the compiled-in choices that the kernel has and that was not timed on this problem already."""
    if kernel is None:
        return []
    variants = _variants(kernel, problem, config.scheduler)
    return [o for o in variants[1:] if (name, problem.key, o) not in done]


def _variants(kernel: Any, problem: Any, options: Any) -> list[int]:
    """The run-time option sets of `options` the kernel takes on `problem`, distinct launches only (the family's
    optional profile_variants hook; without it, the compiled-in choices only)."""
    hook = getattr(kernel.hooks, "profile_variants", None)
    if hook is None:
        return [o for o in options if o == 0][:1]
    return list(hook(kernel.config, problem, list(options)))


def _splits(kernel: Any, problem: Any, env: dict[str, Any]) -> list[int]:
    """The split-K slice counts a kernel is timed at on `problem` (the family's optional profile_splits hook;
    [1] without it, and for a kernel that did not load)."""
    hook = getattr(kernel.hooks, "profile_splits", None) if kernel is not None else None
    return list(hook(kernel.config, problem, int(env.get("sm_count") or 1))) if hook else [1]


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _items(job: dict[str, Any], items: Iterable[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    """The job's problems as queue items: its list, or (`queue`) the lines of stdin (or `items`) until the end."""
    if not job.get("queue"):
        yield from ({"problem": pd} for pd in job["problems"])
        return
    if items is not None:
        yield from items
        return
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield json.loads(line)


def run_job(job: dict[str, Any], engine_factory: Callable[..., Any] | None = None,
            items: Iterable[dict[str, Any]] | None = None) -> int:
    """Run one job (see module doc); returns the process exit code. `items`: a queue job's items, in place of
    stdin."""
    config = ProfileConfig.from_json(job["config"])
    gpu = int(job.get("gpu", 0))
    log = JobLog(job["out"])
    skip: set[tuple[str, str]] = set()
    skip_names: set[str] = set()
    skip_baselines: set[tuple[str, ...]] = set()
    # best median so far per (op, problem) from an earlier sitting (--resume), so pruning sees it
    best_known: dict[tuple[str, str], float] = {}
    # scheduler `top`: kernels whose variants were timed already, and the compiled-in medians that rank them
    skip_variants: set[tuple[str, str, int]] = set()
    known: dict[tuple[str, str], list[tuple[str, int, float]]] = {}

    def learn(part: dict[str, Any]) -> None:
        """What the job (or a queue item) says is known already: not measured again."""
        skip.update((s[0], s[1]) for s in part.get("skip", []))
        skip_names.update(part.get("skip_names", []))
        skip_baselines.update(tuple(s) for s in part.get("skip_baselines", []))
        best_known.update({(b[0], b[1]): float(b[2]) for b in part.get("best_known", [])})
        skip_variants.update((s[0], s[1], int(s[2])) for s in part.get("skip_variants", []))
        for op_k, p_k, k_name, k_split, k_med in part.get("ranked", []):
            if (k_name, int(k_split), float(k_med)) not in known.get((op_k, p_k), []):
                known.setdefault((op_k, p_k), []).append((k_name, int(k_split), float(k_med)))

    learn(job)
    try:
        if engine_factory is not None:
            engine = engine_factory(config, gpu)
        elif job.get("backend", "pycuda") == "fake":
            engine = FakeEngine(config, gpu, job.get("faults"), job.get("model"))
        else:
            engine = GpuEngine(config, gpu)
    except Exception as e:   # no GPU, no PyCUDA: every measurement fails with the reason
        log.write({"type": "fatal", "reason": _short(e)})
        log.close()
        _say(gpu, f"cannot start: {_short(e)}")
        return 2
    env = engine.env()
    log.write({"type": "env", "gpu": gpu, "env": env})
    _say(gpu, f"{env.get('name')}: " + (f"{len(job['problems'])} problems, taken from the queue" if job.get("queue")
                                         else f"{len(job['problems'])} problems") + f" x {len(job['instances'])} kernels")

    # load every kernel once; a kernel that cannot load fails on every problem, with the reason
    kernels: "OrderedDict[str, tuple[Any, Any, str, str | None]]" = OrderedDict()
    for inst in job["instances"]:
        entry, root = inst["entry"], Path(inst["root"])
        op = op_of(entry)
        kernel, why = None, None
        if entry["name"] in skip_names:
            why = "skipped: faulted on earlier problems"
        else:
            try:
                kernel = engine.load(root, entry)
            except Exception as e:
                status, fatal = engine.classify(e)
                why = _short(e)
                if fatal:
                    log.write({"type": "result", "measurement": Measurement(
                        "kernel", entry["name"], "emitter", op, _placeholder(op, job), FAULT, why, gpu,
                        inst.get("manifest")).to_json()})
                    return EXIT_FAULT
        kernels[entry["name"]] = (kernel, op, inst.get("manifest"), why)

    ops: "OrderedDict[str, tuple[Any, list[str]]]" = OrderedDict()
    for name, (_k, op, _man, _why) in kernels.items():
        ops.setdefault(op.key, (op, []))[1].append(name)

    # pruned measurements of the (op, problem) being measured: logged once the problem is done, so that when
    # every candidate was pruned (a baseline far ahead of them all) the best-probed one is timed anyway and its
    # timed record, not a pruned one, is the record of that launch (the log keeps a launch's first result)
    pruned: list[Measurement] = []
    timed: set[tuple[str, str]] = set()       # (op, problem) with a kernel timed correctly in this sitting

    def measure(n: str, split: int, opts: int, problem: Any, op: Any, op_key: str, data: Any,
                best_ms: float | None, waived: str | None = None) -> Measurement | None:
        """Check and time kernel n at (split, opts) and log it (a pruned one goes to `pruned`, logged later);
        `waived`: timed without pruning, for that reason (recorded in its extra). None after a CUDA fault (the
        worker must exit)."""
        kernel, _op, man, why = kernels[n]
        if n in skip_names:                 # dropped after faults on other problems (a queue item says so)
            kernel, why = None, "skipped: faulted on earlier problems"
        m = Measurement("kernel", n, "emitter", op, problem, OK, None, gpu, man, split_k=split, options=opts)
        if kernel is None:
            m.status, m.reason = FAILED, why
            log.write({"type": "result", "measurement": m.to_json()})
            return m
        log.write({"type": "start", "kind": "kernel", "name": n, "problem": problem.key, "op": op_key,
                   "split_k": split, "options": opts})
        prune_ms = config.timing.prune * best_ms if (not waived and config.timing.prune and best_ms) else None
        try:
            m = engine.kernel(kernel, data, m, prune_ms=prune_ms)
        except Exception as e:
            status, fatal = engine.classify(e)
            m.status, m.reason = status, _short(e)
            if status == FAILED and os.environ.get("EMITTER_PROFILE_DEBUG"):
                traceback.print_exc()
            log.write({"type": "result", "measurement": m.to_json()})
            if fatal:
                _say(gpu, f"{problem.key:>22} {n}: CUDA fault ({m.reason}); restarting")
                return None
            return m
        if m.ok:
            timed.add((op_key, problem.key))
            if waived:
                m.extra = {**(m.extra or {}), "pruning_waived": waived}
        if m.status == PRUNED:
            pruned.append(m)
        else:
            log.write({"type": "result", "measurement": m.to_json()})
        if m.ok:
            tf = problem.flops / (m.stats.median_ms * 1e-3) / 1e12
            _say(gpu, f"{problem.key:>22} {m.label[:64]:<64} {m.stats.median_ms * 1e3:10.1f} us {tf:7.1f} TFLOP/s")
        else:
            _say(gpu, f"{problem.key:>22} {m.label[:64]:<64} {m.status}: {m.reason}")
        return m

    def timed_ok(op_key: str, pkey: str) -> bool:
        return (op_key, pkey) in timed or not pruned

    def flush_pruned() -> None:
        for m in pruned:
            log.write({"type": "result", "measurement": m.to_json()})
        pruned.clear()

    def rescue(problem: Any, op: Any, op_key: str, data: Any) -> bool:
        """Every candidate that ran correctly was pruned (their probes all slower than prune x the best so
        far, a baseline's included): time the best-probed one anyway, so the problem keeps a timed kernel
        (and a tuning entry). False after a CUDA fault."""
        best = min(pruned, key=lambda m: (float((m.extra or {}).get("probe_ms") or float("inf")), m.label))
        pruned.remove(best)
        why = (f"every candidate's probe was over {config.timing.prune:g}x the best so far; timed anyway as the "
               f"best-probed one ({float((best.extra or {}).get('probe_ms') or 0):.4g} ms) so the problem keeps a "
               "timed kernel")
        return measure(best.name, best.split_k, best.options, problem, op, op_key, data, None, waived=why) is not None

    # scheduler `top`: the first pass times every kernel at its compiled-in choices, the second the other
    # variants on the `top` fastest of each (op, problem)
    top = config.scheduler_top if len(config.scheduler) > 1 else 0

    def kernel_of(n: str) -> Any:
        """The loaded kernel n, None when it did not load or was dropped after faults (skip_names)."""
        return None if n in skip_names else kernels[n][0]

    def run_problem(queued: Any) -> bool:
        """Every op of the problem: operands, baselines, kernels. False after a CUDA fault (the worker must exit)."""
        for op_key, (op, names) in ops.items():
            if getattr(op, "FAMILY", None) != getattr(queued, "FAMILY", None):
                continue          # a problem of another family: not this op's
            applies = getattr(_hooks(op), "profile_applies", None)
            if applies is not None and not applies(op, queued):
                continue          # the family says the op's kernels do not compute it (attention: another mask)
            # the problem as this op's measurements carry it (the family's optional profile_op_problem hook; the
            # attention backward: the same sizes and key, the backward's FLOPs)
            op_problem = getattr(_hooks(op), "profile_op_problem", None)
            problem = op_problem(op, queued) if op_problem is not None else queued
            todo = [n for n in names if (n, problem.key) not in skip]
            ranked: dict[str, tuple[float, int]] = {}     # kernel -> (best median, its split) at options 0
            for k_name, k_split, k_med in known.get((op_key, problem.key), []):
                if k_med < ranked.get(k_name, (float("inf"), 0))[0]:
                    ranked[k_name] = (k_med, k_split)
            if not todo and (not top or not any(_second_pass(kernel_of(n), n, problem, config, skip_variants)
                                                for n in _top(ranked, top))):
                continue
            try:
                data = engine.prepare(op, problem)
            except Exception as e:
                status, fatal = engine.classify(e)
                for n in todo:
                    _k, _op, man, _w = kernels[n]
                    log.write({"type": "result", "measurement": Measurement(
                        "kernel", n, "emitter", op, problem, FAILED if not fatal else FAULT,
                        f"operands could not be prepared: {_short(e)}", gpu, man).to_json()})
                if fatal:
                    return False
                continue
            best_ms: float | None = best_known.get((op_key, problem.key))   # for timing.prune
            try:
                if ("baseline", op_key, problem.key) not in skip_baselines:
                    for bname in _baselines_of(op, config.baselines):
                        log.write({"type": "start", "kind": "baseline", "name": bname, "problem": problem.key, "op": op_key})
                        try:
                            bm = engine.baseline(data, bname)
                        except Exception as e:
                            status, fatal = engine.classify(e)
                            bm = Measurement("baseline", bname, _provider(_hooks(op), bname), op, problem, status,
                                             _short(e), gpu)
                            log.write({"type": "result", "measurement": bm.to_json()})
                            if fatal:
                                return False
                            continue
                        log.write({"type": "result", "measurement": bm.to_json()})
                        if bm.ok:
                            best_ms = min(best_ms, bm.stats.median_ms) if best_ms else bm.stats.median_ms
                            _say(gpu, f"{problem.key:>22} {op_key:<28} {bname:<12} {bm.stats.median_ms * 1e3:10.1f} us")
                runs = []
                for n in todo:
                    kernel = kernel_of(n)
                    # run-time scheduler options (config `scheduler`): those the kernel has, beside none; with
                    # `top`, the first pass takes the compiled-in choices only
                    # (not twice the same launch: a swizzle the grid caps, a raster = heuristic)
                    variants = list(config.scheduler) if kernel is None else _variants(kernel, problem, config.scheduler)
                    first_pass = variants[:1] if top else variants
                    runs += [(n, s, o) for s in _splits(kernel, problem, env) for o in first_pass or [0]]
                for n, split, opts in runs:
                    m = measure(n, split, opts, problem, op, op_key, data, best_ms)
                    if m is None:
                        return False
                    if m.ok:
                        best_ms = min(best_ms, m.stats.median_ms) if best_ms else m.stats.median_ms
                        if opts == 0 and m.stats.median_ms < ranked.get(n, (float("inf"), 0))[0]:
                            ranked[n] = (m.stats.median_ms, split)
                if top:   # the second pass: every other variant, on the `top` fastest kernels at their best split
                    for n in _top(ranked, top):
                        for opts in _second_pass(kernel_of(n), n, problem, config, skip_variants):
                            m = measure(n, ranked[n][1], opts, problem, op, op_key, data, best_ms)
                            if m is None:
                                return False
                            if m.ok:
                                best_ms = min(best_ms, m.stats.median_ms) if best_ms else m.stats.median_ms
                if not timed_ok(op_key, problem.key) and not rescue(problem, op, op_key, data):
                    return False
            finally:
                flush_pruned()
                try:
                    engine.release(data)
                except Exception:
                    pass
        return True

    for item in _items(job, items):
        learn(item)
        problem = problem_from_json(item["problem"])
        log.write({"type": "problem", "problem": problem.key})
        t0 = time.monotonic()
        if not run_problem(problem):
            return EXIT_FAULT
        log.write({"type": "problem_done", "problem": problem.key, "wall_s": round(time.monotonic() - t0, 4)})
    log.write({"type": "done"})
    log.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m emitter.profile.worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    return run_job(job)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # skip atexit context teardown after a fault (it would only raise again)
