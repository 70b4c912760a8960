"""GEMM's profile baseline: cuBLAS through torch, in the same process, on the same primary context and stream.

The baseline reads the very operand sets the kernels read (zero-copy torch views of the PyCUDA buffers,
same dtypes and layouts, rotated the same way) and is timed by the same EventTimer, so the ratio
kernel / baseline compares like with like. Which library call it was goes into every output row:
  * f16 / bf16 / f32 / tf32:  torch.matmul / torch.addmm / torch.bmm / torch.baddbmm (cuBLAS / cuBLASLt);
    tf32 with torch.backends.cuda.matmul.allow_tf32 = True, f32 with it False;
  * fp8 (e4m3 / e5m2): torch._scaled_mm (cuBLASLt), unit scales, row-major A and column-major B (the
    only layout cuBLASLt fp8 takes); use_fast_accum matches the op (`fast_accum`, from the instances'
    fp8_fast_accum): False (full-precision accumulation) unless the kernels use fast accumulation, so
    each kernel is compared with the cuBLASLt mode of the same numerics. The provider string says which.
Fused epilogues (bias, activations) are not part of the baseline: it computes the plain GEMM.
"""

from __future__ import annotations

from typing import Any

from emitter.dtypes import DType
from emitter.families.base import BaselineLaunch, BaselineUnavailable
from emitter.families.gemm.workload import ProblemData
from emitter.kit.torch_interop import torch_available

BASELINES = ("cublas",)


def use_fast_accum(data: Any) -> bool:
    """torch._scaled_mm's use_fast_accum for `data` (a ProblemData): the GemmConfig's `fast_accum`, or the
    op's (Op.fast_accum) -- workload.op_config builds data.cfg from the op, so either one says it."""
    return bool(getattr(data.cfg, "fast_accum", False) or getattr(data.op, "fast_accum", False))


def scaled_mm_provider(fast_accum: bool, torch_version: str) -> str:
    """The provider string of the fp8 baseline (the first comma-separated part names the call)."""
    return f"torch._scaled_mm (cuBLASLt) use_fast_accum={bool(fast_accum)}, torch {torch_version}"


def cublas(data: ProblemData, stream: Any) -> BaselineLaunch:
    """A launch(i) that runs the cuBLAS GEMM of `data`'s op on operand set i, on the PyCUDA `stream`."""
    if not torch_available():
        raise BaselineUnavailable("torch is not installed: no cuBLAS baseline (pip install torch)")
    import torch

    from emitter.families.gemm.profile_check import torch_view

    cfg, lay, p = data.cfg, data.lay, data.problem
    if cfg.a != cfg.b and not (cfg.a.is_fp8 and cfg.b.is_fp8):
        raise BaselineUnavailable(f"mixed input types {cfg.a}/{cfg.b} have no cuBLAS call through torch")
    if cfg.a in (DType.s8, DType.s32, DType.f64):
        raise BaselineUnavailable(f"no torch cuBLAS baseline for {cfg.a} here")
    tstream = torch.cuda.ExternalStream(int(stream.handle)) if getattr(stream, "handle", 0) else None
    batched = p.batch > 1
    views = []
    for s in data.sets:
        A = torch_view(torch, s.A, lay.A, cfg.a)
        B = torch_view(torch, s.B, lay.B, cfg.b)
        D = torch_view(torch, s.D, lay.D, cfg.d)
        C = torch_view(torch, s.C, lay.C, cfg.c) if data.beta != 0 else None
        if not batched:
            A, B, D = A[0], B[0], D[0]
            C = C[0] if C is not None else None
        views.append((A, B, C, D))
    alpha, beta = data.alpha, data.beta
    fp8 = cfg.a.is_fp8

    if fp8:
        if batched:
            raise BaselineUnavailable("torch._scaled_mm has no batched form")
        if not (cfg.row_major_a and not cfg.row_major_b and cfg.row_major_c):
            raise BaselineUnavailable(f"cuBLASLt fp8 takes only TN with row-major D; this op is {cfg.layout_letters}")
        if beta != 0:
            raise BaselineUnavailable("torch._scaled_mm has no beta * C term")
        if cfg.d not in (DType.bf16, DType.f16, DType.f32):
            raise BaselineUnavailable(f"torch._scaled_mm does not write {cfg.d}")
        one = torch.ones((), device="cuda", dtype=torch.float32)
        scale_a = one * alpha
        out_dtype = {DType.bf16: torch.bfloat16, DType.f16: torch.float16, DType.f32: torch.float32}[cfg.d]

        with_out = [True]        # torch versions without the out= overload allocate D per call instead
        fast_accum = use_fast_accum(data)

        def run(i: int) -> None:
            A, B, _C, D = views[i % len(views)]
            if with_out[0]:
                try:
                    torch._scaled_mm(A, B, scale_a=scale_a, scale_b=one, out_dtype=out_dtype, use_fast_accum=fast_accum,
                                     out=D)
                    return
                except TypeError:
                    with_out[0] = False
            torch._scaled_mm(A, B, scale_a=scale_a, scale_b=one, out_dtype=out_dtype, use_fast_accum=fast_accum)

        provider = scaled_mm_provider(fast_accum, torch.__version__)
    else:
        col_out = not cfg.row_major_c

        def gemm(A: Any, B: Any, C: Any, D: Any) -> None:
            if col_out:    # D column-major: compute D^T = B^T A^T into D's storage, row-major
                A, B, D = B.transpose(-1, -2), A.transpose(-1, -2), D.transpose(-1, -2)
                C = C.transpose(-1, -2) if C is not None else None
            if C is None and alpha == 1.0:
                torch.matmul(A, B, out=D)
            elif C is None:
                (torch.baddbmm if batched else torch.addmm)(D, A, B, beta=0.0, alpha=alpha, out=D)
            else:
                (torch.baddbmm if batched else torch.addmm)(C, A, B, beta=beta, alpha=alpha, out=D)

        tf32 = cfg.a is DType.tf32

        def run(i: int) -> None:
            gemm(*views[i % len(views)])

        call = ("torch.matmul" if data.beta == 0 and alpha == 1.0 else "torch.addmm") if not batched else \
            ("torch.matmul" if data.beta == 0 and alpha == 1.0 else "torch.baddbmm")
        provider = f"{call} (cuBLAS){', TF32' if tf32 else ''}, torch {torch.__version__}"
        base_run = run

        def run(i: int) -> None:  # noqa: F811 - TF32 on only for tf32 ops
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                base_run(i)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev

    def launch(i: int) -> None:
        if tstream is not None:
            with torch.cuda.stream(tstream):
                run(i)
        else:
            run(i)

    # one call now: a dtype / shape that cuBLAS refuses is "unavailable", not a fault
    try:
        launch(0)
        stream.synchronize()
    except RuntimeError as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "illegal" in text.lower():
            raise
        raise BaselineUnavailable(f"{provider.split(',')[0]} refused this problem: {text}") from None
    return BaselineLaunch("cublas", provider, launch, tstream)


def baseline(name: str, data: ProblemData, stream: Any) -> BaselineLaunch:
    """RuntimeFamily.baseline: the named baseline's launch on `data`'s operand sets."""
    if name != "cublas":
        raise BaselineUnavailable(f"no GEMM baseline named {name!r} (known: {', '.join(BASELINES)})")
    return cublas(data, stream)
