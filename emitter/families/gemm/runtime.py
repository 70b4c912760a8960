"""The GEMM family's run-time hooks (emitter.families.base.RuntimeFamily): what verify, profile and the
runtime backends call for a manifest entry with `family: gemm`. Each hook is a function of one of the
modules beside this one; this module only names them.

    config.py         GemmConfig (config_from_entry)
    problem.py        GemmProblem, labels, default problems, not_supported_reasons, user problem parsing
    inputs.py         make_inputs (random / small-integer operands, padded storage, D poisoned)
    reference.py      float64 reference, tolerances, compare (+ no stray writes)
    fake.py           the fake backend's independent computation and its planted faults
    abi.py            the host shim's emitter_gemm_problem (c_problem)
    workload.py       profile: device-resident rotated operand sets, KernelLaunch
    baselines.py      profile: cuBLAS through torch
    profile_check.py  profile: the check before a kernel's time counts
"""

from __future__ import annotations

from typing import Any, Mapping

from emitter.families.base import Footprint
from emitter.families.gemm.abi import c_problem  # noqa: F401
from emitter.families.gemm.baselines import BASELINES, baseline  # noqa: F401
from emitter.families.gemm.config import GemmConfig
from emitter.families.gemm.fake import FAKE_FAULTS, fake_run  # noqa: F401
from emitter.families.gemm.inputs import make_inputs  # noqa: F401
from emitter.families.gemm.problem import (  # noqa: F401
    DATA_KINDS, PROBLEM_KEYS, GemmProblem, default_problems, not_supported_reasons, parse_problem,
    problem_from_mapping, problem_label,
)
from emitter.families.gemm.profile import NAMED_SETS
from emitter.families.gemm.reference import compare_case as compare  # noqa: F401
from emitter.families.gemm.reference import reference_case as reference  # noqa: F401

NAME = "gemm"
PROBLEM_HELP = "GEMM `MxNxK`, `MxNxKxBATCH` or `m=1000,n=517,k=129,beta=0.5`"
DATA_HELP = "GEMM: int = small integers, exact, bit-for-bit; normal = random, dtype tolerance"
BASELINE_PROVIDERS = {"cublas": "cuBLAS via torch"}     # before a baseline ran; its launch then says exactly


def config_from_entry(entry: Mapping[str, Any], root: Any = None) -> GemmConfig:
    return GemmConfig.from_entry(entry, root)


def problem_from_dict(d: Mapping[str, Any]) -> GemmProblem:
    return GemmProblem.from_dict(d)


def problem_to_dict(p: GemmProblem) -> dict[str, Any]:
    return p.as_dict()


def resolve_problem(cfg: GemmConfig, p: GemmProblem) -> GemmProblem:
    """Packed (0) leading dimensions and batch strides replaced by their values for cfg's layouts."""
    return p.resolved(cfg)


def with_options(cfg: GemmConfig, p: GemmProblem, options: int) -> GemmProblem | str:
    """Run-time scheduler options on a problem, or why the instance has no such choice."""
    from dataclasses import replace

    from emitter.families.gemm.options import unsupported

    why = unsupported(cfg, options)
    return why if why else replace(p, options=options)


def flops(cfg: GemmConfig, p: GemmProblem) -> int:
    return 2 * p.batch * p.m * p.n * p.k


def footprint(cfg: GemmConfig, p: GemmProblem) -> Footprint:
    """Bytes of one verify case, from sizes alone (integer arithmetic: no overflow, nothing allocated).

    device: A, B, C, D (with their leading dimensions and batch strides) and bias in their storage types.
    host: that storage, the float64 logical copies of A, B, C (and bias) the reference reads, the float64
    reference and the comparison's float64 temporaries of D's size (about six)."""
    r = p.resolved(cfg)

    def elements(rows: int, cols: int, row_major: bool, ld: int, bstride: int) -> int:
        if rows == 0 or cols == 0:
            return 0
        one = (rows - 1) * ld + cols if row_major else (cols - 1) * ld + rows
        return (r.batch - 1) * bstride + one

    ea = elements(r.m, r.k, cfg.row_major_a, r.lda, r.batch_stride_a)
    eb = elements(r.k, r.n, cfg.row_major_b, r.ldb, r.batch_stride_b)
    ec = elements(r.m, r.n, cfg.row_major_c, r.ldc, r.batch_stride_c)
    ed = elements(r.m, r.n, cfg.row_major_c, r.ldd, r.batch_stride_d)
    nbias = 0 if cfg.bias == "none" else (r.m if cfg.bias == "row" else r.n)
    device = ea * cfg.a.bytes + eb * cfg.b.bytes + ec * cfg.c.bytes + ed * cfg.d.bytes + nbias * cfg.c.bytes
    logical = r.batch * (r.m * r.k + r.k * r.n + r.m * r.n) + nbias
    host = device + 8 * logical + 8 * 7 * r.batch * r.m * r.n
    return Footprint(device=device, host=host)


# ---------------------------------------------------------------------------------------------- profile
def profile_op(cfg: GemmConfig) -> Any:
    from emitter.families.gemm.profile import Op

    def lay(row: bool) -> str:
        return "row" if row else "col"

    return Op(a=cfg.a.yaml, b=cfg.b.yaml, c=cfg.c.yaml, d=cfg.d.yaml, layout_a=lay(cfg.row_major_a),
              layout_b=lay(cfg.row_major_b), layout_c=lay(cfg.row_major_c), accumulator=cfg.accumulator.yaml,
              activation=cfg.activation, bias=cfg.bias, fast_accum=cfg.fast_accum)


def profile_set_bytes(op: Any, problem: Any, settings: Any) -> int:
    from emitter.families.gemm.workload import set_bytes

    return set_bytes(op, problem, settings.beta)


def profile_allocate(op: Any, problem: Any, settings: Any, sets: int) -> Any:
    from emitter.families.gemm.workload import ProblemData

    return ProblemData.allocate(op, problem, settings.alpha, settings.beta, sets)


def kernel_launch(kernel: Any, data: Any, stream: Any, **run_options: Any) -> Any:
    from emitter.families.gemm.workload import KernelLaunch

    return KernelLaunch(kernel, data, stream, **run_options)


def profile_poison(data: Any, set_index: int = 0) -> None:
    """Poison the outputs of operand set `set_index` (before the check launch)."""
    from emitter.families.gemm.profile_check import poison_d

    poison_d(data, set_index)


def profile_check(data: Any, cfg: Any, use_torch: bool, **run_options: Any) -> dict[str, Any]:
    from emitter.families.gemm.profile_check import check

    return check(data, cfg, use_torch, int(run_options.get("split_k", 1)))


def profile_problem(p: GemmProblem) -> Any:
    """The profile's problem for a parsed GEMM problem (sizes only: alpha and beta are the profile config's,
    leading dimensions and split-K the kernels'), or why it cannot be one."""
    from emitter.families.gemm.profile import Problem

    plain = GemmProblem(p.m, p.n, p.k, batch=p.batch)
    if p != plain:
        return ("profile problems are sizes only (m, n, k, batch): alpha and beta come from the profile config, "
                "leading dimensions and split-K from the kernels")
    return Problem(p.m, p.n, p.k, p.batch)


def profile_problem_from_dict(d: Mapping[str, Any]) -> Any:
    from emitter.families.gemm.profile import Problem

    return Problem.from_dict(dict(d))


def profile_op_from_json(d: Mapping[str, Any]) -> Any:
    from emitter.families.gemm.profile import Op

    return Op.from_json(dict(d))


def profile_min_bytes(op: Any, problem: Any, beta: float) -> int:
    from emitter.families.gemm.profile import min_bytes

    return min_bytes(op, problem, beta)


PROFILE_SETS = NAMED_SETS       # named problem sets (`--problem llm`, a profile YAML's `set: llm`)


def profile_named_set(name: str) -> list[Any]:
    from emitter.families.gemm.profile import named_set

    return named_set(name)


def profile_placeholder() -> Any:
    """The problem a profile record names for a kernel that could not load (no problem of its own ran)."""
    from emitter.families.gemm.profile import Problem

    return Problem(1, 1, 1)


def profile_variants(cfg: GemmConfig, problem: Any, options: list[int]) -> list[int]:
    """The scheduler option sets (profile config `scheduler`) the instance takes, distinct launches only."""
    from emitter.families.gemm.options import distinct, unsupported

    return distinct(cfg, problem.m, problem.n, [o for o in options if not unsupported(cfg, o)])


def profile_splits(cfg: GemmConfig, problem: Any, sm_count: int) -> list[int]:
    """The split-K slice counts a serial split-K instance is timed at ([1] for every other instance)."""
    from emitter.families.gemm.profile import split_k_candidates

    if cfg.split_k == "serial":
        return split_k_candidates(cfg.problem_tile, problem.m, problem.n, problem.k, problem.batch, sm_count)
    return [1]


def profile_fake_problem(cfg: Any, problem: Any, settings: Any, limit: int = 64, **run_options: Any) -> GemmProblem:
    """The fake profile engine's check problem: `problem` shrunk to at most `limit` per size."""
    return GemmProblem(min(problem.m, limit), min(problem.n, limit), min(problem.k, limit), batch=problem.batch,
                       alpha=settings.alpha, beta=settings.beta, split_k=int(run_options.get("split_k", 1)),
                       options=int(run_options.get("options", 0)))

# measured / modelled one-GPU profile seconds of this family's problems (emitter.profile.cost's queue order), from the
# 2026-11-27 2 x H200 run of scripts/multigpu_check.sh (docs/scale-out.md): its measurements ran faster than the model's 300 TFLOP/s
PROFILE_COST_FACTOR = 0.63
