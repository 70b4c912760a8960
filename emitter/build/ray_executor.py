"""`emitter build --executor ray`: each nvcc run a Ray task; no file system shared with the nodes.

The builder (builder.py) is unchanged: it plans, consults the content cache on the driver, and hands this
executor the same self-contained NvccTask it would hand a local pool; what comes back is the same NvccResult
with the artifact written where the task said. In between:

  driver  reads the source the command names (relative to the task's cwd) and sends its bytes, the command
          with the driver's nvcc and CUTLASS paths as placeholders, and the driver's toolchain identity
          (nvcc version, CUTLASS header digest: both are in the cache key) through the object store;
  node    a task of num_cpus=1 and a `memory` requirement of nvcc's measured peak (nvcc.memory_per_job: ~4 GB
          an sm90a device pass, half that for a host shim), so Ray never places more compiles on a node than
          its memory holds; max_retries=0 (a failing compile is a result). It refuses to compile with another
          nvcc or CUTLASS than the driver's (the cache key would lie), writes the source to a private temp
          directory, runs nvcc there (executor.run_nvcc: the same timeout and output capture) and returns
          the exit status, the output and the artifact's bytes;
  driver  writes the artifact to the task's output path and resolves the future; the builder installs it
          and fills the cache. A worker that dies (nvcc taking its process down, a node lost, an OOM kill)
          becomes that compile's failure: exit status -1 and what Ray said.

Each node needs nvcc (same release), the CUTLASS headers (the same nvidia-cutlass, or CUTLASS_PATH) and
emitter installed; see docs/scale-out.md.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from concurrent.futures import Executor, Future
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from emitter.build.executor import NvccResult, NvccTask, run_nvcc, terminate_running
from emitter.build.nvcc import GENCODE, memory_per_job
from emitter.executors import RaySession, connect

NVCC = "{nvcc}"
CUTLASS = "{cutlass}"
OUT = "{out}"
_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")   # part of the cache key: sent along
_VIRTUAL_TO_ARCH = {virtual: arch for arch, (virtual, _real) in GENCODE.items()}


def task_memory(argv: tuple[str, ...] | list[str]) -> int:
    """nvcc's peak memory for this command: the arch's measured device-pass peak, half for a host shim
    (the builder's _Plan.memory, read back from the command line)."""
    arch = "sm80"
    for a in argv:
        if a.startswith("-gencode=arch="):
            virtual = a[len("-gencode=arch="):].split(",")[0]
            arch = _VIRTUAL_TO_ARCH.get(virtual, arch)
    need = memory_per_job(arch)
    return need // 2 if "--shared" in argv else need


# ------------------------------------------------------------------------------------------------ node side
@lru_cache(maxsize=4)
def _node_toolchain(driver_nvcc: str) -> tuple[str, str, str, str]:
    """(nvcc, its version line, CUTLASS root, header digest) on this node, once per worker process.
    nvcc: $EMITTER_NVCC set on the node, else the driver's path if this node has it, else PATH / CUDA_HOME."""
    from emitter.build.nvcc import find_nvcc, nvcc_version
    from emitter.cutlass_path import find_cutlass, headers_digest

    if os.environ.get("EMITTER_NVCC"):
        nvcc = os.environ["EMITTER_NVCC"]
    elif os.access(driver_nvcc, os.X_OK):
        nvcc = driver_nvcc
    else:
        nvcc = find_nvcc()
    headers = find_cutlass()
    return nvcc, _version_line(nvcc_version(nvcc)), str(headers.root), headers_digest(headers)


def _version_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    picked = [l for l in lines if "release" in l]
    return (picked or lines or [""])[-1].strip()


def _safe_rel(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"not a relative path inside the work directory: {rel!r}")
    return p


def compile_on_node(job: dict[str, Any]) -> dict[str, Any]:
    """The Ray task's body (a plain function, so it runs without Ray too: the tests call it directly)."""
    host = socket.gethostname()
    where = f"{host} (pid {os.getpid()})"
    try:
        nvcc, version, cutlass_root, digest = _node_toolchain(job["driver_nvcc"])
    except Exception as e:                       # noqa: BLE001 - reported as this compile's failure
        return {"returncode": 127, "output": f"emitter: node {where} cannot compile: {e}", "wall_s": 0.0,
                "timed_out": False, "artifact": None, "node": host}
    mismatch = []
    if version != job["nvcc_version"]:
        mismatch.append(f"nvcc {version!r} (driver: {job['nvcc_version']!r})")
    if digest != job["cutlass_digest"]:
        mismatch.append(f"CUTLASS headers at {cutlass_root} differ from the driver's ({job['cutlass_origin']})")
    if mismatch:
        return {"returncode": 2, "output": f"emitter: node {where} has another toolchain than the driver: "
                f"{'; '.join(mismatch)}\n  fix: install the same CUDA toolkit and nvidia-cutlass on every node "
                "(the cache key names the driver's)", "wall_s": 0.0, "timed_out": False, "artifact": None,
                "node": host}
    work = Path(tempfile.mkdtemp(prefix="emitter-nvcc-"))
    try:
        for rel, data in job["files"].items():
            dst = work / _safe_rel(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        out = work / "out" / job["out_name"]
        out.parent.mkdir()
        argv = []
        for a in job["argv"]:
            if a == NVCC:
                a = nvcc
            elif a == OUT:
                a = str(out)
            elif CUTLASS in a:
                a = a.replace(CUTLASS, cutlass_root)
            argv.append(a)
        try:
            res = run_nvcc(NvccTask(tuple(argv), str(work), str(work / "tmp"), job["timeout_s"],
                                    tuple(job["env"])))
        except BaseException:                    # ray.cancel (KeyboardInterrupt here): stop nvcc too
            terminate_running()
            raise
        artifact = out.read_bytes() if res.returncode == 0 and out.is_file() else None
        return {"returncode": res.returncode, "output": res.output, "wall_s": res.wall_s,
                "timed_out": res.timed_out, "artifact": artifact, "node": host}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- driver side
class RayExecutor(Executor):
    """A concurrent.futures.Executor whose submit(run_nvcc, task) runs the compile as a Ray task."""

    def __init__(self, address: str | None = None, note: Callable[[str], None] | None = None,
                 session: RaySession | None = None) -> None:
        from emitter.build.nvcc import find_nvcc, nvcc_version
        from emitter.cutlass_path import find_cutlass, headers_digest

        self.session = session or connect(address)
        self.ray = self.session.ray
        self.note = note or (lambda _m: None)
        headers = find_cutlass()
        nvcc = find_nvcc()
        self.driver = {"driver_nvcc": nvcc, "nvcc_version": _version_line(nvcc_version(nvcc)),
                       "cutlass_digest": headers_digest(headers), "cutlass_origin": headers.origin}
        self.cutlass_root = str(headers.root)
        self.nvcc = nvcc
        self.max_memory = int(self.session.largest_node("memory"))
        self._remote = self.ray.remote(num_cpus=1, max_retries=0)(compile_on_node)
        self._pending: dict[Any, Future] = {}
        self._lock = threading.Lock()
        self._clamped = False
        self._closed = False

    def slots(self) -> int:
        """Compiles to keep in flight: one per CPU of the cluster."""
        return max(1, int(self.session.total("CPU")))

    def describe(self) -> str:
        nodes = sum(1 for n in self.ray.nodes() if n.get("Alive", n.get("alive")))
        return (f"Ray: {nodes} node{'s' if nodes != 1 else ''}, {self.slots()} CPUs, "
                f"{self.session.total('memory') / 2**30:.0f} GiB task memory")

    def _pack(self, task: NvccTask) -> tuple[dict[str, Any], Path]:
        argv = list(task.argv)
        out: Path | None = None
        files: dict[str, bytes] = {}
        sent = []
        for i, a in enumerate(argv):
            if i == 0 and a == self.nvcc:
                sent.append(NVCC)
            elif i > 0 and argv[i - 1] == "-o":
                out = Path(a) if os.path.isabs(a) else Path(task.cwd) / a
                sent.append(OUT)
            elif a.startswith("-I") and a[2:].startswith(self.cutlass_root):
                sent.append("-I" + CUTLASS + a[2 + len(self.cutlass_root):])
            elif not a.startswith("-") and i > 0 and (Path(task.cwd) / a).is_file() and not os.path.isabs(a):
                _safe_rel(a)
                files[a] = (Path(task.cwd) / a).read_bytes()     # the source (and any file the command names)
                sent.append(a)
            else:
                sent.append(a)
        if out is None:
            raise ValueError(f"an nvcc command without -o: {' '.join(argv)}")
        env = [(k, v) for k, v in task.env] + [(k, os.environ[k]) for k in _ENV_FLAGS if os.environ.get(k)]
        job = {**self.driver, "argv": sent, "files": files, "out_name": out.name, "timeout_s": task.timeout_s,
               "env": env}
        return job, out

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        if fn is not run_nvcc or len(args) != 1 or kwargs:
            raise TypeError("RayExecutor runs run_nvcc(task) only")
        task: NvccTask = args[0]
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        try:
            job, out = self._pack(task)
        except (OSError, ValueError) as e:
            fut.set_result(NvccResult(2, f"emitter: cannot send this compile to Ray: {e}", 0.0))
            return fut
        need = task_memory(task.argv)
        if self.max_memory and need > self.max_memory:
            if not self._clamped:
                self.note(f"nvcc needs ~{need / 2**30:.1f} GiB but the largest Ray node offers "
                          f"{self.max_memory / 2**30:.1f} GiB of task memory: asking for that instead")
                self._clamped = True
            need = self.max_memory
        ref = self._remote.options(memory=need).remote(job)
        with self._lock:
            self._pending[ref] = fut
        ref.future().add_done_callback(lambda rf, ref=ref: self._land(ref, rf, out, fut))
        return fut

    def _land(self, ref: Any, rf: Future, out: Path, fut: Future) -> None:
        with self._lock:
            self._pending.pop(ref, None)
        if fut.done():
            return
        try:
            r = rf.result()
        except BaseException as e:             # noqa: BLE001 - the worker died, the node was lost, cancelled
            fut.set_result(NvccResult(-1, _ray_failure(e), 0.0))
            return
        output = r["output"]
        if r.get("artifact") is not None:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
                tmp.write_bytes(r["artifact"])
                os.replace(tmp, out)
            except OSError as e:
                fut.set_result(NvccResult(1, output + f"\nemitter: cannot write {out}: {e}", r["wall_s"]))
                return
        fut.set_result(NvccResult(r["returncode"], output, r["wall_s"], r["timed_out"]))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            pending = list(self._pending.items())
        if cancel_futures or not wait:
            # force: the worker is killed, and Ray (2.60: kill_child_processes_on_worker_exit) its nvcc with it
            for ref, fut in pending:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:               # noqa: BLE001 - already finished or gone
                    pass
                if not fut.done():
                    fut.set_result(NvccResult(-1, "emitter: cancelled", 0.0))
        elif pending:
            for _ref, fut in pending:
                fut.result()
        self.session.close()


def _ray_failure(e: BaseException) -> str:
    name = type(e).__name__
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if "WorkerCrashed" in name or "died" in first.lower():
        what = "the Ray worker running nvcc died (a crash, an out-of-memory kill, or its node was lost)"
    elif "Cancel" in name:
        what = "the compile was cancelled"
    elif "NodeDied" in name or "ObjectLost" in name or "OwnerDied" in name:
        what = "the node running nvcc was lost"
    else:
        what = "Ray failed to run nvcc"
    return f"emitter: {what}: {name}: {first}"


__all__ = ["RayExecutor", "compile_on_node", "task_memory"]
