"""benchmarks/ncu_compare.py without a GPU: reading ncu's details page (CSV) and the side-by-side table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(lid, kernel, section, metric, unit, value):
    return (f'"{lid}","4242","python3","127.0.0.1","{kernel}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"{section}","{metric}","{unit}","{value}"')


def _mod():
    spec = importlib.util.spec_from_file_location("ncu_compare", ROOT / "benchmarks" / "ncu_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_details_page_parses_per_launch_and_tabulates():
    m = _mod()
    sol = "GPU Speed Of Light Throughput"
    text = "\n".join([
        "==PROF== Connected to process 4242",            # ncu's own lines and the program's output come first
        "some table the program printed",
        HEAD,
        _row(0, "nvjet_sm90_tst_128x64_64x4_1x2_h_bz_TNT", sol, "Duration", "us", "27.10"),
        _row(0, "nvjet_sm90_tst_128x64_64x4_1x2_h_bz_TNT", sol, "Compute (SM) Throughput", "%", "71.20"),
        _row(0, "nvjet_sm90_tst_128x64_64x4_1x2_h_bz_TNT", "Launch Statistics", "Registers Per Thread",
             "register/thread", "168"),
        _row(1, "emitter_gemm_sm90a_x_kernel", sol, "Duration", "us", "31.50"),
        _row(1, "emitter_gemm_sm90a_x_kernel", "Memory Workload Analysis", "L2 Hit Rate", "%", "80.1"),
    ]) + "\n"
    launches = m.parse_details(text)
    assert [x["kernel"] for x in launches] == ["nvjet_sm90_tst_128x64_64x4_1x2_h_bz_TNT", "emitter_gemm_sm90a_x_kernel"]
    a, b = m.shown(launches[0]), m.shown(launches[1])
    assert a == {"duration": "27.10 us", "compute (SM) %": "71.20 %", "registers / thread": "168 register/thread"}
    assert b == {"duration": "31.50 us", "L2 hit rate": "80.1 %"}
    t = m.table([("cuBLAS", a), ("ours", b)]).splitlines()
    assert t[0] == "| metric | cuBLAS | ours |"
    assert "| duration | 27.10 us | 31.50 us |" in t and "| L2 hit rate | - | 80.1 % |" in t
    assert not any(line.startswith("| SM clock") for line in t)     # rows no side has are left out
    assert m.parse_details("==PROF== No kernels were profiled.\n") == []


def test_default_kernel_is_the_runs_choice_with_its_options():
    m = _mod()
    op_tn = {"a": "bf16", "layout": "tnt", "fast_accum": False}
    tuning = {"entries": [
        {"op": op_tn, "problem": {"m": 512, "n": 4096, "k": 4096, "batch": 1}, "kernel": "k_swz", "options": 3},
        {"op": op_tn, "problem": {"m": 512, "n": 4096, "k": 8192, "batch": 1}, "kernel": "other_k", "options": 0},
        {"op": {"a": "bf16", "layout": "nnt", "fast_accum": False},
         "problem": {"m": 512, "n": 4096, "k": 4096, "batch": 1}, "kernel": "k_nn", "options": 0},
        {"op": {"a": "e4m3", "layout": "tnt", "fast_accum": True},
         "problem": {"m": 512, "n": 4096, "k": 4096, "batch": 1}, "kernel": "k_fast", "options": 0},
    ]}
    assert m.best_kernels(tuning, "bf16-tn", "512x4096x4096") == [("k_swz", 3)]
    assert m.best_kernels(tuning, "bf16-nn", "512x4096x4096") == [("k_nn", 0)]
    assert m.best_kernels(tuning, "e4m3-tn-fast", "512x4096x4096") == [("k_fast", 0)]
    assert m.best_kernels(tuning, "e4m3-tn", "512x4096x4096") == []
    assert m.best_kernels({}, "bf16-tn", "512x4096x4096") == []

    from emitter.kit.scheduler import SchedulerOptions

    assert m.options_text(0) == ""
    opts = SchedulerOptions(swizzle=4, promotion_interval=8).encode()
    assert m.options_text(opts) == "swizzle=4,promotion_interval=8"
    assert SchedulerOptions.parse(m.options_text(opts)).encode() == opts   # what `emitter profile --options` reads
