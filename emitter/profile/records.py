"""Profile records: what one (kernel or baseline, problem) measurement produced, as plain JSON data.

Failures are results: a kernel that cannot run a problem, fails its correctness check or faults gets a
record with its status and reason, and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from emitter.profile.config import Problem, problem_from_json
from emitter.profile.stats import TimingStats

# statuses
OK = "ok"
NOT_APPLICABLE = "not_applicable"   # can_implement said no (alignment, batch, shape)
CHECK_FAILED = "check_failed"       # ran, but the result was wrong: its time does not count
FAILED = "failed"                   # load / launch / shim error
FAULT = "fault"                     # the worker died on it (a CUDA fault poisons the context)
UNAVAILABLE = "unavailable"         # baseline: torch missing or dtype unsupported
PRUNED = "pruned"                   # correct, but its probe launch took > timing.prune x the best so far: not timed
STATUSES = (OK, NOT_APPLICABLE, CHECK_FAILED, FAILED, FAULT, UNAVAILABLE, PRUNED)

_LETTER = {"row": "t", "col": "n"}


@dataclass(frozen=True)
class Op:
    """What a GEMM kernel computes, apart from the problem size: the key kernels are compared under (the GEMM
    family's profile op: emitter.families.gemm.runtime.profile_op)."""

    FAMILY: ClassVar[str] = "gemm"

    a: str
    b: str
    c: str
    d: str
    layout_a: str
    layout_b: str
    layout_c: str
    accumulator: str = "f32"
    activation: str = "identity"
    bias: str = "none"
    fast_accum: bool = False      # sm90a fp8 fast accumulation: different numerics, so its own op

    @property
    def layout(self) -> str:
        """BLAS letters, A row-major = t: 'tn' + output letter (t = row-major D)."""
        return _LETTER[self.layout_a] + _LETTER[self.layout_b] + _LETTER[self.layout_c]

    @property
    def key(self) -> str:
        parts = [f"{self.a}{self.b}", f"{self.c}{self.d}", f"acc{self.accumulator}", self.layout]
        if self.activation != "identity":
            parts.append(self.activation)
        if self.bias != "none":
            parts.append(f"bias{self.bias}")
        if self.fast_accum:
            parts.append("fastacc")
        return "_".join(parts)

    @property
    def fused_epilogue(self) -> bool:
        return self.activation != "identity" or self.bias != "none"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "c": self.c, "d": self.d, "layout_a": self.layout_a,
                "layout_b": self.layout_b, "layout_c": self.layout_c, "accumulator": self.accumulator,
                "activation": self.activation, "bias": self.bias, "fast_accum": self.fast_accum,
                "layout": self.layout, "key": self.key}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Op":
        return cls(**{k: d[k] for k in ("a", "b", "c", "d", "layout_a", "layout_b", "layout_c")},
                   accumulator=d.get("accumulator", "f32"), activation=d.get("activation", "identity"),
                   bias=d.get("bias", "none"), fast_accum=bool(d.get("fast_accum", False)))

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "Op":
        """The op of a manifest instance's `config` (GemmInstance.config(): fast accumulation is
        `fp8_fast_accum`)."""
        ep = cfg.get("epilogue") or {}
        return cls(a=cfg["a"], b=cfg["b"], c=cfg["c"], d=cfg["d"], layout_a=cfg["layout_a"],
                   layout_b=cfg["layout_b"], layout_c=cfg["layout_c"], accumulator=cfg.get("accumulator", "f32"),
                   activation=ep.get("activation", "identity"), bias=ep.get("bias", "none"),
                   fast_accum=bool(cfg.get("fp8_fast_accum", False)))


def op_of(entry: Mapping[str, Any]) -> Any:
    """The op of a manifest entry, from its family's run-time hooks (profile_op of its config)."""
    from emitter.runtime.backend import family_config

    hooks, cfg = family_config(entry)
    return hooks.profile_op(cfg)


_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "tf32": 4, "f64": 8, "s8": 1, "s32": 4, "e4m3": 1, "e5m2": 1}


def op_from_json(d: dict[str, Any]) -> Any:
    """A profile op from its JSON (to_json): GEMM's Op, or the family's named by "family"."""
    family = d.get("family", "gemm")
    if family == "gemm":
        return Op.from_json(d)
    from emitter.families.registry import runtime_family

    return runtime_family(family, need=("profile_op_from_json",)).profile_op_from_json(d)


def min_bytes(op: Any, p: Any, beta: float) -> int | None:
    """The fewest bytes the GEMM must move: A and B read once, D written once, C read when beta != 0. Other
    families: their optional profile_min_bytes hook (None without one)."""
    if getattr(op, "FAMILY", "gemm") != "gemm":
        from emitter.families.registry import runtime_family

        hook = getattr(runtime_family(type(op).FAMILY, need=()), "profile_min_bytes", None)
        return hook(op, p, beta) if hook else None
    ab = (p.m * p.k * _BYTES[op.a] + p.k * p.n * _BYTES[op.b]) * p.batch
    d = p.m * p.n * _BYTES[op.d] * p.batch
    c = p.m * p.n * _BYTES[op.c] * p.batch if beta != 0 else 0
    bias = (p.m if op.bias == "row" else p.n if op.bias == "column" else 0) * _BYTES[op.c]
    return ab + c + d + bias


def launch_label(name: str, split_k: int = 1, options: int = 0) -> str:
    """A kernel as launched: `<name>`, plus `@splitk<n>` above 1 slice and `@<options>` (`@swz4_rastern`) when set."""
    from emitter.runtime.options import SchedulerOptions

    out = name if split_k == 1 else f"{name}@splitk{split_k}"
    return out + (f"@{SchedulerOptions.decode(options).label().replace(' ', '_')}" if options else "")


@dataclass
class Measurement:
    kind: str                       # "kernel" | "baseline"
    name: str                       # instance name, or the baseline's name ("cublas")
    provider: str                   # "emitter" | "torch.matmul (cuBLAS)" | "torch._scaled_mm (cuBLASLt)"
    op: Op
    problem: Problem
    status: str = OK
    reason: str | None = None
    gpu: int = 0
    manifest: str | None = None
    stats: TimingStats | None = None
    check: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # rotation sets, working set, iterations...
    split_k: int = 1                # split-K slices the kernel ran with (split_k: serial instances sweep it)
    options: int = 0                # run-time scheduler options it ran with (emitter.runtime.options; 0 = none)

    @property
    def label(self) -> str:
        """What ran: the instance, plus its split-K slice count when it is above 1 (`<name>@splitk4`) and its
        run-time scheduler options when set (`<name>@swz4_rastern`)."""
        return launch_label(self.name, self.split_k, self.options)

    @property
    def options_label(self) -> str:
        from emitter.runtime.options import SchedulerOptions
        return SchedulerOptions.decode(self.options).label() if self.options else ""

    @property
    def ok(self) -> bool:
        return self.status == OK and self.stats is not None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "provider": self.provider, "op": self.op.to_json(),
                "problem": self.problem.as_dict(), "status": self.status, "reason": self.reason, "gpu": self.gpu,
                "manifest": self.manifest, "stats": self.stats.to_json() if self.stats else None,
                "check": self.check, "extra": self.extra, "split_k": self.split_k, "options": self.options}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Measurement":
        return cls(kind=d["kind"], name=d["name"], provider=d.get("provider", ""), op=op_from_json(d["op"]),
                   problem=problem_from_json(d["problem"]), status=d.get("status", OK), reason=d.get("reason"),
                   gpu=d.get("gpu", 0), manifest=d.get("manifest"),
                   stats=TimingStats.from_json(d["stats"]) if d.get("stats") else None,
                   check=d.get("check"), extra=d.get("extra") or {}, split_k=int(d.get("split_k", 1) or 1),
                   options=int(d.get("options", 0) or 0))
