"""The sm90a attention backward through an exported library on the GPU: emit -> `emitter library` -> CMake build
of a library holding a forward sm80 f16 attention kernel (lse: true), sm80 backward kernels (GQA, deterministic
and key-split), sm90a backward kernels (examples/88 as one launch) and the two GEMM kernels a library needs; then
the Python loader: attention_backward() with the sm90a kernel forced and by dispatch (which must pick it for an f16
problem, GQA included, and for a bf16 one), against autograd through the float64 forward; loss.backward() through
lib.attention(), a CUDA graph of the backward call, and a deterministic request falling back to sm80's
deterministic kernel.

    python3 -m pytest -q -s -m gpu tests/attention/test_attention_backward_sm90a_library_gpu.py      (a few minutes on 16 cores)

$EMITTER_ATTENTION_BWD90_LIBRARY=<dir> reuses an exported tree built before (its build/ folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC, load_module  # noqa: E402
from test_attention_backward_library_gpu import _grads64, _rel, _run  # noqa: E402
from test_attention_backward_sm90a_library import SPEC  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "attbwd90gpu"
S90 = "attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd_gqa"
S90_BF16 = "attn_bwd_sm90a_bf16_d64_64x128_causaltl_bshd_gqa"
S90_SPLIT = "attn_bwd_sm90a_f16_d64_128x128_causaltl_bshd_gqa_dqsplit"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100 / H200) visible to torch")
    os.environ[f"{NAME.upper()}_LOG"] = "1"          # the C API names the kernel each call ran (stderr)
    given = os.environ.get("EMITTER_ATTENTION_BWD90_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("attention_backward_sm90a_library_gpu")
        (work / "spec.yaml").write_text(GEMM_SPEC + SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", work / "spec.yaml", "-o", work / "gen"], cwd=ROOT)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", work / "gen", "--name", NAME, "-o", tree], cwd=ROOT)
        _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=90;90a", "-DCMAKE_BUILD_TYPE=Release"])
        _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")])
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))), None)
    assert so is not None, f"lib{NAME}.so not built under {tree}"
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def _inputs(torch, b=2, s=300, hq=8, hkv=8, d=64, seed=0, dtype=None):
    torch.manual_seed(seed)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=dtype or torch.float16)   # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), mk(hq)


def _forward32(torch, q, k, v):
    """O (in q's dtype) and the LSE (float32 [batch, heads_q, seq_q]) of the causal forward, as a forward kernel
    saves them (the library's forward here is f16 only)."""
    hq, hkv = q.shape[2], k.shape[2]
    qt = q.float().transpose(1, 2)
    kt, vt = (x.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1) for x in (k, v))
    sc = qt @ kt.transpose(-1, -2) / q.shape[-1] ** 0.5
    sc = sc.masked_fill(torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = (torch.softmax(sc, dim=-1) @ vt).transpose(1, 2).contiguous().to(q.dtype)
    return o, torch.logsumexp(sc, dim=-1).contiguous()


def test_sm90a_backward_forced_and_dispatched(lib, capfd):
    torch = pytest.importorskip("torch")
    assert S90 in lib.attention_backward_kernels()
    q, k, v, do = _inputs(torch)
    want = _grads64(torch, q, k, v, do)
    o, lse = lib.attention(q, k, v, causal=True, lse=True)
    for kernel in (S90, None):
        got = lib.attention_backward(q, k, v, o, lse, do, causal=True, kernel=kernel)
        torch.cuda.synchronize()
        errs = [_rel(g, w) for g, w in zip(got, want)]
        print("attention_backward", kernel or "dispatch", ["%.2e" % e for e in errs])
        assert all(e < 5e-3 for e in errs), errs
    log = capfd.readouterr().err
    # by dispatch: the split-dQ kernel first (the static order), which the spec exports beside upstream's dQ
    assert f"-> {S90} (forced" in log and f"-> {S90_SPLIT}" in log.split("(forced")[1], log
    # GQA (8 query heads on 2 KV heads) through the sm90a kernel; deterministic asked: sm80's deterministic kernel
    q, k, v, do = _inputs(torch, hkv=2, seed=1)
    want = _grads64(torch, q, k, v, do)
    o, lse = lib.attention(q, k, v, causal=True, lse=True)
    for det, kernel in ((False, "attn_bwd_sm90a_f16_d64_"), (True, "attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa_det")):
        got = lib.attention_backward(q, k, v, o, lse, do, causal=True, deterministic=det)
        torch.cuda.synchronize()
        errs = [_rel(g, w) for g, w in zip(got, want)]
        print("GQA attention_backward", "deterministic" if det else "dispatch", ["%.2e" % e for e in errs])
        assert all(e < 5e-3 for e in errs), errs
        assert f"-> {kernel}" in capfd.readouterr().err


def test_loss_backward_and_cuda_graph_through_sm90a(lib, capfd):
    torch = pytest.importorskip("torch")
    q, k, v, do = _inputs(torch, s=517, seed=2)
    want = _grads64(torch, q, k, v, do)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    lib.attention(qr, kr, vr, causal=True).backward(do)
    errs = [_rel(x.grad, w) for x, w in zip((qr, kr, vr), want)]
    print("loss.backward() through lib.attention", ["%.2e" % e for e in errs])
    assert all(e < 5e-3 for e in errs), errs
    assert "-> attn_bwd_sm90a_f16_d64_" in capfd.readouterr().err
    o, lse = lib.attention(q, k, v, causal=True, lse=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lib.attention_backward(q, k, v, o, lse, do, causal=True, kernel=S90)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = lib.attention_backward(q, k, v, o, lse, do, causal=True, kernel=S90)
    for _ in range(3):          # replays reuse the workspace: the phase counters reset themselves
        g.replay()
    torch.cuda.synchronize()
    errs = [_rel(x, w) for x, w in zip(captured, want)]
    print("CUDA graph replay", ["%.2e" % e for e in errs])
    assert all(e < 5e-3 for e in errs), errs


def test_bf16_backward_runs_the_sm90a_kernel(lib, capfd):
    """bf16 (the instance's bf16 fragments take upstream's f32 dS): forced and by dispatch, MHA and GQA, within
    bf16's tolerance (4e-2) of the float64 gradients; the dispatch picks the sm90a bf16 kernel over sm80's."""
    torch = pytest.importorskip("torch")
    assert S90_BF16 in lib.attention_backward_kernels()
    for hkv, seed in ((8, 3), (2, 4)):
        q, k, v, do = _inputs(torch, s=333, hkv=hkv, seed=seed, dtype=torch.bfloat16)
        want = _grads64(torch, q, k, v, do)
        o, lse = _forward32(torch, q, k, v)
        for kernel in (S90_BF16, None):
            got = lib.attention_backward(q, k, v, o, lse, do, causal=True, kernel=kernel)
            torch.cuda.synchronize()
            assert all(g.dtype == torch.bfloat16 for g in got)
            errs = [_rel(g, w) for g, w in zip(got, want)]
            print(f"bf16 attention_backward hkv={hkv}", kernel or "dispatch", ["%.2e" % e for e in errs])
            assert all(e < 4e-2 for e in errs), errs
        log = capfd.readouterr().err
        assert f"-> {S90_BF16} (forced" in log and f"-> {S90_BF16}" in log.split("(forced")[1], log
