"""Attention cases run in this process on a backend the caller constructs (the GPU's PycudaBackend, or the
fake numpy backend with planted faults): load each built instance, run problems on poisoned outputs, compare with
the float64 reference and say per case PASS / FAIL / SKIP with where a failure is (heads, masked rows, LSE), so a
planted bug shows its reason.

The backends are the runtime stage's; a family does not import a stage, so the caller passes one in:

    from emitter.runtime.pycuda_backend import PycudaBackend
    from emitter.families.attention.runner import run
    run("generated/attn", PycudaBackend(), select="*_gqa", quick=True)

There is no worker isolation here (a CUDA fault ends the run). From the command line `emitter verify OUT
--no-isolation` runs the same cases in one process, and its `<out>/verify/results.json` holds the same verdicts
(failed_heads, failed_rows, failed_masked_rows, failed_full_rows, lse_failed); this module is what the attention
GPU tests (tests/attention/test_attention*_gpu.py) use to look at one instance closely.
"""

from __future__ import annotations

import fnmatch
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from emitter.families.attention import runtime as hooks
from emitter.families.attention.problem import AttentionProblem


def attention_entries(root: str | Path, select: str = "*") -> list[dict[str, Any]]:
    data = json.loads((Path(root) / "manifest.json").read_text())
    return [e for e in data["instances"] if e.get("family") == "attention" and fnmatch.fnmatchcase(e["name"], select)]


class Runner:
    """The kernels loaded from `root` on `backend` (emitter.runtime's PycudaBackend -- the primary context, shared
    with torch -- or its FakeBackend, numpy with planted faults, which runs the same path without a GPU)."""

    def __init__(self, root: str | Path, backend: Any) -> None:
        self.root = Path(root)
        self.backend = backend
        self._kernels: dict[str, Any] = {}

    def kernel(self, entry: dict[str, Any]) -> Any:
        if entry["name"] not in self._kernels:
            self._kernels[entry["name"]] = self.backend.load(self.root, entry)
        return self._kernels[entry["name"]]

    def run_case(self, entry: dict[str, Any], p: AttentionProblem, data: str = "normal", seed: int = 0,
                 keep: bool = False) -> dict[str, Any]:
        """One case: inputs (outputs poisoned), launch, reference, compare. Returns the verdict with `label`,
        `status` (PASSED / FAILED / SKIPPED) and `reason`; keep: also `inputs` and `outputs` (storage)."""
        from emitter.kit.failures import CannotImplement, CudaFault, LaunchFailed

        k = self.kernel(entry)
        cfg = k.config
        label = hooks.problem_label(p, data)
        why = hooks.not_supported_reasons(cfg, p)
        if why:
            return {"instance": k.name, "label": label, "status": "SKIPPED", "reason": "; ".join(why)}
        inp = hooks.make_inputs(cfg, p, data, seed)
        t0 = time.perf_counter()
        try:
            res = self.backend.run(k, p, inp)
        except CannotImplement as e:
            return {"instance": k.name, "label": label, "status": "SKIPPED", "reason": str(e)}
        except (LaunchFailed, CudaFault) as e:
            return {"instance": k.name, "label": label, "status": "FAILED", "reason": f"{type(e).__name__}: {e}",
                    "fatal": isinstance(e, CudaFault)}
        ref = hooks.reference(cfg, p, inp, device=self.backend.reference_device)
        verdict = hooks.compare(cfg, p, inp, res.outputs, ref)
        verdict.update(instance=k.name, label=label, time_ms=res.time_ms, launch=res.launch,
                       wall_s=time.perf_counter() - t0)
        if keep:
            verdict.update(inputs=inp, outputs=res.outputs)
        return verdict


def line(v: dict[str, Any]) -> str:
    word = {"PASSED": "PASS", "FAILED": "FAIL", "SKIPPED": "SKIP"}.get(v["status"], v["status"])
    text = f"{word} {v['instance']} [{v['label']}]"
    if v["status"] == "PASSED":
        text += f" rel {v.get('rel_err', 0):.2e} (tol {v.get('tol', 0):g})"
        if v.get("lse_max_abs_err") is not None:
            text += f" lse {v['lse_max_abs_err']:.1e}"
    else:
        text += f": {v.get('reason', '')}"
        if v.get("failed_heads"):
            text += (f" | heads {v['failed_heads']} rows {v.get('failed_rows')} (masked {v.get('failed_masked_rows')}, "
                     f"full {v.get('failed_full_rows')}) lse_failed={v.get('lse_failed')}")
    return text


def run(root: str | Path, backend: Any, select: str = "*",
        problems: Iterable[tuple[AttentionProblem, str]] | None = None, quick: bool = False, data: str = "all",
        seed: int = 0, out: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every selected attention instance of `root` on `problems` (default: the family's default set), one `line`
    per case through `out`; stops at a CUDA fault (the context is lost)."""
    r = Runner(root, backend)
    results = []
    for entry in attention_entries(root, select):
        cfg = hooks.config_from_entry(entry, root)
        cases = list(problems) if problems is not None else hooks.default_problems(cfg, quick=quick)
        for i, (p, kind) in enumerate(cases):
            if data != "all" and kind != data:
                continue
            v = r.run_case(entry, p, kind, seed + i)
            results.append(v)
            out(line(v))
            if v.get("fatal"):
                out("CUDA context lost: stopping")
                return results
    return results
