"""Conv family (issue 28) on the GPU, through emitter.families.conv.runner: every instance of
configs/conv/verify_set.yaml on its default problems (odd C/K/H/W, stride 2, dilation 2, 1x1, 7x7, asymmetric
padding, C = 3/4 first layers, 3D, beta 0 and != 0, serial split-K), and planted bugs (a halo read from memory
instead of zeros, swapped filter axes, stride ignored, one output row short), each caught for its own reason: where
the output goes wrong and what it equals (emitter/families/conv/check.py).

Set EMITTER_CONV_GPU_DIR to a directory where `emitter emit configs/conv/verify_set.yaml -o DIR && emitter build
DIR -j 16` already ran (the lead's command does); otherwise the test emits and builds it (minutes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_GPU_DIR")
    if root:
        root = Path(root)
    else:
        root = tmp_path_factory.mktemp("conv_gpu") / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(ROOT / "configs" / "conv" / "verify_set.yaml"), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    out, errors = {}, {}
    for e in manifest["instances"]:
        try:
            out[e["name"]] = ConvKernel(root, e)
        except Exception as ex:  # noqa: BLE001  (a build failure fails the first test, not the fixture)
            errors[e["name"]] = f"{type(ex).__name__}: {ex}"
    out["__errors__"] = errors
    return out


def test_every_instance_passes_its_default_problems(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    kernels = dict(kernels)
    errors = kernels.pop("__errors__")
    failures, passed, seen_beta, seen = [f"{n}: does not load: {e}" for n, e in errors.items()], 0, set(), set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert cases, f"{name}: no default problem it can run"
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 1000 + i)
            if v["status"] == "FAILED":
                failures.append(f"{name} {v['problem']}: {v['reason']}")
            elif v["status"] == "PASSED":
                passed += 1
                seen_beta.add(p.beta != 0)
                seen.add((k.cfg.op, k.cfg.arch))
            else:
                failures.append(f"{name} {v['problem']}: SKIPPED by the shim although not_supported_reasons "
                                f"allowed it: {v['reason']}")
    assert not failures, "\n".join(failures)
    assert passed >= 5 * len(kernels)
    assert seen_beta == {False, True}
    assert {(op, arch) for op in ("fprop", "dgrad", "wgrad") for arch in ("sm80", "sm90a")} <= seen


@pytest.mark.parametrize("pattern", ["conv2d_fprop_sm80_*_opt_*", "conv2d_dgrad_sm80_*", "conv2d_wgrad_sm80_*_identity",
                                     "conv2d_fprop_sm90a_f16_*_identity", "conv2d_dgrad_sm90a_*", "conv2d_wgrad_sm90a_*"])
def test_planted_bugs_are_caught_for_the_right_reason(kernels, pattern):
    import fnmatch

    from emitter.families.conv.runner import PLANTED, _wgrad_swapped, expected_reason, planted_problem, run_case

    names = [n for n in kernels if n != "__errors__" and fnmatch.fnmatchcase(n, pattern)
             and "gemm1x1" not in n]   # kernel gemm_1x1 runs 1x1 problems only (tests/conv/test_conv_gemm1x1_gpu.py)
    assert names, pattern
    k = kernels[names[0]]
    p = planted_problem(k.cfg)
    clean = run_case(k, p, "normal", 7)
    assert clean["status"] == "PASSED", clean
    for bug in PLANTED:
        if bug == "stride_ignored" and p.stride[1] == 1:
            continue
        if bug == "swapped_filter_axes" and k.cfg.op == "wgrad":
            v = _wgrad_swapped(k, p, 7)
        else:
            v = run_case(k, p, "normal", 7, planted=bug)
        # caught for its own reason: the wrong (or unwritten) elements are where the fault puts them (border
        # rows/columns, off-diagonal taps, all but the first window, the last row) and the output is the fault
        # model's (emitter/families/conv/check.py)
        print(k.name, bug, v.get("status"), "bad rows", v.get("bad_rows"), "cols", v.get("bad_cols"),
              "unwritten rows", v.get("unwritten_rows"), "model", (v.get("fault_model") or {}).get("status"))
        assert v.get("signature_misses") == [], (k.name, bug, v.get("reason"), v.get("signature_misses"), v.get("bad_map"))
        if bug != "row_short":
            assert v["fault_model"]["status"] == "PASSED", (k.name, bug, v["fault_model"])
        assert expected_reason(bug, v), (k.name, bug, v.get("status"), v.get("reason"), v.get("rel_err"),
                                         v.get("unwritten"))
