"""Grouped conv fprop on the GPU (sm80 group_mode single / multiple; Hopper runs the sm_80 build): every grouped
instance of configs/conv/verify_set.yaml on its default problems (groups 2, 3, 4 and depthwise groups = C, odd
C/groups, stride 2, dilation 2, 1x1 and 7x7, asymmetric padding, beta 0 and != 0) against the float64 reference;
the planted bugs (the four of every conv kernel and the wrong group offset) caught for their own reason; and the
kernel's output against cuDNN's grouped convolution (F.conv2d(groups=g) on channels_last tensors).

Set EMITTER_CONV_GPU_DIR to a directory where verify_set.yaml was emitted and built (scripts/gpu_suite.sh conv
does); otherwise the test emits the verify set and builds its grouped instances only."""

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
        root = tmp_path_factory.mktemp("conv_group_gpu") / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(ROOT / "configs" / "conv" / "verify_set.yaml"), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "--select", "*_group*", "-j", str(os.cpu_count() or 4),
                              "--no-progress"], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    grouped = [e for e in manifest["instances"] if e.get("config", {}).get("group_mode", "none") != "none"]
    assert {e["config"]["group_mode"] for e in grouped} == {"single", "multiple"}, "verify_set lacks grouped kernels"
    return {e["name"]: ConvKernel(root, e) for e in grouped}


def test_grouped_instances_pass_their_default_problems(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures, passed, groups = [], 0, set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert cases, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 2000 + i)
            print(name, v["status"], v["problem"], f"rel_err={v.get('rel_err')}", v.get("reason", ""))
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
            else:
                passed += 1
                groups.add("depthwise" if p.groups == p.c else p.groups)
    assert not failures, "\n".join(failures)
    assert passed >= 14 and {2, 3, 4, "depthwise"} <= groups


def test_planted_bugs_on_grouped_instances_are_caught_for_their_reason(kernels):
    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    for name, k in kernels.items():
        p = planted_problem(k.cfg)
        assert run_case(k, p, "normal", 7)["status"] == "PASSED", name
        bugs = planted_bugs(k.cfg)
        assert "group_offset" in bugs
        for bug in bugs:
            v = run_case(k, p, "normal", 7, planted=bug)
            print(name, bug, v.get("status"), "bad channels", v.get("bad_channels", [])[:8], "misses",
                  v.get("signature_misses"))
            assert expected_reason(bug, v), (name, bug, v.get("reason"), v.get("signature_misses"))


@pytest.mark.parametrize("groups", [2, 4, "depthwise"])
def test_grouped_output_matches_cudnn_grouped_convolution(kernels, groups):
    import torch
    import torch.nn.functional as F

    from emitter.families.conv.problem import ConvProblem, not_supported_reasons

    torch.manual_seed(0)
    for name, k in kernels.items():
        tn = k.cfg.tile[1]
        if groups == "depthwise":
            p = ConvProblem(n=4, h=28, w=28, c=64, k=64, groups=64, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
        else:
            kg = tn if k.cfg.group_mode == "single" else tn // 2
            cg = 8 * max(k.cfg.alignment_a, 1)
            p = ConvProblem(n=4, h=28, w=28, c=groups * cg, k=groups * kg, groups=groups, r=3, s=3,
                            pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2))
        if not_supported_reasons(k.cfg.cfg, p):
            continue
        x = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(p.k, p.c // p.groups, p.r, p.s, device="cuda", dtype=torch.float16).to(
            memory_format=torch.channels_last)
        want = F.conv2d(x, w, stride=p.stride[1:], padding=p.pad_front[1:], groups=p.groups)    # cuDNN
        z, pp, q = p.output_extents()
        y = torch.full((p.n, 1, pp, q, p.k), float("nan"), device="cuda", dtype=torch.float16)
        k.run(p, {"x": x.permute(0, 2, 3, 1).unsqueeze(1), "w": w.permute(0, 2, 3, 1).unsqueeze(1), "y": y,
                  "source": None, "bias": None})
        got = y[:, 0].permute(0, 3, 1, 2).float()
        rel = float((got - want.float()).norm() / want.float().norm())
        print(name, groups, f"rel vs cuDNN {rel:.2e}")
        assert torch.isfinite(got).all() and rel < 5e-3, (name, groups, rel)
