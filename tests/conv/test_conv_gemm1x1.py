"""Conv family, `kernel: gemm_1x1` (issue 28's 1x1 layers): sm90a 1x1 fprop / wgrad as a persistent CUTLASS 3.x GEMM.

Spec defaults, names and rejections (rule + fix); implicit instances unchanged (names, manifest configs); the
rendered levels (GemmUniversal, schedules, layouts, the shim's refusals); the host-side mirror of can_implement
(not_supported_reasons) and the default 1x1 problem set; `emitter verify --backend fake` through the conv
pipeline; and ONE real nvcc compile of an fprop instance whose shim refuses every non-GEMM problem."""

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from emitter.emit import resolve_specs, spec_entries
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.conv import instance_name, render_instance, resolve
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.model import ConvKernelKind, ConvSchedule, ConvTileScheduler, StrideSupport
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

ROOT = Path(__file__).resolve().parents[2]
BASE = "family: conv\narch: sm90a\ndtype: f16\ntile: 128x128x64\nkernel: gemm_1x1\n"


def expand(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    out = []
    for path, entry, key_paths in spec_entries(doc):
        out += [inst for inst, _ in expand_entry(doc, path, entry, key_paths)]
    return out


def one(text: str):
    (inst,) = expand(text)
    return resolve(inst)


# ------------------------------------------------------------------------------------------------ spec and names
def test_defaults_fprop_persistent_cooperative_wgrad_stream_k():
    f = one(BASE + "op: fprop\n")
    w = one(BASE + "op: wgrad\n")
    assert not isinstance(f, Rejection) and not isinstance(w, Rejection)
    assert (f.kernel, f.schedule, f.scheduler) == (ConvKernelKind.gemm_1x1, ConvSchedule.cooperative,
                                                   ConvTileScheduler.persistent)
    assert (w.schedule, w.scheduler) == (ConvSchedule.cooperative, ConvTileScheduler.stream_k)
    assert f.stride_support is StrideSupport.unity and f.alignment_a == 8 and f.alignment_c == 8
    assert instance_name(f).endswith("_identity_gemm1x1_coop_persistent")
    assert instance_name(w).endswith("_identity_gemm1x1_coop_streamk")
    assert f.config()["kernel"] == "gemm_1x1" and f.config()["scheduler"] == "persistent"
    pp = one(BASE + "op: fprop\nschedule: pingpong\n")
    assert instance_name(pp).endswith("_gemm1x1_pingpong_persistent")
    assert len({instance_name(f), instance_name(pp), instance_name(one(BASE + "op: fprop\nscheduler: stream_k\n"))}) == 3


def test_implicit_instances_keep_their_names_and_configs():
    inst = one("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\n")
    assert inst.kernel is ConvKernelKind.implicit
    assert "gemm1x1" not in instance_name(inst)
    cfg = inst.config()
    assert not {"kernel", "schedule", "scheduler"} & set(cfg)
    explicit = one("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\nkernel: implicit\n")
    assert instance_name(explicit) == instance_name(inst) and explicit.config() == cfg
    # every config file still resolves, nothing rejected; the bench and verify sets hold the new variant
    resolved, rejected, _specs, _dups = resolve_specs(sorted((ROOT / "configs" / "conv").glob("*.yaml")))
    assert rejected == []
    names = [r.name for r in resolved]
    for needle in ("fprop_sm90a_f16", "fprop_sm90a_bf16", "wgrad_sm90a_f16", "wgrad_sm90a_bf16"):
        assert any(needle in n and "gemm1x1" in n for n in names), needle
    assert any("128x256x64" in n and "gemm1x1_coop_persistent" in n for n in names)
    assert any("gemm1x1_pingpong_persistent" in n for n in names)
    assert any("wgrad" in n and "gemm1x1_coop_streamk" in n for n in names)


@pytest.mark.parametrize("extra, rule, fix", [
    ("op: dgrad\nswap_ab: true\n", "gemm-1x1-swap-ab", "remove swap_ab"),
    ("op: fprop\ndtype: tf32\n", "gemm-1x1-dtype", "use dtype f16 or bf16"),
    ("op: fprop\nschedule: pingpong\nscheduler: stream_k\n", "gemm-1x1-stream-k-pingpong", "schedule: cooperative"),
    ("op: fprop\ntile: 64x128x64\n", "gemm-1x1-tile-m", "schedule: pingpong"),
    ("op: fprop\ntile: 256x128x64\nschedule: pingpong\n", "gemm-1x1-tile-m", "m = 64 or 128"),
    ("op: wgrad\nsplit_k: serial\n", "gemm-1x1-split-k", "scheduler: stream_k"),
    ("op: fprop\nalignment: 4\n", "alignment-tma", "multiples of 8"),
    ("op: fprop\nstages: 9\n", "smem", "fewer stages"),
    ("op: fprop\ncluster: 2x2x1\n", "cluster", "1x1x1"),
    ("op: wgrad\nepilogue: {bias: true}\n", "bias-fprop-only", "remove bias"),
    ("op: fprop\nswap_ab: true\n", "gemm-1x1-swap-ab", "remove swap_ab"),
])
def test_rejections_name_rule_and_fix(extra, rule, fix):
    text = BASE + extra
    if "dtype:" in extra:
        text = text.replace("dtype: f16\n", "")
    if "tile:" in extra:
        text = text.replace("tile: 128x128x64\n", "")
    r = one(text)
    assert isinstance(r, Rejection), r
    assert r.rule == rule and fix in r.reason, (r.rule, r.reason)


def test_sm80_and_implicit_schedules_are_rejected():
    r = one("family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\nkernel: gemm_1x1\n")
    assert isinstance(r, Rejection) and r.rule == "gemm-1x1-sm90a-only" and "arch: sm90a" in r.reason
    r = one("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\nschedule: pingpong\n")
    assert isinstance(r, Rejection) and r.rule == "schedule-gemm-1x1-only" and "kernel: gemm_1x1" in r.reason
    r = one("family: conv\narch: sm90a\nop: wgrad\ndtype: f16\ntile: 128x128x64\nswap_ab: true\n")
    assert isinstance(r, Rejection) and r.rule == "schedule-gemm-1x1-only"


def test_explicit_stages_against_shared_memory():
    # compiled (nvcc 13.0, CUTLASS 4.2): 128x256x64 bf16 + bias at 4 stages and 128x128x64 at 6 fit in 227 KiB
    assert not isinstance(one(BASE.replace("128x128x64", "128x256x64") + "op: fprop\nstages: 4\n"), Rejection)
    assert not isinstance(one(BASE + "op: fprop\nstages: 6\nepilogue: {bias: true}\n"), Rejection)
    for tile, stages in (("128x256x64", 5), ("128x128x64", 7)):
        r = one(BASE.replace("128x128x64", tile) + f"op: fprop\nstages: {stages}\n")
        assert isinstance(r, Rejection) and r.rule == "smem", (tile, stages)


def test_unknown_kernel_value_is_a_spec_error():
    with pytest.raises(SpecError) as e:
        expand(BASE.replace("gemm_1x1", "winograd") + "op: fprop\n")
    text = str(e.value)
    assert "winograd" in text and "gemm_1x1" in text and "implicit" in text and "kernel" in text


# ------------------------------------------------------------------------------------------------ rendering
def _render(text: str) -> tuple[str, str]:
    inst = one(text)
    name = instance_name(inst)
    return name, render_instance(inst, name, banner("t.yaml", "0" * 64))


def test_fprop_renders_a_persistent_gemm_with_the_conv_abi():
    name, src = _render(BASE + "op: fprop\nepilogue: {activation: relu, bias: true}\n")
    levels = [int(m) for m in re.findall(r"^// level (\d): ", src, re.M)]
    assert levels == [1, 2, 3, 4, 5, 6]
    assert "cutlass::gemm::kernel::GemmUniversal<" in src and "cutlass::gemm::collective::CollectiveBuilder<" in src
    assert "cutlass::gemm::KernelTmaWarpSpecializedCooperative" in src
    assert "cutlass::epilogue::TmaWarpSpecializedCooperative" in src
    assert "cutlass::gemm::PersistentScheduler" in src and "emitter_sk" not in src
    assert "using LayoutA = cutlass::layout::RowMajor;" in src and "using LayoutB = cutlass::layout::ColumnMajor;" in src
    assert "cute::Shape<cute::_128, cute::_128, cute::_64>" in src
    assert "LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu" in src
    assert "StageCountAutoCarveout" in src
    assert "cutlass/conv/" not in src and "conv::kernel::ConvUniversal" not in src
    # the shim's refusals and the conv ABI symbols
    assert "if (p->t != 1 || p->r != 1 || p->s != 1) return EMITTER_CANNOT_IMPLEMENT;" in src
    assert "p->pad_front[i] != 0 || p->pad_back[i] != 0 || p->stride[i] != 1) return EMITTER_CANNOT_IMPLEMENT" in src
    assert "if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;" in src
    assert "int const M = int(npq), N = p->k, K = p->c;" in src
    for sym in ("query", "initialize", "name", "conv_abi"):
        assert f"emitter_{name}_{sym}(" in src
    assert f"emitter_{name}_kernel(__grid_constant__" in src
    assert "using ConvKernel = GemmKernel;" in src
    assert "cute::get<0>(dA) = lda;" in src and "cute::get<0>(dB) = ldb;" in src


def test_wgrad_renders_mn_major_operands_and_stream_k():
    _name, src = _render("family: conv\narch: sm90a\ndtype: bf16\ntile: 128x128x64\nkernel: gemm_1x1\nop: wgrad\n")
    assert "using LayoutA = cutlass::layout::ColumnMajor;" in src and "using LayoutB = cutlass::layout::RowMajor;" in src
    assert "cute::get<1>(dA) = lda;" in src and "cute::get<1>(dB) = ldb;" in src
    assert "using TileSchedulerTag = emitter_sk::StreamKSchedulerResettingLocks;" in src
    assert "#define EMITTER_STREAM_K_RESET_DEFINED" in src          # the scheduler itself is in the instance
    assert "int const M = p->k, N = p->c, K = int(npq);" in src
    assert "split_k_slices != 1" not in src and "DecompositionMode::SplitK" in src   # the run-time split count
    assert "long long const lda = ldy, ldb = ldx, ldc = ldw;" in src
    assert "cutlass::bfloat16_t" in src
    _n, pp = _render(BASE + "op: fprop\nschedule: pingpong\n")
    assert "KernelTmaWarpSpecializedPingpong" in pp and "cutlass::epilogue::TmaWarpSpecialized;" in pp


def test_wgrad_swap_ab_writes_dw_transposed_column_major():
    name, src = _render("family: conv\narch: sm90a\ndtype: f16\ntile: 128x64x64\nkernel: gemm_1x1\nop: wgrad\n"
                        "swap_ab: true\n")
    assert name.endswith("_gemm1x1_coop_streamk_swapab")
    assert "using LayoutA = cutlass::layout::ColumnMajor;" in src and "using LayoutB = cutlass::layout::RowMajor;" in src
    assert "using LayoutC = cutlass::layout::ColumnMajor;" in src and "cute::get<1>(dC) = ldc;" in src
    assert "int const M = p->c, N = p->k, K = int(npq);" in src and "long long const lda = ldx, ldb = ldy, ldc = ldw;" in src
    assert "static_cast<ElementA const*>(p->ptr_x), dA, static_cast<ElementB const*>(p->ptr_y), dB" in src


def test_3d_instance_checks_the_depth_stride():
    _n, src = _render(BASE + "op: fprop\ndims: 3\n")
    assert "if (given[1] && given[1] != want_d) return false;" in src and "a 2D instance: no depth" not in src
    _n, src2 = _render(BASE + "op: fprop\n")
    assert "given[1]" not in src2 and "a 2D instance: no depth" in src2


def test_no_spec_text_reaches_cpp():
    doc = BASE + "op: fprop\nname: 'evil */ #include <x> \\n'\n"
    _n, src = _render(doc)
    assert "evil" not in src and "#include <x>" not in src


# ------------------------------------------------------------------------------------------------ run-time mirror
def _cfg(op: str = "fprop", bias: bool = False, dims: int = 2) -> dict:
    inst = one(BASE + f"op: {op}\ndims: {dims}\n" + ("epilogue: {bias: true}\n" if bias else ""))
    return ConvConfig.from_entry({"name": "t", "config": inst.config()}).cfg


def test_not_supported_reasons_refuse_every_non_gemm_problem():
    cfg = _cfg()
    ok = ConvProblem(n=3, h=7, w=9, c=40, k=72, r=1, s=1, beta=0.5)
    assert not_supported_reasons(cfg, ok) == []
    assert not_supported_reasons(cfg, replace(ok, dilation=(1, 2, 2))) == []     # dilation moot for 1x1
    three = replace(ok, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    assert any("1x1 filters only" in r for r in not_supported_reasons(cfg, three))
    assert any("stride 1 only" in r for r in not_supported_reasons(cfg, replace(ok, stride=(1, 2, 2))))
    assert any("unpadded" in r for r in not_supported_reasons(cfg, replace(ok, pad_front=(0, 1, 0), pad_back=(0, 1, 0))))
    assert any("multiple" in r for r in not_supported_reasons(cfg, replace(ok, c=60)))
    # a run-time split count: the stream-K instances take it (split-K mode), the persistent ones do not
    assert any("split-K" in r for r in not_supported_reasons(cfg, replace(ok, split_k=3)))
    assert not_supported_reasons(_cfg("wgrad"), replace(ok, split_k=3)) == []
    # the implicit kernel's rules are untouched: the same 3x3 problem runs there
    implicit = dict(cfg, kernel="implicit", stride_support="strided")
    assert not_supported_reasons(implicit, three) == []
    # the manifest's kernel key reaches ConvConfig (and an unknown one is an error, not a silent implicit)
    entry = {"name": "x", "config": {**one(BASE + "op: fprop\n").config()}}
    assert ConvConfig.from_entry(entry).kernel == "gemm_1x1"
    entry["config"]["kernel"] = "winograd"
    with pytest.raises(Exception, match="kernel"):
        ConvConfig.from_entry(entry)


@pytest.mark.parametrize("op, bias, dims", [("fprop", True, 2), ("wgrad", False, 2), ("fprop", False, 3)])
def test_default_problems_are_odd_1x1_problems(op, bias, dims):
    cfg = _cfg(op, bias, dims)
    cases = default_problems(cfg)
    probs = [p for p, data in cases if data == "normal"]
    assert len(cases) >= 5 and len(probs) >= 4
    assert all((p.t, p.r, p.s) == (1, 1, 1) and max(p.stride) == 1 for p in probs)
    assert any((p.n * p.d * p.h * p.w) % 2 == 1 for p in probs)                 # odd N*P*Q
    assert any(p.c % 64 and p.k % 64 and p.c % 8 == 0 and p.k % 8 == 0 for p in probs)
    assert {p.beta != 0 for p in probs} == {False, True}
    assert all(p.bias == bias for p in probs)
    if dims == 3:
        assert any(p.d > 1 for p in probs)
    assert any(p.split_k > 1 for p in probs) == (op == "wgrad")     # wgrad: stream-K, also at a given split count
    assert default_problems(cfg, quick=True)


# ------------------------------------------------------------------------------------------------ fake pipeline
SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: fprop
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    schedule: [cooperative, pingpong]
    epilogue: {activation: relu, bias: true}
  - family: conv
    arch: sm90a
    op: wgrad
    kernel: gemm_1x1
    dtype: {a: bf16, c: bf16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
"""


def test_emitter_verify_fake_backend_runs_and_refuses(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["total_instances"] == 3
    assert res["summary"]["cases"]["FAILED"] == 0 and res["summary"]["cases"]["PASSED"] >= 15
    # a 3x3 problem is refused cleanly (SKIPPED with the reason), a 1x1 one with beta and bias runs
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--select", "*fprop*",
                              "--problem", "n=2,h=9,w=9,c=64,k=64,r=3,s=3,pad_h=1,pad_w=1,bias=1",
                              "--problem", "n=3,h=7,w=9,c=40,k=72,r=1,s=1,beta=0.5,bias=1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    by = {}
    for x in res["results"]:
        by.setdefault("r3" if "r3s3" in x["problem"] else "r1", set()).add(x["status"])
    assert by["r3"] == {"SKIPPED"} and by["r1"] == {"PASSED"}, res["results"]
    assert all("1x1" in x["reason"] for x in res["results"] if x["status"] == "SKIPPED")
    # a planted bug is caught
    faults = json.dumps([{"kind": "conv_row_short", "select": "*wgrad*"}])
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick", "--select", "*wgrad*",
                              "--fake-faults", faults], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:]


# ------------------------------------------------------------------------------------------------ one real compile
NVCC_SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: fprop
    kernel: gemm_1x1
    dtype: f16
    tile: 128x128x64
"""


@pytest.mark.nvcc
def test_sm90a_gemm_1x1_fprop_builds_and_refuses_non_gemm_problems(tmp_path):
    from emitter.families.conv.abi import ConvShim, c_problem_from
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_CUDA_ERROR, EMITTER_OK

    (tmp_path / "spec.yaml").write_text(NVCC_SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["build", str(out), "-j", "1", "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (entry,) = json.loads((out / "manifest.json").read_text())["instances"]
    name = entry["name"]
    rec = json.loads((out / "build" / name / "record.json").read_text())
    assert rec["status"] in ("ok", "cached") and rec["resources"]["spill_bytes"] == 0
    assert f"emitter_{name}_kernel".encode() in (out / rec["artifacts"]["cubin"]).read_bytes()
    shim = ConvShim(out / rec["artifacts"]["host"], name)
    ptrs = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}
    gemm = ConvProblem(n=128, h=56, w=56, c=64, k=256, r=1, s=1)
    # can_implement passes; without a GPU the SM-count query after it is a CUDA error
    assert shim.query(c_problem_from(gemm, ptrs))[0] in (EMITTER_OK, EMITTER_CUDA_ERROR)
    assert shim.query(c_problem_from(replace(gemm, dilation=(1, 2, 2)), ptrs))[0] in (EMITTER_OK, EMITTER_CUDA_ERROR)
    refused = [replace(gemm, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)), replace(gemm, stride=(1, 2, 2)),
               replace(gemm, r=3, s=3), replace(gemm, c=60), replace(gemm, split_k=2)]
    for p in refused:
        assert shim.query(c_problem_from(p, ptrs))[0] == EMITTER_CANNOT_IMPLEMENT, p.label()
    # tensors that are not one dense matrix (an H stride that is not W * row pitch) are refused, padded rows run
    prob = c_problem_from(gemm, ptrs)
    prob.stride_x[2] = 56 * 64 + 8
    assert shim.query(prob)[0] == EMITTER_CANNOT_IMPLEMENT
    prob = c_problem_from(gemm, ptrs)
    prob.stride_x[3], prob.stride_x[2], prob.stride_x[0] = 72, 72 * 56, 72 * 56 * 56
    assert shim.query(prob)[0] in (EMITTER_OK, EMITTER_CUDA_ERROR)
    prob.stride_x[3] = 68      # a row pitch that breaks the 16-byte rows
    prob.stride_x[2], prob.stride_x[0] = 68 * 56, 68 * 56 * 56
    assert shim.query(prob)[0] == EMITTER_CANNOT_IMPLEMENT


def test_planted_bugs_for_gemm_1x1_are_the_ones_that_apply():
    from emitter.families.conv.runner import PLANTED, planted_bugs, planted_problem

    g = ConvConfig.from_entry({"name": "g", "config": one(BASE + "op: fprop\nepilogue: {bias: true}\n").config()})
    i = ConvConfig.from_entry({"name": "i", "config": one("family: conv\narch: sm90a\nop: fprop\ndtype: f16\n"
                                                          "tile: 128x128x64\n").config()})
    assert planted_bugs(g) == ("row_short",) and planted_bugs(i) == PLANTED
    p = planted_problem(g)
    assert (p.r, p.s) == (1, 1) and p.bias and not_supported_reasons(g.cfg, p) == []
    assert planted_problem(i).r == 3
