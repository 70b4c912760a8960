"""Conv dgrad paths of issue 38 without a GPU: strided dgrad on sm80 (CUTLASS 2.x's strided-dgrad kernel with its own
swizzle; 3D through the analytic iterator) and 1x1 stride-1 dgrad as a persistent sm90a GEMM (`kernel: gemm_1x1`,
dx = dy . w). Spec rules with their fixes, the rendered levels, the host-side mirror of can-implement, the default
problems (stride 2 and 3, per-side padding, odd sizes), the fake backend through `emitter verify` with a planted
fault, the runner's planted short row for a gemm_1x1 dgrad, the starter and verify configs, the bench's stride-2
layers, and ONE real nvcc compile of each new kernel kind (whose shims then answer can-implement)."""

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from emitter.emit import resolve_specs, spec_entries
from emitter.families.base import Rejection
from emitter.families.conv import instance_name, render_instance, resolve
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.model import ConvKernelKind, ConvSchedule, ConvTileScheduler, StrideSupport
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

ROOT = Path(__file__).resolve().parents[2]
SM80 = "family: conv\narch: sm80\nop: dgrad\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\nstages: 3\n"
GEMM = "family: conv\narch: sm90a\nop: dgrad\ndtype: f16\ntile: 128x128x64\nkernel: gemm_1x1\n"


def one(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(expand_entry(doc, path, entry, kp))
    return resolve(cand)


def render(text: str) -> tuple[str, str]:
    inst = one(text)
    assert not isinstance(inst, Rejection), inst
    name = instance_name(inst)
    return name, render_instance(inst, name, banner("t.yaml", "0" * 64))


def cfg_of(text: str) -> dict:
    inst = one(text)
    return ConvConfig.from_entry({"name": instance_name(inst), "config": inst.config()}).cfg


# ------------------------------------------------------------------------------------------------ sm80 strided dgrad
def test_sm80_strided_dgrad_resolves_and_renders_the_strided_kernel():
    name, src = render(SM80 + "stride_support: strided\nswizzle: 4\n")
    assert "_opt_strided_swz4_" in name
    assert "using ThreadblockSwizzle = cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<4>;" in src
    assert '#include "cutlass/conv/threadblock/threadblock_swizzle.h"' in src
    assert "cutlass::conv::StrideSupport::kStrided" in src and "cutlass::conv::IteratorAlgorithm::kOptimized" in src
    assert "DefaultConv2dDgrad<" in src and "stride_support: unity" not in src
    assert "if (p->stride[0] != 1 || p->stride[1] != 1 || p->stride[2] != 1) return EMITTER_CANNOT_IMPLEMENT" not in src
    # unity dgrad keeps the plain swizzle and no conv swizzle header (its file is unchanged)
    _n, unity = render(SM80)
    assert "GemmIdentityThreadblockSwizzle<1>" in unity and "conv/threadblock/threadblock_swizzle.h" not in unity
    assert "return EMITTER_CANNOT_IMPLEMENT;   // stride_support: unity" in unity


def test_analytic_2d_and_3d_strided_dgrad():
    _n, src = render(SM80.replace("tile: 128x128x64\nwarp: 64x64x64", "tile: 64x64x64\nwarp: 32x32x64")
                     + "stride_support: strided\niterator: analytic\nalignment: {a: 4, b: 4, c: 8}\n")
    assert "StridedDgradIdentityThreadblockSwizzle<1>" in src and "kAnalytic" in src
    name, src3 = render(SM80 + "stride_support: strided\niterator: analytic\ndims: 3\n")
    assert name.startswith("conv3d_dgrad_sm80") and "_analytic_strided_" in name
    # 3D: CUTLASS's strided analytic iterator inside the plain kernel (no strided-dgrad swizzle there)
    assert "DefaultConv3dDgrad<" in src3 and "GemmIdentityThreadblockSwizzle<1>" in src3
    assert "StridedDgrad" not in src3


@pytest.mark.parametrize("extra, rule, fix", [
    ("stride_support: strided\nswizzle: 2\n", "dgrad-strided-swizzle", "swizzle 1, 4 or 8"),
    ("stride_support: strided\nsplit_k: serial\n", "dgrad-strided-split-k", "remove split_k"),
    ("stride_support: strided\ndims: 3\n", "dgrad-strided-3d", "iterator: analytic"),
    ("dims: 3\niterator: analytic\n", "dgrad-unity-3d", "iterator: optimized"),
    # the two-stage strided-dgrad kernel at sub-128-bit loads wrote wrong dx on the GPU; 128-bit loads are right
    ("stride_support: strided\niterator: analytic\nstages: 2\nalignment: {a: 4, b: 4, c: 8}\n",
     "dgrad-strided-pipelined", "use stages >= 3 with alignment a/b >= 2"),
    ("stride_support: strided\niterator: analytic\nstages: 2\nalignment: {a: 1, b: 8, c: 1}\n",
     "dgrad-strided-pipelined", "alignment a/b 8"),
])
def test_sm80_strided_dgrad_rules(extra, rule, fix):
    r = one(SM80.replace("stages: 3\n", "") + extra) if "stages:" in extra else one(SM80 + extra)
    assert isinstance(r, Rejection) and r.rule == rule and fix in r.reason, r


def test_sm80_strided_dgrad_alignments_that_ran_right_are_accepted():
    for extra in ("stages: 2\nalignment: {a: 8, b: 8, c: 1}\n", "stages: 3\nalignment: {a: 2, b: 2, c: 2}\n"):
        inst = one(SM80.replace("stages: 3\n", "") + "stride_support: strided\niterator: analytic\n" + extra)
        assert not isinstance(inst, Rejection), inst


def test_sm90a_strided_dgrad_is_the_stride_phase_kernel_and_refuses_f32_with_the_sm80_route():
    inst = one("family: conv\narch: sm90a\nop: dgrad\ndtype: f16\ntile: 128x128x64\nstride_support: strided\n")
    assert not isinstance(inst, Rejection) and inst.stride_support is StrideSupport.strided   # test_conv_sm90a_strided*
    r = one("family: conv\narch: sm90a\nop: dgrad\ndtype: f32\ntile: 128x128x32\nstride_support: strided\n")
    assert isinstance(r, Rejection) and r.rule == "dgrad-strided-dtype"
    assert "arch: sm80 with stride_support: strided" in r.reason


def test_dgrad_defaults_to_unity_and_unity_refuses_stride():
    inst = one(SM80)
    assert inst.stride_support is StrideSupport.unity
    unity, strided = cfg_of(SM80), cfg_of(SM80 + "stride_support: strided\n")
    p = ConvProblem(n=2, h=13, w=10, c=40, k=72, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2))
    assert any("unity-stride" in r for r in not_supported_reasons(unity, p))
    assert not_supported_reasons(strided, p) == []
    assert not_supported_reasons(strided, replace(p, stride=(1, 3, 2))) == []
    assert not_supported_reasons(strided, replace(p, stride=(1, 1, 1))) == []       # stride 1 runs there too
    # CUTLASS refuses dilation on every strided-dgrad kernel, at stride 1 as well
    for q in (replace(p, dilation=(1, 2, 2)), replace(p, stride=(1, 1, 1), dilation=(1, 1, 2))):
        assert any("dilation" in r for r in not_supported_reasons(strided, q)), q.label()
    assert not_supported_reasons(unity, replace(p, stride=(1, 1, 1), dilation=(1, 2, 2))) == []
    # the optimized dgrad iterators' filter limit (CUTLASS: R, S <= 32), the analytic ones have none
    big = replace(p, r=33, s=3, pad_front=(0, 16, 1), pad_back=(0, 16, 1), h=40)
    assert any("up to 32" in r for r in not_supported_reasons(strided, big))
    assert not_supported_reasons(cfg_of(SM80 + "stride_support: strided\niterator: analytic\n"), big) == []


def test_strided_dgrad_default_problems_cover_the_phases():
    cases = default_problems(cfg_of(SM80 + "stride_support: strided\n"))
    probs = [p for p, d in cases if d == "normal"]
    assert all(not not_supported_reasons(cfg_of(SM80 + "stride_support: strided\n"), p) for p, _ in cases)
    strides = {p.stride[1:] for p in probs}
    assert {(2, 2), (3, 3), (2, 3), (1, 1)} <= strides
    assert any(p.r == 1 and p.stride[1] == 2 for p in probs)            # phases with no tap: beta * source only
    assert any(p.pad_front[1:] != p.pad_back[1:] and p.stride[1] > 1 for p in probs)   # padding per side
    assert any(p.h % p.stride[1] and p.w % p.stride[2] for p in probs if p.stride[1] > 1)
    assert {p.beta != 0 for p in probs if p.stride[1] > 1} == {False, True}
    assert any(p.alpha != 1 for p in probs if p.stride[1] > 1)
    assert any(d == "int" and p.stride[1] > 1 for p, d in cases)
    # 3D analytic: stride-2 problems with depth
    c3 = cfg_of(SM80 + "stride_support: strided\niterator: analytic\ndims: 3\n")
    p3 = [p for p, _ in default_problems(c3)]
    assert any(p.d > 1 and p.stride[1] == 2 for p in p3) and all(not not_supported_reasons(c3, p) for p in p3)


# ------------------------------------------------------------------------------------------------ gemm_1x1 dgrad
def test_gemm_1x1_dgrad_defaults_and_render():
    inst = one(GEMM)
    assert not isinstance(inst, Rejection), inst
    assert (inst.kernel, inst.schedule, inst.scheduler) == (ConvKernelKind.gemm_1x1, ConvSchedule.cooperative,
                                                            ConvTileScheduler.persistent)
    assert inst.stride_support is StrideSupport.unity
    name, src = render(GEMM)
    assert name.startswith("conv2d_dgrad_sm90a_f16") and name.endswith("_gemm1x1_coop_persistent")
    # A = dy [NPQ, K] K-major, B = w [K, C] read N-major, D = dx [NPQ, C] row-major
    assert "using LayoutA = cutlass::layout::RowMajor;" in src and "using LayoutB = cutlass::layout::RowMajor;" in src
    assert "using LayoutC = cutlass::layout::RowMajor;" in src
    assert "cute::get<0>(dA) = lda;" in src and "cute::get<1>(dB) = ldb;" in src and "cute::get<0>(dC) = ldc;" in src
    assert "int const M = int(npq), N = p->c, K = p->k;" in src
    assert "long long const lda = ldy, ldb = ldw, ldc = ldx;" in src
    assert "static_cast<ElementA const*>(p->ptr_y), dA, static_cast<ElementB const*>(p->ptr_w), dB" in src
    assert "void* out_ptr = const_cast<void*>(p->ptr_x);" in src
    assert "cutlass::gemm::PersistentScheduler" in src and "if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;" in src
    _n, pp = render(GEMM.replace("dtype: f16", "dtype: bf16") + "schedule: pingpong\n")
    assert "KernelTmaWarpSpecializedPingpong" in pp and "cutlass::bfloat16_t" in pp
    _n, sk = render(GEMM + "scheduler: stream_k\n")
    assert "emitter_sk::StreamKSchedulerResettingLocks" in sk and "DecompositionMode::SplitK" in sk


@pytest.mark.parametrize("extra, rule", [
    ("swap_ab: true\n", "gemm-1x1-swap-ab"), ("epilogue: {bias: true}\n", "bias-fprop-only"),
    ("dtype: tf32\n", "gemm-1x1-dtype"), ("split_k: parallel\n", "gemm-1x1-split-k"),
])
def test_gemm_1x1_dgrad_rejections(extra, rule):
    text = GEMM.replace("dtype: f16\n", "") + ("" if "dtype" in extra else "dtype: f16\n") + extra
    r = one(text)
    assert isinstance(r, Rejection) and r.rule == rule, r


def test_gemm_1x1_dgrad_problems_and_planted_bug():
    from emitter.families.conv.runner import planted_bugs, planted_problem

    cfg = cfg_of(GEMM)
    cases = default_problems(cfg)
    probs = [p for p, d in cases if d == "normal"]
    assert len(probs) >= 5 and all((p.r, p.s) == (1, 1) and max(p.stride) == 1 and not max(p.pad_front) for p in probs)
    assert any((p.n * p.h * p.w) % 2 for p in probs) and {p.beta != 0 for p in probs} == {False, True}
    ok = ConvProblem(n=3, h=7, w=9, c=40, k=72)
    assert not_supported_reasons(cfg, ok) == []
    for bad, why in ((replace(ok, stride=(1, 2, 2)), "stride 1 only"), (replace(ok, r=3, s=3), "1x1 filters only"),
                     (replace(ok, pad_front=(0, 0, 1), pad_back=(0, 0, 1)), "unpadded"), (replace(ok, c=44), "multiple")):
        assert any(why in r for r in not_supported_reasons(cfg, bad)), bad.label()
    kcfg = ConvConfig.from_entry({"name": "g", "config": one(GEMM).config()})
    assert planted_bugs(kcfg) == ("row_short",)
    p = planted_problem(kcfg)
    assert (p.r, p.s) == (1, 1) and not_supported_reasons(cfg, p) == []


def test_runner_plants_a_short_dx_row_a_gemm_1x1_can_run():
    """The planted short row of a 1x1 dgrad must be a problem the GEMM shim accepts (no padding): one input row
    fewer, dy cut with it; run by the CPU stand-in, only the last dx row stays poison."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_conv_runner_cpu import StandIn

    from emitter.families.conv.runner import expected_reason, planted_problem, run_case

    kcfg = ConvConfig.from_entry({"name": "g", "config": one(GEMM).config()})

    class GemmStandIn(StandIn):
        def run(self, p, tensors):
            reasons = not_supported_reasons(kcfg.cfg, p)
            assert not reasons, reasons                  # what the shim would refuse (SKIPPED, not caught)
            return super().run(p, tensors)

    k = GemmStandIn(kcfg)
    p = planted_problem(kcfg)
    assert run_case(k, p, "normal", 3)["status"] == "PASSED"
    v = run_case(k, p, "normal", 3, planted="row_short")
    assert expected_reason("row_short", v), (v.get("status"), v.get("unwritten_rows"), v.get("signature_misses"))


# ------------------------------------------------------------------------------------------------ configs and bench
def test_configs_hold_the_new_dgrad_kernels():
    conv = sorted((ROOT / "configs" / "conv").glob("*.yaml"))
    resolved, rejected, _s, _d = resolve_specs(conv)
    assert rejected == []
    for spec in ("sm80_resnet50.yaml", "sm90a_resnet50.yaml", "verify_set.yaml", "sm90a_dgrad_bench.yaml"):
        names = [r.name for r in resolve_specs([ROOT / "configs" / "conv" / spec])[0]]
        assert any(n.startswith("conv2d_dgrad_sm80") and "_strided_" in n for n in names), spec
        if spec != "sm80_resnet50.yaml":
            assert any(n.startswith("conv2d_dgrad_sm90a") and "gemm1x1" in n for n in names), spec
    vs = [r.name for r in resolve_specs([ROOT / "configs" / "conv" / "verify_set.yaml"])[0]]
    assert any(n.startswith("conv3d_dgrad_sm80") and "_analytic_strided_" in n for n in vs)
    assert any("bf16" in n and "gemm1x1_pingpong" in n and "dgrad" in n for n in vs)


def test_bench_has_the_stride_2_layers_behind_its_default_set():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import conv_bench

    labels = [layer[0] for layer in conv_bench.LAYERS]
    assert conv_bench.DEFAULT_LAYERS == tuple(range(8))
    assert labels[8:] == ["C128 56² K128 3x3 s2", "C256 28² K256 3x3 s2", "C512 14² K512 3x3 s2",
                          "C256 56² K512 1x1 s2", "C512 28² K1024 1x1 s2", "C1024 14² K2048 1x1 s2"]
    from emitter.families.conv.library import _LABEL
    for layer in conv_bench.LAYERS[8:]:
        p = conv_bench.problem_for(layer, 4)
        assert p.stride == (1, 2, 2) and p.output_extents()[1] == layer[2] // 2, layer
        assert _LABEL.match(layer[0]), layer[0]          # the library reads the bench's rows by this label


# ------------------------------------------------------------------------------------------------ fake pipeline
SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: dgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    stride_support: strided
  - family: conv
    arch: sm90a
    op: dgrad
    kernel: gemm_1x1
    dtype: {a: bf16, c: bf16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    schedule: pingpong
"""


def test_emitter_verify_fake_backend_and_a_planted_stride_fault(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["cases"]["FAILED"] == 0 and res["summary"]["cases"]["PASSED"] >= 15
    strided = [x for x in res["results"] if "_strided_" in x["instance"] and x["status"] == "PASSED"]
    assert any("str1x3x3" in x["problem"] for x in strided) and any("str1x2x3" in x["problem"] for x in strided)
    # a stride-2 problem on the GEMM is SKIPPED with its reason; on the strided kernel it runs
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--problem",
                              "n=2,h=13,w=11,c=64,k=64,r=1,s=1,stride=2,beta=0.5"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    by = {("gemm1x1" in x["instance"]): x for x in res["results"]}
    assert by[True]["status"] == "SKIPPED" and "stride 1 only" in by[True]["reason"]
    assert by[False]["status"] == "PASSED"
    faults = json.dumps([{"kind": "conv_stride_ignored", "select": "*_strided_*"}])
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick", "--select", "*_strided_*",
                              "--fake-faults", faults], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:]


# ------------------------------------------------------------------------------------------------ real compiles
NVCC_SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: dgrad
    dtype: f16
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    stride_support: strided
  - family: conv
    arch: sm90a
    op: dgrad
    kernel: gemm_1x1
    dtype: f16
    tile: 128x128x64
"""


@pytest.mark.nvcc
def test_strided_dgrad_and_gemm_1x1_dgrad_build_and_answer_can_implement(tmp_path):
    from emitter.families.conv.abi import ConvShim, c_problem_from
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_CUDA_ERROR, EMITTER_OK

    (tmp_path / "spec.yaml").write_text(NVCC_SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["build", str(out), "-j", "2", "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    shims = {}
    for e in json.loads((out / "manifest.json").read_text())["instances"]:
        rec = json.loads((out / "build" / e["name"] / "record.json").read_text())
        assert rec["status"] in ("ok", "cached") and rec["resources"]["spill_bytes"] == 0, rec.get("error")
        assert f"emitter_{e['name']}_kernel".encode() in (out / rec["artifacts"]["cubin"]).read_bytes()
        shims[e["arch"]] = ConvShim(out / rec["artifacts"]["host"], e["name"])
    ptrs = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}

    # the strided-dgrad kernel: a ResNet stride-2 layer; its grid is the M tiles of every stride phase
    s2 = ConvProblem(n=128, h=56, w=56, c=128, k=128, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2))
    status, launch = shims["sm80"].query(c_problem_from(s2, ptrs))
    assert status == EMITTER_OK
    assert launch.as_dict()["grid"] == [4 * (128 * 28 * 28 // 128), 1, 1]
    odd = ConvProblem(n=3, h=13, w=11, c=40, k=72, r=1, s=1, stride=(1, 2, 2))      # 1x1 s2: phases without taps
    status, launch = shims["sm80"].query(c_problem_from(odd, ptrs))
    assert status == EMITTER_OK and launch.as_dict()["grid"][0] == 4 * -(-3 * 7 * 6 // 128)
    assert shims["sm80"].query(c_problem_from(replace(s2, stride=(1, 3, 2)), ptrs))[0] == EMITTER_OK
    assert shims["sm80"].query(c_problem_from(replace(s2, stride=(1, 1, 1)), ptrs))[0] == EMITTER_OK
    for bad in (replace(s2, dilation=(1, 2, 2)), replace(s2, c=60), replace(s2, split_k=2)):
        assert shims["sm80"].query(c_problem_from(bad, ptrs))[0] == EMITTER_CANNOT_IMPLEMENT, bad.label()

    # the 1x1 dgrad GEMM: can-implement passes (without a GPU the SM-count query after it is a CUDA error)
    g = ConvProblem(n=128, h=56, w=56, c=256, k=64, r=1, s=1)
    assert shims["sm90a"].query(c_problem_from(g, ptrs))[0] in (EMITTER_OK, EMITTER_CUDA_ERROR)
    for bad in (replace(g, stride=(1, 2, 2)), replace(g, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),
                replace(g, c=60), replace(g, k=68), replace(g, split_k=2)):
        assert shims["sm90a"].query(c_problem_from(bad, ptrs))[0] == EMITTER_CANNOT_IMPLEMENT, bad.label()
