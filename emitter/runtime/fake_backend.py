"""A pure-numpy backend for CI: "runs" a GEMM instance from its manifest config, with planted faults.

It needs no build record and no GPU: it reads the operands from the storage buffers with the problem's
leading dimensions and batch strides exactly as a kernel would, computes in the accumulator's precision
(float32 for f32/tf32 accumulators, so tolerances are exercised), applies the instance's epilogue,
rounds to D's type and writes D's storage.

Faults (tests plant them to prove the verifier catches each): FakeBackend(faults=[{...}, ...]) where each
fault has `kind` and optionally `select` (a glob on the instance name, default all) and `problem` (a glob
on the problem label the verifier passes via `problem_label`, default all):

  wrong        one element off by `delta` (default 1.0) at `at` = [b, i, j] (default the last element)
  nan          one element NaN (at `at`)
  unwritten    one element left as poison (at `at`); `row: true` leaves the whole last row
  noise        relative Gaussian noise of size `eps` on every element
  wrong_ld     ignore the given leading dimensions (packed instead)
  swap_layout  read A with the other layout
  drop_beta    compute as if beta were 0
  wrong_activation   apply `activation` (default relu, or identity when the instance uses relu)
  skip_last_k  accumulate only k-1 terms (an off-by-one in the K loop bound)
  crash        the process dies (os._exit(`code`, default 134)) - like a segfaulting shim
  hang         sleep `seconds` (default 3600) - like a kernel that never ends
  illegal_address    raise CudaFault("an illegal memory access was encountered") (context poisoned)
  launch_error raise LaunchFailed
  cannot_implement   raise CannotImplement
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from emitter.dtypes import DType
from emitter.runtime.backend import (
    Backend, CannotImplement, CudaFault, GemmBuffers, GemmProblem, Kernel, LaunchFailed, RunResult,
)
from emitter.runtime.config import GemmConfig
from emitter.runtime.hostdata import MatrixLayout, decode, encode, poison_value
from emitter.runtime.options import unsupported

FAULT_KINDS = (
    "wrong", "nan", "unwritten", "noise", "wrong_ld", "swap_layout", "drop_beta", "wrong_activation",
    "skip_last_k", "crash", "hang", "illegal_address", "launch_error", "cannot_implement",
)


class FakeBackend(Backend):
    name = "fake"
    reference_device = None

    def __init__(self, faults: Sequence[Mapping[str, Any]] = (), require_build: bool = False) -> None:
        for f in faults:
            if f.get("kind") not in FAULT_KINDS:
                raise ValueError(f"unknown fake fault kind {f.get('kind')!r} (known: {', '.join(FAULT_KINDS)})")
        self.faults = [dict(f) for f in faults]
        self.require_build = require_build
        self.problem_label = ""      # set by the verifier before each run (fault matching only)

    def device_name(self) -> str:
        return "numpy (fake backend)"

    def load(self, root: Path, entry: Mapping[str, Any]) -> Kernel:
        cfg = GemmConfig.from_entry(entry, root)
        if self.require_build:
            from emitter.runtime.backend import build_record

            build_record(Path(root), cfg.name)
        return Kernel(name=cfg.name, config=cfg, entry=dict(entry), root=Path(root))

    def _active(self, name: str) -> list[dict[str, Any]]:
        out = []
        for f in self.faults:
            if not fnmatch.fnmatchcase(name, f.get("select", "*")):
                continue
            if not fnmatch.fnmatchcase(self.problem_label or "", f.get("problem", "*")):
                continue
            out.append(f)
        return out

    def run(self, kernel: Kernel, problem: GemmProblem, buffers: GemmBuffers) -> RunResult:
        cfg = kernel.config
        faults = self._active(kernel.name)
        kinds = {f["kind"]: f for f in faults}
        if "crash" in kinds:
            os._exit(int(kinds["crash"].get("code", 134)))
        if "hang" in kinds:
            time.sleep(float(kinds["hang"].get("seconds", 3600)))
        if "illegal_address" in kinds:
            raise CudaFault("cuCtxSynchronize failed: an illegal memory access was encountered")
        if "launch_error" in kinds:
            raise LaunchFailed("cuLaunchKernel failed: too many resources requested for launch")
        if "cannot_implement" in kinds:
            raise CannotImplement(f"{kernel.name}: EMITTER_CANNOT_IMPLEMENT (planted)")
        if problem.split_k > 1 and cfg.split_k == "none":
            raise CannotImplement(f"{kernel.name}: split-K is not enabled for this instance")
        if problem.batch > 1 and not cfg.batched:
            raise CannotImplement(f"{kernel.name}: batched problems are not enabled for this instance")
        if not cfg.source and problem.beta != 0.0:
            raise CannotImplement(f"{kernel.name}: no C operand (epilogue source: false), so beta must be 0, "
                                  f"not {problem.beta}")
        why = unsupported(cfg, problem.options)
        if why:
            raise CannotImplement(f"{kernel.name}: {why}")
        for dim, al, what in self._alignment_checks(cfg, problem):
            if dim % al:
                raise CannotImplement(f"{kernel.name}: {what}={dim} is not a multiple of the alignment {al}")

        p = problem.resolved(cfg)
        if "wrong_ld" in kinds:
            p = GemmProblem(p.m, p.n, p.k, p.batch, p.split_k, p.alpha, p.beta).resolved(cfg)
        row_a = cfg.row_major_a ^ ("swap_layout" in kinds)
        la = MatrixLayout(p.m, p.k, row_a, p.lda if row_a == cfg.row_major_a else (p.k if row_a else p.m),
                          p.batch, p.batch_stride_a)
        lb = MatrixLayout(p.k, p.n, cfg.row_major_b, p.ldb, p.batch, p.batch_stride_b)
        lc = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldc, p.batch, p.batch_stride_c)
        ld = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldd, p.batch, p.batch_stride_d)
        try:
            A = decode(la.gather(buffers.A), cfg.a)
            B = decode(lb.gather(buffers.B), cfg.b)
        except IndexError:
            raise CudaFault("an illegal memory access was encountered (fake: operand read out of bounds)") from None
        k_used = p.k - 1 if "skip_last_k" in kinds else p.k
        acc_t = np.float32 if cfg.accumulator in (DType.f32, DType.tf32, DType.f16, DType.bf16) else np.float64
        acc = np.matmul(A[:, :, :k_used].astype(acc_t), B[:, :k_used, :].astype(acc_t)).astype(np.float64)
        beta = 0.0 if "drop_beta" in kinds else p.beta
        z = p.alpha * acc
        if buffers.C is not None and beta != 0.0:   # beta != 0 never reaches a kernel without C (refused above)
            z = z + beta * decode(lc.gather(buffers.C), cfg.c)
        if cfg.bias != "none" and buffers.bias is not None:
            vec = decode(buffers.bias, cfg.c)
            z = z + (vec[None, :, None] if cfg.bias == "row" else vec[None, None, :])
        act = cfg.activation
        if "wrong_activation" in kinds:
            act = kinds["wrong_activation"].get("activation") or ("identity" if act == "relu" else "relu")
        from emitter.verify.reference import apply_activation

        z = apply_activation(z, act, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
        if "noise" in kinds:
            rng = np.random.default_rng(0)
            z = z * (1.0 + float(kinds["noise"].get("eps", 1e-3)) * rng.standard_normal(z.shape))
        vals = encode(z, cfg.d)
        if "wrong" in kinds:
            f = kinds["wrong"]
            b, i, j = f.get("at", [-1, -1, -1])
            vals[b, i, j] = encode(np.array(decode(vals[b, i, j], cfg.d) + float(f.get("delta", 1.0))), cfg.d)
        if "nan" in kinds:
            b, i, j = kinds["nan"].get("at", [-1, -1, -1])
            vals[b, i, j] = encode(np.array(np.nan), cfg.d) if cfg.d.is_float else vals[b, i, j]
        poison = poison_value(cfg.d)
        if "unwritten" in kinds:
            f = kinds["unwritten"]
            if f.get("row"):
                vals[:, -1, :] = poison
            else:
                b, i, j = f.get("at", [-1, -1, -1])
                vals[b, i, j] = poison
        out = buffers.D.copy()
        try:
            ld.scatter(out, vals)
        except IndexError:
            raise CudaFault("an illegal memory access was encountered (fake: D written out of bounds)") from None
        return RunResult(D=out, time_ms=None, launch={"grid": [1, 1, 1], "block": [1, 1, 1], "cluster": [1, 1, 1],
                                                       "shared_bytes": 0, "params_bytes": 0, "params_align": 0,
                                                       "workspace_bytes": 0})

    @staticmethod
    def _alignment_checks(cfg: GemmConfig, p: GemmProblem) -> list[tuple[int, int, str]]:
        checks = [
            (p.k if cfg.row_major_a else p.m, cfg.alignment_a, "A's contiguous extent"),
            (p.n if cfg.row_major_b else p.k, cfg.alignment_b, "B's contiguous extent"),
            (p.n if cfg.row_major_c else p.m, cfg.alignment_c, "C's contiguous extent"),
        ]
        for ld, al, what in ((p.lda, cfg.alignment_a, "lda"), (p.ldb, cfg.alignment_b, "ldb"),
                             (p.ldc, cfg.alignment_c, "ldc"), (p.ldd, cfg.alignment_c, "ldd")):
            if ld:
                checks.append((ld, al, what))
        return checks
