"""Where nvcc runs: any concurrent.futures.Executor (`submit(fn, task) -> Future`).

A task is self-contained: an argv, a working directory and a scratch directory in, an exit status and the
compiler output out; artifacts are files the task names. So a thread pool (the default: nvcc is a child
process, Python only waits), a process pool, or a Ray adapter whose futures come from
`ray.remote(run_nvcc).remote(task).future()` on nodes sharing the file system, all fit unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["NvccTask", "NvccResult", "run_nvcc", "make_executor", "terminate_running"]


@dataclass(frozen=True)
class NvccTask:
    argv: tuple[str, ...]
    cwd: str
    scratch: str                     # TMPDIR for nvcc's intermediates (removed with the work directory)
    timeout_s: float | None = None
    env: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True)
class NvccResult:
    returncode: int
    output: str                      # stdout + stderr, interleaved as nvcc wrote them
    wall_s: float
    timed_out: bool = False


_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


def run_nvcc(task: NvccTask) -> NvccResult:
    env = dict(os.environ)
    env.update(task.env)
    env["TMPDIR"] = task.scratch
    os.makedirs(task.scratch, exist_ok=True)
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(list(task.argv), cwd=task.cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as e:
        return NvccResult(127, f"cannot run {task.argv[0]}: {e}", time.perf_counter() - start)
    with _running_lock:
        _running.add(proc)
    try:
        out, _ = proc.communicate(timeout=task.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        timed_out = True
    finally:
        with _running_lock:
            _running.discard(proc)
    text = out.decode("utf-8", "replace")
    if timed_out:
        text += f"\nemitter: nvcc killed after {task.timeout_s:g} s (--timeout)"
    return NvccResult(proc.returncode if not timed_out else 124, text, time.perf_counter() - start, timed_out)


def terminate_running() -> None:
    """Stop the nvcc processes this process started (on Ctrl-C / SIGTERM), by their own pids."""
    with _running_lock:
        procs = list(_running)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass


def make_executor(kind: str, workers: int) -> Executor:
    if kind == "thread":
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nvcc")
    if kind == "process":
        return ProcessPoolExecutor(max_workers=workers)
    raise ValueError(f"unknown executor {kind!r} (thread, process)")
