"""GPU checks of the sm90a attention kernels (H100 / H200) against a float64 torch reference.

Needs built instances: emit + build configs/attention/sm90a_verify.yaml and point EMITTER_ATTENTION_SM90A_BUILD
at the output directory (the lead's command in the report), e.g.

    python3 -m emitter emit configs/attention/sm90a_verify.yaml -o /tmp/att90 && python3 -m emitter build /tmp/att90 -j 16
    EMITTER_ATTENTION_SM90A_BUILD=/tmp/att90 python3 -m pytest -q -m gpu tests/attention/test_attention_sm90a_gpu.py

Skips cleanly without torch, a GPU of compute capability 9.0, or the build. Every output is poisoned (NaN)
first; O and LSE are compared element by element with the reference (relative Frobenius error, NaN and
unwritten never pass, -inf rows must be -inf). Negative controls check the comparison can fail: the same
kernel output against a reference with the wrong mask / scale / KV-head mapping must not pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

ROOT = os.environ.get("EMITTER_ATTENTION_SM90A_BUILD", "")
TOL_O = {"f16": 5e-3, "bf16": 2e-2}
TOL_LSE = 1e-3
DT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return "sm90a kernels need a compute capability 9.0 GPU"
    if not ROOT or not (Path(ROOT) / "manifest.json").is_file():
        return "EMITTER_ATTENTION_SM90A_BUILD does not name an emitted + built sm90a attention directory"
    return None


@pytest.fixture(scope="module")
def kernels():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from emitter.families.attention.torch_run import AttentionKernel, manifest_configs

    torch.cuda.init()
    torch.empty(1, device="cuda")      # the primary context is current from here on
    out = {}
    for name, cfg in manifest_configs(ROOT).items():
        if cfg["arch"] == "sm90a":
            out[name] = (cfg, AttentionKernel(ROOT, name))
    if not out:
        pytest.skip(f"no sm90a attention instance in {ROOT}")
    return out


def _tensors(cfg, b, sq, sk, hq, hkv, *, magnitude=1.0, layout=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt, d = DT[cfg["dtype"]], cfg["head_dim"]
    layout = layout or cfg["layout"]

    def make(s, h, dim, scale):
        shape = (b, s, h, dim) if layout == "bshd" else (b, h, s, dim)
        t = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * scale).to(dt)
        return t if layout == "bshd" else t.transpose(1, 2)      # logical [b, s, h, d] either way

    q, k, v = make(sq, hq, d, magnitude), make(sk, hkv, d, magnitude), make(sk, hkv, d, 1.0)
    o = make(sq, hq, d, 1.0)
    o.fill_(float("nan"))
    return q, k, v, o


def _run_and_check(cfg, kern, *, b=2, sq=256, sk=256, hq=4, hkv=None, scale=0.0, lse=True, magnitude=1.0,
                   layout=None, packed_strides=False):
    from emitter.families.attention.torch_run import compare, reference

    hkv = hkv or (2 if cfg["gqa"] else hq)
    lse = lse and cfg.get("lse", True)      # an instance built without the LSE output (lse: false) takes none
    q, k, v, o = _tensors(cfg, b, sq, sk, hq, hkv, magnitude=magnitude, layout=layout)
    lse_t = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32) if lse else None
    if packed_strides:
        p = kern.problem(q, k, v, o, lse_t, scale)
        for f in ("stride_q", "stride_k", "stride_v", "stride_o"):
            for i in range(3):
                getattr(p, f)[i] = 0
        p.stride_lse[0] = p.stride_lse[1] = 0
        status, _ = kern.shim.query(p)
        assert status == 0, kern.reason()
        import ctypes
        status, params, launch = kern.shim.initialize(p, None, torch.cuda.current_stream().cuda_stream, 1 << 16)
        assert status == 0, kern.reason()
        from emitter.kit.launcher import PackedParams
        kern.kernel.launch(tuple(launch.grid), tuple(launch.block), launch.shared_bytes,
                           torch.cuda.current_stream().cuda_stream, PackedParams(params))
    else:
        kern(q, k, v, o, lse_t, scale)
    torch.cuda.synchronize()
    want_o, want_lse = reference(q, k, v, mask=cfg["mask"], scale=scale)
    res = compare(o, want_o, tol=TOL_O[cfg["dtype"]])
    assert res["passed"], f"O: {res}"
    if lse:
        res_lse = compare(lse_t, want_lse, tol=TOL_LSE)
        assert res_lse["passed"], f"LSE: {res_lse}"
    return q, k, v, o, lse_t


def fixed(kernels):
    """The fixed-length instances (varlen instances take packed cu_seqlens problems only: test_varlen)."""
    return {n: v for n, v in kernels.items() if not v[0]["varlen"]}


def _names(kernels, pred):
    names = [n for n, (cfg, _) in kernels.items() if pred(cfg)]
    if not names:
        pytest.skip("no instance of that kind in the build")
    return names


def test_square_default_scale(kernels):
    for name, (cfg, kern) in fixed(kernels).items():
        _run_and_check(cfg, kern, sq=256, sk=256, lse=cfg["lse"])


def test_key_tail_and_seq_q_ne_seq_k(kernels):
    for name in _names(kernels, lambda c: c["key_tail"] and not c["varlen"]):
        cfg, kern = kernels[name]
        for sq, sk in ((512, 1000), (1000, 384), (128, 77), (8, 200), (384, 129)):
            _run_and_check(cfg, kern, b=1, sq=sq, sk=sk, lse=cfg["lse"])


def test_no_key_tail_instance_refuses_a_tail(kernels):
    from emitter.families.attention.torch_run import CannotRun

    for name in _names(kernels, lambda c: not c["key_tail"] and not c["varlen"]):
        cfg, kern = kernels[name]
        _run_and_check(cfg, kern, b=1, sq=200, sk=512, lse=False)   # multiple of every tile_kv: runs
        q, k, v, o = _tensors(cfg, 1, 128, 500, 4, 4)
        with pytest.raises(CannotRun) as e:
            kern(q, k, v, o, None, 0.0)
        assert e.value.status == 1 and "tile_kv" in e.value.reason


def test_runtime_scale(kernels):
    for name, (cfg, kern) in fixed(kernels).items():
        _run_and_check(cfg, kern, sq=256, sk=320 if cfg["key_tail"] else 256, scale=0.3, lse=cfg["lse"])
        _run_and_check(cfg, kern, sq=128, sk=128, scale=1.7, lse=cfg["lse"])


def test_gqa_and_mqa(kernels):
    for name in _names(kernels, lambda c: c["gqa"] and not c["varlen"]):
        cfg, kern = kernels[name]
        _run_and_check(cfg, kern, hq=8, hkv=2, sq=256, sk=384)
        _run_and_check(cfg, kern, hq=6, hkv=1, sq=128, sk=200)    # MQA
        _run_and_check(cfg, kern, hq=4, hkv=4, sq=128, sk=128)


def test_non_gqa_instance_refuses_grouped_heads(kernels):
    from emitter.families.attention.torch_run import CannotRun

    for name in _names(kernels, lambda c: not c["gqa"] and not c["varlen"]):
        cfg, kern = kernels[name]
        q, k, v, o = _tensors(cfg, 1, 128, 128, 4, 2)
        with pytest.raises(CannotRun) as e:
            kern(q, k, v, o, None, 0.0)
        assert e.value.status == 1 and "gqa" in e.value.reason


def test_lse_optional(kernels):
    from emitter.families.attention.torch_run import CannotRun

    for name, (cfg, kern) in fixed(kernels).items():
        if cfg["lse"]:
            _run_and_check(cfg, kern, sq=256, sk=256, lse=True)
            _run_and_check(cfg, kern, sq=256, sk=256, lse=False)   # NULL pointer: no LSE written, O still right
        else:
            q, k, v, o = _tensors(cfg, 1, 128, 128, 4, 4)
            lse_t = torch.zeros((1, 4, 128), device="cuda")
            with pytest.raises(CannotRun):
                kern(q, k, v, o, lse_t, 0.0)


def test_large_magnitudes(kernels):
    # scores of several hundred: exp overflows f32 unless the running max is subtracted
    for name, (cfg, kern) in fixed(kernels).items():
        _run_and_check(cfg, kern, sq=256, sk=256, magnitude=12.0, lse=cfg["lse"])


def test_other_layout_and_packed_strides(kernels):
    for name, (cfg, kern) in fixed(kernels).items():
        other = "bhsd" if cfg["layout"] == "bshd" else "bshd"
        sk = 300 if cfg["key_tail"] else 256
        _run_and_check(cfg, kern, sq=256, sk=sk, layout=other, lse=cfg["lse"])
        _run_and_check(cfg, kern, sq=256, sk=sk, packed_strides=True, lse=cfg["lse"])


def test_larger_problem(kernels):
    for name, (cfg, kern) in fixed(kernels).items():
        _run_and_check(cfg, kern, b=2, hq=4, sq=2048, sk=2048 if not cfg["key_tail"] else 2000, lse=cfg["lse"])


def test_negative_controls_fail(kernels):
    """The comparison catches a wrong mask, a wrong scale and a wrong KV head (each must NOT pass)."""
    from emitter.families.attention.torch_run import compare, reference

    for name, (cfg, kern) in fixed(kernels).items():
        hkv = 2 if cfg["gqa"] else 4
        q, k, v, o, _ = _run_and_check(cfg, kern, sq=256, sk=256, hq=4, hkv=hkv, lse=False)
        tol = TOL_O[cfg["dtype"]]
        wrong_mask = "none" if cfg["mask"] != "none" else "causal_top_left"
        assert not compare(o, reference(q, k, v, mask=wrong_mask)[0], tol=tol)["passed"], name
        assert not compare(o, reference(q, k, v, mask=cfg["mask"], scale=1.3 / cfg["head_dim"] ** 0.5)[0],
                           tol=tol)["passed"], name
        if cfg["gqa"]:
            k2 = k[:, :, [1, 0]]    # KV heads swapped: query head h reading head h % hkv instead of h // group
            v2 = v[:, :, [1, 0]]
            assert not compare(o, reference(q, k2, v2, mask=cfg["mask"])[0], tol=tol)["passed"], name


VARLEN_CASES = (
    ([100, 1, 256, 37], [100, 5, 300, 200]),
    ([512], [512]),
    ([8, 136, 64], [128, 1, 700]),
    ([200, 64], [64, 333]),          # seq_q > seq_k in one sequence: bottom-right rows without keys
    ([37, 5, 1], [50, 3, 129]),      # the longest query sequence not a multiple of 8 (the shim rounds it up)
)


def _varlen_tensors(cfg, lens_q, lens_k, hq, hkv, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt, d = DT[cfg["dtype"]], cfg["head_dim"]
    cu_q = torch.tensor([0] + list(__import__("itertools").accumulate(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(__import__("itertools").accumulate(lens_k)), dtype=torch.int32, device="cuda")
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn((tq, hq, d), generator=gen, device="cuda").to(dt)
    k = torch.randn((tk, hkv, d), generator=gen, device="cuda").to(dt)
    v = torch.randn((tk, hkv, d), generator=gen, device="cuda").to(dt)
    o = torch.full((tq, hq, d), float("nan"), device="cuda", dtype=dt)
    return q, k, v, o, cu_q, cu_k


def test_varlen(kernels):
    from emitter.families.attention.torch_run import compare, reference_varlen

    for name in _names(kernels, lambda c: c["varlen"]):
        cfg, kern = kernels[name]
        hq, hkv = 4, (2 if cfg["gqa"] else 4)
        for i, (lens_q, lens_k) in enumerate(VARLEN_CASES):
            for scale in (0.0, 0.2):
                q, k, v, o, cu_q, cu_k = _varlen_tensors(cfg, lens_q, lens_k, hq, hkv, seed=i)
                lse = torch.full((hq, q.shape[0]), float("nan"), device="cuda") if cfg["lse"] else None
                kern(q, k, v, o, lse, scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
                torch.cuda.synchronize()
                want_o, want_lse = reference_varlen(q, k, v, cu_q, cu_k, mask=cfg["mask"], scale=scale)
                res = compare(o, want_o, tol=TOL_O[cfg["dtype"]])
                assert res["passed"], f"{name} {lens_q} {lens_k} O: {res}"
                if lse is not None:
                    res = compare(lse, want_lse, tol=TOL_LSE)
                    assert res["passed"], f"{name} {lens_q} {lens_k} LSE: {res}"


def test_varlen_and_fixed_instances_refuse_each_others_problems(kernels):
    from emitter.families.attention.torch_run import CannotRun

    for name, (cfg, kern) in kernels.items():
        hkv = 2 if cfg["gqa"] else 4
        if cfg["varlen"]:
            q, k, v, o = _tensors(cfg, 1, 128, 128, 4, hkv)
            with pytest.raises(CannotRun) as e:
                kern(q, k, v, o, None, 0.0)
            assert "varlen" in e.value.reason
        elif cfg["key_tail"]:
            q, k, v, o, cu_q, cu_k = _varlen_tensors(cfg, [64, 64], [64, 64], 4, hkv)
            with pytest.raises(CannotRun) as e:
                kern(q, k, v, o, None, 0.0, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
            assert "varlen: true" in e.value.reason
