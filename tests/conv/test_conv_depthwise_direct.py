"""The depthwise direct convolution kernel (`kernel: depthwise_direct`, sm80: CUTLASS 2.x DefaultDepthwiseDirect2dConvFprop),
on the CPU: the spec's keys and every rejection with its rule and fix, the name, the rendered instance against its
golden file (EMITTER_UPDATE_GOLDEN=1 to rewrite after an intended change), what an instance refuses at run time, the
default verify problems (and the fake backend passing them, the planted faults failing them), configs/conv/
depthwise.yaml and the verify set, and the exported library's pieces: the table flag, the launch unit calling the
instance's run(), and the dispatch twin putting the direct kernels first for a depthwise problem only."""

import ctypes
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from emitter.emit import spec_entries
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.conv import instance_name, render_instance, resolve
from emitter.families.conv import runtime as hooks
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "conv" / "sm80" / "depthwise_direct" / "instance.cu"
UPDATE = os.environ.get("EMITTER_UPDATE_GOLDEN") == "1"
DW = "family: conv\narch: sm80\nop: fprop\ndtype: f16\nkernel: depthwise_direct\ntile: 8x8x64\nfilter: 3x3\nstride: 1\n"
ANY = DW.replace("stride: 1\n", "stride: any\ndilation: any\n")
DW5 = DW.replace("tile: 8x8x64\nfilter: 3x3", "tile: 8x8x16\nfilter: 5x5")     # its row_short reads bottom padding


def one(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(expand_entry(doc, path, entry, kp))
    return resolve(cand)


def config(text: str) -> ConvConfig:
    inst = one(text)
    assert not isinstance(inst, Rejection), inst
    return ConvConfig.from_entry({"name": instance_name(inst), "config": inst.config()})


def dw(c=64, **kw) -> ConvProblem:
    geo = dict(n=2, h=13, w=11, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    geo.update(kw)
    return ConvProblem(c=c, k=c, groups=c, **geo)


# ------------------------------------------------------------------------------------------------ spec, name, render
def test_resolves_names_and_renders_the_direct_kernel():
    inst = one(DW)
    assert not isinstance(inst, Rejection), inst
    name = instance_name(inst)
    assert name == "conv2d_fprop_sm80_f16_f16_accf32_nhwc_8x8x64_w16x64x9_i1x1x1_s4_dwdirect_f3x3_st1x1_dl1x1_al8x8x8_identity"
    cfg = inst.config()
    assert (cfg["kernel"], cfg["filter"], cfg["conv_stride"], cfg["conv_dilation"]) == ("depthwise_direct", [3, 3], [1, 1], [1, 1])
    assert "group_mode" not in cfg and cfg["tile"] == [8, 8, 64] and cfg["alignment_a"] == 8
    src = render_instance(inst, name, banner("t.yaml", "0" * 64))
    for want in ("DefaultDepthwiseDirect2dConvFprop<", "cutlass::MatrixShape<3, 3>", "TensorNHWCShape<1, 8, 8, 64>",
                 "IteratorAlgorithm::kFixedStrideDilation", "StrideSupport::kFixed", "StrideShape = cutlass::MatrixShape<1, 1>",
                 f"emitter_{name}::run(params", "CUTLASS_DEVICE void run(", "reordered[(long long)tap * K + k]"):
        assert want in src, want
    anyname = instance_name(one(ANY))
    assert "_stany_dlany_" in anyname
    src = render_instance(one(ANY), anyname, banner("t.yaml", "0" * 64))
    assert "IteratorAlgorithm::kOptimized" in src and "StrideShape = cutlass::MatrixShape<-1, -1>" in src
    assert "compiled stride and dilation" not in src     # a run-time stride: no compiled-stride refusal in the shim


def test_instance_matches_golden():
    inst = one(DW)
    text = render_instance(inst, instance_name(inst), banner("golden.yaml", "0" * 64))
    if UPDATE:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.is_file(), f"no golden file {GOLDEN}: EMITTER_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == GOLDEN.read_text(), f"the depthwise_direct instance differs from {GOLDEN}"


def test_other_kernels_keep_their_names_and_manifest_entries():
    plain = one("family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\n")
    assert not {"filter", "conv_stride", "conv_dilation"} & set(plain.config())
    assert "dwdirect" not in instance_name(plain)


@pytest.mark.parametrize("extra,rule", [
    ("op: dgrad\n", "depthwise-fprop-2d"),
    ("dims: 3\n", "depthwise-fprop-2d"),
    ("dtype: f32\n", "depthwise-dtype"),
    ("dtype: {a: f16, c: f32}\n", "depthwise-output"),
    ("dtype: {a: bf16, accumulator: f16}\n", "dtype-accumulator"),
    ("dtype: {a: f16, accumulator: f16}\n", "dtype-accumulator"),
    ("filter: 11\n", "depthwise-filter"),
    ("tile: 8x8x48\n", "depthwise-tile-channels"),
    ("tile: 7x7x64\n", "depthwise-tile"),
    ("warp: 16x32x9\n", "depthwise-warp"),
    ("warp: 12x64x9\n", "depthwise-warp"),
    ("alignment: 4\n", "depthwise-alignment"),
    ("group_mode: multiple\n", "depthwise-group-mode"),
    ("iterator: analytic\n", "depthwise-iterator"),
    ("split_k: serial\n", "depthwise-split-swizzle"),
    ("swizzle: 2\n", "depthwise-split-swizzle"),
    ("epilogue: relu\n", "depthwise-epilogue"),
    ("instruction: 16x8x16\n", "depthwise-instruction"),
    ("stages: 16\nstride: 8\ntile: 10x10x128\nwarp: 25x128x9\n", "smem"),
    ("arch: sm90a\n", "depthwise-direct-sm80"),
])
def test_rejections_name_the_rule_and_a_fix(extra, rule):
    lines = {ln.split(":")[0]: ln for ln in DW.splitlines()}
    for ln in extra.splitlines():
        lines[ln.split(":")[0]] = ln
    r = one("\n".join(lines.values()) + "\n")
    assert isinstance(r, Rejection), r
    assert r.rule == rule, (r.rule, r.reason)
    assert len(r.reason) > 40


def test_missing_filter_and_depthwise_keys_on_other_kernels_are_rejected():
    r = one(DW.replace("filter: 3x3\n", ""))
    assert isinstance(r, Rejection) and r.rule == "depthwise-filter" and "filter: 3x3" in r.reason
    r = one("family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nfilter: 3x3\n")
    assert isinstance(r, Rejection) and r.rule == "depthwise-keys"


@pytest.mark.parametrize("key,value,needle", [
    ("filter", "3x3x3", "filter shape"),
    ("filter", "40", "out of range"),
    ("stride", "0", "out of range"),
    ("stride", "fast", "step"),
    ("dilation", "2x9", "1..8 per axis"),
    ("kernel", "depthwise_fast", "kernel"),
])
def test_bad_values_are_spec_errors_with_file_line_and_key(key, value, needle):
    text = "\n".join(ln for ln in DW.splitlines() if not ln.startswith(key + ":")) + f"\n{key}: {value}\n"
    with pytest.raises(SpecError) as e:
        one(text)
    msg = str(e.value)
    assert "t.yaml" in msg and key in msg and needle in msg, msg


def test_tile_sweep_and_square_shorthands():
    doc = parse_text(DW.replace("tile: 8x8x64", "tile: [8x8x64, 8x8x16]").replace("filter: 3x3", "filter: 5"), "t.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    insts = [resolve(c) for c, _ in expand_entry(doc, path, entry, kp)]
    assert [i.tile.k for i in insts] == [64, 16] and all(i.filter == (5, 5) for i in insts)
    assert [i.warp.as_list() for i in insts] == [[16, 64, 25], [16, 16, 25]]


# ------------------------------------------------------------------------------------------------ run-time rules
def test_what_an_instance_refuses_at_run_time():
    cfg = config(DW).cfg
    assert not_supported_reasons(cfg, dw()) == []
    cases = {
        "groups = C = K": [replace(dw(), groups=1, k=64), replace(dw(), groups=32), replace(dw(), k=128, groups=64)],
        "compiled for 3x3": [dw(r=5, s=5, pad_front=(0, 2, 2), pad_back=(0, 2, 2))],
        "stride 1x1": [dw(stride=(1, 2, 2))],
        "dilation 1x1": [dw(dilation=(1, 2, 2))],
        "multiple of the alignment": [dw(c=20)],
        "bias": [replace(dw(), bias=True)],
        # a CTA computes one output tile (a CTA walking several raced in CUTLASS's fused epilogue): no split_k, at
        # most 65535 tiles along the grid's z
        "no reduction to split": [replace(dw(), split_k=3), replace(dw(), split_k=2)],
        "65535": [dw(n=2731, h=64, w=48)],
    }
    for needle, problems in cases.items():
        for p in problems:
            why = not_supported_reasons(cfg, p)
            assert any(needle in w for w in why), (p, why)
    anycfg = config(ANY).cfg
    assert not_supported_reasons(anycfg, dw(stride=(1, 2, 2), dilation=(1, 2, 2))) == []
    assert not_supported_reasons(anycfg, dw(stride=(1, 3, 1))) == []
    # a run-time stride sizes the input window at launch: 3 stages of a 24 x 24 x 64 f16 window exceed sm80's 163 KB
    why = not_supported_reasons(anycfg, dw(h=40, w=40, stride=(1, 3, 3)))
    assert any("shared memory" in w for w in why), why


@pytest.mark.parametrize("text", [DW, ANY, DW.replace("filter: 3x3", "filter: 7x7").replace("tile: 8x8x64", "tile: 8x8x32"),
                                  DW.replace("stride: 1", "stride: 2").replace("tile: 8x8x64", "tile: 8x8x16")])
def test_default_problems_cover_channel_blocks_odd_sizes_padding_and_steps(text):
    cfg = config(text)
    probs = [p for p, _ in default_problems(cfg.cfg)]
    assert len(probs) >= 6 and all(not not_supported_reasons(cfg.cfg, p) for p in probs)
    ch = cfg.tile[2]
    cs = {p.c for p in probs}
    assert min(cs) < ch and any(c > ch and c % ch for c in cs)          # under one block, a partial block
    assert {max(p.pad_front + p.pad_back) for p in probs} >= {0, 3}
    assert any(p.pad_front != p.pad_back for p in probs) and all(p.split_k == 1 for p in probs)
    # a large layer (56 x 56 x 144, batch 8): hundreds of CTAs busy at once, where small problems had passed a race
    big = [p for p in probs if (p.n, p.h, p.w, p.c) == (8, 56, 56, 144)]
    assert len(big) == 1 and big[0].output_extents()[1] >= 28
    assert not any((p.n, p.h, p.w, p.c) == (8, 56, 56, 144) for p, _ in default_problems(cfg.cfg, quick=True))
    assert any(p.beta != 0 for p in probs) and any(p.alpha != 1 for p in probs)
    for p in probs:
        _, pp, qq = p.output_extents()
        assert pp > 0 and qq > 0
    assert any(p.output_extents()[1] % cfg.tile[0] and p.output_extents()[2] % cfg.tile[1] for p in probs)
    if cfg.conv_stride == (0, 0):
        assert {p.stride[1] for p in probs} == {1, 2} and {p.dilation[1] for p in probs} == {1, 2}
    else:
        assert {p.stride[1:] for p in probs} == {tuple(cfg.conv_stride)}


@pytest.mark.parametrize("text", [DW, ANY])
def test_fake_backend_passes_the_default_problems(text):
    cfg = config(text)
    for k, (p, data) in enumerate(default_problems(cfg.cfg, quick=True)):
        inputs = hooks.make_inputs(cfg, p, data, k)
        out = hooks.fake_run(cfg, p, inputs.buffers, {})
        v = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
        assert v["status"] == "PASSED", (p.label(data), v["reason"])


@pytest.mark.parametrize("text", [DW, ANY, DW5])
def test_runner_planted_launches_on_depthwise_direct_instances(text):
    """The GPU runner's planted launches for a direct instance (its planted problem runs on it; a compiled stride
    leaves stride_ignored out) run by the CPU stand-in kernel of test_conv_runner_cpu.py: each bug fails for its
    reason, the default cases pass."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_conv_runner_cpu import StandIn

    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    k = StandIn(config(text))
    p = planted_problem(k.cfg)
    assert p.groups == p.c == p.k and not not_supported_reasons(k.cfg.cfg, p)
    bugs = planted_bugs(k.cfg)
    assert "group_offset" in bugs and ("stride_ignored" in bugs) == (text == ANY)
    assert run_case(k, p, "normal", 3)["status"] == "PASSED"
    for bug in bugs:
        v = run_case(k, p, "normal", 3, planted=bug)
        assert expected_reason(bug, v), (bug, v.get("status"), v.get("reason"), v.get("signature_misses"))


# ------------------------------------------------------------------------------------------------ configs
def test_depthwise_config_and_verify_set():
    from emitter.emit import resolve_specs

    resolved, rejected, _s, _d = resolve_specs([ROOT / "configs" / "conv" / "depthwise.yaml"])
    assert rejected == [] and len(resolved) == 12
    names = [r.name for r in resolved]
    for token, count in (("_f3x3_st1x1_", 4), ("_f3x3_st2x2_", 2), ("_f5x5_st1x1_", 2), ("_f7x7_st1x1_", 2),
                         ("_f3x3_stany_dlany_", 2)):
        assert sum(token in n for n in names) == count, token               # f16 and bf16 (3x3: two tiles)
    resolved, rejected, _s, _d = resolve_specs([ROOT / "configs" / "conv" / "verify_set.yaml"])
    direct = [r.name for r in resolved if "_dwdirect_" in r.name]
    assert rejected == [] and len(direct) >= 3
    assert any("_st2x2_" in n for n in direct) and any("_f5x5_" in n or "_f7x7_" in n for n in direct)


# ------------------------------------------------------------------------------------------------ library
def _records(*texts):
    from emitter.families.conv.library import kernel_records

    entries = []
    for t in texts:
        inst = one(t)
        assert not isinstance(inst, Rejection), inst
        entries.append({"name": instance_name(inst), "config": inst.config()})
    return kernel_records(entries)


MULTIPLE = ("family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 64x64x32\nwarp: 32x32x32\nstages: 2\n"
            "iterator: analytic\nalignment: {a: 1, b: 1, c: 8}\ngroup_mode: multiple\n")
PLAIN = "family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\n"


def test_dispatch_twin_tries_the_direct_kernel_first_for_depthwise_problems_only():
    from emitter.families.conv.library_dispatch import ConvQuery, candidate_order, depthwise_first, select

    ks = _records(DW, MULTIPLE, PLAIN)
    direct = [k.index for k in ks if k.depthwise_direct]
    assert len(direct) == 1 and sum(k.depthwise_direct for k in ks) == 1
    q = ConvQuery(op="fprop", a="f16", c="f16", n=32, h=56, w=56, ci=144, k=144, r=3, s=3, p=56, q=56, groups=144)
    plain_order = candidate_order(ks, [], q)
    assert plain_order[0].kernel != direct[0]        # the static priority alone would not put it first
    assert depthwise_first(ks, q, plain_order)[0].kernel == direct[0]
    assert select(ks, [], q)[0].kernel == direct[0]
    grouped = replace(q, ci=128, k=128, groups=32)   # a grouped, not depthwise, problem keeps the static order
    assert depthwise_first(ks, grouped, candidate_order(ks, [], grouped)) == candidate_order(ks, [], grouped)
    # the direct kernel refuses (another filter size): the walk goes on to the grouped implicit GEMM
    refuse = select(ks, [], q, can_implement=lambda k, split: k != direct[0])
    assert refuse is not None and refuse[0].kernel != direct[0]


def test_exported_library_marks_and_launches_the_direct_kernel(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("kernels:\n" + "".join("  - " + t.rstrip().replace("\n", "\n    ") + "\n" for t in (DW, MULTIPLE)))
    gen, lib = tmp_path / "gen", tmp_path / "lib"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(spec), "-o", str(gen), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(cmd + ["library", str(gen), "--name", "dwlib", "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = instance_name(one(DW))
    launch = next(lib.rglob(f"{name}.launch.cu")).read_text()
    assert f"emitter_{name}::run(params, shared_storage)" in launch
    table = "\n".join(p.read_text() for p in lib.rglob("*conv_table*"))
    assert "int32_t depthwise_direct;" in table
    rows = [ln for ln in "\n".join(p.read_text() for p in lib.rglob("*.cpp")).splitlines() if f'{{"{name}"' in ln]
    assert len(rows) == 1 and rows[0].rstrip().endswith(", 1},")
    api = "\n".join(p.read_text() for p in lib.rglob("*.cpp"))
    assert "conv_depthwise_first(c->e, conv_order(*p, *c, cc))" in api


DW16 = DW.replace("tile: 8x8x64", "tile: 8x8x16")


def test_dispatch_twin_prefers_a_channel_block_that_divides_c():
    from emitter.families.conv.library_dispatch import ConvQuery, select

    ks = _records(DW, DW16, MULTIPLE)
    block = {k.index: k.tile[2] for k in ks if k.depthwise_direct}
    for c, want in ((144, 16), (384, 64), (64, 64), (136, None)):
        q = ConvQuery(op="fprop", a="f16", c="f16", n=4, h=28, w=28, ci=c, k=c, r=3, s=3, p=28, q=28, groups=c)
        got = select(ks, [], q)[0].kernel
        assert got in block, (c, got)
        if want is not None:
            assert block[got] == want, (c, block[got])


def test_c_api_tries_the_direct_kernels_first_for_depthwise_problems(tmp_path):
    """The exported C API (api.cpp compiled with the host compiler against stand-in shims that accept what their
    kernel kind accepts): a depthwise problem runs on the direct kernel whose channel block divides C, then the
    other direct kernel when that one refuses, then the grouped implicit GEMM (the ungrouped kernel refusing groups)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_conv_library as tl

    if tl.CXX is None:
        pytest.skip("needs a host C++ compiler")
    from emitter.emit import emit
    from emitter.library.export import export_library

    spec = tmp_path / "spec.yaml"
    spec.write_text("kernels:\n" + "".join("  - " + t.rstrip().replace("\n", "\n    ") + "\n"
                                           for t in (DW, DW16, MULTIPLE, PLAIN)))
    emit([spec], tmp_path / "gen", jobs=1)
    export_library([tmp_path / "gen"], tl.LIB, tmp_path / "lib")
    out = tmp_path / "lib"
    so = tl._build_so(tmp_path, out)
    m = tl._loader(out, so, "dw")
    c = m._lib
    names = m.conv_kernels()
    idx = {("dw64" if "8x8x64" in n else "dw16") if "_dwdirect_" in n else ("grouped" if "_group" in n else "plain"): i
           for i, n in enumerate(names)}
    assert len(idx) == 4, names
    refuse = ctypes.c_int.in_dll(c, "g_refuse")
    ctypes.c_int.in_dll(c, "g_ungrouped").value = 1 << idx["plain"]
    last = ctypes.c_int.in_dll(c, "g_last_kernel")

    def run(ch, groups, kk=None, refused=()):
        refuse.value = sum(1 << idx[r] for r in refused)
        p = tl.problem(m, c=ch, k=kk or ch, groups=groups)
        st_, err = tl.call(m, p)
        assert st_ == 0, err
        return names[last.value]

    assert "_8x8x16_" in run(144, 144) and "_dwdirect_" in run(144, 144)       # 144 = 9 x 16
    assert "_8x8x64_" in run(384, 384)                                          # 384 = 6 x 64: the wider block
    assert "_8x8x64_" in run(144, 144, refused=("dw16",))                       # the next direct kernel
    assert "_groupmultiple" in run(144, 144, refused=("dw16", "dw64"))          # then the grouped implicit GEMM
    assert "_groupmultiple" in run(96, 4, kk=256, refused=("dw16", "dw64"))     # a grouped problem
    refuse.value = 0


def test_loader_runs_a_depthwise_dgrad_as_the_direct_fprop_of_dy_in_a_library_of_fprop_kernels(tmp_path):
    """A library whose conv kernels are all fprop (direct kernels and a grouped implicit GEMM, as the GPU test's):
    conv2d_input_grad of a depthwise problem -- input_shape a torch.Size, as x.shape gives it -- takes the loader's
    route, the fprop of dy (zero-inserted at stride 2) with the rotated filter on a direct kernel, one launch, instead
    of asking the C API for a dgrad kernel it does not have (the GPU run of the first version: "no conv kernel of this
    library runs dgrad f16", before the route's cache key took a torch.Size). The generated C API with stand-in shims
    that accept every problem; torch's CPU tensors."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_conv_library as tl

    if tl.CXX is None:
        pytest.skip("needs a host C++ compiler")
    from emitter.emit import emit
    from emitter.library.export import export_library

    spec = tmp_path / "spec.yaml"
    spec.write_text("kernels:\n" + "".join("  - " + t.rstrip().replace("\n", "\n    ") + "\n"
                                           for t in (DW, DW16, DW.replace("stride: 1", "stride: 2"), ANY, MULTIPLE)))
    emit([spec], tmp_path / "gen", jobs=1)
    export_library([tmp_path / "gen"], tl.LIB, tmp_path / "lib")
    out = tmp_path / "lib"
    m = tl._loader(out, tl._build_so(tmp_path, out), "dwdgrad")
    m.init_torch()
    names = {torch.float16: "f16"}
    real_view = m.operand_view
    m.operand_view = lambda x, want, what, fallback=None: (
        (x.data_ptr(), x.shape, x.stride(), names[x.dtype], 0, x) if isinstance(x, torch.Tensor) and x.dtype in names
        else real_view(x, want, what, fallback))
    m.current_device = lambda: 0
    m.raw_stream = lambda dev: 0x5000 + max(dev, 0)
    m._conv_empty = lambda shape, tdt, dev: torch.empty_strided(shape, m._channels_last(shape), dtype=tdt)
    m._CONV_SMS.update({0: 132, -1: 132})
    kernels = m.conv_kernels()
    assert all("_fprop_" in n for n in kernels) and sum("_dwdirect_" in n for n in kernels) == 4, kernels
    runs = ctypes.c_int.in_dll(m._lib, "g_runs")
    lastk = ctypes.c_int.in_dll(m._lib, "g_last_kernel")
    cl = torch.channels_last
    for st in (1, 2):
        c, h, pad = 144, 20, 1
        x = torch.randn(2, c, h, h + 1).half().to(memory_format=cl)
        w = torch.randn(c, 1, 3, 3).half().to(memory_format=cl)
        ys = torch.nn.functional.conv2d(x.float(), w.float(), stride=st, padding=pad, groups=c)
        gy = torch.randn_like(ys).half().contiguous(memory_format=cl)
        sel = m.conv_select("dgrad", None, w, gy, stride=st, padding=pad, groups=c, shape=x.shape)
        assert sel.get("route", "").startswith("depthwise fprop of dy (rotated filter"), sel
        before = runs.value
        gx = m.conv2d_input_grad(gy, w, x.shape, stride=st, padding=pad, groups=c)
        assert runs.value == before + 1 and "_dwdirect_" in kernels[lastk.value], kernels[lastk.value]
        e = tl.last(m)
        assert (e["groups"], e["c"], e["k"], e["stride"], e["pad_front"]) == (c, c, c, (1, 1, 1), (0, 1, 1)), e
        assert (e["h"], e["w"], e["p"], e["q"]) == ((ys.shape[2] - 1) * st + 1 + (h + 2 - 3) % st,
                                                    (ys.shape[3] - 1) * st + 1 + (h + 3 - 3) % st, h, h + 1), e
        assert e["ptr_y"] == gx.data_ptr() and tuple(gx.shape) == tuple(x.shape)
