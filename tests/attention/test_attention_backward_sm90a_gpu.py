"""sm90a attention backward on the GPU: configs/attention/sm90a_backward.yaml emitted and built (-j 16), every
instance verified on its default problems (dQ, dK, dV against autograd through the float64 forward: odd lengths
both ways, both causal alignments with seq_q != seq_k, a run-time scale, large magnitudes, padded input rows),
planted bugs in emitter's own levels caught for their reasons, the phase counters reused across launches, a
speed table against torch SDPA's backward (cuDNN and flash) on the same f16 and bf16 tensors, and a transformer
block's training step in f16 and in bf16 (an sm90a forward saving O and the LSE, the sm90a backward) against
torch's.

    source .device-wheels/setup.sh; python3 -m pytest -q -s -m gpu tests/attention/test_attention_backward_sm90a_gpu.py
EMITTER_ATTN_BWD90_DIR=<dir> reuses (or keeps) the emitted and built directory; EMITTER_GPU_REPORTS=<dir> writes
the verdicts and the speed table as JSON there.
"""

import json
import math
import os
from pathlib import Path

import pytest
from backward_gpu_common import median_ms, plant_bugs, report, run_planted, verdict_line

pytestmark = pytest.mark.gpu

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "attention" / "sm90a_backward.yaml"

# (kind, base instance name, [(exact text, replacement)]): bugs in emitter's own levels
PLANTS = [
    # the backward's causal diagonal one key further than the forward's (the backward alone is wrong)
    ("mask_off_by_one", "attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd",
     [("if (query + off < key || key >= keys) {", "if (query + off + 1 < key || key >= keys) {")]),
    # dS without the softmax scale (upstream folds the scale into dS; P keeps its own log2 scale)
    ("no_scale_ds", "attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd",
     [("P.main.mainloop.scale_softmax = s.scale;", "P.main.mainloop.scale_softmax = 1.0f;")]),
]


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    from emitter.build import BuildOptions, build
    from emitter.emit import emit
    from emitter.manifest import load, write

    root = Path(os.environ.get("EMITTER_ATTN_BWD90_DIR") or tmp_path_factory.mktemp("attn_bwd90_gpu"))
    emit([str(CONFIG)], root)    # unchanged files are kept (so is their build): a kept directory gets new entries
    data = load(root)
    real = [e for e in data["instances"] if "planted" not in e and e["config"].get("op") == "backward"]
    forward = [e for e in data["instances"] if "planted" not in e and e["config"].get("op") != "backward"]
    planted = plant_bugs(root, real, PLANTS)
    data["instances"] = real + forward + planted
    write(root, data)
    summary = build(root, options=BuildOptions(jobs=16))
    records = {r.name: r for r in summary.results}
    from emitter.families.attention.runner import Runner
    from emitter.runtime.pycuda_backend import PycudaBackend

    runner = Runner(root, PycudaBackend(device_reference=True))
    return root, real, {p["planted"]: p for p in planted}, records, runner


def test_every_instance_builds(suite):
    root, real, planted, records, _ = suite
    failed = {n: (r.error or "")[:1500] for n, r in records.items() if r.status == "failed"}
    assert not failed, json.dumps(failed, indent=1)


def test_default_problems_pass_on_every_instance(suite):
    from emitter.families.attention import runtime as hooks

    root, real, planted, records, runner = suite
    verdicts = []
    for entry in real:
        cfg = hooks.config_from_entry(entry, root)
        for i, (p, data) in enumerate(hooks.default_problems(cfg, quick=False)):
            v = runner.run_case(entry, p, data, seed=100 + i)
            v["config"] = entry["config"]
            v["problem_obj"] = p.to_dict()
            verdicts.append(v)
            print(verdict_line(v))
    report("attention_backward_sm90a", "default", verdicts)
    counts = {s: sum(v["status"] == s for v in verdicts) for s in ("PASSED", "FAILED", "SKIPPED")}
    print(f"sm90a attention backward verify: {len(verdicts)} cases, {counts}")
    bad = [verdict_line(v) for v in verdicts if v["status"] != "PASSED"]
    assert not bad, "\n".join(bad)

    def seen(pred):
        return any(pred(v["config"], v["problem_obj"], v) for v in verdicts if v["status"] == "PASSED")

    for mask in ("causal_top_left", "causal_bottom_right"):
        assert seen(lambda c, p, v: c["mask"] == mask and p["seq_q"] > p["seq_k"]), f"{mask} with seq_q > seq_k"
        assert seen(lambda c, p, v: c["mask"] == mask and p["seq_q"] < p["seq_k"]), f"{mask} with seq_q < seq_k"
    assert seen(lambda c, p, v: p["seq_q"] % 8 != 0), "a seq_q upstream's can_implement refuses"
    assert seen(lambda c, p, v: c["mask"] != "none" and 1 < p["heads_kv"] < p["heads_q"]), "GQA, causal"
    assert seen(lambda c, p, v: p["heads_kv"] == 1 and p["heads_q"] > 1), "MQA"
    assert seen(lambda c, p, v: c["layout"] == "bhsd"), "BHSD"
    for d in (64, 128):     # bf16 (the instance's bf16 fragments): d64 and d128, full and causal
        for mask in ("none", "causal_top_left"):
            assert seen(lambda c, p, v: c["dtype"] == "bf16" and c["head_dim"] == d and c["mask"] == mask), \
                f"bf16 d{d} {mask}"
    assert seen(lambda c, p, v: "_large" in v["label"]), "large magnitudes"
    assert seen(lambda c, p, v: p["pad"] > 0 and v["stray_writes"] == 0), "padded rows"


def test_repeated_launches_reuse_the_workspace(suite):
    """The phase counters reset themselves: after each launch the counters in the workspace are zero again, and a
    second launch on the same workspace, without the shim's initialize (as a CUDA graph replays it), gives the
    same gradients up to the last bits dQ's arrival-order sums leave."""
    torch = pytest.importorskip("torch")
    from emitter.families.attention import runtime as hooks
    from emitter.families.attention.problem import make_problem
    from emitter.kit.launcher import PackedParams

    root, real, planted, records, runner = suite
    entry = next(e for e in real if e["name"] == "attn_bwd_sm90a_f16_d128_64x128_causalbr_bshd_gqa_dqsplit")
    b, h, hkv, sq, sk, d = 2, 4, 2, 300, 333, 128
    torch.manual_seed(3)
    q, do = (torch.randn(b, sq, h, d, device="cuda", dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    o = torch.randn(b, sq, h, d, device="cuda", dtype=torch.float16)
    lse = torch.randn(b, h, sq, device="cuda", dtype=torch.float32).abs() + 5.0
    kern = runner.kernel(entry)
    grads = {g: torch.empty_like(x) for g, x in (("dq", q), ("dk", k), ("dv", v))}
    ptrs = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr(), "d_o": do.data_ptr(),
            "lse": lse.data_ptr(), **{g: x.data_ptr() for g, x in grads.items()}}
    prob = hooks.c_problem(kern.config, make_problem(batch=b, heads_q=h, heads_kv=hkv, seq_q=sq, seq_k=sk, head_dim=d), ptrs)
    shim, fn = kern.handle["shim"], kern.handle["fn"]
    status, qinfo = shim.query(prob)
    assert status == 0
    ws = torch.full((int(qinfo.workspace_bytes),), 0x7F, device="cuda", dtype=torch.uint8)   # garbage but counters
    stream = torch.cuda.current_stream().cuda_stream
    status, params, launch = shim.initialize(prob, ws.data_ptr(), stream, int(qinfo.params_bytes))
    assert status == 0
    fn.allow_shared(int(launch.shared_bytes))
    counters = 1 + 3 * b * hkv
    outs = []
    for _ in range(3):
        for x in grads.values():
            x.fill_(float("nan"))
        fn.launch(tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes), stream, PackedParams(params))
        torch.cuda.synchronize()
        assert int(ws[:counters * 4].view(torch.int32).abs().sum()) == 0, "phase counters not reset"
        outs.append({g: x.float().clone() for g, x in grads.items()})
    for g in grads:
        ref = outs[0][g]
        assert torch.isfinite(ref).all(), g
        for other in outs[1:]:
            assert float((other[g] - ref).abs().max()) <= 1e-2 * float(ref.abs().max()), g



def test_planted_mask_off_by_one(suite):
    prob = dict(batch=2, heads_q=4, heads_kv=4, seq_q=100, seq_k=101, head_dim=64)
    assert run_planted(suite, "mask_off_by_one", base=True, **prob)["status"] == "PASSED"
    v = run_planted(suite, "mask_off_by_one", **prob)
    # every row sees one key it must not: failures only in rows the mask hides keys of, and the last key (no
    # query may see it) gets a gradient
    assert v["status"] == "FAILED" and v["failed_full_rows"] == 0 and v["unseen_key_rows"] > 0, v


def test_planted_no_scale_ds(suite):
    prob = dict(batch=1, heads_q=4, heads_kv=4, seq_q=77, seq_k=90, head_dim=64, scale=0.3)
    assert run_planted(suite, "no_scale_ds", base=True, **prob)["status"] == "PASSED"
    v = run_planted(suite, "no_scale_ds", **prob)
    assert v["status"] == "FAILED" and v["failed_tensors"] == ["dq", "dk"], v      # dV = P^T dO has no dS


# ------------------------------------------------------------------------------------------------ speed
SPEED = [  # (dtype, head_dim, seq, causal): B*S = 16k tokens, H*D = 2048 (the anchor set, S <= 4k)
    (dt, d, s, causal) for dt in ("bf16", "f16") for d in (128, 64) for s in (1024, 4096) for causal in (False, True)
]


def _kernels(dt: str, d: int, causal: bool) -> list[str]:
    mask = "causaltl" if causal else "nomask"
    if d == 128:   # the starter set's d128 backward: the split dQ (mainloop.cu.j2)
        return [f"attn_bwd_sm90a_{dt}_d128_64x128_{mask}_bshd_gqa_dqsplit"]
    return [f"attn_bwd_sm90a_{dt}_d64_64x128_{mask}_bshd", f"attn_bwd_sm90a_{dt}_d64_128x128_{mask}_bshd_dqsplit"]


AGREE = {"f16": 2e-2, "bf16": 5e-2}     # max |ours - cuDNN| / max |cuDNN| per gradient


def test_speed_table(suite):
    """emitter's sm90a backward (one launch: preprocessing, upstream's kernel, dQ conversion; the counter reset
    of each call's initialize included) against SDPA's backward, cuDNN and flash, on the same bf16 / f16 tensors.
    Reports; asserts that everything ran, and that a launch after 20+ on one workspace (without the counter reset)
    agrees with cuDNN's gradients."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from emitter.families.attention import runtime as hooks
    from emitter.families.attention.problem import make_problem
    from emitter.kit.launcher import PackedParams

    root, real, planted, records, runner = suite
    by = {e["name"]: e for e in real}
    rows = []
    for dname, d, s, causal in SPEED:
        dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dname]
        b, h = 16384 // s, 2048 // d
        torch.manual_seed(0)
        q, kk, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=dt) for _ in range(4))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, kk, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        o = out.detach().transpose(1, 2).contiguous()
        scale = d ** -0.5
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for i in range(b):      # the LSE the forward saves, in f32, one batch entry at a time
            sc = torch.einsum("hid,hjd->hij", qt[i].float(), kt[i].float()) * scale
            if causal:
                sc.masked_fill_(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
            lse[i] = torch.logsumexp(sc, dim=-1)
            del sc
        p = make_problem(batch=b, heads_q=h, heads_kv=h, seq_q=s, seq_k=s, head_dim=d)
        timed = []
        counters = ((1 + 3 * b * h) * 4 + 255) // 256 * 256
        for name in _kernels(dname, d, causal):
            k = runner.kernel(by[name])
            grads = {g: torch.empty(b, s, h, d, device="cuda", dtype=dt) for g in ("dq", "dk", "dv")}
            ptrs = {"q": q.data_ptr(), "k": kk.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr(),
                    "d_o": do.data_ptr(), "lse": lse.data_ptr(), **{g: x.data_ptr() for g, x in grads.items()}}
            prob = hooks.c_problem(k.config, p, ptrs)
            shim, fn = k.handle["shim"], k.handle["fn"]
            status, qinfo = shim.query(prob)
            assert status == 0, (name, status)
            ws = torch.empty(max(int(qinfo.workspace_bytes), 1), device="cuda", dtype=torch.uint8)
            stream = torch.cuda.current_stream().cuda_stream
            status, params, launch = shim.initialize(prob, ws.data_ptr(), stream, max(int(qinfo.params_bytes), 64))
            assert status == 0, (name, status)
            packed = PackedParams(params)
            fn.allow_shared(int(launch.shared_bytes))
            grid, block, shared = tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes)

            def ours():
                ws[:counters].zero_()            # what each call's initialize does
                fn.launch(grid, block, shared, stream, packed)

            ms = median_ms(torch, ours)
            for x in grads.values():
                x.fill_(float("nan"))
            fn.launch(grid, block, shared, stream, packed)   # no counter reset: the last launch left them zero
            torch.cuda.synchronize()
            timed.append((ms, name, grid, grads))
            del ws
        t_ours, kname, grid, grads = min(timed, key=lambda x: x[0])
        flop = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)     # the convention
        others = {n: round(flop / ms / 1e9, 1) for ms, n, _, _ in timed}
        base = {}
        for bname, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(backend):
                out_b = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            dot = do.transpose(1, 2)
            base[bname] = median_ms(torch, lambda: torch.autograd.grad(out_b, (qt, kt, vt), dot, retain_graph=True))
            if bname == "cudnn":
                ref = torch.autograd.grad(out_b, (qt, kt, vt), dot, retain_graph=True)
        agree = {}
        for g, r in zip(("dq", "dk", "dv"), ref):
            r = r.transpose(1, 2).float()
            agree[g] = float((grads[g].float() - r).abs().max() / r.abs().max())
        rows.append({"case": f"{dname} d{d} s{s} {'causal' if causal else 'full'}", "dtype": dname,
                     "kernel": kname, "grid": grid,
                     "candidates_tflops": others, "ours_tflops": flop / t_ours / 1e9,
                     "cudnn_tflops": flop / base["cudnn"] / 1e9, "flash_tflops": flop / base["flash"] / 1e9,
                     "vs_cudnn": base["cudnn"] / t_ours, "vs_flash": base["flash"] / t_ours,
                     "max_rel_vs_cudnn": agree, "gpu": torch.cuda.get_device_name()})
        del q, kk, v, do, qt, kt, vt, out, out_b, o, lse, grads, timed
        torch.cuda.empty_cache()
    print(f"\n{'case':23} {'emitter':>8} {'cuDNN':>8} {'FA2':>8} {'x cuDNN':>8} {'x FA2':>8}  kernel (grid), max rel vs cuDNN")
    for r in rows:
        print(f"{r['case']:23} {r['ours_tflops']:8.1f} {r['cudnn_tflops']:8.1f} {r['flash_tflops']:8.1f} "
              f"{r['vs_cudnn']:8.2f} {r['vs_flash']:8.2f}  {r['kernel'][15:]} {r['grid']} "
              + " ".join(f"{g} {x:.1e}" for g, x in r["max_rel_vs_cudnn"].items()))
    for dname in ("bf16", "f16"):
        sel = [r for r in rows if r["dtype"] == dname]
        geo = lambda key: math.exp(sum(math.log(r[key]) for r in sel) / len(sel))   # noqa: E731
        print(f"{dname}: geomean x cuDNN {geo('vs_cudnn'):.2f}, x FA2 {geo('vs_flash'):.2f} on {rows[0]['gpu']} "
              f"(TFLOP/s = 2.5 x forward FLOPs / time)")
    report("attention_backward_sm90a", "speed", rows)
    for r in rows:
        assert all(x < AGREE[r["dtype"]] for x in r["max_rel_vs_cudnn"].values()), r


# ------------------------------------------------------------------------------------------------ training step
@pytest.mark.parametrize("dname, bwd_tile", [("f16", "64x128"), ("bf16", "64x128"), ("bf16", "128x128_dqsplit")])
def test_training_step_matches_torch(suite, dname, bwd_tile):
    """A transformer block's training step (LayerNorm, Q/K/V projections, causal attention, output projection,
    MLP) in f16 / bf16 with emitter's sm90a attention (forward FWD saving O and the LSE, backward BWD) against the
    same block with torch's SDPA in that dtype, both judged by the block in float64: every parameter's gradient
    (and the input's) within 2x torch's own error in that dtype (+1e-3)."""
    torch = pytest.importorskip("torch")
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from emitter.families.attention import backward_torch, torch_run

    root, real, planted, records, runner = suite
    FWD = f"attn_sm90a_{dname}_d64_128x128_cooperative_s5_causaltl_bshd_lse"
    tile, _, split = bwd_tile.partition("_")     # BlockQ 64 with upstream's dQ, or BlockQ 128 with the split dQ
    BWD = f"attn_bwd_sm90a_{dname}_d64_{tile}_causaltl_bshd" + (f"_{split}" if split else "")
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dname]
    fwd, bwd = torch_run.AttentionKernel(root, FWD), backward_torch.BackwardKernel(root, BWD)
    B, S, H, D = 2, 200, 8, 64
    C = H * D

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.wqkv = nn.Linear(C, 3 * H * D)
            self.wo = nn.Linear(H * D, C)
            self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

        def forward(self, x, attn):
            q, k, v = self.wqkv(self.ln1(x)).view(B, S, 3, H, D).unbind(2)
            x = x + self.wo(attn(q, k, v).reshape(B, S, H * D))
            return x + self.mlp(self.ln2(x))

    def torch_attn(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    def emitter_attn(q, k, v):
        return backward_torch.attention(q, k, v, fwd, bwd)

    torch.manual_seed(0)
    base = Block().cuda()
    x0 = torch.randn(B, S, C, device="cuda")
    w = torch.randn(B, S, C, device="cuda")

    def step(dtype, attn, backend=None):
        m = Block().cuda().to(dtype)
        m.load_state_dict({k: t.to(dtype) for k, t in base.state_dict().items()})
        x = x0.to(dtype).requires_grad_()
        if backend is not None:
            with sdpa_kernel(backend):
                (m(x, attn).double() * w.double()).sum().backward()
        else:
            (m(x, attn).double() * w.double()).sum().backward()
        grads = {n: p.grad.double() for n, p in m.named_parameters()}
        grads["x"] = x.grad.double()
        return grads

    truth = step(torch.float64, torch_attn, SDPBackend.MATH)
    g_torch, g_emit = step(dtype, torch_attn), step(dtype, emitter_attn)

    def err(g, ref):
        return float((g - ref).abs().max() / ref.abs().max().clamp_min(1e-30))

    rows = [(n, err(g_emit[n], truth[n]), err(g_torch[n], truth[n])) for n in truth]
    print(f"\n{'gradient':16} {'emitter':>9} {'torch':>9}   (max |g - g64| / max |g64|, {dname}, sm90a forward + backward)")
    for n, e_, t_ in rows:
        print(f"{n:16} {e_:9.2e} {t_:9.2e}")
    report("attention_backward_sm90a", f"training_step_{dname}_{bwd_tile}", rows)
    bad = [(n, e_, t_) for n, e_, t_ in rows if not e_ <= 2 * t_ + 1e-3]
    assert not bad, bad
