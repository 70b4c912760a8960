"""`emitter profile` of attention backward instances, without a GPU: a profile problem applies to backward
instances under their own op (attnbwd_...) and problem (the forward's sizes and key, 2.5x its FLOPs, `"pass":
"backward"` in its JSON), the fake backend checks each backward kernel with verify's case (its planted bugs fail
the check) and times it, tuning.json gets backward winners beside forward ones without mixing them, and the GPU
check (float64 gradients of sampled (batch, KV head) pairs, every element written) and launch path run here on host
memory and a stand-in shim."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from emitter.emit import emit
from emitter.families.attention import runtime as hooks
from emitter.resources import configs_root

SPEC = """\
kernels:
  - family: attention
    op: backward
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: [64x64, 128x128]
    mask: [none, causal_top_left]
    gqa: true
    deterministic: false
  - family: attention
    op: backward
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 64x128
    mask: [none, causal_top_left]
    deterministic: false
  - family: attention
    op: forward
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 128x64
    schedule: cooperative
    mask: [none, causal_top_left]
    gqa: true
    lse: true
"""
PROBLEMS = ("b=4,hq=8,sq=256,sk=256,d=64", "b=2,hq=8,hkv=2,sq=200,sk=300,d=64,causal")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    out = tmp_path_factory.mktemp("attnbwdprof")
    (out / "spec.yaml").write_text(SPEC)
    emit([out / "spec.yaml"], out / "k", jobs=1)
    return out / "k"


def _entries(manifest):
    return json.loads((manifest / "manifest.json").read_text())["instances"]


def _cli(*args):
    from click.testing import CliRunner

    from emitter.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_backward_problem_flops_key_and_json():
    from emitter.families.attention.backward_profile import AttentionBackwardProfileProblem, op_problem
    from emitter.families.attention.profile import AttentionProfileProblem
    from emitter.profile.config import problem_from_json, problems_from_text

    (fwd,) = problems_from_text(["b=2,hq=8,hkv=2,sq=200,sk=300,d=64,causal"], families=["attention"])
    assert type(fwd) is AttentionProfileProblem
    cfg = hooks.config_from_entry({"name": "x", "config": {"op": "backward", "arch": "sm80", "dtype": "f16",
                                                           "head_dim": 64, "head_dim_v": 64, "tile_q": 64, "tile_kv": 64,
                                                           "mask": "causal_top_left", "layout": "bshd", "gqa": True,
                                                           "varlen": False, "deterministic": False}})
    op = hooks.profile_op(cfg)
    assert op.key.startswith("attnbwd_") and hooks.profile_applies(op, fwd)
    bwd = hooks.profile_op_problem(op, fwd)
    assert isinstance(bwd, AttentionBackwardProfileProblem) and bwd.key == fwd.key and bwd != fwd
    assert bwd.flops * 2 == fwd.flops * 5                          # 2.5x the forward's visible-pair FLOPs
    assert bwd.flops == hooks.flops(cfg, fwd.verify_problem())     # the verify side's backward FLOPs agree
    assert bwd.as_dict()["pass"] == "backward" and "pass" not in fwd.as_dict()
    assert problem_from_json(bwd.as_dict()) == bwd and problem_from_json(fwd.as_dict()) == fwd
    assert bwd.forward() == fwd and op_problem(op, bwd) is bwd
    fop = hooks.profile_op_from_json({"family": "attention", "dtype": "f16", "head_dim": 64, "mask": "none"})
    assert hooks.profile_op_problem(fop, fwd) is fwd               # a forward op keeps the forward problem
    full = problems_from_text(["b=2,hq=8,hkv=2,sq=200,sk=300,d=64"], families=["attention"])[0]
    assert not hooks.profile_applies(op, full)                     # a causal backward op: not a full problem
    assert hooks.profile_min_bytes(op, fwd) > hooks.profile_min_bytes(fop, fwd)


def test_fake_profile_times_backward_instances_under_their_own_op(manifest, tmp_path):
    args = [a for p in PROBLEMS for a in ("--problem", p)]
    res = _cli("profile", manifest, "--backend", "fake", "-o", tmp_path / "p", "--quick", "--no-plots", *args)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "attnbwd_f16_d64_causal_bshd" in res.output
    tuning = json.loads((tmp_path / "p" / "tuning.json").read_text())
    by = {(e["op"]["key"], e["problem"]["causal"]): e for e in tuning["entries"]}
    # one winner per (op, problem): forward and backward apart
    assert set(by) == {("attn_f16_d64_full_bshd", False), ("attn_f16_d64_causal_bshd", True),
                       ("attnbwd_f16_d64_full_bshd", False), ("attnbwd_f16_d64_causal_bshd", True)}
    for (key, causal), e in by.items():
        backward = key.startswith("attnbwd_")
        assert e["kernel"].startswith("attn_bwd_") == backward, e
        assert (e["problem"].get("pass") == "backward") == backward
        assert e["baseline"] == "sdpa_cudnn" and e["ratio_to_baseline"] > 0
    gqa = by[("attnbwd_f16_d64_causal_bshd", True)]
    assert gqa["kernel"].startswith("attn_bwd_sm80_") and gqa["kernel"].endswith("_gqa")   # sm90a here: no GQA
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    rows = prof["measurements"]
    bwd = [r for r in rows if r["op"]["key"].startswith("attnbwd_")]
    assert {r["name"] for r in bwd if r["kind"] == "baseline"} == {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient"}
    ok = [r for r in bwd if r["kind"] == "kernel" and r["status"] == "ok"]
    assert ok and all(r["check"]["passed"] and "run_case" in r["check"]["reference"] for r in ok)
    na = [r for r in bwd if r["kind"] == "kernel" and r["status"] == "not_applicable"]
    assert na and all("sm90a" in r["name"] and "heads_kv" in r["reason"] for r in na)   # GQA problem, MHA kernel
    # TFLOP/s from the backward's FLOPs: 2.5x the forward problem's
    from emitter.profile.config import problem_from_json

    for (key, _), e in by.items():
        p = problem_from_json(e["problem"])
        fwd_flops = p.forward().flops if key.startswith("attnbwd_") else p.flops
        factor = 2.5 if key.startswith("attnbwd_") else 1.0
        assert e["tflops"] == pytest.approx(factor * fwd_flops / (e["median_ms"] * 1e-3) / 1e12)


def test_fake_profile_planted_backward_bug_fails_its_check(manifest, tmp_path):
    """dS without the softmax scale: the backward kernel fails the profile's check, its time does not count, and
    another kernel wins the problem."""
    from emitter.manifest import manifest_path
    from emitter.profile.config import ProfileConfig, problems_from_text
    from emitter.profile.runner import plan, run

    mpath = manifest_path(manifest)
    probs = tuple(problems_from_text([PROBLEMS[1]], families=["attention"]))
    cfg = ProfileConfig(file=str(mpath), manifests=(str(mpath.resolve()),), problems=probs, baselines=("sdpa_cudnn",))
    pl = plan(cfg)
    bad = next(i["entry"]["name"] for i in pl.instances if i["entry"]["name"] ==
               "attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa")
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", faults=[{"kind": "bwd_no_scale_ds", "select": bad}])
    by = {m.name: m for m in outcome.measurements if m.kind == "kernel"}
    assert by[bad].status == "check_failed" and by[bad].stats is None, by[bad]
    other = by["attn_bwd_sm80_f16_d64_128x128_causaltl_bshd_gqa"]
    assert other.status == "ok" and other.problem.flops == 5 * other.problem.forward().flops // 2


def test_backward_profile_of_the_shipped_configs_runs_end_to_end(tmp_path):
    """`emitter emit configs/attention/sm90a_backward.yaml` then `emitter profile <its manifest> --backend fake`:
    a clean report with backward winners."""
    spec = configs_root() / "attention" / "sm90a_backward.yaml"
    res = _cli("emit", spec, "-o", tmp_path / "gen")
    assert res.exit_code == 0, res.output
    res = _cli("profile", tmp_path / "gen", "--backend", "fake", "-o", tmp_path / "p", "--quick", "--no-plots",
               "--problem", "b=2,hq=16,sq=512,sk=512,d=128", "--problem", "b=2,hq=16,sq=512,sk=512,d=64,causal")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    entries = json.loads((tmp_path / "p" / "tuning.json").read_text())["entries"]
    keys = {e["op"]["key"] for e in entries}
    assert {"attnbwd_f16_d128_full_bshd", "attnbwd_f16_d64_causal_bshd"} <= keys, keys


class _HostArena:
    """DeviceArena's face over host arrays (pointer = index), for the profile check without a GPU."""

    def __init__(self) -> None:
        self.mem: dict[int, np.ndarray] = {}

    def put(self, arr: np.ndarray) -> int:
        self.mem[len(self.mem) + 1] = arr
        return len(self.mem)

    def to_host(self, ptr, storage_dtype, count):
        return self.mem[ptr].view(storage_dtype)[:count].copy()

    def free(self):
        self.mem.clear()


@pytest.mark.parametrize("causal", [False, True])
def test_backward_profile_check_on_host_memory(manifest, causal):
    """The GPU check (float64 gradients of sampled (batch, KV head) pairs, every element written) on host memory:
    the fake backend's gradients (its own arithmetic) pass; an unwritten element, dS without the scale and dK
    written to the wrong KV head fail for their reason."""
    from emitter.families.attention import backward_profile as bp
    from emitter.families.attention import backward_runtime as brt
    from emitter.kit.hostdata import poison_value

    mask = "causal_top_left" if causal else "none"
    cfg = next(hooks.config_from_entry(e) for e in _entries(manifest) if e["config"].get("op") == "backward"
               and e["config"]["mask"] == mask and e["config"]["arch"] == "sm80" and e["config"]["tile_q"] == 64)
    pp = bp.AttentionBackwardProfileProblem(2, 4, 2, 100, 130 if not causal else 100, 64, 64, causal)
    op = hooks.profile_op(cfg)
    vp = pp.verify_problem()
    inputs = brt.make_inputs(cfg, vp, "normal", 5)
    arena = _HostArena()
    n = vp.elements()

    def check(faults=None, edit=None):
        out = brt.fake_run(cfg, vp, inputs.buffers, faults or {})
        grads = {g: np.asarray(out[g])[:n[bp._LIKE[g]]].copy() for g in bp.GRADS}
        if edit:
            edit(grads)
        ptrs = {k: arena.put(np.asarray(inputs.buffers[k])) for k in ("q", "k", "v", "o", "d_o", "lse")}
        ptrs.update({g: arena.put(x) for g, x in grads.items()})
        data = bp.BackwardData(op, pp, vp, [ptrs], arena, cfg=op)
        return bp.profile_check(data, cfg, use_torch=False)

    good = check()
    assert good["passed"], good
    assert all(e < brt.GRAD_REL["f16"] for e in good["errors"].values())
    poison = np.asarray(poison_value(cfg.dtype)).astype(inputs.buffers["q"].dtype)
    unwritten = check(edit=lambda g: g["dk"].__setitem__(slice(3, 6), poison))
    assert not unwritten["passed"] and unwritten["unwritten"] == 3 and "dk never written" in unwritten["reason"]
    noscale = check({"bwd_no_scale_ds": {}})
    assert not noscale["passed"] and "dq" in noscale["reason"] and "dv" not in noscale["reason"], noscale
    wrong = check({"bwd_wrong_kv_head": {}})
    assert not wrong["passed"] and "dk" in wrong["reason"], wrong


def test_backward_kernel_launch_with_a_stand_in_shim(manifest):
    """The GPU launch path with a stand-in shim and function: one query / initialize per operand set with that
    set's ten pointers (the LSE, dO and the gradients among them), launch(i) on set i % sets; a problem the
    instance cannot run (GQA heads on an MHA instance, a shim that refuses) is CannotImplement before any launch;
    run-time options are refused."""
    from emitter.families.attention import backward_profile as bp
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_OK
    from emitter.runtime.backend import CannotImplement

    entries = [e for e in _entries(manifest) if e["config"].get("op") == "backward"
               and e["config"]["mask"] == "causal_top_left"]
    gqa = next(e for e in entries if e["config"]["gqa"])
    mha = next(e for e in entries if not e["config"]["gqa"])
    seen, launched = [], []

    class Shim:
        status = EMITTER_OK

        def query(self, prob):
            seen.append((prob.q, prob.lse, prob.d_o, prob.dq, prob.dv, prob.heads_kv))
            return self.status, SimpleNamespace(workspace_bytes=0, params_bytes=128)

        def initialize(self, prob, ws, stream, capacity):
            launch = SimpleNamespace(grid=(4, 2, 1), block=(128, 1, 1), shared_bytes=500, params_bytes=128,
                                     as_dict=lambda: {"grid": [4, 2, 1]})
            return EMITTER_OK, bytes([prob.q]) * 128, launch

    class Fn:
        def allow_shared(self, n):
            assert n == 500

        def launch(self, grid, block, shared, stream, packed):
            launched.append((grid, packed.size))

    def kernel(entry, shim):
        return SimpleNamespace(name=entry["name"], config=hooks.config_from_entry(entry), handle={"shim": shim, "fn": Fn()})

    pp = bp.AttentionBackwardProfileProblem(2, 8, 2, 256, 256, 64, 64, True)
    op = hooks.profile_op(hooks.config_from_entry(gqa))
    names = ("q", "k", "v", "o", "d_o", "lse", "dq", "dk", "dv")
    sets = [{k: 10 * s + i for i, k in enumerate(names, 1)} for s in (1, 2)]
    data = bp.BackwardData(op, pp, pp.verify_problem(), sets, None, cfg=op)
    stream = SimpleNamespace(handle=0, synchronize=lambda: None)
    launch = hooks.kernel_launch(kernel(gqa, Shim()), data, stream, split_k=1, options=0)
    assert isinstance(launch, bp.BackwardLaunch)
    assert seen == [(11, 16, 15, 17, 19, 2), (21, 26, 25, 27, 29, 2)]
    for i in range(3):
        launch(i)
    assert launched == [((4, 2, 1), 128)] * 3 and launch.info["grid"] == [4, 2, 1]
    with pytest.raises(CannotImplement, match="heads_kv"):
        hooks.kernel_launch(kernel(mha, Shim()), data, stream)
    refusing = Shim()
    refusing.status = EMITTER_CANNOT_IMPLEMENT
    with pytest.raises(CannotImplement, match="can_implement"):
        hooks.kernel_launch(kernel(gqa, refusing), data, stream)
    with pytest.raises(CannotImplement, match="split-K"):
        hooks.kernel_launch(kernel(gqa, Shim()), data, stream, split_k=2)


def test_backward_baseline_without_torch_cuda_is_a_record(manifest):
    """Where SDPA cannot run (no torch, no GPU) the backward baselines say so; an unknown name too; a
    bottom-right op on seq_q != seq_k has no SDPA equivalent."""
    from emitter.families.attention import backward_profile as bp
    from emitter.families.attention.backward_runtime import BackwardProfileOp
    from emitter.families.base import BaselineUnavailable

    op = BackwardProfileOp("f16", 64, 64, "none")
    pp = bp.AttentionBackwardProfileProblem(1, 4, 4, 64, 64, 64, 64, False)
    data = bp.BackwardData(op, pp, pp.verify_problem(), [], None, cfg=op)
    with pytest.raises(BaselineUnavailable, match="no attention baseline named"):
        hooks.baseline("cublas", data, SimpleNamespace(handle=0))
    mismatch = bp.BackwardData(op, pp, pp.verify_problem(), [], None, mismatch="not this op's", cfg=op)
    with pytest.raises(BaselineUnavailable, match="not this op"):
        hooks.baseline("sdpa_cudnn", mismatch, SimpleNamespace(handle=0))
