"""Run a built attention backward instance on torch tensors, and a differentiable attention built from a forward
and a backward instance (torch.autograd.Function): the GPU tests' way to put emitter's attention in a training
step without an exported library.

    fwd = torch_run.AttentionKernel(root, "<forward instance with lse: true>")
    bwd = BackwardKernel(root, "<backward instance, same mask>")
    out = attention(q, k, v, fwd, bwd, scale=0.0)      # q [b, sq, hq, d], k / v [b, sk, hkv, d] (BSHD views)
    out.float().sum().backward()                        # dQ, dK, dV from the backward instance

The forward saves O and its LSE; the backward's one launch does the rowsum(dO * O) preprocessing, the key loop
and the GQA group sum. Gradients come back packed BSHD (the backward ABI's row-stride rule). Launches go on
torch's current stream; the instances' cubin and host shim come from their build records, as in torch_run.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from emitter.families.attention.backward_abi import EmitterAttentionBackwardProblem
from emitter.kit.launcher import DriverKernel, PackedParams
from emitter.kit.shim import HostShim


class CannotRun(Exception):
    """The backward shim refused the problem (`status`: EMITTER_*)."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(f"{what}: status {status}")
        self.status = status


class BackwardKernel:
    """One built attention backward instance: load once, run many problems."""

    def __init__(self, root: str | Path, name: str) -> None:
        root = Path(root)
        record = json.loads((root / "build" / name / "record.json").read_text())
        if record.get("status") not in ("ok", "cached"):
            raise RuntimeError(f"{name} is not built: {record.get('status')} {record.get('error')}")
        self.name = name
        self.shim = HostShim(root / record["artifacts"]["host"], name)
        self.kernel = DriverKernel(root / record["artifacts"]["cubin"], f"emitter_{name}_kernel")

    @staticmethod
    def problem(q, k, v, o, do, lse, dq, dk, dv, scale: float = 0.0) -> EmitterAttentionBackwardProblem:
        """BSHD (any strides, head dim contiguous) tensors; lse [b, hq, sq] float32, seq contiguous."""
        b, sq, hq, d = q.shape
        _, sk, hkv, _ = k.shape
        p = EmitterAttentionBackwardProblem()
        p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k = b, hq, hkv, sq, sk
        p.head_dim, p.head_dim_v = d, v.shape[3]
        p.scale = float(scale)
        for field, t in (("stride_q", q), ("stride_k", k), ("stride_v", v), ("stride_o", o), ("stride_do", do),
                         ("stride_dq", dq), ("stride_dk", dk), ("stride_dv", dv)):
            if t.stride(3) != 1:
                raise ValueError(f"{field[7:]}: the head dim must be contiguous")
            arr = getattr(p, field)
            arr[0], arr[1], arr[2] = t.stride(0), t.stride(1), t.stride(2)
        if lse.stride(2) != 1:
            raise ValueError("lse: the seq dim must be contiguous")
        p.stride_lse[0], p.stride_lse[1] = lse.stride(0), lse.stride(1)
        p.q, p.k, p.v, p.o, p.d_o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr()
        p.lse = lse.data_ptr()
        p.dq, p.dk, p.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        return p

    def __call__(self, q, k, v, o, do, lse, scale: float = 0.0):
        """(dq, dk, dv), packed BSHD, computed on torch's current stream."""
        import torch

        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        p = self.problem(q, k, v, o, do, lse, dq, dk, dv, scale)
        status, sizes = self.shim.query(p)
        if status != 0:
            raise CannotRun(status, f"{self.name}_query")
        workspace = torch.empty(max(int(sizes.workspace_bytes), 1), dtype=torch.uint8, device=q.device)
        stream = torch.cuda.current_stream().cuda_stream
        status, params, launch = self.shim.initialize(p, workspace.data_ptr(), stream, max(int(sizes.params_bytes), 64))
        if status != 0:
            raise CannotRun(status, f"{self.name}_initialize")
        self.kernel.launch(tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes), stream,
                           PackedParams(params))
        # the caching allocator may hand the workspace out again only after the launch: record its use
        workspace.record_stream(torch.cuda.current_stream())
        return dq, dk, dv


def _function():
    import torch

    class EmitterAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q, k, v, fwd: Any, bwd: Any, scale: float):
            b, sq, hq, _ = q.shape
            o = torch.empty(b, sq, hq, v.shape[3], dtype=q.dtype, device=q.device)
            lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
            fwd(q, k, v, o, lse, scale)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.bwd, ctx.scale = bwd, scale
            return o

        @staticmethod
        def backward(ctx: Any, do):
            q, k, v, o, lse = ctx.saved_tensors
            if do.stride(-1) != 1:
                do = do.contiguous()
            dq, dk, dv = ctx.bwd(q, k, v, o, do, lse, ctx.scale)
            return dq, dk, dv, None, None, None

    return EmitterAttention


_FN: Any = None


def attention(q, k, v, fwd: Any, bwd: Any, scale: float = 0.0):
    """O = softmax(scale * Q K^T + mask) V through the forward instance `fwd` (torch_run.AttentionKernel, built
    with lse: true), differentiable through the backward instance `bwd` (BackwardKernel) of the same mask."""
    global _FN
    if _FN is None:
        _FN = _function()
    return _FN.apply(q, k, v, fwd, bwd, float(scale))


__all__ = ["BackwardKernel", "CannotRun", "attention"]
