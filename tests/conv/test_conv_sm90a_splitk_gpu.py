"""sm90a wgrad split over the SMs (`split_k: parallel`) on the GPU, through emitter.families.conv.runner: the
split-K instances of configs/conv/sm90a_splitk.yaml on their default problems (odd C/K/H/W, stride 2, dilation 2,
asymmetric padding, beta 0 and != 0; 3 slices, 1 = the stream-K heuristic, 13 on a long reduction), the planted
bugs, the two long-reduction ResNet-50 layers (at N = 8) at every slice count the bench times and beyond, and one
prepared launch run again and again on its workspace (the scheduler's tile locks must come back to zero: a stale
lock would hang the next launch or hand it a partial sum).

The instances are in configs/conv/sm90a_splitk.yaml and configs/conv/verify_set.yaml: set EMITTER_CONV_SPLITK_DIR
(or EMITTER_CONV_GPU_DIR, as scripts/gpu_suite.sh does for the verify set) to a directory where either was emitted
and built; otherwise the test emits and builds them (minutes)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu
WANT = ("conv2d_wgrad_sm90a_f16_f16_accf32_nhwc_64x64x64_c1x1x1_s8_strided_al8x8x8_identity_splitkparallel",
        # a 1x2 cluster: dy multicast to two CTAs, the 9 n-tiles of a 3x3 filter padded to 10 (one empty tile)
        "conv2d_wgrad_sm90a_f16_f16_accf32_nhwc_64x64x64_c1x2x1_s8_strided_al8x8x8_identity_splitkparallel",
        "conv2d_wgrad_sm90a_bf16_bf16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_splitkparallel")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_SPLITK_DIR") or os.environ.get("EMITTER_CONV_GPU_DIR")
    if root:
        root = Path(root)
    else:
        root = tmp_path_factory.mktemp("conv_splitk") / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(ROOT / "configs" / "conv" / "sm90a_splitk.yaml"), "-o", str(root)],
                       check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"]
                       + [a for n in WANT for a in ("--select", n)], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["instances"]}
    out = {}
    for name in WANT:
        assert name in entries, f"{name} is not in {root}/manifest.json"
        out[name] = ConvKernel(root, entries[name])
    return out


def test_default_problems_and_planted_bugs(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import PLANTED, _wgrad_swapped, expected_reason, planted_problem, run_case

    failures, splits = [], set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 8, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 2000 + i)
            splits.add(p.split_k)
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
        p = planted_problem(k.cfg)
        for bug in PLANTED:
            v = _wgrad_swapped(k, p, 77) if bug == "swapped_filter_axes" else run_case(k, p, "normal", 77, planted=bug)
            if not expected_reason(bug, v):
                failures.append(f"{name} planted {bug} not caught for its reason: {v.get('reason')}")
    assert splits == {1, 3, 13}
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("layer", ["C64 56^2 K64 3x3", "C128 28^2 K128 3x3"])
def test_resnet_layer_at_every_slice_count(kernels, layer):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import run_case

    c = 64 if layer.startswith("C64") else 128
    hw = 56 if c == 64 else 28
    base = ConvProblem(n=8, h=hw, w=hw, c=c, k=c, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), beta=0.5)
    failures = []
    for name, k in kernels.items():
        counts = sorted(set(hooks.split_k_choices(k.cfg, base)) | {1, 2, 5, 64})
        for i, split in enumerate(counts):
            for data in ("normal", "int"):
                v = run_case(k, replace(base, split_k=split), data, 3000 + i)
                if v["status"] != "PASSED":
                    failures.append(f"{name} {layer} split {split} {data}: {v['status']} {v.get('reason')}")
    assert not failures, "\n".join(failures)


def test_one_prepared_launch_runs_again_and_again_on_its_workspace(kernels):
    import numpy as np

    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import to_device, to_host

    for name, k in kernels.items():
        torch = k.torch
        for split in (1, 14):
            p = ConvProblem(n=8, h=28, w=28, c=128, k=128, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                            split_k=split)
            inputs = hooks.make_inputs(k.cfg, p, "int", 11)
            dts = {"x": k.cfg.a, "w": k.cfg.c, "y": k.cfg.a, "source": k.cfg.c, "bias": k.cfg.c}
            dev = {t: to_device(torch, v, dts[t]) for t, v in inputs.buffers.items()}
            stream = torch.cuda.current_stream().cuda_stream
            ptrs = {t: (dev[t].data_ptr() if dev.get(t) is not None else 0) for t in ("x", "w", "y", "source", "bias")}
            packed, launch = k.prepare(p, ptrs, stream)
            ref = hooks.reference(k.cfg, p, inputs, "cuda")
            poison = to_device(torch, np.asarray(inputs.buffers["w"]), k.cfg.c)   # make_inputs poisoned it
            for again in range(4):
                dev["w"].copy_(poison)
                k.launch(packed, launch, stream)
                torch.cuda.synchronize()
                got = to_host(torch, dev["w"], k.cfg.c)
                v = hooks.compare(k.cfg, p, inputs, {"w": got}, ref)
                assert v["status"] == "PASSED", (name, split, again, v.get("reason"))
