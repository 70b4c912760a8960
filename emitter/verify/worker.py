"""The verify worker: one process holding one CUDA context, running cases the runner sends it.

A CUDA fault poisons the context of the process it happens in, so kernels run here and not in the
runner: when a case reports a fatal fault, or the process dies or hangs, the runner records FAILED and
starts a fresh worker. The worker's stdout/stderr (device printf, CUDA or CUTLASS messages) go to a log
file whose new text is attached to each result.

Protocol over a multiprocessing Pipe (pickled tuples):
  worker -> ("ready", device_name) | ("error", kind, message)                         once, at start
  runner -> ("load", root, entry)        worker -> ("loaded", name) | ("error", kind, message)
  runner -> ("run", problem_dict, seed)  worker -> ("phase", "launch"), ("phase", "check"), ("result", dict)
  runner -> ("quit",)
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any


class _Log:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.pos = 0

    def new_text(self, limit: int = 4000) -> str:
        if not self.path:
            return ""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace").strip()
        return text[-limit:]


def _redirect(log_path: str | None) -> None:
    if not log_path:
        return
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def worker_main(conn: Any, backend_name: str, backend_options: dict[str, Any], log_path: str | None = None) -> None:
    _redirect(log_path)
    log = _Log(log_path)
    from emitter.runtime import CudaFault, NotBuilt, RuntimeBackendError, create_backend
    from emitter.verify.check import run_case
    from emitter.verify.problems import VerifyProblem

    try:
        backend = create_backend(backend_name, backend_options)
        conn.send(("ready", backend.device_name()))
    except Exception as e:  # noqa: BLE001 - report anything; the runner decides
        conn.send(("error", type(e).__name__, f"{e}"))
        conn.close()
        os._exit(3)

    kernel = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        op = msg[0]
        if op == "quit":
            break
        if op == "load":
            _, root, entry = msg
            try:
                kernel = backend.load(Path(root), entry)
                conn.send(("loaded", kernel.name))
            except NotBuilt as e:
                kernel = None
                conn.send(("error", "NotBuilt", f"{e}" + (" [build failed]" if e.build_failed else "")))
            except CudaFault as e:
                conn.send(("error", "CudaFault", f"{e}\n{log.new_text()}".strip()))
                conn.close()
                os._exit(4)
            except RuntimeBackendError as e:
                kernel = None
                conn.send(("error", type(e).__name__, f"{e}"))
            except Exception as e:  # noqa: BLE001
                kernel = None
                conn.send(("error", type(e).__name__, f"{e}\n{traceback.format_exc(limit=5)}"))
            continue
        if op == "run":
            _, pdict, seed = msg
            vp = None
            try:
                if kernel is None:
                    raise RuntimeError("no instance loaded")
                vp = VerifyProblem.from_dict(pdict, kernel.family)
                res = run_case(backend, kernel, vp, seed,
                               on_launch=lambda: conn.send(("phase", "launch")),
                               on_launched=lambda: conn.send(("phase", "check")))
            except Exception as e:  # noqa: BLE001 - a bug here must not look like a kernel verdict
                res = {"instance": getattr(kernel, "name", "?"), "problem": str(pdict.get("label", "?")),
                       "problem_spec": dict(pdict),
                       "seed": seed, "status": "FAILED",
                       "reason": f"verifier error {type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)}
            out = log.new_text()
            if out:
                res["output"] = out
            conn.send(("result", res))
            if res.get("fatal"):
                conn.close()
                os._exit(4)     # the context is poisoned: never reuse it
            continue
        conn.send(("error", "Protocol", f"unknown op {op!r}"))
    try:
        backend.close()
    except Exception:
        pass
    conn.close()


if __name__ == "__main__":  # pragma: no cover
    print("emitter.verify.worker is started by the verify runner (multiprocessing, spawn)", file=sys.stderr)
    sys.exit(2)
