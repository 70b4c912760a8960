"""What a timed launch pays for its workspace: the profiler's side of the library's per-call workspace reset.

The exported library calls an instance's host shim `emitter_<name>_initialize` on every call, and a shim whose
kernel keeps state in its workspace zeroes that state there, on the caller's stream, before the launch: sm90a GEMM
stream-K / split-K tile locks (GemmKernel::initialize_workspace, templates/gemm/sm90a/entry.cu.j2), sm90a conv
(ConvKernel::initialize_workspace: its stream-K 1x1 kernels' locks) and sm80 conv serial split-K semaphores (cudaMemsetAsync,
templates/conv/sm80/entry.cu.j2). A kernel launch in the profiler runs initialize() once per operand set and then
launches many times, so it decides itself whether each timed launch is preceded by that memset
(profile config `timing.workspace_reset`, `emitter profile --workspace-reset`):

  library   (default) a memset of the bytes initialize() zeroed, on the stream before every timed launch: what a
            call into the exported library costs on the GPU, so a tuning table ranks kernels on what users get.
  settled   the memset only where one launch does not leave those bytes zeroed again (emitter's sm90a stream-K
            scheduler sets its locks back to zero, templates/common/sm90_stream_k.cu.j2): the kernel alone.

Which bytes initialize() zeroes is read off the device: the workspace is filled with MARK before initialize() runs
and read back after it; the zeroed span is what each reset zeroes (a workspace larger than SCAN_LIMIT is zeroed
whole). Everything here takes the PyCUDA driver module and the stream as arguments (tests pass stand-ins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MODES = ("library", "settled")   # the profile config's timing.workspace_reset values

DEFAULT = "library"
MARK = 0xA5                      # workspace bytes before initialize(): what it zeroes shows up as 0
SCAN_LIMIT = 256 << 20           # larger workspaces are zeroed whole before each launch (not read back)


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"workspace_reset {mode!r}: expected one of {', '.join(MODES)}")
    return str(mode)


def mark(drv: Any, ws: int, nbytes: int) -> None:
    """Fill a fresh workspace with MARK before initialize() runs on it (zeroed_range then finds what it zeroed)."""
    if ws and 0 < nbytes <= SCAN_LIMIT:
        drv.memset_d8(ws, MARK, nbytes)


def zeroed_range(drv: Any, stream: Any, ws: int, nbytes: int) -> tuple[int, int] | None:
    """The span of a marked workspace that initialize() set to zero (after it ran on `stream`); None: nothing."""
    if not ws or nbytes <= 0:
        return None
    stream.synchronize()
    if nbytes > SCAN_LIMIT:
        return (ws, nbytes)
    host = np.empty(nbytes, dtype=np.uint8)
    drv.memcpy_dtoh(host, ws)
    zero = np.flatnonzero(host == 0)
    if zero.size == 0:
        return None
    lo, hi = int(zero[0]), int(zero[-1]) + 1
    return (ws + lo, hi - lo)


def settle(drv: Any, fn: Any, stream: Any, handle: int, launches: list, resets: list) -> int:
    """`settled` mode: drop the reset of each set where one launch leaves the zeroed bytes at zero again.

    One launch per set that has a reset, read back: bytes still zero -> resets[j] = None. A set whose bytes do not
    come back to zero keeps its reset (and is zeroed again here for the first timed launch); so does a span too
    large to read back. launches[j] = (grid, block, packed params, shared bytes). Returns how many kept one."""
    kept = 0
    for j, reset in enumerate(resets):
        if reset is None:
            continue
        if reset[1] > SCAN_LIMIT:
            kept += 1
            continue
        grid, block, packed, shared = launches[j]
        fn.launch(grid, block, shared, handle, packed)
        stream.synchronize()
        host = np.empty(reset[1], dtype=np.uint8)
        drv.memcpy_dtoh(host, reset[0])
        if np.any(host):
            drv.memset_d8(reset[0], 0, reset[1])       # as initialize() left it, for the first timed launch
            kept += 1
        else:
            resets[j] = None
    return kept


def describe(mode: str, zeroed: bool, resets: list, workspace_bytes: int) -> dict[str, Any]:
    """The launch record's fields: {"workspace_reset_mode": mode, "workspace_reset": what each timed launch pays}.
    zeroed: initialize() zeroed some workspace on some set (before settle() dropped any reset)."""
    out: dict[str, Any] = {"workspace_reset_mode": mode}
    if any(r is not None for r in resets):
        out["workspace_reset"] = ("memset before each launch (as the library's initialize())" if mode == "library"
                                  else "memset before each launch")
    elif zeroed:
        out["workspace_reset"] = "none: each launch leaves the zeroed workspace zeroed"
    elif workspace_bytes:
        out["workspace_reset"] = "none: initialize() zeroes none of the workspace"
    return out


def before_launch(drv: Any, stream: Any, reset: tuple[int, int] | None) -> None:
    """The reset of one set, on the stream, ahead of its launch (what initialize() issues in the library)."""
    if reset is not None:
        drv.memset_d8_async(reset[0], 0, reset[1], stream)
