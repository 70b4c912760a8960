"""Profile records: what one (kernel or baseline, problem) measurement produced, as plain JSON data.

Failures are results: a kernel that cannot run a problem, fails its correctness check or faults gets a
record with its status and reason, and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from emitter.profile.config import problem_from_json
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


def op_of(entry: Mapping[str, Any]) -> Any:
    """The op of a manifest entry, from its family's run-time hooks (profile_op of its config)."""
    from emitter.runtime.backend import family_config

    hooks, cfg = family_config(entry)
    return hooks.profile_op(cfg)


def op_from_json(d: dict[str, Any]) -> Any:
    """A profile op from its JSON (to_json), by the family it names (the default family's without one)."""
    from emitter.families.registry import entry_family, runtime_family

    return runtime_family(entry_family(d), need=("profile_op_from_json",)).profile_op_from_json(d)


def min_bytes(op: Any, p: Any, beta: float) -> int | None:
    """The fewest bytes a kernel of `op` must move on problem `p`: its family's profile_min_bytes hook (None
    without one: no GB/s column)."""
    from emitter.families.registry import DEFAULT_FAMILY, runtime_family

    hook = getattr(runtime_family(getattr(type(op), "FAMILY", DEFAULT_FAMILY), need=()), "profile_min_bytes", None)
    return hook(op, p, beta) if hook else None


def launch_label(name: str, split_k: int = 1, options: int = 0) -> str:
    """A kernel as launched: `<name>`, plus `@splitk<n>` above 1 slice and `@<options>` (`@swz4_rastern`) when set."""
    from emitter.kit.scheduler import SchedulerOptions

    out = name if split_k == 1 else f"{name}@splitk{split_k}"
    return out + (f"@{SchedulerOptions.decode(options).label().replace(' ', '_')}" if options else "")


@dataclass
class Measurement:
    kind: str                       # "kernel" | "baseline"
    name: str                       # instance name, or the baseline's name ("cublas")
    provider: str                   # "emitter" | "torch.matmul (cuBLAS)" | "torch._scaled_mm (cuBLASLt)"
    op: Any            # the family's profile op (RuntimeFamily.profile_op)
    problem: Any       # the family's profile problem
    status: str = OK
    reason: str | None = None
    gpu: int = 0
    manifest: str | None = None
    stats: TimingStats | None = None
    check: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # rotation sets, working set, iterations...
    split_k: int = 1                # split-K slices the kernel ran with (split_k: serial instances sweep it)
    options: int = 0                # run-time scheduler options it ran with (emitter.kit.scheduler; 0 = none)

    @property
    def label(self) -> str:
        """What ran: the instance, plus its split-K slice count when it is above 1 (`<name>@splitk4`) and its
        run-time scheduler options when set (`<name>@swz4_rastern`)."""
        return launch_label(self.name, self.split_k, self.options)

    @property
    def options_label(self) -> str:
        from emitter.kit.scheduler import SchedulerOptions
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
