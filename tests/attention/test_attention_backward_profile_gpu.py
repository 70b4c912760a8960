"""The attention backward through `emitter profile` and tuned library dispatch on the GPU (sm_90): an sm80 forward
(lse), an sm80 key-split backward and an sm90a backward (f16 d64 causal, GQA) emitted and built; `emitter profile`
(pycuda) on two causal problems (MHA and GQA): every backward kernel checked (float64 gradients of sampled (batch,
KV head) pairs, every element written, again after the timed launches) and timed, SDPA's cuDNN and flash backward
timed on the same buffers (or recorded unavailable) and their own gradients checked, a backward winner per problem
in tuning.json (op attnbwd_..., FLOPs 2.5x the forward's); then `emitter library --tuning` with that table and a
hand-written record that gives a third problem to the sm80 kernel (which the static order puts after sm90a), the
CMake build, and the loader's attention_backward(): the C API logs `(tuned` and runs each record's kernel for its
problem, gradients against autograd through the float64 forward.

    source .device-wheels/setup.sh; python3 -m pytest -q -s -m gpu tests/attention/test_attention_backward_profile_gpu.py

(about 5-8 minutes on 16 cores: two nvcc builds of the same kernels, emitter's and CMake's). EMITTER_ATTN_BWD_PROFILE_DIR
=<dir> keeps (or reuses) the work directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC, load_module  # noqa: E402
from test_attention_backward_library_gpu import _grads64, _rel, _run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "attbwdtuned"
SPEC = """\
  - family: attention
    op: forward
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    lse: true
    gqa: true
  - family: attention
    op: backward
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    gqa: true
    deterministic: false
  - family: attention
    op: backward
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 64x128
    mask: causal_top_left
    gqa: true
    deterministic: false
"""
S80 = "attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa"
S90 = "attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd_gqa"
PROBLEMS = ("b=4,hq=16,sq=1024,sk=1024,d=64,causal", "b=2,hq=16,hkv=4,sq=2048,sk=2048,d=64,causal")
BWD_OP = "attnbwd_f16_d64_causal_bshd"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100 / H200) visible to torch")
    given = os.environ.get("EMITTER_ATTN_BWD_PROFILE_DIR")
    w = Path(given) if given else tmp_path_factory.mktemp("attention_backward_profile_gpu")
    w.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if not (w / "gen" / "manifest.json").is_file():
        (w / "spec.yaml").write_text(GEMM_SPEC + SPEC)
        _run([py, "-m", "emitter", "emit", w / "spec.yaml", "-o", w / "gen"], cwd=ROOT)
    _run([py, "-m", "emitter", "build", w / "gen", "-j", os.environ.get("EMITTER_TEST_JOBS", "16"),
          "--select", "family=attention"], cwd=ROOT)
    if not (w / "p" / "tuning.json").is_file():
        args = [a for p in PROBLEMS for a in ("--problem", p)]
        r = _run([py, "-m", "emitter", "profile", w / "gen", "--select", "family=attention", "--quick", "--no-plots",
                  "-o", w / "p", *args], cwd=ROOT)
        print(r.stdout[-6000:])
    return w


def test_profile_checks_and_times_backward_kernels_and_sdpa_backward(work):
    prof = json.loads((work / "p" / "profile.json").read_text())
    rows = [m for m in prof["measurements"] if m["op"]["key"] == BWD_OP]
    kernels = [m for m in rows if m["kind"] == "kernel"]
    bases = [m for m in rows if m["kind"] == "baseline"]
    table = []
    for pk in {m["problem"]["seq_q"] for m in kernels}:
        ks = {m["name"]: m for m in kernels if m["problem"]["seq_q"] == pk}
        assert set(ks) == {S80, S90}, ks.keys()
        # every kernel is checked; a pruned one (correct, its probe launch > timing.prune x the best) is not timed,
        # and at least one kernel per problem is
        assert any(m["status"] == "ok" for m in ks.values()), [(m["name"], m["status"]) for m in ks.values()]
        for m in ks.values():
            assert m["status"] in ("ok", "pruned"), (m["name"], m["status"], m.get("reason"))
            assert m["problem"]["pass"] == "backward"
            c = m["check"]
            assert c["passed"] and c["unwritten"] == 0 and all(e < 5e-3 for e in c["errors"].values()), c
            if m["status"] == "ok":
                assert c["after_timing"]["passed"], c
                table.append((pk, m["name"], m["stats"]["median_ms"]))
        bs = {m["name"]: m for m in bases if m["problem"]["seq_q"] == pk}
        assert {"sdpa_cudnn", "sdpa_flash"} <= set(bs), bs.keys()
        assert all(b["status"] in ("ok", "unavailable") for b in bs.values()), [(b["name"], b["reason"]) for b in bs.values()]
        timed = [b for b in bs.values() if b["status"] == "ok"]
        assert timed, [(b["name"], b["reason"]) for b in bs.values()]
        for b in timed:
            assert "autograd.grad" in b["provider"], b["provider"]
            assert b["check"]["passed"], (b["name"], b["check"])      # SDPA's own gradients, same reference
            table.append((pk, b["name"], b["stats"]["median_ms"]))
    from emitter.profile.config import problem_from_json

    flops = {m["problem"]["seq_q"]: problem_from_json(m["problem"]).flops for m in kernels}
    print(f"\n{'seq':>6} {'who':50} {'ms':>9} {'TFLOP/s (2.5x fwd)':>19}")
    for pk, who, ms in sorted(table):
        print(f"{pk:6} {who:50} {ms:9.4f} {flops[pk] / (ms * 1e-3) / 1e12:19.1f}")
    tuning = json.loads((work / "p" / "tuning.json").read_text())
    winners = [e for e in tuning["entries"] if e["op"]["key"] == BWD_OP]
    assert len(winners) == 2 and all(e["kernel"] in (S80, S90) and e["problem"]["pass"] == "backward" for e in winners)
    for e in winners:
        print("winner", e["problem"]["seq_q"], e["kernel"], f"{e['tflops']:.1f} TFLOP/s", f"x{e['ratio_to_baseline']:.2f}",
              e["baseline"])


@pytest.fixture(scope="module")
def lib(work):
    os.environ[f"{NAME.upper()}_LOG"] = "1"          # the C API names the kernel each call ran, and why (stderr)
    (work / "hand.json").write_text(json.dumps({
        "schema_version": 1, "kind": "emitter.tuning_table", "gpu": {"name": "NVIDIA H100 80GB HBM3", "cc": "9.0"},
        "entries": [{"op": {"family": "attention", "op": "backward", "dtype": "f16", "head_dim": 64, "head_dim_v": 64,
                            "mask": "causal_top_left", "layout": "bshd", "key": BWD_OP},
                     "problem": {"family": "attention", "batch": 1, "heads_q": 8, "heads_kv": 2, "seq_q": 77,
                                 "seq_k": 77, "head_dim": 64, "head_dim_v": 64, "causal": True, "pass": "backward"},
                     "kernel": S80, "split_k": 1, "options": 0}]}))
    tree = work / NAME
    py = sys.executable
    r = _run([py, "-m", "emitter", "library", work / "gen", "--name", NAME, "-o", tree, "--tuning",
              work / "p" / "tuning.json", "--tuning", work / "hand.json"], cwd=ROOT)
    print(r.stdout[-3000:])
    api = (tree / "src" / f"{NAME}_api.cpp").read_text()
    assert "kBackwardTuning[] = {" in api
    if not any(tree.rglob(f"lib{NAME}.so")):
        _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=90;90a", "-DCMAKE_BUILD_TYPE=Release"])
        _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")])
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))), None)
    assert so is not None, f"lib{NAME}.so not built under {tree}"
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def _inputs(torch, b, s, hq, hkv, d=64, seed=0):
    torch.manual_seed(seed)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.float16)   # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), mk(hq)


def test_library_dispatches_each_tuned_backward_record_to_its_kernel(work, lib, capfd):
    torch = pytest.importorskip("torch")
    winners = {e["problem"]["seq_q"]: e for e in json.loads((work / "p" / "tuning.json").read_text())["entries"]
               if e["op"]["key"] == BWD_OP}
    cases = [(e["problem"]["batch"], e["problem"]["seq_q"], e["problem"]["heads_q"], e["problem"]["heads_kv"],
              e["kernel"]) for e in winners.values()]
    cases.append((1, 77, 8, 2, S80))          # the hand-written record: the sm80 kernel, ahead of the static sm90a
    for b, s, hq, hkv, want in cases:
        q, k, v, do = _inputs(torch, b, s, hq, hkv)
        o, lse = lib.attention(q, k, v, causal=True, lse=True)
        capfd.readouterr()
        got = lib.attention_backward(q, k, v, o, lse, do, causal=True)
        torch.cuda.synchronize()
        log = capfd.readouterr().err
        print(log.strip())
        assert f"-> {want} (tuned" in log, (b, s, hq, hkv, want, log)
        if b * s <= 4096:                       # the float64 reference of the smaller problems
            ref = _grads64(torch, q, k, v, do)
            errs = [_rel(g, r) for g, r in zip(got, ref)]
            print("max rel", ["%.2e" % e for e in errs])
            assert all(e < 5e-3 for e in errs), errs
