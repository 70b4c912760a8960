"""The tuned attention dispatch of an exported library on the GPU: emit -> `emitter library --tuning` with a tuning
table (as `emitter profile` writes it, measured on cc 9.0) whose record picks the sm80 kernel where the static
order would run the sm90a one -> CMake build -> the Python loader: attention_select names the tuned kernel for the
tuned problem and for an untuned one (the nearest record), the sm90a kernel where no record's kernel computes the
problem, and attention() through the tuned kernel matches a float64 reference.

    python3 -m pytest -q -m gpu tests/attention/test_tuning_gpu.py          (a build of 4 kernels, about 3 minutes on 16 cores)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "tunegpu"

SPEC = GEMM_SPEC + """\
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 128
    tile: 128x128
    schedule: cooperative
    mask: [none, causal_top_left]
    lse: true
    gqa: true
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 128
    tile: 32x128
    mask: none
    lse: true
    gqa: true
"""


def _run(cmd, cwd=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-8000:]}\n{r.stderr[-8000:]}"
    return r


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    work = tmp_path_factory.mktemp("tuning_gpu")
    (work / "spec.yaml").write_text(SPEC)
    py = sys.executable
    _run([py, "-m", "emitter", "emit", work / "spec.yaml", "-o", work / "gen"], cwd=ROOT)
    names = [e["name"] for e in json.loads((work / "gen" / "manifest.json").read_text())["instances"]
             if e.get("family") == "attention"]
    sm80 = next(n for n in names if n.startswith("attn_sm80_") and "nomask" in n)
    entry = {"op": {"family": "attention", "dtype": "f16", "head_dim": 128, "head_dim_v": 128, "mask": "none",
                    "layout": "bshd", "key": "attn_f16_d128_full_bshd"},
             "problem": {"family": "attention", "batch": 2, "heads_q": 8, "heads_kv": 2, "seq_q": 1024, "seq_k": 1024,
                         "head_dim": 128, "head_dim_v": 128, "causal": False},
             "kernel": sm80, "split_k": 1, "options": 0}
    (work / "tuning.json").write_text(json.dumps({"schema_version": 1, "kind": "emitter.tuning_table",
                                                  "gpu": {"name": "NVIDIA H100 80GB HBM3", "cc": "9.0"},
                                                  "entries": [entry]}))
    tree = work / NAME
    r = _run([py, "-m", "emitter", "library", work / "gen", "--tuning", work / "tuning.json", "--name", NAME,
              "-o", tree], cwd=ROOT)
    assert "(1 tuned problems)" in r.stdout and "not used" not in r.stdout + r.stderr, r.stdout
    _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=90;90a", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")])
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))), None)
    assert so is not None, f"lib{NAME}.so not built under {tree}"
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod, sm80


def _qkv(torch, b, hq, hkv, sq, sk):
    g = torch.Generator(device="cuda").manual_seed(37)
    return (torch.randn(b, sq, hq, 128, device="cuda", dtype=torch.float16, generator=g),
            torch.randn(b, sk, hkv, 128, device="cuda", dtype=torch.float16, generator=g),
            torch.randn(b, sk, hkv, 128, device="cuda", dtype=torch.float16, generator=g))


def test_tuned_record_picks_its_kernel_and_the_nearest_one_for_other_shapes(lib):
    import torch

    mod, sm80 = lib
    tuned = mod.attention_select(*_qkv(torch, 2, 8, 2, 1024, 1024))
    assert tuned["kernel"] == sm80 and tuned["tried"] == 0, tuned
    near = mod.attention_select(*_qkv(torch, 4, 8, 2, 2048, 3000))
    assert near["kernel"] == sm80, near
    causal = mod.attention_select(*_qkv(torch, 2, 8, 2, 1024, 1024), causal=True)   # no record's kernel computes it
    assert causal["kernel"].startswith("attn_sm90a_"), causal


def test_the_tuned_kernel_computes_right(lib):
    import math

    import torch

    mod, _ = lib
    q, k, v = _qkv(torch, 2, 8, 2, 1024, 1024)
    out = mod.attention(q, k, v)
    torch.cuda.synchronize()
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = kd.repeat_interleave(4, dim=1), vd.repeat_interleave(4, dim=1)
    p = torch.softmax((qd @ kd.transpose(-1, -2)) / math.sqrt(128), dim=-1)
    want = (p @ vd).transpose(1, 2)
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, err
