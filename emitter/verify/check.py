"""One verification case: instance x problem x seed -> inputs, poisoned output, launch, reference, verdict.

Runs inside a worker process (emitter.verify.worker) or inline, for any family: the kernel's family hooks
(emitter.families.base.RuntimeFamily) size the case (footprint: refused before anything is allocated when
it cannot fit), draw the inputs from `seed` (reported, so a failure replays), compute the float64
reference and judge the outputs; this module only sequences them and turns backend errors into verdicts.
"""

from __future__ import annotations

import time
import zlib
from typing import Any, Callable

from emitter.runtime.backend import (
    Backend, CannotImplement, CudaFault, Kernel, LaunchFailed, RuntimeBackendError,
)
from emitter.verify.problems import VerifyProblem

# What a case may take of the memory available: the rest stays for the process, torch, the driver.
MEMORY_FRACTION = 0.9


def case_seed(base_seed: int, instance: str, label: str) -> int:
    """Deterministic per-case seed from the run's seed (so `--seed` replays every case)."""
    return (int(base_seed) * 1_000_003 + zlib.crc32(f"{instance}|{label}".encode())) % (1 << 63)


def _size(n: int) -> str:
    x = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if x < 1024 or unit == "EiB":
            return f"{int(x)} bytes" if unit == "bytes" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} bytes"


def too_large_reason(footprint: Any, device_free: int | None, host_available: int) -> str | None:
    """Why a case of this Footprint cannot be run here (bytes needed vs available), or None.

    The device check applies where buffers live on a device (device_free known); the host always holds the
    inputs, the reference and the comparison's temporaries (and, on the fake backend, the "device" buffers)."""
    host_need = footprint.host + (footprint.device if device_free is None else 0)
    if device_free is not None and footprint.device > MEMORY_FRACTION * device_free:
        return (f"does not fit: the problem needs {_size(footprint.device)} ({footprint.device} bytes) of device "
                f"memory, {_size(device_free)} are free; refused before allocating (use smaller sizes)")
    if host_need > MEMORY_FRACTION * host_available:
        return (f"does not fit: the problem needs {_size(host_need)} ({host_need} bytes) of host memory for its "
                f"inputs, outputs and float64 reference, {_size(host_available)} are available; refused before "
                f"allocating (use smaller sizes)")
    return None


# ---------------------------------------------------------------------------------------------- one case
def _result(kernel_name: str, vp: VerifyProblem, seed: int, status: str, reason: str = "", **kw: Any) -> dict[str, Any]:
    out = {"instance": kernel_name, "problem": vp.label, "problem_spec": vp.as_dict(), "seed": seed,
           "status": status, "reason": reason}
    out.update(kw)
    return out


def run_case(backend: Backend, kernel: Kernel, vp: VerifyProblem, seed: int,
             on_launch: Callable[[], None] | None = None, on_launched: Callable[[], None] | None = None) -> dict[str, Any]:
    """Verify `kernel` on `vp`; returns a result dict (status PASSED / FAILED / SKIPPED, errors, worst element).

    A CudaFault is returned as FAILED with `fatal: True` (the caller must drop the CUDA context)."""
    t0 = time.perf_counter()
    cfg = kernel.config
    hooks = kernel.hooks
    p = hooks.resolve_problem(cfg, vp.problem)
    device_free, host_available = backend.memory_available()
    why = too_large_reason(hooks.footprint(cfg, p), device_free, host_available)
    if why:
        return _result(kernel.name, vp, seed, "SKIPPED", why, wall_s=time.perf_counter() - t0)
    inp = hooks.make_inputs(cfg, p, vp.data, seed)
    if hasattr(backend, "problem_label"):
        backend.problem_label = vp.label
    if on_launch:
        on_launch()
    try:
        res = backend.run(kernel, p, inp)
    except CannotImplement as e:
        return _result(kernel.name, vp, seed, "SKIPPED", str(e), wall_s=time.perf_counter() - t0)
    except CudaFault as e:
        return _result(kernel.name, vp, seed, "FAILED", f"CUDA fault: {e}", fatal=True, wall_s=time.perf_counter() - t0)
    except LaunchFailed as e:
        return _result(kernel.name, vp, seed, "FAILED", f"launch failed: {e}", wall_s=time.perf_counter() - t0)
    except RuntimeBackendError as e:
        return _result(kernel.name, vp, seed, "FAILED", f"{type(e).__name__}: {e}", wall_s=time.perf_counter() - t0)
    if on_launched:
        on_launched()

    ref = hooks.reference(cfg, p, inp, device=backend.reference_device)
    cmp = hooks.compare(cfg, p, inp, res.outputs, ref)
    status, reason = cmp.get("status", "FAILED"), cmp.get("reason", "")
    time_ms = res.time_ms
    flops = hooks.flops(cfg, p)
    return _result(
        kernel.name, vp, seed, status, reason,
        **{k: v for k, v in cmp.items() if k not in ("status", "reason")},
        **inp.info,
        time_ms=time_ms, tflops=(flops / (time_ms * 1e-3) / 1e12) if time_ms else None,
        launch=res.launch, wall_s=time.perf_counter() - t0,
    )
