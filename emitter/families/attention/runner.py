"""A family-local GPU path for attention instances: load each built instance (cubin + host shim, from its
build record, through emitter.runtime's PycudaBackend and launcher: Params by value, workspace, dynamic
shared memory), run problems on poisoned outputs, compare with the float64 reference (torch on the GPU when
it is importable, numpy otherwise) and print PASS / FAIL / SKIP per case, with where a failure is (heads,
masked rows, LSE) so a planted bug shows its reason.

    python3 -m emitter.families.attention.runner OUT [--select GLOB] [--quick] [--problem b=2,hq=16,...]
                                                [--data normal|int|large|all] [--seed N] [--json PATH]
                                                [--backend fake [--fault KIND]]   (no GPU: the fake backend)

It runs in this process (no worker isolation: a CUDA fault ends the run). `emitter verify OUT` runs the same
cases through the family seam with isolation and reports; this module is what tests/attention/test_attention_gpu.py
and a person at the GPU use to look at one instance closely.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from emitter.families.attention import runtime as hooks
from emitter.families.attention.problem import AttentionProblem, make_problem, parse_problem_text


def attention_entries(root: str | Path, select: str = "*") -> list[dict[str, Any]]:
    data = json.loads((Path(root) / "manifest.json").read_text())
    return [e for e in data["instances"] if e.get("family") == "attention" and fnmatch.fnmatchcase(e["name"], select)]


class Runner:
    """One PycudaBackend (the primary context, shared with torch) and the kernels loaded from `root`."""

    def __init__(self, root: str | Path, device_reference: bool = True, backend: str = "pycuda",
                 faults: list[dict[str, Any]] | None = None) -> None:
        """backend "fake" (numpy, planted `faults`) runs the same path without a GPU (CI)."""
        self.root = Path(root)
        if backend == "fake":
            from emitter.runtime.fake_backend import FakeBackend

            self.backend = FakeBackend(faults=faults or [])
        else:
            from emitter.runtime.pycuda_backend import PycudaBackend

            self.backend = PycudaBackend(device_reference=device_reference)
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


def run(root: str | Path, select: str = "*", problems: Iterable[tuple[AttentionProblem, str]] | None = None,
        quick: bool = False, data: str = "all", seed: int = 0, out: Callable[[str], None] = print,
        backend: str = "pycuda", faults: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every selected attention instance of `root` on `problems` (default: the family's default set)."""
    r = Runner(root, backend=backend, faults=faults)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m emitter.families.attention.runner", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="an emitted and built directory (manifest.json, build/)")
    ap.add_argument("--select", default="*", help="instance name glob")
    ap.add_argument("--problem", action="append", default=[], help="b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128 (repeatable)")
    ap.add_argument("--data", default="all", choices=["all", "normal", "int", "large"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every verdict here")
    ap.add_argument("--backend", default="pycuda", choices=["pycuda", "fake"], help="fake: numpy, no GPU")
    ap.add_argument("--fault", action="append", default=[], help="fake backend: plant a fault kind (repeatable)")
    a = ap.parse_args(argv)
    problems = None
    if a.problem:
        try:
            problems = [(make_problem(**parse_problem_text(t)), "normal" if a.data == "all" else a.data) for t in a.problem]
        except (ValueError, TypeError) as e:
            print(f"error: bad --problem: {e}", file=sys.stderr)
            return 2
    results = run(a.root, a.select, problems, a.quick, a.data, a.seed, backend=a.backend,
                  faults=[{"kind": k} for k in a.fault])
    counts = {s: sum(1 for v in results if v["status"] == s) for s in ("PASSED", "FAILED", "SKIPPED")}
    print(f"attention runner: {len(results)} cases: {counts['PASSED']} passed, {counts['FAILED']} failed, "
          f"{counts['SKIPPED']} skipped")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
