"""`emitter profile --executor ray`: one Ray GPU actor per GPU, the local runner's queue and fault policy.

runner.run stays the scheduler: it keeps the queue (largest estimated cost first), hands a worker its next
problem when the worker's log says it finished one, watches each log for progress, restarts a worker that
died without the kernel it was measuring (a `fault` record; the rest of the problem back to the queue; a
kernel that faults twice is dropped), kills one that stalls, and merges every log into the measurements that
profile.json / tuning.json are built from. Here only where a worker runs changes:

  GpuActor   a Ray actor holding one GPU (num_gpus=1; Ray sets its CUDA_VISIBLE_DEVICES). It never touches
             CUDA itself: it starts `python -m emitter.profile.worker` as a child on its node (so a CUDA fault
             or a crash takes down the child, and the actor restarts it), and keeps the child's JSON-lines log
             and stderr on the node's disk.
  _RemoteProc  what runner.run sees in place of a local worker: poll() copies the new log bytes into the
             driver's shard log (and the child's stderr lines, "[gpuN] problem kernel time", to the driver's
             stderr) and returns the child's exit code once its log is drained; send() writes a queue item to
             the child's stdin through the actor, close_input() ends it; kill() kills the child.

No shared file system: the built artifacts of the selected instances (record.json, cubin, host .so) travel
once through the object store and each actor writes them into a private directory on its node; the job's
instance roots point there. An actor that dies (its node lost) is replaced on the next restart.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from emitter.executors import RaySession, RayUnavailable, connect
from emitter.profile.config import ProfileConfig
from emitter.profile.runner import Plan, RunOutcome
from emitter.profile.runner import run as run_local

_POLL_BYTES = 8 << 20
_START_TIMEOUT_S = 600.0


class GpuActor:
    """Runs profile workers on its GPU, one at a time (see the module doc). Plain class: Ray wraps it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="emitter-profile-"))
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None
        self.err: Path | None = None
        self.err_offset = 0
        self.attempt = 0
        self.roots: dict[str, str] = {}

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"host": socket.gethostname(), "node": ctx.get_node_id(), "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def stage(self, bundle: dict[str, dict[str, bytes]]) -> int:
        """Write the artifacts of each manifest root into this node's directory; returns the bytes written."""
        total = 0
        for i, (root, files) in enumerate(sorted(bundle.items())):
            local = self.dir / "roots" / str(i)
            for rel, data in files.items():
                p = PurePosixPath(rel)
                if p.is_absolute() or ".." in p.parts:
                    raise ValueError(f"refusing to write {rel!r} outside {local}")
                dst = local / p
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(data)
                total += len(data)
            local.mkdir(parents=True, exist_ok=True)
            self.roots[root] = str(local)
        return total

    def start(self, job: dict[str, Any]) -> int:
        self.kill()
        self.attempt += 1
        job = dict(job)
        job["instances"] = [dict(i, root=self.roots.get(i["root"], i["root"])) for i in job["instances"]]
        self.log = self.dir / f"attempt{self.attempt}.jsonl"
        self.err = self.dir / f"attempt{self.attempt}.stderr"
        self.err_offset = 0
        job["out"] = str(self.log)
        job_path = self.dir / f"attempt{self.attempt}.job.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        self.log.touch()
        with open(self.err, "wb") as err:
            # no preexec_fn (unsafe in the actor's threaded process): Ray kills a dead actor's children itself
            self.proc = subprocess.Popen([sys.executable, "-m", "emitter.profile.worker", str(job_path)],
                                         stdin=subprocess.PIPE, stdout=err, stderr=subprocess.STDOUT)
        return self.proc.pid

    def feed(self, text: str) -> bool:
        """A queue item (one JSON line) to the worker; False when it has exited."""
        if self.proc is None or self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(text.encode("utf-8"))
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def close_input(self) -> None:
        """No more items: the worker finishes and exits."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

    def poll(self, offset: int) -> tuple[bytes, str, int | None]:
        """(log bytes from offset, new stderr text, exit code once exited and the log is read to its end)."""
        if self.proc is None or self.log is None or self.err is None:
            return b"", "", None
        code = self.proc.poll()
        with open(self.log, "rb") as f:
            f.seek(offset)
            data = f.read(_POLL_BYTES + 1)
        more = len(data) > _POLL_BYTES
        data = data[:_POLL_BYTES]
        with open(self.err, "rb") as f:
            f.seek(self.err_offset)
            err = f.read(1 << 20)
        last_nl = err.rfind(b"\n")
        err = err[:last_nl + 1] if (code is None and last_nl >= 0) else (err if code is not None else b"")
        self.err_offset += len(err)
        return data, err.decode("utf-8", "replace"), (None if more else code)

    def kill(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class _RemoteProc:
    """A worker on a GpuActor, as runner.run handles a local worker process (poll / kill / wait)."""

    def __init__(self, pool: "GpuPool", index: int, log_path: Path) -> None:
        self.pool, self.index, self.log_path = pool, index, log_path
        self.offset = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ray = self.pool.ray
        try:
            data, err, code = ray.get(self.pool.actors[self.index].poll.remote(self.offset), timeout=60)
        except ray.exceptions.GetTimeoutError:
            return None
        except ray.exceptions.RayActorError as e:       # the actor (its node) is gone: the worker with it
            self.pool.lost(self.index, e)
            self.returncode = -1
            return self.returncode
        if data:
            with open(self.log_path, "ab") as f:
                f.write(data)
            self.offset += len(data)
        if err:
            sys.stderr.write(err)
            sys.stderr.flush()
        if code is not None:
            self.returncode = code
        return code

    def kill(self) -> None:
        try:
            self.pool.ray.get(self.pool.actors[self.index].kill.remote(), timeout=60)
        except Exception:                               # noqa: BLE001 - a dead actor has no worker to kill
            pass

    def send(self, text: str) -> None:
        try:
            self.pool.ray.get(self.pool.actors[self.index].feed.remote(text), timeout=60)
        except Exception:                               # noqa: BLE001 - a dead actor: poll() says so next
            pass

    def close_input(self) -> None:
        try:
            self.pool.ray.get(self.pool.actors[self.index].close_input.remote(), timeout=60)
        except Exception:                               # noqa: BLE001
            pass

    def wait(self, timeout: float | None = None) -> int:
        t0 = time.monotonic()
        while self.poll() is None:
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise subprocess.TimeoutExpired("ray worker", timeout)
            time.sleep(0.1)
        assert self.returncode is not None
        return self.returncode


def _bundle(the_plan: Plan) -> dict[str, dict[str, bytes]]:
    """The files a worker reads for each selected instance: build/<name>/record.json and the artifacts it names."""
    out: dict[str, dict[str, bytes]] = {}
    for inst in the_plan.instances:
        root = Path(inst["root"])
        name = inst["entry"]["name"]
        files = out.setdefault(inst["root"], {})
        rec_rel = f"build/{name}/record.json"
        try:
            rec = json.loads((root / rec_rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue                     # not built: the worker reports it as the local run would
        files[rec_rel] = (root / rec_rel).read_bytes()
        for rel in (rec.get("artifacts") or {}).values():
            if rel and (root / rel).is_file():
                files[rel] = (root / rel).read_bytes()
    return out


class GpuPool:
    """n GpuActors (num_gpus=1 each) on a Ray cluster; `gpus` are the labels runner.run queues work to."""

    def __init__(self, session: RaySession, n: int) -> None:
        self.session, self.ray = session, session.ray
        have = int(session.total("GPU"))
        if n > have:
            session.close()
            raise RayUnavailable(f"asked for {n} GPUs but the Ray cluster has {have}\n  fix: --gpus {max(have, 1)} "
                                 "or all, or add GPU nodes (`ray start --address <head>:6379` on a GPU node)")
        self._actor_cls = self.ray.remote(num_gpus=1, num_cpus=0, max_restarts=0)(GpuActor)
        self.actors = [self._actor_cls.remote() for _ in range(n)]
        self.where = self.ray.get([a.where.remote() for a in self.actors], timeout=_START_TIMEOUT_S)
        nodes = {w["node"] for w in self.where}
        ids = [w["gpu_ids"][0] if w["gpu_ids"] else None for w in self.where]
        if len(nodes) == 1 and all(i is not None and str(i).isdigit() for i in ids) and len(set(ids)) == n:
            # one node: the physical indices in ascending order, as a local run names them
            order = sorted(range(n), key=lambda j: int(ids[j]))
            self.actors = [self.actors[j] for j in order]
            self.where = [self.where[j] for j in order]
            self.gpus = [int(ids[j]) for j in order]
        else:
            self.gpus = list(range(n))
        self.bundle_ref: Any = None
        self.closed = False

    @classmethod
    def connect(cls, config: ProfileConfig, override: str | None, address: str | None,
                fake: bool = False) -> "GpuPool":
        """The pool for `gpus:` / --gpus on the cluster at `address`. `fake` (the fake backend, whose GPUs are
        labels): a local Ray instance started here declares as many GPUs as asked for ("all": 1)."""
        spec: Any = config.gpus
        if override:
            spec = "all" if override == "all" else (tuple(int(x) for x in override.split(",")) if "," in override
                                                     else int(override))
        local = address is None and not os.environ.get("EMITTER_RAY_ADDRESS")
        want = 1 if spec == "all" else (len(spec) if isinstance(spec, tuple) else int(spec))
        session = connect(address, num_gpus=want if fake and local else None)
        n = int(session.total("GPU")) if spec == "all" else (len(spec) if isinstance(spec, tuple) else int(spec))
        if n < 1:
            session.close()
            raise RayUnavailable("the Ray cluster has no GPU\n  fix: start Ray on a GPU node (`ray start --head` "
                                 "there, or `ray start --address <head>:6379 --num-gpus N`)")
        return cls(session, n)

    def describe(self) -> str:
        hosts = sorted({w["host"] for w in self.where})
        return (f"Ray: {len(self.actors)} GPU actor{'s' if len(self.actors) != 1 else ''} on "
                f"{', '.join(hosts)} (gpus {', '.join(str(g) for g in self.gpus)})")

    def spawn(self, shard: Any, job_path: Path) -> _RemoteProc:
        i = self.gpus.index(shard.gpu)
        job = json.loads(Path(job_path).read_text(encoding="utf-8"))
        try:
            self.ray.get(self.actors[i].start.remote(job), timeout=_START_TIMEOUT_S)
        except Exception as e:                          # noqa: BLE001 - dead actor: replace it once, then give up
            self.lost(i, e)
            try:
                self.ray.get(self.actors[i].start.remote(job), timeout=_START_TIMEOUT_S)
            except Exception as e2:                     # noqa: BLE001
                proc = _RemoteProc(self, i, shard.log_path)
                proc.returncode = 1
                sys.stderr.write(f"[gpu{shard.gpu}] cannot start a worker on Ray: {type(e2).__name__}: {e2}\n")
                return proc
        return _RemoteProc(self, i, shard.log_path)

    def lost(self, i: int, why: BaseException) -> None:
        """Actor i is gone: start another (it may land on another node) with the artifacts staged again."""
        sys.stderr.write(f"[gpu{self.gpus[i]}] the Ray GPU actor died ({type(why).__name__}); starting another\n")
        try:
            self.ray.kill(self.actors[i])
        except Exception:                               # noqa: BLE001
            pass
        self.actors[i] = self._actor_cls.remote()
        if self.bundle_ref is not None:
            self.ray.get(self.actors[i].stage.remote(self.bundle_ref), timeout=_START_TIMEOUT_S)

    def run(self, config: ProfileConfig, the_plan: Plan, out_dir: Path, gpus: list[int] | None = None,
            backend: str = "pycuda", faults: list[dict[str, Any]] | None = None, model: dict[str, Any] | None = None,
            stall_timeout_s: float = 300.0, isolate: bool = True, resume: bool = False,
            cost: Any = None) -> RunOutcome:
        """runner.run on the actors (same arguments; `gpus` must be self.gpus); closes the pool."""
        try:
            if gpus is not None and list(gpus) != self.gpus:
                raise ValueError(f"gpus {gpus} are not this pool's {self.gpus}")
            self.bundle_ref = self.ray.put(_bundle(the_plan))
            self.ray.get([a.stage.remote(self.bundle_ref) for a in self.actors], timeout=_START_TIMEOUT_S)
            return run_local(config, the_plan, out_dir, self.gpus, backend=backend, faults=faults, model=model,
                             stall_timeout_s=stall_timeout_s, isolate=True, resume=resume, spawn=self.spawn,
                             cost=cost)
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.ray.get([a.close.remote() for a in self.actors], timeout=60)
        except Exception:                               # noqa: BLE001 - dead actors clean nothing
            pass
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:                           # noqa: BLE001
                pass
        self.session.close()


__all__ = ["GpuActor", "GpuPool"]
