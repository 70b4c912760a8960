"""Preparing a kernel launch through its HostShim, the steps every family's profiler launch object takes per operand
set (GEMM's KernelLaunch in emitter/families/gemm/workload.py, attention's in emitter/families/attention/profile.py):

    q = prepare.query(shim, problem, kernel.name, refusal=f"can_implement is false for {key}")
    ... allocate q.workspace_bytes of workspace (the family's own business: marking, resets) ...
    entry, launch = prepare.initialize(shim, fn, problem, ws, stream.handle, q, kernel.name,
                                       refusal=f"initialize: can_implement is false for {key}")
    launches.append(entry)            # (grid, block, PackedParams, shared bytes): fn.launch(grid, block, shared, ...)

query(): the shim's sizes, or CannotImplement (the family's `refusal` message) / LaunchFailed. initialize(): the
Params block, asked for with the capacity query() gave (at least 64 bytes) and asked again once with the size the
shim says it needs if that was too small; CannotImplement / LaunchFailed on a refusal, an error or no Params; an
empty grid or block is LaunchFailed; the kernel function is allowed the launch's dynamic shared memory.
"""

from __future__ import annotations

from typing import Any

from emitter.kit.failures import CannotImplement, LaunchFailed
from emitter.kit.launcher import PackedParams
from emitter.kit.shim import (EMITTER_BUFFER_TOO_SMALL, EMITTER_CANNOT_IMPLEMENT, EMITTER_OK, EmitterLaunch,
                                  status_name)

LaunchEntry = tuple[tuple[int, int, int], tuple[int, int, int], PackedParams, int]   # grid, block, params, shared

MIN_PARAMS_CAPACITY = 64


def query(shim: Any, problem: Any, name: str, *, refusal: str) -> EmitterLaunch:
    """emitter_<name>_query on `problem`: the launch sizes (workspace_bytes, params_bytes, ...)."""
    status, q = shim.query(problem)
    if status == EMITTER_CANNOT_IMPLEMENT:
        raise CannotImplement(refusal)
    if status != EMITTER_OK:
        raise LaunchFailed(f"emitter_{name}_query returned {status_name(status)}")
    return q


def initialize(shim: Any, fn: Any, problem: Any, workspace: int, stream: Any, q: EmitterLaunch, name: str, *,
               refusal: str) -> tuple[LaunchEntry, EmitterLaunch]:
    """emitter_<name>_initialize on `problem` with its workspace, on `stream`: the launch entry and the shim's
    launch record (grid, block, shared and Params sizes: the measurement's info)."""
    capacity = max(int(q.params_bytes), MIN_PARAMS_CAPACITY)
    status, params, launch = shim.initialize(problem, workspace, stream, capacity)
    if status == EMITTER_BUFFER_TOO_SMALL and launch.params_bytes > capacity:
        status, params, launch = shim.initialize(problem, workspace, stream, int(launch.params_bytes))
    if status == EMITTER_CANNOT_IMPLEMENT:
        raise CannotImplement(refusal)
    if status != EMITTER_OK or not params:
        raise LaunchFailed(f"emitter_{name}_initialize returned {status_name(status)}")
    grid, block = tuple(launch.grid), tuple(launch.block)
    if min(grid) < 1 or min(block) < 1:
        raise LaunchFailed(f"shim returned an empty launch: grid={grid} block={block}")
    shared = int(launch.shared_bytes)
    fn.allow_shared(shared)
    return (grid, block, PackedParams(params), shared), launch
