"""benchmarks/conv_grouped_bench.py without a GPU: its spec emits the kernels the grouped routes need, its layers
are grouped problems the conv parser accepts (with the FLOPs emitter counts), the table renders rows that ran and
rows the library refused, and without a GPU the script says so (exit 2) instead of failing on import."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("conv_grouped_bench", ROOT / "benchmarks" / "conv_grouped_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_emits_every_route(tmp_path):
    r = subprocess.run([sys.executable, "-m", "emitter", "emit", str(ROOT / "configs/conv/grouped.yaml"), "-o",
                        str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    names = [i["name"] for i in json.loads((tmp_path / "manifest.json").read_text())["instances"]]
    assert len(names) == 13 and "rejected 0" in r.stdout + r.stderr
    assert any(n.endswith("_groupsingle") for n in names) and any(n.endswith("_groupmultiple") for n in names)
    # strided dgrad for C/g, K/g multiples of 2 (3 stages), 128-bit; wgrad at alignment 1 (a depthwise group)
    assert any("dgrad" in n and "_s3_analytic_strided_" in n and "al2x2x2" in n for n in names)
    assert any("wgrad" in n and "al1x1x1" in n for n in names)
    # Hopper's dense kernels for the block-diagonal and per-group routes: fprop, dgrad, split-K parallel wgrad
    sm90a = [n for n in names if "_sm90a_" in n]
    assert {n.split("_")[1] for n in sm90a} == {"fprop", "dgrad", "wgrad"} and len(sm90a) == 5
    assert sum(n.endswith("_splitkparallel") for n in sm90a) == 2
    # the bench exports the depthwise direct kernels beside them
    assert [p.name for p in _bench().SPECS] == ["grouped.yaml", "depthwise.yaml", "depthwise_simt.yaml"]


def test_layers_are_grouped_problems_with_emitters_flops():
    from emitter.families.conv.flops import conv_flops
    from emitter.families.conv.problem import parse_problem, problem_from_mapping

    b = _bench()
    assert len(b.LAYERS) >= 8
    depthwise = 0
    for layer in b.LAYERS:
        name, n, c, h, w, k, g, r, st, pad = layer
        assert c % g == 0 and k % g == 0 and g > 1, name
        depthwise += g == c == k
        p = problem_from_mapping(parse_problem(f"n={n},h={h},w={w},c={c},k={k},r={r},s={r},pad={pad},stride={st},"
                                               f"groups={g}")[0])
        assert conv_flops(p) == b.flops(layer), name
    assert depthwise >= 4


def test_table_renders_ran_and_refused_rows():
    b = _bench()
    rows = [{"layer": "L", "op": "fprop", "route": "grouped kernel", "kernel": "k_accf32_identity", "flops": 1e12,
             "tflops": 100.0, "cudnn_tflops": 200.0, "ratio": 0.5, "check": "ok"},
            {"layer": "L", "op": "dgrad", "route": "2 launches (a group each)", "kernel": None, "flops": 1e12,
             "cudnn_ms": 5.0, "cudnn_tflops": 200.0, "reason": "library refused: Error: no kernel"}]
    text = b.table(rows, "GPU X")
    assert "| L | fprop | grouped kernel | `k` | 100.0 | 200.0 | 0.50 | ok | GPU X |" in text
    assert "library refused" in text and "| fprop | 0.500 | 0.50 | 1 |" in text


def test_without_a_gpu_it_says_so():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/conv_grouped_bench.py"), "--out", "/nonexistent/x"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/conv_grouped_bench.py"), "--layers", "99"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "--layers" in r.stderr
