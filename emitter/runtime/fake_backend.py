"""A pure-numpy backend for CI: "runs" an instance of any family from its manifest config, with planted faults.

It needs no build record and no GPU: the family's `fake_run` hook (emitter.families.base.RuntimeFamily)
reads the input buffers as a kernel would, computes the outputs with its own arithmetic (independent of the
family's reference, so a bug on one side cannot cancel one on the other) and writes the outputs' storage.

Faults (tests plant them to prove the verifier catches each): FakeBackend(faults=[{...}, ...]) where each
fault has `kind` and optionally `select` (a glob on the instance name, default all) and `problem` (a glob
on the problem label the verifier passes via `problem_label`, default all). Kinds every family has:

  crash        the process dies (os._exit(`code`, default 134)) - like a segfaulting shim
  hang         sleep `seconds` (default 3600) - like a kernel that never ends
  illegal_address    raise CudaFault("an illegal memory access was encountered") (context poisoned)
  launch_error raise LaunchFailed
  cannot_implement   raise CannotImplement

and the family's own (its runtime module's FAKE_FAULTS; GEMM: wrong, nan, unwritten, noise, wrong_ld,
swap_layout, drop_beta, wrong_activation, skip_last_k -- emitter/families/gemm/fake.py says what each does).
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from emitter.families.base import Inputs
from emitter.kit.failures import FakeFaultError
from emitter.runtime.backend import (
    Backend, CannotImplement, CudaFault, Kernel, LaunchFailed, RunResult, family_config,
)

GENERIC_FAULTS = ("crash", "hang", "illegal_address", "launch_error", "cannot_implement")


def _known_faults() -> tuple[str, ...]:
    from emitter.families.base import FamilyNotRunnable
    from emitter.families.registry import runtime_family
    from emitter.families.registry import FAMILIES

    kinds = list(GENERIC_FAULTS)
    for fam in FAMILIES:
        try:
            kinds += [k for k in runtime_family(fam, need=()).FAKE_FAULTS if k not in kinds]
        except (ImportError, FamilyNotRunnable):
            continue
    return tuple(kinds)


class FakeBackend(Backend):
    name = "fake"
    reference_device = None

    def __init__(self, faults: Sequence[Mapping[str, Any]] = (), require_build: bool = False) -> None:
        known = _known_faults()
        for f in faults:
            if not isinstance(f, Mapping) or f.get("kind") not in known:
                kind = f.get("kind") if isinstance(f, Mapping) else f
                raise FakeFaultError(f"unknown fake fault kind {kind!r} (known: {', '.join(known)})")
        self.faults = [dict(f) for f in faults]
        self.require_build = require_build
        self.problem_label = ""      # set by the verifier before each run (fault matching only)

    def device_name(self) -> str:
        return "numpy (fake backend)"

    def load(self, root: Path, entry: Mapping[str, Any]) -> Kernel:
        hooks, cfg = family_config(entry, root)
        if self.require_build:
            from emitter.runtime.backend import build_record

            build_record(Path(root), cfg.name)
        return Kernel(name=cfg.name, config=cfg, entry=dict(entry), root=Path(root), family=hooks.NAME)

    def _active(self, name: str) -> list[dict[str, Any]]:
        out = []
        for f in self.faults:
            if not fnmatch.fnmatchcase(name, f.get("select", "*")):
                continue
            if not fnmatch.fnmatchcase(self.problem_label or "", f.get("problem", "*")):
                continue
            out.append(f)
        return out

    def run(self, kernel: Kernel, problem: Any, inputs: Inputs) -> RunResult:
        kinds = {f["kind"]: f for f in self._active(kernel.name)}
        if "crash" in kinds:
            os._exit(int(kinds["crash"].get("code", 134)))
        if "hang" in kinds:
            time.sleep(float(kinds["hang"].get("seconds", 3600)))
        if "illegal_address" in kinds:
            raise CudaFault("cuCtxSynchronize failed: an illegal memory access was encountered")
        if "launch_error" in kinds:
            raise LaunchFailed("cuLaunchKernel failed: too many resources requested for launch")
        if "cannot_implement" in kinds:
            raise CannotImplement(f"{kernel.name}: EMITTER_CANNOT_IMPLEMENT (planted)")
        family_faults = {k: f for k, f in kinds.items() if k not in GENERIC_FAULTS}
        hooks = kernel.hooks
        p = hooks.resolve_problem(kernel.config, problem)
        outputs = hooks.fake_run(kernel.config, p, inputs.buffers, family_faults)
        return RunResult(outputs={k: outputs[k] for k in inputs.outputs}, time_ms=None,
                         launch={"grid": [1, 1, 1], "block": [1, 1, 1], "cluster": [1, 1, 1], "shared_bytes": 0,
                                 "params_bytes": 0, "params_align": 0, "workspace_bytes": 0})
