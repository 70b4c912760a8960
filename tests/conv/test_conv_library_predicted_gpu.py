"""The conv library's predicted-time dispatch on a GPU: five of configs/conv/sm90a_resnet50.yaml's f16 2-D kernels
(fprop 128x128 implicit at clusters 1x1 and 1x2, the 128x256 cooperative and 128x128 pingpong 1x1 GEMMs, wgrad
128x128 split-K) emitted and built (`emitter build`), profiled (`emitter profile`, two ResNet-50 layers at N = 32:
writes tuning.json and profile.json), exported with that tuning table (so with the profile.json beside it:
kConvMeasured) and built with CMake (about 3 minutes on 16 cores); then, on layers between and at the profiled ones:

* conv_select says 'predicted' between layers and 'tuned' at a profiled one, and picks the kernel the Python twin
  (emitter/families/conv/library_dispatch.py over the same tables) picks, split-K count included;
* conv2d and conv2d_weight_grad dispatched that way agree with torch (float64 reference, relative error < 1e-2).

$EMITTER_CONV_PREDICTED_LIBRARY: a work directory of an earlier run (gen/, prof/, the built tree) to reuse."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "convpred"
SELECT = "dims=2 a=f16 op=fprop,wgrad tile=128x128x64,128x256x64"
TUNE = ["n=32,h=28,w=28,c=128,k=128,r=3,s=3,pad=1", "n=32,h=14,w=14,c=256,k=256,r=1,s=1"]


def _run(cmd, log: Path, check: bool = True) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    assert r.returncode == 0 or not check, f"{cmd[:4]} failed; see {log}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch (the kernels are sm90a)")
    given = os.environ.get("EMITTER_CONV_PREDICTED_LIBRARY")
    work = Path(given) if given else tmp_path_factory.mktemp("conv_predicted_gpu")
    tree = work / NAME
    if not given:
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        log = Path(os.environ.get("OUT", work)) / "conv_predicted_build.log"
        py, jobs = sys.executable, os.environ.get("EMITTER_TEST_JOBS", "16")
        _run([py, "-m", "emitter", "emit", str(ROOT / "configs/conv/sm90a_resnet50.yaml"), "-o", str(work / "gen"), "-q"], log)
        _run([py, "-m", "emitter", "build", str(work / "gen"), "-j", jobs, "--no-progress", "--select", SELECT], log,
             check=False)      # a kernel that fails to build is left out of the profile and the export
        args = [py, "-m", "emitter", "profile", str(work / "gen"), "--select", SELECT, "--no-baseline", "--no-plots",
                "-o", str(work / "prof")]
        for t in TUNE:
            args += ["--problem", t]
        _run(args, log, check=False)
        assert (work / "prof/tuning.json").is_file() and (work / "prof/profile.json").is_file(), f"no tables; see {log}"
        _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree), "--select", SELECT,
              "--tuning", str(work / "prof/tuning.json")], log)
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_CUDA_ARCHITECTURES=90a",
              "-DCMAKE_BUILD_TYPE=Release"], log)
        _run(["cmake", "--build", str(tree / "build"), "-j", jobs], log)
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return work, tree, mod


def _twin(work: Path, names: list[str]):
    from emitter.families.conv.library import entry_records, kernel_records, measured_entries

    entries = [e for e in json.loads((work / "gen/manifest.json").read_text())["instances"] if e["name"] in names]
    kernels = kernel_records(entries)
    tab = json.loads((work / "prof/tuning.json").read_text())
    prof = [{**e, "source": str(work / "prof/tuning.json"), "position": i} for i, e in enumerate(tab["entries"])
            if (e.get("problem") or {}).get("family") == "conv"]
    tuning, _, _ = entry_records(kernels, prof)
    measured, notes = measured_entries(kernels, prof)
    assert measured, notes
    return kernels, tuning, measured


# (op, N, H, C, K, R): between the profiled layers, and one of them
CASES = [("fprop", 48, 28, 128, 128, 3, "predicted"), ("fprop", 24, 14, 256, 256, 1, "predicted"),
         ("wgrad", 48, 28, 128, 128, 3, "predicted"), ("wgrad", 64, 14, 256, 256, 1, "predicted"),
         ("fprop", 32, 28, 128, 128, 3, "tuned")]


def test_the_table_holds_measured_records(built):
    _, tree, _ = built
    assert "kConvMeasured[]" in (tree / f"src/{NAME}_table.cpp").read_text()
    assert (tree / f"src/{NAME}_conv_dispatch.h").is_file()


def test_predicted_dispatch_runs_correctly(built):
    import torch
    import torch.nn.functional as F

    from emitter.families.conv.library_dispatch import ConvQuery, candidate_order, launch_split_k

    work, _, lib = built
    names = lib.conv_kernels()
    kernels, tuning, measured = _twin(work, names)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for op, n, h, c, k, r, want in CASES:
        pad = (r - 1) // 2
        x = torch.randn(n, c, h, h, device="cuda").half().to(memory_format=torch.channels_last)
        w = (torch.randn(k, c, r, r, device="cuda") / (c * r * r) ** 0.5).half().to(memory_format=torch.channels_last)
        y = torch.randn(n, k, h, h, device="cuda").half().to(memory_format=torch.channels_last)
        if op == "fprop":
            sel = lib.conv_select("fprop", x, w, None, padding=pad)
            got, ref = lib.conv2d(x, w, padding=pad), F.conv2d(x.double(), w.double(), padding=pad)
        else:
            sel = lib.conv_select("wgrad", x, None, y, padding=pad, shape=tuple(w.shape))
            got = lib.conv2d_weight_grad(x, y, tuple(w.shape), padding=pad)
            ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, y.double(), padding=pad)
        what = f"{op} n={n} h={h} c={c} k={k} r={r}: {sel}"
        assert sel["reason"] == want, what
        q = ConvQuery(op=op, a="f16", c="f16", n=n, h=h, w=h, ci=c, k=k, r=r, s=r, p=h, q=h)
        first = candidate_order(kernels, tuning, q, measured)[0]
        assert sel["kernel"] == kernels[first.kernel].name, what
        if first.measured >= 0:      # a split-K kernel runs with its measured record's slices (the twin's count)
            print(f"  twin: split_k {launch_split_k(kernels, tuning, measured, first, q, sms)}")
        err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-2, f"{what}: max relative error {err:.3e}"
        print(f"{what}: max relative error {err:.2e}")
