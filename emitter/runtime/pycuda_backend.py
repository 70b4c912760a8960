"""The GPU backend: PyCUDA context, memory, streams and events; Params from the instance's ctypes host shim.

Family-agnostic: the manifest entry's family supplies the config (config_from_entry) and the shim's
problem struct (c_problem) for the device pointers of the case's buffers.

Launch path: emitter_<name>_query -> workspace -> emitter_<name>_initialize(problem, workspace, stream,
params_buf, capacity, &launch) -> the Params bytes, packed 64-byte aligned -> raise the dynamic
shared-memory limit above 48 KiB -> cuLaunchKernel of emitter_<name>_kernel(__grid_constant__ Params)
with the Params by value in kernelParams form (emitter/kit/launcher.py says why not PyCUDA's packed
buffer) and the shim's grid/block/shared. Cluster kernels carry __cluster_dims__ in the cubin, which a
plain launch honours.

PyCUDA is imported only inside functions (`pip install emitter[gpu]`), and the primary context is used
(pycuda.autoprimaryctx) so torch (GPU references) and the shim's CUDA runtime calls share it.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from emitter.families.base import Inputs
from emitter.runtime.backend import (
    Backend, BackendUnavailable, CannotImplement, CudaFault, Kernel, LaunchFailed, NotBuilt, RunResult,
    build_record, family_config, host_memory_available,
)
from emitter.kit.launcher import DriverError, DriverKernel, PackedParams
from emitter.kit.shim import (
    EMITTER_BUFFER_TOO_SMALL, EMITTER_CANNOT_IMPLEMENT, EMITTER_OK, HostShim, ShimError, status_name,
)

# CUDA errors after which the context is unusable (sticky errors): the worker process must exit.
_STICKY = (
    "illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
    "illegal instruction", "invalid program counter", "device-side assert", "hardware stack error",
    "launch timed out", "launch timeout", "context is destroyed", "uncorrectable",
)


def is_sticky(text: str) -> bool:
    """Whether a CUDA error text names a sticky error (the context is unusable afterwards)."""
    t = text.lower()
    return any(s in t for s in _STICKY)


_is_sticky = is_sticky


class PycudaBackend(Backend):
    name = "pycuda"

    def __init__(self, device_reference: bool = True) -> None:
        try:
            import pycuda.driver as drv  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable(f"PyCUDA is not importable ({e}); install it with `pip install emitter[gpu]` "
                                     "on a machine with an NVIDIA GPU and driver") from None
        try:
            import pycuda.autoprimaryctx  # noqa: F401  (retains and pushes the device's primary context)
        except Exception as e:  # pycuda raises its own Error types (no device, no driver)
            raise BackendUnavailable(f"no usable CUDA device: {e}") from None
        self.drv = drv
        self.device = drv.Context.get_device()
        self.stream = drv.Stream()
        self.reference_device = "cuda" if device_reference and importlib.util.find_spec("torch") else None

    # -------------------------------------------------------------------------------------- info
    def device_name(self) -> str:
        cc = self.device.compute_capability()
        return f"{self.device.name()} (sm_{cc[0]}{cc[1]}, {self.device.get_attribute(self.drv.device_attribute.MULTIPROCESSOR_COUNT)} SMs)"

    # -------------------------------------------------------------------------------------- load
    def load(self, root: Path, entry: Mapping[str, Any]) -> Kernel:
        root = Path(root)
        name = str(entry["name"])
        hooks, cfg = family_config(entry, root)
        record = build_record(root, name)
        cubin = root / record["artifacts"]["cubin"]
        host = root / record["artifacts"]["host"]
        try:
            shim = HostShim(host, name)
        except ShimError as e:
            raise LaunchFailed(str(e)) from None
        try:
            fn = DriverKernel(cubin, f"emitter_{name}_kernel")
        except (DriverError, OSError) as e:
            text = f"cannot load {cubin.name} / emitter_{name}_kernel: {e}"
            low = str(e).lower()
            if "no kernel image" in low or "no binary" in low or "kernel image is invalid" in low:
                cc = self.device.compute_capability()
                raise NotBuilt(f"cannot run here: the cubin (arch {cfg.arch}) has no code for this GPU "
                               f"(sm_{cc[0]}{cc[1]}): {e}") from None
            if _is_sticky(str(e)):
                raise CudaFault(text) from None
            raise LaunchFailed(text) from None
        return Kernel(name=name, config=cfg, entry=dict(entry), root=root,
                      handle={"shim": shim, "fn": fn, "record": record}, family=hooks.NAME)

    def memory_available(self) -> tuple[int | None, int]:
        try:
            free, _total = self.drv.mem_get_info()
            dev: int | None = int(free)
        except Exception:  # noqa: BLE001 - a driver without the query: unknown, not zero
            dev = None
        return dev, host_memory_available()

    # -------------------------------------------------------------------------------------- run
    def _alloc(self, host: np.ndarray | None, allocations: list) -> int:
        if host is None:
            return 0
        nbytes = max(int(host.nbytes), 1)
        dev = self.drv.mem_alloc(nbytes)
        allocations.append(dev)
        if host.nbytes:
            self.drv.memcpy_htod(dev, np.ascontiguousarray(host))
        return int(dev)

    def run(self, kernel: Kernel, problem: Any, inputs: Inputs) -> RunResult:
        drv = self.drv
        h = kernel.handle
        shim: HostShim = h["shim"]
        p = kernel.hooks.resolve_problem(kernel.config, problem)
        allocations: list = []
        try:
            pointers: dict[str, int] = {}
            try:
                for key, host in inputs.buffers.items():
                    pointers[key] = self._alloc(host, allocations)
            except drv.Error as e:
                raise (CudaFault if _is_sticky(str(e)) else LaunchFailed)(f"device allocation/copy failed: {e}") from None

            prob = kernel.hooks.c_problem(kernel.config, p, pointers)
            status, q = shim.query(prob)
            if status == EMITTER_CANNOT_IMPLEMENT:
                what = kernel.hooks.problem_label(p, "").rstrip("_")
                raise CannotImplement(f"{kernel.name}_query: EMITTER_CANNOT_IMPLEMENT (can_implement is false "
                                      f"for {what})")
            if status != EMITTER_OK:
                raise LaunchFailed(f"emitter_{kernel.name}_query returned {status_name(status)}")

            ws_bytes = int(q.workspace_bytes)
            if ws_bytes < 0:
                raise LaunchFailed(f"query returned a negative workspace size {ws_bytes}")
            ws = 0
            if ws_bytes:
                dev = drv.mem_alloc(ws_bytes)
                allocations.append(dev)
                ws = int(dev)

            capacity = max(int(q.params_bytes), 64)
            status, params, launch = shim.initialize(prob, ws, self.stream.handle, capacity)
            if status == EMITTER_BUFFER_TOO_SMALL and launch.params_bytes > capacity:
                status, params, launch = shim.initialize(prob, ws, self.stream.handle, int(launch.params_bytes))
            if status == EMITTER_CANNOT_IMPLEMENT:
                raise CannotImplement(f"{kernel.name}_initialize: EMITTER_CANNOT_IMPLEMENT")
            if status != EMITTER_OK:
                raise LaunchFailed(f"emitter_{kernel.name}_initialize returned {status_name(status)}")
            info = launch.as_dict()
            grid, block, cluster = tuple(launch.grid), tuple(launch.block), tuple(launch.cluster)
            if min(grid) < 1 or min(block) < 1:
                raise LaunchFailed(f"shim returned an empty launch: grid={grid} block={block}")
            if any(c < 1 or g % c for g, c in zip(grid, cluster)):
                raise LaunchFailed(f"grid {grid} is not a multiple of the cluster shape {cluster}")
            if len(params) != launch.params_bytes or not params:
                raise LaunchFailed(f"shim wrote {len(params)} params bytes, launch says {launch.params_bytes}")

            packed = PackedParams(params)
            shared = int(launch.shared_bytes)
            fn: DriverKernel = h["fn"]
            try:
                fn.allow_shared(shared)
            except DriverError as e:
                raise LaunchFailed(f"cannot allow {shared} bytes of dynamic shared memory: {e}") from None

            start, end = drv.Event(), drv.Event()
            try:
                self.stream.synchronize()           # the shim's workspace initialisation
                start.record(self.stream)
                fn.launch(grid, block, shared, self.stream.handle, packed)
                end.record(self.stream)
                end.synchronize()
            except (drv.Error, DriverError) as e:
                text = f"{type(e).__name__}: {e}"
                if _is_sticky(text) or not self._context_ok():
                    raise CudaFault(text) from None
                raise LaunchFailed(text) from None
            time_ms = float(end.time_since(start))

            outputs: dict[str, np.ndarray] = {}
            for key in inputs.outputs:
                out = np.empty_like(inputs.buffers[key])
                try:
                    if out.nbytes:
                        drv.memcpy_dtoh(out, pointers[key])
                except drv.Error as e:
                    raise CudaFault(f"copying {key} back failed: {e}") from None
                outputs[key] = out
            return RunResult(outputs=outputs, time_ms=time_ms, launch=info)
        finally:
            for a in allocations:
                try:
                    a.free()
                except Exception:
                    pass

    def _context_ok(self) -> bool:
        try:
            self.drv.Context.synchronize()
            return True
        except self.drv.Error:
            return False


def pycuda_available() -> bool:
    """True when PyCUDA imports and a CUDA device answers (used to skip GPU tests cleanly)."""
    if importlib.util.find_spec("pycuda") is None:
        return False
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False
