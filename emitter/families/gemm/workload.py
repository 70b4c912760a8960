"""GEMM's profile workload: device-resident operands for one (op, problem), shared by every kernel of that op and the baseline.

`ProblemData` allocates `sets` rotated input sets (A, B, C when beta != 0, D, bias) in PyCUDA memory,
fills them with random values (never zeros) from a seed that depends only on the op and the problem, so
every kernel and the cuBLAS baseline read the same data, and the correctness reference is computed once.
`KernelLaunch` turns a kernel loaded by the runtime Backend into a launch on set i: the host shim fills
one Params block per set (their pointers differ), packed once, and each launch is one cuLaunchKernel of
the instance's entry with those Params by value (emitter/kit/launcher.py).

The runtime's Backend.run copies host buffers in and D out around a single launch (the verifier's need);
timing needs device-resident rotated buffers and back-to-back launches, so this module composes the
Backend's loaded Kernel (its host shim and cubin function) instead of calling run().
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emitter.dtypes import DType
from emitter.families.gemm.config import GemmConfig
from emitter.families.gemm.layout import MatrixLayout
from emitter.families.gemm.problem import GemmProblem
from emitter.families.gemm.profile import Op, Problem
from emitter.kit import prepare
from emitter.kit import workspace as wsr
from emitter.kit.failures import CannotImplement, CudaFault, LaunchFailed
from emitter.kit.hostdata import storage_dtype
from emitter.kit.launcher import DriverError

_WS_MARK = wsr.MARK                # workspace bytes before initialize(): what it zeroes shows up as 0
_WS_SCAN_LIMIT = wsr.SCAN_LIMIT    # larger workspaces are zeroed whole before each launch

_STICKY = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
           "illegal instruction", "invalid program counter", "device-side assert", "hardware stack error",
           "launch timed out", "launch timeout", "context is destroyed", "uncorrectable")


def is_sticky(text: str) -> bool:
    t = text.lower()
    return any(s in t for s in _STICKY)


def op_config(op: Op) -> GemmConfig:
    """A GemmConfig carrying the op's facts (layouts, dtypes, epilogue) for sizes and references."""
    entry = {"name": f"op_{op.key}", "family": "gemm", "arch": "?",
             "config": {"a": op.a, "b": op.b, "c": op.c, "d": op.d, "accumulator": op.accumulator,
                        "layout_a": op.layout_a, "layout_b": op.layout_b, "layout_c": op.layout_c,
                        "epilogue": {"activation": op.activation, "bias": op.bias},
                        "fp8_fast_accum": op.fast_accum}}
    return GemmConfig.from_entry(entry)


def gemm_problem(p: Problem, alpha: float, beta: float) -> GemmProblem:
    return GemmProblem(p.m, p.n, p.k, batch=p.batch, alpha=alpha, beta=beta)


@dataclass(frozen=True)
class Layouts:
    A: MatrixLayout
    B: MatrixLayout
    C: MatrixLayout
    D: MatrixLayout


def layouts(cfg: GemmConfig, gp: GemmProblem) -> Layouts:
    p = gp.resolved(cfg)
    return Layouts(
        A=MatrixLayout(p.m, p.k, cfg.row_major_a, p.lda, p.batch, p.batch_stride_a),
        B=MatrixLayout(p.k, p.n, cfg.row_major_b, p.ldb, p.batch, p.batch_stride_b),
        C=MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldc, p.batch, p.batch_stride_c),
        D=MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldd, p.batch, p.batch_stride_d),
    )


def set_bytes(op: Op, p: Problem, beta: float) -> int:
    cfg = op_config(op)
    lay = layouts(cfg, gemm_problem(p, 1.0, beta))
    n = lay.A.elements() * cfg.a.bytes + lay.B.elements() * cfg.b.bytes + lay.D.elements() * cfg.d.bytes
    if beta != 0:
        n += lay.C.elements() * cfg.c.bytes
    if cfg.bias != "none":
        n += (p.m if cfg.bias == "row" else p.n) * cfg.c.bytes
    return n


def data_seed(op: Op, p: Problem) -> int:
    text = f"{op.a}{op.b}{op.c}{op.d}{op.layout}{op.bias}|{p.key}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


@dataclass
class OperandSet:
    A: int
    B: int
    C: int          # 0 when beta == 0
    D: int
    bias: int       # 0 when the op has no bias


@dataclass
class ProblemData:
    op: Op
    problem: Problem
    alpha: float
    beta: float
    sets: list[OperandSet]
    cfg: GemmConfig
    lay: Layouts
    arena: Any
    reference: Any = None          # cached correctness reference (check.py)
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def gp(self) -> GemmProblem:
        return gemm_problem(self.problem, self.alpha, self.beta)

    @property
    def working_set_bytes(self) -> int:
        return len(self.sets) * set_bytes(self.op, self.problem, self.beta)

    @classmethod
    def allocate(cls, op: Op, problem: Problem, alpha: float, beta: float, sets: int) -> "ProblemData":
        from emitter.kit.arena import DeviceArena

        cfg = op_config(op)
        lay = layouts(cfg, gemm_problem(problem, alpha, beta))
        arena = DeviceArena(seed=data_seed(op, problem))
        out = []
        try:
            for _ in range(sets):
                a = arena.alloc(lay.A.elements() * cfg.a.bytes)
                arena.fill_random(a, cfg.a, lay.A.elements())
                b = arena.alloc(lay.B.elements() * cfg.b.bytes)
                arena.fill_random(b, cfg.b, lay.B.elements())
                c = 0
                if beta != 0:
                    c = arena.alloc(lay.C.elements() * cfg.c.bytes)
                    arena.fill_random(c, cfg.c, lay.C.elements())
                bias = 0
                if cfg.bias != "none":
                    nb = problem.m if cfg.bias == "row" else problem.n
                    bias = arena.alloc(nb * cfg.c.bytes)
                    arena.fill_random(bias, cfg.c, nb)
                d = arena.alloc(lay.D.elements() * cfg.d.bytes)
                arena.fill_random(d, cfg.d, lay.D.elements())
                out.append(OperandSet(a, b, c, d, bias))
        except Exception:
            arena.free()
            raise
        return cls(op, problem, alpha, beta, out, cfg, lay, arena)

    def free(self) -> None:
        self.arena.free()
        if self.reference is not None:
            self.reference = None
            import torch   # the reference came from torch: give its cached blocks back for the next problem

            torch.cuda.empty_cache()
        self.cache.clear()


class KernelLaunch:
    """One loaded kernel prepared on every operand set of a ProblemData.

    workspace_reset (profile config timing.workspace_reset, emitter/kit/workspace.py): "library" (default)
    re-zeroes, on the stream before every launch, the workspace bytes initialize() zeroed, as the exported library's
    call path does (it runs initialize() on every call); "settled" drops that memset where one launch leaves those
    bytes zeroed (the kernel alone). The mode and what it led to are in self.info (the measurement's record)."""

    def __init__(self, kernel: Any, data: ProblemData, stream: Any, split_k: int = 1, options: int = 0,
                 workspace_reset: str = wsr.DEFAULT) -> None:
        import pycuda.driver as drv

        from emitter.families.gemm.abi import EmitterGemmProblem

        self.mode = wsr.check_mode(workspace_reset)
        self.drv = drv
        self.kernel = kernel
        self.data = data
        self.stream = stream
        h = kernel.handle or {}
        if "shim" not in h or "fn" not in h:
            raise LaunchFailed(f"{kernel.name}: the backend's kernel handle has no host shim / function "
                               "(profiling needs the PyCUDA backend)")
        shim, fn = h["shim"], h["fn"]
        p = data.gp.resolved(kernel.config)
        self.launches: list[tuple[tuple[int, int, int], tuple[int, int, int], bytes, int]] = []
        # (pointer, bytes) of workspace that initialize() zeroes and every launch must find zeroed again: re-zeroed
        # on the stream before each launch, as the library's initialize() does on every call (and CUTLASS's own
        # device adapter in every run()); in "settled" mode not where one launch leaves them zeroed
        # (_settle_workspaces)
        self.resets: list[tuple[int, int] | None] = []
        self.info: dict[str, Any] = {}
        self._allocs: list[Any] = []
        self.fn = fn
        self._handle = int(stream.handle)
        self.workspace_bytes = 0
        try:
            for s in data.sets:
                prob = EmitterGemmProblem(
                    m=p.m, n=p.n, k=p.k, batch_count=p.batch, split_k_slices=max(int(split_k), 1), options=int(options),
                    A=s.A or None, B=s.B or None, C=s.C or None, D=s.D or None, bias=s.bias or None,
                    lda=p.lda, ldb=p.ldb, ldc=p.ldc, ldd=p.ldd,
                    batch_stride_A=p.batch_stride_a, batch_stride_B=p.batch_stride_b,
                    batch_stride_C=p.batch_stride_c, batch_stride_D=p.batch_stride_d,
                    alpha=p.alpha, beta=p.beta)
                q = prepare.query(shim, prob, kernel.name, refusal=f"can_implement is false for {data.problem.key}")
                ws, ws_bytes = 0, int(q.workspace_bytes)
                self.workspace_bytes = max(self.workspace_bytes, ws_bytes)
                if ws_bytes > 0:        # one workspace per set: a set's state is its own
                    buf = drv.mem_alloc(ws_bytes)
                    self._allocs.append(buf)
                    ws = int(buf)
                    wsr.mark(drv, ws, ws_bytes)
                entry, launch = prepare.initialize(shim, fn, prob, ws, stream.handle, q, kernel.name,
                                                   refusal=f"initialize: can_implement is false for {data.problem.key}")
                self.launches.append(entry)
                self.resets.append(self._zeroed_range(ws, ws_bytes) if ws_bytes else None)
                self.info = launch.as_dict()
            stream.synchronize()            # workspace initialisation on the stream
            self.info.update(wsr.describe(self.mode, any(r is not None for r in self.resets), self.resets,
                                          self.workspace_bytes))
            if self.mode == "settled":      # "library": the memset before every launch, as the library issues it
                self._settle_workspaces()
        except (drv.Error, DriverError) as e:
            self.free()
            raise (CudaFault if is_sticky(str(e)) else LaunchFailed)(f"{kernel.name}: {e}") from None
        except Exception:
            self.free()
            raise

    def _settle_workspaces(self) -> None:
        """`settled` mode: drop the per-launch re-zeroing where one launch leaves the zeroed bytes at zero again.

        emitter's sm90a stream-K / split-K scheduler (templates/common/sm90_stream_k.cu.j2) sets each tile lock back to
        zero when the tile is done, as does any launch that needed no lock; then the next launch finds the workspace
        as initialize() left it, and the memset on the stream (1.0-3.0 us a launch on an H100 where splits were
        reduced, benchmarks/workspace_reset.py) is what the library adds, not the kernel. One launch per set, read
        back: the bytes still zero -> no reset for that set. A kernel that leaves its locks counted up keeps the
        memset. The profiler's check after the timed launches (worker.py) runs on the workspace the timed launches
        left behind."""
        zeroed = any(r is not None for r in self.resets)
        wsr.settle(self.drv, self.fn, self.stream, self._handle, self.launches, self.resets)
        self.info.update(wsr.describe(getattr(self, "mode", "settled"), zeroed, self.resets, self.workspace_bytes))

    def _zeroed_range(self, ws: int, ws_bytes: int) -> tuple[int, int] | None:
        """Which bytes of the workspace initialize() set to zero (they were marked before it ran)."""
        return wsr.zeroed_range(self.drv, self.stream, ws, ws_bytes)

    def __call__(self, i: int) -> None:
        j = i % len(self.launches)
        grid, block, packed, shared = self.launches[j]
        wsr.before_launch(self.drv, self.stream, self.resets[j])
        self.fn.launch(grid, block, shared, self._handle, packed)

    def free(self) -> None:
        for a in self._allocs:
            try:
                a.free()
            except Exception:
                pass
        self._allocs.clear()


def storage_of(dt: DType) -> np.dtype:
    return storage_dtype(dt)
