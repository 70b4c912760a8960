"""Attention: every configured instance has a runnable default problem; `emitter profile` of attention
instances through the family's profile hooks (fake backend: tuning table, winners per problem, baselines)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from emitter.emit import emit
from emitter.families.attention import runtime as hooks
from emitter.resources import configs_root

ATTENTION_CONFIGS = sorted((configs_root() / "attention").glob("*.yaml"))


@pytest.mark.parametrize("spec", ATTENTION_CONFIGS, ids=lambda p: p.name)
def test_every_instance_has_a_runnable_default_problem(spec, tmp_path):
    emit([spec], tmp_path, jobs=1)
    entries = json.loads((tmp_path / "manifest.json").read_text())["instances"]
    assert entries, f"{spec.name}: no instances"
    for e in entries:
        cfg = hooks.config_from_entry(e)
        for quick in (True, False):
            probs = hooks.default_problems(cfg, quick=quick)
            runnable = [p for p, _ in probs if not hooks.not_supported_reasons(cfg, p)]
            assert runnable, (f"{spec.name}: {e['name']} (quick={quick}) has no runnable default problem: "
                              + "; ".join(hooks.not_supported_reasons(cfg, p)[0] for p, _ in probs))
        if not cfg.varlen:     # the tile-multiple cases run on every fixed-length instance, and odd ones stay
            full = hooks.default_problems(cfg)
            assert any(p.seq_k % cfg.tile_kv for p, _ in full)
            assert any(p.seq_k % cfg.tile_kv == 0 and not hooks.not_supported_reasons(cfg, p) for p, _ in full)


# ---------------------------------------------------------------------------------------------- profile hooks
SPEC = """\
kernels:
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: [128x64, 128x128]
    schedule: cooperative
    mask: [none, causal_top_left]
    gqa: true
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 128x64
    schedule: cooperative
    mask: causal_top_left
    gqa: false
"""


@pytest.fixture(scope="module")
def attention_manifest(tmp_path_factory):
    out = tmp_path_factory.mktemp("attn")
    spec = out / "spec.yaml"
    spec.write_text(SPEC)
    emit([spec], out / "k", jobs=1)
    return out / "k"


def test_attention_has_every_profile_hook():
    from emitter.families.base import PROFILE_HOOKS, VERIFY_HOOKS
    from emitter.families.registry import runtime_family
    from emitter.profile.runner import _profilable

    mod = runtime_family("attention", need=VERIFY_HOOKS + PROFILE_HOOKS)
    assert mod.BASELINES == ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
    assert _profilable("attention") is None


def test_profile_problem_parse_key_flops_roundtrip():
    from emitter.errors import SpecError
    from emitter.profile.config import problem_from_json, problems_from_text

    full, causal, gqa = problems_from_text(["b=16,hq=16,sq=1024,sk=1024,d=128",
                                            "b=16,hq=16,sq=1024,sk=1024,d=128,causal",
                                            "b=2,hq=8,hkv=2,s=4096,d=64,causal=1"], families=["attention"])
    assert full.key == "b16_h16_s1024x1024_d128" and causal.key == "b16_h16_s1024x1024_d128_causal"
    assert full.flops == 4 * 16 * 16 * 1024 * 1024 * 128
    assert causal.flops == 4 * 16 * 16 * 128 * (1024 * 1025 // 2)      # the visible pairs: about half
    assert gqa.heads_kv == 2 and gqa.causal
    for p in (full, causal, gqa):
        assert problem_from_json(json.loads(json.dumps(p.as_dict()))) == p
    for bad in ("b=1,hq=4,sq=64,sk=64,d=64,scale=0.5", "lq=3:4,lk=5:6,hq=2,d=64", "b=1,hq=4,s=64,d=64,layout=bhsd"):
        with pytest.raises(SpecError):
            problems_from_text([bad], families=["attention"])
    with pytest.raises(SpecError, match="causal"):
        problems_from_text(["b=1,hq=4,s=64,d=64,causal=maybe"], families=["attention"])


def test_mask_request_skips_instances_of_another_mask():
    from emitter.families.attention.problem import make_problem
    from emitter.families.attention.model import AttentionInstance, Arch, Mask
    from emitter.families.attention.sm90a import resolve
    from emitter.dtypes import DType

    causal = resolve(AttentionInstance(Arch.sm90a, DType.f16, 64, 64, 128, 64, mask=Mask.causal_top_left))
    full = resolve(AttentionInstance(Arch.sm90a, DType.f16, 64, 64, 128, 64))
    br = resolve(AttentionInstance(Arch.sm90a, DType.f16, 64, 64, 128, 64, mask=Mask.causal_bottom_right))
    p = make_problem(batch=1, heads_q=2, seq_q=64, seq_k=128, head_dim=64, causal=True)
    assert not hooks.not_supported_reasons(causal, p)
    assert any("causal" in r for r in hooks.not_supported_reasons(full, p))
    assert any("bottom_right" in r for r in hooks.not_supported_reasons(br, p))          # seq_q != seq_k
    square = make_problem(batch=1, heads_q=2, seq_q=64, seq_k=64, head_dim=64, causal=True)
    assert not hooks.not_supported_reasons(br, square)
    nomask = make_problem(batch=1, heads_q=2, seq_q=64, seq_k=64, head_dim=64, causal=False)
    assert hooks.not_supported_reasons(causal, nomask) and not hooks.not_supported_reasons(full, nomask)
    assert hooks.problem_from_dict(p.to_dict()) == p
    assert "causal" not in make_problem(batch=1, heads_q=2, seq_q=64, seq_k=64, head_dim=64).to_dict()


def _profile(manifest, out, *args):
    from click.testing import CliRunner

    from emitter.cli import main

    res = CliRunner().invoke(main, ["profile", str(manifest), "--backend", "fake", "-o", str(out), "--quick",
                                    "--problem", "b=4,hq=8,sq=256,sk=256,d=64",
                                    "--problem", "b=4,hq=8,hkv=2,sq=256,sk=256,d=64,causal", *args])
    assert res.exit_code == 0, res.output
    return res


def test_fake_profile_tuning_table_winners_per_problem(attention_manifest, tmp_path):
    _profile(attention_manifest, tmp_path / "p")
    tuning = json.loads((tmp_path / "p" / "tuning.json").read_text())
    entries = {(e["op"]["key"], json.dumps(e["problem"], sort_keys=True)): e for e in tuning["entries"]}
    assert len(entries) == 2          # one winner per (op, problem) the op computes: full/full, causal/causal
    by_op = {e["op"]["key"]: e for e in entries.values()}
    full, causal = by_op["attn_f16_d64_full_bshd"], by_op["attn_f16_d64_causal_bshd"]
    assert not full["problem"]["causal"] and "nomask" in full["kernel"]
    assert causal["problem"]["causal"] and causal["problem"]["heads_kv"] == 2 and "causaltl" in causal["kernel"]
    assert causal["kernel"].endswith("_gqa")        # the GQA problem: only GQA instances can win it
    assert full["baseline"] == "sdpa_cudnn" and full["ratio_to_baseline"] > 0
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    rows = prof["measurements"] if "measurements" in prof else prof["results"]
    base = {(r["name"], r["op"]["key"] if isinstance(r["op"], dict) else r["op"]) for r in rows if r["kind"] == "baseline"}
    assert {b for b, _ in base} == {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient"}
    assert len(base) == 6             # 3 baselines x the 2 (op, problem) pairs that apply, no others
    kernels = [r for r in rows if r["kind"] == "kernel"]
    na = [r for r in kernels if r["status"] == "not_applicable"]
    assert [r["name"] for r in na] == ["attn_sm90a_f16_d64_128x64_cooperative_s5_causaltl_bshd"]   # not GQA
    assert "heads_kv" in na[0]["reason"]


def test_fake_profile_planted_bug_fails_its_check(attention_manifest, tmp_path):
    """A causal kernel that skips its mask fails the profile's check (the verify case it runs), its time does
    not count, and the other causal kernel wins."""
    from emitter.profile.runner import plan, run
    from emitter.profile.config import ProfileConfig, problems_from_text
    from emitter.manifest import manifest_path

    mpath = manifest_path(attention_manifest)
    probs = tuple(problems_from_text(["b=4,hq=8,sq=256,sk=256,d=64,causal"], families=["attention"]))
    cfg = ProfileConfig(file=str(mpath), manifests=(str(mpath.resolve()),), problems=probs,
                        baselines=("sdpa_cudnn",))
    pl = plan(cfg)
    bad = next(i["entry"]["name"] for i in pl.instances if "causaltl" in i["entry"]["name"]
               and "128x128" in i["entry"]["name"])
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", faults=[{"kind": "no_mask", "select": bad}])
    by = {m.name: m for m in outcome.measurements if m.kind == "kernel"}
    assert by[bad].status == "check_failed" and by[bad].stats is None
    good = [n for n, m in by.items() if "causaltl" in n and n != bad]
    assert good and all(by[n].status == "ok" for n in good)


class _HostArena:
    """DeviceArena's face over host arrays (pointer = index), for the profile check without a GPU."""

    def __init__(self) -> None:
        self.mem: dict[int, np.ndarray] = {}

    def put(self, arr: np.ndarray) -> int:
        ptr = len(self.mem) + 1
        self.mem[ptr] = arr
        return ptr

    def to_host(self, ptr, storage_dtype, count):
        return self.mem[ptr].view(storage_dtype)[:count].copy()

    def free(self):
        self.mem.clear()


@pytest.mark.parametrize("causal", [False, True])
def test_profile_check_catches_unwritten_wrong_and_passes_right(attention_manifest, causal):
    """The GPU check (sampled float64 rows, every element written) on host memory: the fake backend's output
    (its own arithmetic) passes; a poisoned element, a wrong scale and a missing mask fail for their reason."""
    from emitter.families.attention import profile as prof
    from emitter.families.attention.fake import fake_run
    from emitter.kit.hostdata import encode, poison_value

    entries = json.loads((attention_manifest / "manifest.json").read_text())["instances"]
    mask = "causal_top_left" if causal else "none"
    cfg = next(hooks.config_from_entry(e) for e in entries if e["config"]["mask"] == mask and e["config"]["gqa"])
    pp = prof.AttentionProfileProblem(2, 4, 2, 200, 200, 64, 64, causal)
    op = prof.profile_op(cfg)
    assert prof.profile_applies(op, pp)
    vp = pp.verify_problem()
    rng = np.random.default_rng(7)
    n = vp.elements()
    arena = _HostArena()
    store = {k: encode(rng.uniform(-1, 1, n[k]), cfg.dtype) for k in ("q", "k", "v")}
    poison = np.full(n["o"], poison_value(cfg.dtype), dtype=store["q"].dtype)

    def check(faults=None, edit=None):
        out = fake_run(cfg, vp, {**store, "o": poison.copy(), "lse": None}, faults or {})["o"]
        if edit:
            edit(out)
        ptrs = {k: arena.put(v) for k, v in {**store, "o": out}.items()}
        data = prof.AttentionData(op, pp, vp, [ptrs], arena)
        return prof.profile_check(data, cfg, use_torch=False)

    good = check()
    assert good["passed"], good
    assert good["rel_err"] < 5e-3
    unwritten = check(edit=lambda o: o.__setitem__(slice(5, 7), poison[:2]))
    assert not unwritten["passed"] and unwritten["unwritten"] == 2 and "never written" in unwritten["reason"]
    if causal:
        nomask = check({"no_mask": {}})
        assert not nomask["passed"] and "max |o - ref|" in nomask["reason"]
    flipped = check(edit=lambda o: o.__setitem__(slice(None), encode(-np.ones(o.size), cfg.dtype)))
    assert not flipped["passed"]


# ---------------------------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
def test_gpu_profile_kernels_and_sdpa_baselines(tmp_path):
    """`emitter profile` (pycuda) of the built sm90a verify instances on one full and one causal d128 problem:
    each kernel checked and timed on the device operand sets, the SDPA baselines timed on the same buffers (or
    recorded unavailable), a winner per problem. Needs EMITTER_ATTENTION_SM90A_BUILD (see
    tests/attention/test_attention_sm90a_gpu.py)."""
    import os
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    root = os.environ.get("EMITTER_ATTENTION_SM90A_BUILD", "")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a compute capability 9.0 GPU")
    if not root or not (Path(root) / "manifest.json").is_file():
        pytest.skip("EMITTER_ATTENTION_SM90A_BUILD does not name a built sm90a attention directory")
    out = tmp_path / "p"
    cmd = [sys.executable, "-m", "emitter", "profile", root, "--quick", "-o", str(out), "--select", "head_dim=128",
           "--problem", "b=2,hq=8,s=1024,d=128", "--problem", "b=2,hq=8,s=1024,d=128,causal"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    tuning = json.loads((out / "tuning.json").read_text())
    got = {e["problem"]["causal"]: e for e in tuning["entries"] if e["op"].get("family") == "attention"}
    assert set(got) == {False, True}, tuning["entries"]
    assert "nomask" in got[False]["kernel"] and "causal" in got[True]["kernel"]
    prof = json.loads((out / "profile.json").read_text())
    rows = prof["measurements"] if "measurements" in prof else prof["results"]
    kernels = [r for r in rows if r["kind"] == "kernel" and r["status"] == "ok"]
    assert kernels and all(r["check"]["passed"] for r in kernels)
    bases = [r for r in rows if r["kind"] == "baseline"]
    assert {r["name"] for r in bases} == {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient"}
    assert all(r["status"] in ("ok", "unavailable") for r in bases)


def test_kernel_launch_fills_one_params_block_per_set_and_refuses_what_it_cannot_run(attention_manifest):
    """The GPU launch path with a stand-in shim and function: one query/initialize per operand set with that
    set's pointers and no LSE pointer, launch(i) on set i % sets; a problem the instance cannot run (GQA heads
    on a non-GQA instance, the shim's can-implement) is CannotImplement before any launch."""
    from types import SimpleNamespace

    from emitter.families.attention import profile as prof
    from emitter.runtime.backend import CannotImplement
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_OK

    entries = json.loads((attention_manifest / "manifest.json").read_text())["instances"]
    by_gqa = {e["config"]["gqa"]: e for e in entries if e["config"]["mask"] == "causal_top_left"
              and e["config"]["tile_kv"] == 64}
    seen, launched = [], []

    class Shim:
        status = EMITTER_OK

        def query(self, prob):
            seen.append((prob.q, prob.o, prob.lse, prob.heads_kv, prob.seq_q))
            return self.status, SimpleNamespace(workspace_bytes=0, params_bytes=128)

        def initialize(self, prob, ws, stream, capacity):
            launch = SimpleNamespace(grid=(8, 2, 4), block=(384, 1, 1), shared_bytes=1000, params_bytes=128,
                                     as_dict=lambda: {"grid": [8, 2, 4]})
            return EMITTER_OK, bytes([prob.q]) * 128, launch

    class Fn:
        def allow_shared(self, n):
            assert n == 1000

        def launch(self, grid, block, shared, stream, packed):
            launched.append((grid, packed.size))

    def kernel(entry, shim):
        return SimpleNamespace(name=entry["name"], config=hooks.config_from_entry(entry), handle={"shim": shim, "fn": Fn()})

    pp = prof.AttentionProfileProblem(2, 8, 2, 1024, 1024, 64, 64, True)
    op = prof.profile_op(hooks.config_from_entry(by_gqa[True]))
    vp = pp.verify_problem()
    data = prof.AttentionData(op, pp, vp, [{"q": 11, "k": 12, "v": 13, "o": 14}, {"q": 21, "k": 22, "v": 23, "o": 24}],
                              None)
    stream = SimpleNamespace(handle=0, synchronize=lambda: None)
    launch = prof.kernel_launch(kernel(by_gqa[True], Shim()), data, stream, split_k=1, options=0)
    assert seen == [(11, 14, None, 2, 1024), (21, 24, None, 2, 1024)]
    for i in range(3):
        launch(i)
    assert launched == [((8, 2, 4), 128)] * 3 and launch.info == {"grid": [8, 2, 4]}
    with pytest.raises(CannotImplement, match="heads_kv"):
        prof.kernel_launch(kernel(by_gqa[False], Shim()), data, stream)
    refusing = Shim()
    refusing.status = EMITTER_CANNOT_IMPLEMENT
    with pytest.raises(CannotImplement, match="can_implement"):
        prof.kernel_launch(kernel(by_gqa[True], refusing), data, stream)


def test_baseline_unavailable_is_a_record_not_a_crash(attention_manifest):
    """Without torch (CI) every SDPA baseline raises BaselineUnavailable with the reason; an unknown name too."""
    from emitter.families.attention import profile as prof
    from emitter.families.base import BaselineUnavailable

    pp = prof.AttentionProfileProblem(1, 4, 4, 64, 64, 64, 64, False)
    op = prof.AttentionOp("f16", 64, 64, "none")
    data = prof.AttentionData(op, pp, pp.verify_problem(), [], None)
    with pytest.raises(BaselineUnavailable, match="no attention baseline named"):
        prof.baseline("cublas", data, None)
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001
        for name in prof.BASELINES:
            with pytest.raises(BaselineUnavailable, match="torch"):
                prof.baseline(name, data, None)
