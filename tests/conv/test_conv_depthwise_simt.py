"""emitter's SIMT depthwise kernel (`kernel: depthwise_simt`, sm80), on the CPU: the spec's keys and every rejection
with its rule and fix, the names, the rendered wgrad and fprop instances, what an instance refuses at run time, the
default verify problems (the fake backend passing them; the GPU runner's planted launches failing them for their
reason through the CPU stand-in kernel), configs/conv/depthwise_simt.yaml, and the exported library's pieces: the
table code (2), the launch unit calling the instance's run(), the dispatch twin putting it before CUTLASS's direct
kernels for depthwise problems only, and the loader's cost of it."""

import sys
from pathlib import Path

import pytest

from emitter.families.base import Rejection
from emitter.families.conv import instance_name, render_instance
from emitter.families.conv import runtime as hooks
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.render import banner

ROOT = Path(__file__).resolve().parents[2]
WG = "family: conv\narch: sm80\nop: wgrad\ndtype: f16\nkernel: depthwise_simt\ntile: 32x1x64\nfilter: 3x3\n"
FP = WG.replace("op: wgrad", "op: fprop").replace("tile: 32x1x64", "tile: 32x4x64")
DG = FP.replace("op: fprop", "op: dgrad")
WG7 = WG.replace("filter: 3x3", "filter: 7x7").replace("f16", "bf16")
DIRECT = "family: conv\narch: sm80\nop: fprop\ndtype: f16\nkernel: depthwise_direct\ntile: 8x8x64\nfilter: 3x3\nstride: 1\n"


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_conv_depthwise_direct import config, dw, one  # noqa: E402  (the spec/problem helpers both kernels use)


# ------------------------------------------------------------------------------------------------ spec, name, render
def test_resolves_names_and_renders_wgrad_and_fprop():
    inst = one(WG)
    assert not isinstance(inst, Rejection), inst
    name = instance_name(inst)
    assert name == "conv2d_wgrad_sm80_f16_f16_accf32_nhwc_32x1x64_s1_dwsimt_f3x3_al8x8x8_identity"
    cfg = inst.config()
    assert (cfg["kernel"], cfg["filter"]) == ("depthwise_simt", [3, 3])
    assert "conv_stride" not in cfg and "conv_dilation" not in cfg and cfg["alignment_a"] == 8
    src = render_instance(inst, name, banner("t.yaml", "0" * 64))
    for want in ("static constexpr int kR = 3;", "static constexpr int kTapRows = 3;", "static constexpr int kChannels = 64;",
                 "atomicAdd(tickets + group, 1)", "__ldcg(P.partial", "cudaMemsetAsync(", f"emitter_{name}::run(params",
                 "struct ConvKernel {", "cutlass::half_t"):
        assert want in src, want
    assert "cutlass/conv/" not in src           # no CUTLASS kernel under it
    fp = one(FP)
    src = render_instance(fp, instance_name(fp), banner("t.yaml", "0" * 64))
    assert "__shared__ float taps[kTaps][kChannels];" in src and "static constexpr int kPixels = 4;" in src
    assert "atomicAdd" not in src and "cudaMemsetAsync" not in src
    src7 = render_instance(one(WG7), instance_name(one(WG7)), banner("t.yaml", "0" * 64))
    assert "static constexpr int kTapRows = 1;" in src7 and "static constexpr int kRowGroups = 7;" in src7
    assert "cutlass::bfloat16_t" in src7
    dg = one(DG)
    assert not isinstance(dg, Rejection) and dg.stride_support.value == "strided"      # any stride, whatever the default
    src = render_instance(dg, instance_name(dg), banner("t.yaml", "0" * 64))
    assert "dgrad_runs<1, 1>(P, taps, lane, c0)" in src and "oq * P.stride_w == u" in src and "kDgrad = true" in src
    for alias in ("dwsimt", "simt_depthwise"):
        assert instance_name(one(WG.replace("depthwise_simt", alias))) == name


@pytest.mark.parametrize("extra,rule", [
    ("dims: 3\n", "depthwise-simt-op"),
    ("dtype: f32\n", "depthwise-simt-dtype"),
    ("dtype: {a: f16, c: f32}\n", "depthwise-simt-output"),
    ("dtype: {a: f16, c: f16, accumulator: f16}\n", "depthwise-simt-accumulator"),
    ("group_mode: multiple\n", "depthwise-simt-group-mode"),
    ("split_k: serial\n", "depthwise-simt-keys"),
    ("stages: 3\n", "depthwise-simt-keys"),
    ("warp: 32x32x32\n", "depthwise-simt-keys"),
    ("epilogue: relu\n", "depthwise-simt-epilogue"),
    ("filter: 11x11\n", "depthwise-simt-filter"),
    ("tile: 32x1x48\n", "depthwise-simt-tile"),
    ("tile: 4x1x64\n", "depthwise-simt-tile"),
    ("tile: 32x9x64\n", "depthwise-simt-tile"),
    ("alignment: 4\n", "depthwise-simt-alignment"),
    ("stride: 2\n", "depthwise-simt-stride"),
    ("arch: sm90a\n", "depthwise-simt-sm80"),
])
def test_rejections_name_the_rule_and_a_fix(extra, rule):
    base = {ln.split(":")[0]: ln for ln in WG.strip().splitlines()}
    base[extra.split(":")[0]] = extra.strip()
    got = one("\n".join(base.values()) + "\n")
    assert isinstance(got, Rejection), got
    assert got.rule == rule, (got.rule, got.reason)
    assert ": " in got.reason or "use" in got.reason


def test_missing_filter_is_rejected():
    got = one(WG.replace("filter: 3x3\n", ""))
    assert isinstance(got, Rejection) and got.rule == "depthwise-simt-filter" and "filter: RxS" in got.reason


def test_what_an_instance_refuses_at_run_time():
    cfg = config(WG).cfg
    assert not not_supported_reasons(cfg, dw(136, stride=(1, 2, 2), dilation=(1, 2, 2), pad_front=(0, 0, 3),
                                             pad_back=(0, 2, 1)))
    for p, needle in ((ConvProblem(n=2, h=9, w=9, c=64, k=64, r=3, s=3), "depthwise convolutions only"),
                      (dw(20), "multiple of the alignment 8"),
                      (dw(64, r=5, s=5), "compiled for 3x3"),
                      (dw(64, split_k=2), "splits its reduction itself"),
                      (dw(64, bias=True), "bias")):
        why = " ".join(not_supported_reasons(cfg, p))
        assert needle in why, (p, why)


@pytest.mark.parametrize("text", [WG, FP, WG7])
def test_default_problems_cover_blocks_odd_sizes_strides_dilation_and_beta(text):
    cfg = config(text)
    probs = [p for p, data in default_problems(cfg.cfg) if data == "normal"]
    assert len(probs) >= 7
    assert all(p.groups == p.c == p.k and (p.r, p.s) == tuple(cfg.filter) for p in probs)
    assert any(p.c % 64 for p in probs) and any(p.c > 64 for p in probs) and any(p.c < 64 for p in probs)
    assert {p.stride[1] for p in probs} == {1, 2} and {p.dilation[1] for p in probs} == {1, 2}
    assert any(p.pad_front[1:] != p.pad_back[1:] for p in probs) and any(p.beta != 0 for p in probs)
    assert any(p.h % 2 and p.w % 2 for p in probs)


@pytest.mark.parametrize("text", [WG, FP, WG7, DG])
def test_fake_backend_passes_the_default_problems(text):
    cfg = config(text)
    for k, (p, data) in enumerate(default_problems(cfg.cfg, quick=True)):
        inputs = hooks.make_inputs(cfg, p, data, k)
        out = hooks.fake_run(cfg, p, inputs.buffers, {})
        v = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
        assert v["status"] == "PASSED", (p.label(data), v["reason"])


@pytest.mark.parametrize("text", [WG, FP, DG])
def test_runner_planted_launches_are_caught_for_their_reason(text):
    """The GPU runner's planted launches on a depthwise_simt instance (every bug applies -- run-time stride -- but the
    group offset on dgrad, which writes x), run by the CPU stand-in kernel of test_conv_runner_cpu.py."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_conv_runner_cpu import StandIn

    from emitter.families.conv.runner import _wgrad_swapped, expected_reason, planted_bugs, planted_problem, run_case

    k = StandIn(config(text))
    p = planted_problem(k.cfg)
    assert p.groups == p.c == p.k and not not_supported_reasons(k.cfg.cfg, p)
    bugs = planted_bugs(k.cfg)
    want = {"wrong_padding", "swapped_filter_axes", "stride_ignored", "row_short", "group_offset"}
    assert set(bugs) == (want - {"group_offset"} if text == DG else want)
    assert run_case(k, p, "normal", 3)["status"] == "PASSED"
    for bug in bugs:
        if bug == "swapped_filter_axes" and k.cfg.op == "wgrad":
            v = _wgrad_swapped(k, p, 3)
        else:
            v = run_case(k, p, "normal", 3, planted=bug)
        assert expected_reason(bug, v), (bug, v.get("status"), v.get("reason"), v.get("signature_misses"))


def test_config_resolves_every_instance():
    from emitter.emit import resolve_specs

    resolved, rejected, _s, _d = resolve_specs([ROOT / "configs" / "conv" / "depthwise_simt.yaml",
                                                ROOT / "configs" / "conv" / "depthwise_simt_dgrad.yaml"])
    assert rejected == [] and len(resolved) == 18
    names = [r.name for r in resolved]
    for op in ("wgrad", "fprop", "dgrad"):
        for f in ("3x3", "5x5", "7x7"):
            for dt in ("f16", "bf16"):
                assert sum(f"conv2d_{op}_sm80_{dt}_{dt}_" in n and f"_dwsimt_f{f}_" in n for n in names) == 1


# ------------------------------------------------------------------------------------------------ library
def _records(*texts):
    from emitter.families.conv.library import kernel_records

    entries = []
    for t in texts:
        inst = one(t)
        assert not isinstance(inst, Rejection), inst
        entries.append({"name": instance_name(inst), "config": inst.config()})
    return kernel_records(entries)


PLAIN_WGRAD = "family: conv\narch: sm80\nop: wgrad\ndtype: f16\ntile: 128x128x32\nwarp: 64x64x32\n"


def test_dispatch_twin_puts_the_simt_kernel_first_for_depthwise_problems_only():
    from dataclasses import replace

    from emitter.families.conv.library_dispatch import ConvQuery, candidate_order, depthwise_first, select

    ks = _records(WG, PLAIN_WGRAD, FP, DIRECT)
    simt = {k.index for k in ks if k.depthwise_simt}
    assert len(simt) == 2 and not any(k.depthwise_direct for k in ks if k.index in simt)
    q = ConvQuery(op="wgrad", a="f16", c="f16", n=32, h=56, w=56, ci=144, k=144, r=3, s=3, p=56, q=56, groups=144)
    got = select(ks, [], q)[0].kernel
    assert got in simt and ks[got].op == "wgrad"
    fq = replace(q, op="fprop")
    order = depthwise_first(ks, fq, candidate_order(ks, [], fq))
    assert ks[order[0].kernel].depthwise_simt and ks[order[1].kernel].depthwise_direct   # simt before CUTLASS's
    dense = replace(q, ci=128, k=128, groups=1)
    assert depthwise_first(ks, dense, candidate_order(ks, [], dense)) == candidate_order(ks, [], dense)
    refuse = select(ks, [], q, can_implement=lambda k, split: k not in simt)
    assert refuse is None or refuse[0].kernel not in simt


def test_exported_library_marks_and_launches_the_simt_kernel(tmp_path):
    import subprocess

    spec = tmp_path / "s.yaml"
    spec.write_text("kernels:\n" + "".join("  - " + t.rstrip().replace("\n", "\n    ") + "\n" for t in (WG, DIRECT)))
    gen, lib = tmp_path / "gen", tmp_path / "lib"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(spec), "-o", str(gen), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(cmd + ["library", str(gen), "--name", "dwslib", "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = instance_name(one(WG))
    launch = next(lib.rglob(f"{name}.launch.cu")).read_text()
    assert f"emitter_{name}::run(params, shared_storage)" in launch
    cpp = "\n".join(p.read_text() for p in lib.rglob("*.cpp"))
    rows = [ln for ln in cpp.splitlines() if f'{{"{name}"' in ln]
    assert len(rows) == 1 and rows[0].rstrip().endswith(", 2},")
    assert "if (sx != sy) return sx > sy;" in cpp
    loader = next(lib.rglob("dwslib.py")).read_text()
    assert "_CONV_RATE_DWSIMT" in loader and f'("{name}", False, 32, 1, 64, 16, False, "optimized", 1, 1, 1, False, True)' in loader


def test_loader_prices_the_simt_kernel_at_its_own_rate(tmp_path, monkeypatch):
    """The loader's _conv_kernel_seconds: a depthwise_simt kernel (the 13th _CONV_KMODEL field) costs its bytes of x
    and y and its FLOPs at _CONV_RATE_DWSIMT[op], added; 12-field rows (the other kernels) keep their model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import subprocess

    from _helpers import load_module

    spec = tmp_path / "s.yaml"
    spec.write_text("kernels:\n" + "".join("  - " + t.rstrip().replace("\n", "\n    ") + "\n" for t in (WG, DIRECT)))
    gen, lib = tmp_path / "gen", tmp_path / "lib"
    cmd = [sys.executable, "-m", "emitter"]
    assert subprocess.run(cmd + ["emit", str(spec), "-o", str(gen), "-q"]).returncode == 0
    assert subprocess.run(cmd + ["library", str(gen), "--name", "dwsl2", "-o", str(lib)],
                          capture_output=True).returncode == 0
    m = load_module("dwsl2", next(lib.rglob("dwsl2.py")))
    (ki,) = [i for i, row in enumerate(m._CONV_KMODEL) if row[-1] is True]
    dims = (32, 144, 144, (56, 56), (3, 3), (56, 56))
    t = m._conv_kernel_seconds(ki, "wgrad", dims, 144)
    bw, rate = m._CONV_RATE_DWSIMT["wgrad"]
    assert t == pytest.approx(m._CONV_LAUNCH_S + 2 * 32 * 56 * 56 * 144 * 2 / bw + 2.0 * 32 * 56 * 56 * 144 * 9 / rate)
    assert 60e-6 < t < 150e-6                                      # measured on an H200: about 90 us
    assert m._conv_kernel_seconds(ki, "fprop", dims, 144) < t      # fprop streams its bytes faster
