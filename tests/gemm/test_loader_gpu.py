"""The exported library's loader on a GPU (issue 26 must-have 4): lib.gemm inside torch.compile(fullgraph=True)
(the custom ops torch.ops.<lib>.gemm / gemm_out) and inside a CUDA graph capture + replay, checked against torch.

Builds one sm90a bf16 kernel (emit -> export -> CMake, about a minute on 16 cores), or uses an exported and
built library given by $EMITTER_LOADER_LIBRARY (e.g. what `benchmarks/loader_overhead.py --keep DIR` left in
DIR/lobench)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    import loader_overhead as bench

    given = os.environ.get("EMITTER_LOADER_LIBRARY")
    if given:
        tree = Path(given)
    else:
        bench.SPEC = bench.SPEC.split("  - tile: 128x256x64")[0] + "  - tile: 64x128x64\n    cluster: 1x1x1\n" \
            "    schedule: {kernel: pingpong}\n"
        tree = bench.build_library(tmp_path_factory.mktemp("loader_gpu"), int(os.environ.get("EMITTER_TEST_JOBS", "16")))
    return bench.load_loader(tree)


def _check(torch, got, want, what: str) -> None:
    err = ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    assert err < 2e-2, f"{what}: max relative error {err:.3e}"


def test_torch_compile_fullgraph(lib):
    import torch

    assert getattr(torch.ops, lib.NAME).gemm is not None   # registered at import (torch came first)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)

    def f(x, w):
        return lib.gemm(x, w.t()) * 2 + 1

    def g(x, w, out):
        lib.gemm(x, w.t(), out)
        return out.float().sum(dim=1)

    want = (x.float() @ w.float().t()) * 2 + 1
    import importlib.util

    backends = ("eager", "aot_eager") + (("inductor",) if importlib.util.find_spec("triton") else ())
    for backend in backends:
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend=backend)(x, w)
        torch.cuda.synchronize()
        _check(torch, got, want, f"torch.compile(fullgraph=True, backend={backend!r})")
    out = torch.empty(256, 384, device="cuda", dtype=torch.bfloat16)
    got = torch.compile(g, fullgraph=True, backend=backends[-1])(x, w, out)
    _check(torch, got, (x.float() @ w.float().t()).bfloat16().float().sum(dim=1), "gemm_out in torch.compile")


def test_cuda_graph_capture_and_replay(lib):
    import torch

    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(640, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(512, 640, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up outside the capture (first-launch attributes, plans)
        for _ in range(3):
            lib.gemm(x, w.t(), out)
            y = lib.gemm(x, w.t())
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lib.gemm(x, w.t(), out)
        y = lib.gemm(x, w.t())      # allocated from the graph's private pool
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        want = x.float() @ w.float().t()
        _check(torch, out, want, "out= in a CUDA graph replay")
        _check(torch, y, want, "allocated output in a CUDA graph replay")


def test_eager_refusals_on_the_gpu(lib):
    import torch

    a = torch.randn(3, 64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(5, 32, 48, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(lib.OperandError, match="same batch count"):
        lib.gemm(a, b)
    with pytest.raises(lib.OperandError, match="CPU tensor"):
        lib.gemm(a[0].cpu(), b[0])
    with pytest.raises(lib.OperandError, match="out"):
        lib.gemm(a, b[:3], torch.empty(64, 48, device="cuda", dtype=torch.bfloat16))
