"""Conv family, `split_k: parallel` on sm90a wgrad: CUTLASS's sm90 conv collectives (im2col TMA mainloop, TMA
epilogue) under emitter's persistent split-K / stream-K kernel (templates/conv/sm90a/splitk_*.cu.j2).

Spec values, names and rejections (rule + fix); the implicit and gemm_1x1 instances keep their names and text;
the rendered kernel level (emitter's kernel class, the stream-K scheduler, the run-time slice count reaching the
scheduler, no split-K refusal in the shim); the run-time slice choices (one wave of 132 SMs over the layer's
tiles, half, double, and the stream-K heuristic); the default problems; `emitter verify --backend fake`; and ONE
real nvcc compile (no C7510 serialization, no spills) whose shim takes split counts and refuses what the kernel
cannot run."""

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
from emitter.families.conv import runtime as hooks
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.model import SplitK
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

ROOT = Path(__file__).resolve().parents[2]
BASE = "family: conv\narch: sm90a\nop: wgrad\ndtype: f16\ntile: 64x64x64\nsplit_k: parallel\n"
C64 = ConvProblem(n=128, h=56, w=56, c=64, k=64, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
C128 = ConvProblem(n=128, h=28, w=28, c=128, k=128, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))


def expand(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    out = []
    for path, entry, key_paths in spec_entries(doc):
        out += [inst for inst, _ in expand_entry(doc, path, entry, key_paths)]
    return out


def one(text: str):
    (inst,) = expand(text)
    return resolve(inst)


def cfg_of(inst) -> ConvConfig:
    return ConvConfig.from_entry({"name": instance_name(inst), "config": inst.config()})


def render(inst) -> str:
    return render_instance(inst, instance_name(inst), banner("t.yaml", "0" * 16))


# ------------------------------------------------------------------------------------------------ spec and rules
def test_parallel_split_k_resolves_for_sm90a_wgrad():
    inst = one(BASE)
    assert not isinstance(inst, Rejection), inst
    assert inst.split_k is SplitK.parallel and inst.stages >= 2 and (inst.alignment_a, inst.alignment_c) == (8, 8)
    assert instance_name(inst).endswith("_identity_splitkparallel")
    assert inst.config()["split_k"] == "parallel"
    for extra in ("dims: 3\n", "dtype: bf16\n", "tile: 128x128x64\n", "tile: 128x64x64\n", "tile: 64x128x64\n",
                  "cluster: 1x2x1\n", "cluster: 2x1x1\n"):
        text = BASE.replace("dtype: f16\n", "") if extra.startswith("dtype") else BASE
        text = text.replace("tile: 64x64x64\n", "") if extra.startswith("tile") else text
        got = one(text + extra)
        assert not isinstance(got, Rejection), (extra, got)
    # the name says split_k; the same config without it is the non-persistent kernel, named as before
    plain = one(BASE.replace("split_k: parallel\n", ""))
    assert instance_name(plain) == instance_name(inst).replace("_splitkparallel", "")


@pytest.mark.parametrize("text, rule, fix", [
    (BASE.replace("parallel", "serial"), "split-k-3x", "split_k: parallel"),
    (BASE.replace("op: wgrad", "op: fprop"), "split-k-wgrad-only", "remove split_k"),
    (BASE.replace("op: wgrad", "op: dgrad"), "split-k-wgrad-only", "remove split_k"),
    (BASE.replace("dtype: f16", "dtype: tf32"), "split-k-dtype", "f16 or bf16"),
    (BASE.replace("dtype: f16", "dtype: {a: s8, c: s32, accumulator: s32, epilogue: f32}"), "split-k-dtype", "f16"),
    (BASE.replace("dtype: f16", "dtype: {a: f16, c: f16, accumulator: f16, epilogue: f16}"), "split-k-dtype",
     "accumulator: f32"),
    (BASE + "cluster: 2x2x1\n", "split-k-cluster", "1x2x1"),
    (BASE + "cluster: 1x4x1\n", "split-k-cluster", "1x2x1"),
    (BASE.replace("64x64x64", "128x256x64"), "split-k-tile", "n <= 128"),
    (BASE.replace("64x64x64", "256x128x64"), "split-k-tile", "m = 64 or 128"),
    (BASE.replace("sm90a", "sm80") + "warp: 32x32x64\n", "split-k-parallel", "split_k: serial"),
])
def test_rejections_name_rule_and_fix(text, rule, fix):
    got = one(text)
    assert isinstance(got, Rejection), got
    assert got.rule == rule and fix in got.reason, (got.rule, got.reason)


def test_other_instances_keep_their_names_and_text():
    implicit = one(BASE.replace("split_k: parallel\n", ""))
    text = render(implicit)
    assert "ConvUniversalSplitK" not in text and "emitter_sk" not in text
    assert "if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;  // no split-K in the sm90 conv kernel" in text
    gemm = one("family: conv\narch: sm90a\nop: wgrad\ndtype: f16\ntile: 128x128x64\nkernel: gemm_1x1\n")
    assert "ConvUniversalSplitK" not in render(gemm)
    # every config resolves; the bench, verify and split-K sets hold the new instances
    resolved, rejected, _specs, _dups = resolve_specs(sorted((ROOT / "configs" / "conv").glob("*.yaml")))
    assert rejected == []
    names = [r.name for r in resolved]
    for needle in ("wgrad_sm90a_f16_f16_accf32_nhwc_64x64x64", "wgrad_sm90a_bf16_bf16_accf32_nhwc_128x128x64",
                   "conv3d_wgrad_sm90a_bf16"):
        assert any(needle in n and n.endswith("splitkparallel") for n in names), needle


# ------------------------------------------------------------------------------------------------ rendered levels
def test_split_instance_renders_emitter_kernel_under_the_stream_k_scheduler():
    text = render(one(BASE))
    # CUTLASS's conv collectives (builders) under emitter's kernel class; never CUTLASS's ConvUniversal
    assert "cutlass::conv::collective::CollectiveBuilder<" in text
    assert "cutlass::epilogue::collective::CollectiveBuilder<" in text
    assert "using ConvKernel = emitter_conv_sk::ConvUniversalSplitK<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;" in text
    assert "cutlass::conv::kernel::ConvUniversal<" not in text
    assert text.count("class ConvUniversalSplitK {") == 1 and text.count("class PersistentTileSchedulerSm90StreamKResettingLocks") == 1
    assert "emitter_sk::PersistentTileSchedulerSm90StreamKResettingLocks<SchedulerTileShape, ClusterShape>" in text
    # the run-time slice count reaches the scheduler; the shim no longer refuses split_k_slices > 1
    assert "args.scheduler.splits = p->split_k_slices;" in text
    assert "DecompositionMode::SplitK" in text and "ReductionMode::Nondeterministic" in text
    assert "no split-K in the sm90 conv kernel" not in text
    # the unit's k-tile range drives the collective's load, the fixup meets the units of a tile
    assert "collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs," in text
    assert "k_tile_iter, int(work_k_tile_count)" in text
    assert "TileScheduler::fixup(params.scheduler, work_tile_info, accumulators, NumMmaWarpGroups, 0);" in text
    # the entry level and the conv ABI are the implicit kernel's
    assert "__cluster_dims__(1, 1, 1)" in text and "emitter_conv_problem" in text
    assert "cute::Shape<cute::_64, cute::Shape<cute::_64>, cute::Shape<cute::_64>>" in text   # wgrad nests N and K


def test_3d_split_instance_renders():
    text = render(one(BASE + "dims: 3\n"))
    assert "static constexpr int kSpatialDims = 3;" in text and "ConvUniversalSplitK" in text


# ------------------------------------------------------------------------------------------------ run time
def test_split_k_choices_fill_one_wave_of_units():
    small = cfg_of(one(BASE))
    big = cfg_of(one(BASE.replace("64x64x64", "128x128x64")))
    # C64 K64 3x3 at 64x64: 1 x (1 x 3 x 3) = 9 tiles (the tile runs along C; S and R are their own modes):
    # 132 // 9 = 14 slices a tile fill one wave, 7 and 28 beside it, 1 = the stream-K heuristic
    assert hooks.split_k_choices(small, C64) == [1, 7, 14, 28]
    assert hooks.choose_split_k(small, C64) == 14
    # C128 K128 3x3 at 128x128: 9 tiles again
    assert hooks.split_k_choices(big, C128) == [1, 7, 14, 28]
    # C64 at 128x128 tiles: still 9 tiles (C = 64 fills half of each), not the 5 of a linear C*R*S = 576
    assert hooks.choose_split_k(big, C64) == 14
    # a short reduction caps the slices (each keeps >= 8 k-tiles): N*P*Q = 2*9*11 = 198 -> 4 k-tiles -> 1
    tiny = ConvProblem(n=2, h=9, w=11, c=64, k=64, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    assert hooks.split_k_choices(small, tiny) == [1]
    assert hooks.profile_splits(small, C64, 132) == [1, 7, 14, 28]
    assert hooks.split_k_choices(small, C64, sm_count=114) == [1, 6, 12, 24]   # H100 PCIe: 114 SMs
    # a 1x2 cluster pads the 9 n-tiles to 10: 13 slices fill the wave (14 would be 140 units on 132 SMs)
    paired = cfg_of(one(BASE + "cluster: 1x2x1\n"))
    assert hooks.split_k_choices(paired, C64) == [1, 6, 13, 26]
    # the serial (sm80) choices are what they were
    serial = cfg_of(one("family: conv\narch: sm80\nop: wgrad\ndtype: f16\ntile: 64x128x32\nwarp: 32x64x32\n"
                        "split_k: serial\n"))
    assert hooks.split_k_choices(serial, C64) == [13, 27, 54]


def test_default_problems_split_three_ways_one_way_and_thirteen():
    cfg = cfg_of(one(BASE))
    cases = default_problems(cfg.cfg)
    probs = [p for p, _ in cases]
    assert all(not_supported_reasons(cfg.cfg, p) == [] for p in probs)
    splits = {p.split_k for p in probs}
    assert splits == {1, 3, 13}, splits
    assert any(p.beta != 0 for p in probs if p.split_k == 13)
    assert any(max(p.stride) > 1 for p in probs) and any(max(p.dilation) > 1 for p in probs)
    assert any(p.pad_front != p.pad_back for p in probs)             # asymmetric padding
    assert any(p.c % 64 and p.k % 64 for p in probs)                 # C and K no tile multiples
    assert {d for _, d in cases} == {"normal", "int"}
    # split counts are a problem field a split instance takes and any other instance refuses
    plain = cfg_of(one(BASE.replace("split_k: parallel\n", "")))
    assert not_supported_reasons(cfg.cfg, replace(C64, split_k=14)) == []
    assert any("not a split-K instance" in r for r in not_supported_reasons(plain.cfg, replace(C64, split_k=14)))


SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: wgrad
    dtype: [f16, bf16]
    tile: 64x64x64
    split_k: parallel
"""


def test_emitter_verify_fake_backend_runs_and_catches_a_planted_fault(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["total_instances"] == 2
    assert res["summary"]["cases"]["FAILED"] == 0 and res["summary"]["cases"]["PASSED"] >= 12
    assert any("splitk13" in x["problem"] for x in res["results"] if x["status"] == "PASSED")
    faults = json.dumps([{"kind": "conv_row_short", "select": "*f16_f16*"}])
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick", "--select", "*f16_f16*",
                              "--fake-faults", faults], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:]


def test_fake_profile_times_each_slice_count_and_checks_it(tmp_path):
    from click.testing import CliRunner

    from emitter.cli import main

    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "emitter", "emit", str(tmp_path / "spec.yaml"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = CliRunner().invoke(main, ["profile", str(out), "--backend", "fake", "-o", str(tmp_path / "p"), "--quick",
                                    "--no-plots", "--problem", "n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1"])
    assert res.exit_code == 0, res.output
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    rows = [r for r in (prof.get("measurements") or prof["results"]) if r["kind"] == "kernel"]
    assert len(rows) == 8, [(r["name"], r["split_k"]) for r in rows]     # 2 instances x slices 1, 7, 14, 28
    for dt in ("f16_f16", "bf16_bf16"):
        assert sorted(r["split_k"] for r in rows if dt in r["name"]) == [1, 7, 14, 28]
    assert all(r["status"] == "ok" and r["check"]["passed"] for r in rows), [(r["name"], r["reason"]) for r in rows]


# ------------------------------------------------------------------------------------------------ one real compile
NVCC_SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: wgrad
    dtype: f16
    tile: 64x64x64
    split_k: parallel
"""


@pytest.mark.nvcc
def test_sm90a_split_k_wgrad_builds_without_serialized_wgmma(tmp_path):
    from emitter.families.conv.abi import ConvShim, c_problem_from
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_CUDA_ERROR, EMITTER_INVALID_ARGUMENT, EMITTER_OK

    (tmp_path / "spec.yaml").write_text(NVCC_SPEC)
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # emitter build fails a device compile whose ptxas report says C7510 (wgmma serialized)
    r = subprocess.run(cmd + ["build", str(out), "-j", "1", "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (entry,) = json.loads((out / "manifest.json").read_text())["instances"]
    name = entry["name"]
    rec = json.loads((out / "build" / name / "record.json").read_text())
    assert rec["status"] in ("ok", "cached") and not rec.get("serialized_wgmma")
    assert "C7510" not in json.dumps(rec.get("warnings", []))
    assert rec["resources"]["spill_bytes"] == 0
    assert f"emitter_{name}_kernel".encode() in (out / rec["artifacts"]["cubin"]).read_bytes()
    shim = ConvShim(out / rec["artifacts"]["host"], name)
    ptrs = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}
    # can_implement passes (split counts included); without a GPU the SM-count query after it is a CUDA error
    for p in (C64, replace(C64, split_k=14), replace(C64, split_k=64), replace(C64, stride=(1, 2, 2)),
              replace(C64, beta=0.5)):
        src = {"source": 1 << 23} if p.beta else {}
        assert shim.query(c_problem_from(p, {**ptrs, **src}))[0] in (EMITTER_OK, EMITTER_CUDA_ERROR), p.label("normal")
    assert shim.query(c_problem_from(replace(C64, c=60), ptrs))[0] == EMITTER_CANNOT_IMPLEMENT   # 16-byte rows
    prob = c_problem_from(C64, ptrs)
    prob.groups = 2
    assert shim.query(prob)[0] == EMITTER_CANNOT_IMPLEMENT
    prob = c_problem_from(C64, ptrs)
    prob.split_k_slices = 0
    assert shim.query(prob)[0] == EMITTER_INVALID_ARGUMENT
    # wgrad reads dy as one dense N*P*Q x K matrix (CUTLASS's can_implement): a padded row pitch of dy is refused;
    # x goes through the im2col TMA, which takes any 16-byte multiple of a pitch
    prob = c_problem_from(C64, ptrs)
    prob.stride_y[2] = 56 * 64 + 8
    assert shim.query(prob)[0] == EMITTER_CANNOT_IMPLEMENT
    prob = c_problem_from(C64, ptrs)
    prob.stride_x[2] = 56 * 64 + 8
    assert shim.query(prob)[0] in (EMITTER_OK, EMITTER_CUDA_ERROR)
