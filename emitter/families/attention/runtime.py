"""The attention family's run-time hooks (emitter.families.base.RuntimeFamily): what verify and the runtime
backends call for a manifest entry with `family: attention`. Each hook is a function of a module beside this
one; this module names them and adapts signatures.

    problem.py     AttentionProblem, the parser, not_supported_reasons
    inputs.py      make_inputs (normal / int / large), the storage layout
    reference.py   float64 reference (numpy; torch on the GPU machine)
    check.py       compare (where a case failed: heads, masked rows, LSE)
    fake.py        the fake backend's independent computation and its planted faults
    abi.py         the host shim's emitter_attention_problem (c_problem)
    flops.py       exact FLOPs over the unmasked pairs

    profile.py     profile: the profile problem (sizes + causal) and op, device-resident operand sets,
                   kernel launches, the torch SDPA baselines (cuDNN, flash, efficient), the check
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from emitter.errors import ManifestError, SpecError
from emitter.families.attention.abi import c_problem  # noqa: F401
from emitter.families.attention.check import compare  # noqa: F401
from emitter.families.attention.fake import FAKE_FAULTS
from emitter.families.attention.fake import fake_run as _fake_run
from emitter.families.attention.flops import flops as _flops
from emitter.families.attention.inputs import DATA_KINDS, make_inputs  # noqa: F401
from emitter.families.attention.model import AttentionInstance
from emitter.families.attention.problem import (
    PROBLEM_KEYS as _KEYS, AttentionProblem, ProblemError, make_problem, parse_problem_text,
)
from emitter.families.attention.problem import not_supported_reasons as _reasons
from emitter.families.attention.reference import reference  # noqa: F401
from emitter.families.attention.profile import (  # noqa: F401
    BASELINE_PROVIDERS, BASELINES, baseline, kernel_launch, profile_allocate, profile_applies, profile_check,
    profile_fake_problem,
    profile_min_bytes, profile_op, profile_op_from_json, profile_poison, profile_problem, profile_problem_from_dict,
    profile_set_bytes,
)
from emitter.families.base import Footprint

NAME = "attention"
PROBLEM_HELP = "attention e.g. `b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128`"
DATA_HELP = "attention also large"                # int and normal as GEMM's, which the help states first
PROBLEM_KEYS = _KEYS + ("data", "label")


@dataclass(frozen=True)
class AttentionConfig:
    """A manifest attention entry: its name, arch (manifest spelling) and the AttentionInstance its config
    describes; other attributes (dtype, mask, lse, tile_kv, ...) read through to the instance."""

    FAMILY = "attention"
    name: str
    arch: str
    instance: AttentionInstance = field(repr=False)

    def __getattr__(self, key: str) -> Any:        # only for names the dataclass lacks
        if key == "instance":
            raise AttributeError(key)
        return getattr(self.instance, key)


def config_from_entry(entry: Mapping[str, Any], root: Any = None) -> AttentionConfig:
    name = str(entry.get("name", "?")) if isinstance(entry, Mapping) else "?"
    cfg = entry.get("config") if isinstance(entry, Mapping) else None
    if not isinstance(cfg, Mapping):
        raise ManifestError(f"instance {name}: `config` must be a mapping (re-run `emitter emit`)")
    try:
        inst = AttentionInstance.from_config(dict(cfg))
    except (KeyError, ValueError, TypeError) as e:
        raise ManifestError(f"instance {name}: unreadable attention config ({type(e).__name__}: {e}); "
                            f"re-run `emitter emit`") from None
    return AttentionConfig(name=name, arch=inst.arch.yaml, instance=inst)


# ---------------------------------------------------------------------------------------------- problems
def problem_from_dict(d: Mapping[str, Any]) -> AttentionProblem:
    return AttentionProblem.from_dict(d)


def problem_to_dict(p: AttentionProblem) -> dict[str, Any]:
    return p.to_dict()


def problem_label(p: AttentionProblem, data: str) -> str:
    return f"{p.label()}_{data}" if data else p.label()


def parse_problem(text: str, where: str = "<command line>") -> list[dict[str, Any]]:
    try:
        d = parse_problem_text(text)
    except ValueError as e:
        raise SpecError(f"bad attention problem {text!r}: {e}", file=where, key_path="--problem", value=text,
                        allowed="b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128[,dv=..][,scale=..][,layout=bhsd][,causal]; varlen: "
                                "lq=100:37,lk=120:40", fix="comma-separated key=value pairs") from None
    return [d]


def problem_from_mapping(item: Mapping[str, Any], where: str, line: int | None, key_path: str,
                         key_lines: Mapping[str, int] | None = None) -> AttentionProblem:
    unknown = [k for k in item if k not in _KEYS]
    if unknown:
        raise SpecError(f"unknown attention problem key {unknown[0]!r}", file=where, line=line,
                        key_path=f"{key_path}.{unknown[0]}", value=unknown[0], allowed=PROBLEM_KEYS,
                        fix="remove it or fix its spelling")
    kw = dict(item)
    for k in ("seqlens_q", "seqlens_k"):
        if isinstance(kw.get(k), list):
            kw[k] = tuple(kw[k])
    try:
        return make_problem(**kw)
    except (ProblemError, TypeError) as e:
        raise SpecError(f"bad attention problem: {e}", file=where, line=line, key_path=key_path, value=dict(item),
                        fix="give hq, d and b/sq/sk (or seqlens_q/seqlens_k)") from None


def default_problems(cfg: AttentionConfig, quick: bool = False) -> list[tuple[AttentionProblem, str]]:
    """The default verify set: sequence lengths that are not tile multiples (nor multiples of 8: one query
    row, 77, 33), seq_q != seq_k both ways (both causal alignments see rows with few or no keys: under
    causal_bottom_right with seq_q > seq_k the leading rows see none), GQA groups (MQA too) on GQA instances,
    a run-time scale, both data kinds plus large magnitudes, padded rows (strides that are not packed, and
    stray writes into the padding caught: the LSE padding sits right after the last query row); varlen
    instances get ragged cu_seqlens with an empty sequence. quick: small sizes only (CI / fake backend)."""
    d, dv, lay = cfg.head_dim, cfg.head_dim_v, cfg.layout.value
    hq, hkv = (8, 2) if cfg.gqa else (4, 4)
    out: list[tuple[AttentionProblem, str]] = []

    def P(data: str, **kw: Any) -> None:
        kw.setdefault("heads_q", hq)
        kw.setdefault("heads_kv", hkv)
        out.append((make_problem(head_dim=d, head_dim_v=dv, layout=lay, **kw), data))

    if cfg.varlen:
        P("normal", seqlens_q=(1, 77, 130, 64), seqlens_k=(5, 77, 97, 0))
        P("int", seqlens_q=(33, 3), seqlens_k=(65, 200), scale=0.25)
        P("large", seqlens_q=(100, 64), seqlens_k=(100, 129))
        if cfg.gqa:
            P("normal", heads_kv=1, seqlens_q=(17, 50), seqlens_k=(70, 3))
        if cfg.arch == "sm80":      # padded rows: any strides, and nothing written outside the rows
            P("normal", seqlens_q=(20, 45), seqlens_k=(33, 0), pad=8)
        if not quick:
            P("normal", seqlens_q=(1000, 513, 2), seqlens_k=(1000, 1024, 700))
        return out
    P("normal", batch=2, seq_q=77, seq_k=77)
    P("normal", batch=1, seq_q=100, seq_k=130, scale=0.3)
    P("normal", batch=2, seq_q=130, seq_k=65)
    P("int", batch=2, seq_q=64, seq_k=129)
    P("large", batch=1, seq_q=96, seq_k=200)
    P("normal", batch=3, seq_q=1, seq_k=300)         # one query row (decode) against a ragged key length
    P("int", batch=2, seq_q=150, seq_k=3)            # bottom-right: all but the last 3 rows see no key
    if cfg.gqa:
        P("normal", batch=1, heads_q=4, heads_kv=1, seq_q=33, seq_k=47)
    # padded rows (8 elements: sm90a's TMA strides stay 16-byte multiples): any strides, nothing written
    # outside the rows
    P("normal", batch=2, seq_q=50, seq_k=70, scale=0.2, pad=8)
    # key lengths that are tile multiples: the only ones a key_tail-false instance runs (and the no-tail path
    # of every other instance); seq_q != seq_k both ways, a run-time scale, both data kinds, GQA
    tkv = cfg.tile_kv
    P("normal", batch=2, seq_q=100, seq_k=2 * tkv)
    P("int", batch=1, seq_q=3 * tkv + 5, seq_k=tkv, scale=0.25)
    P("large", batch=1, seq_q=41, seq_k=3 * tkv)
    P("normal", batch=2, seq_q=1, seq_k=tkv)
    if cfg.gqa:
        P("normal", batch=1, heads_q=4, heads_kv=1, seq_q=33, seq_k=tkv)
    if not quick:
        P("normal", batch=2, seq_q=1000, seq_k=1000)
        P("normal", batch=1, seq_q=513, seq_k=2048, scale=0.1)
        P("normal", batch=1, seq_q=2049, seq_k=2047)
    return out


def not_supported_reasons(cfg: AttentionConfig, p: AttentionProblem) -> list[str]:
    return _reasons(cfg, p)


def resolve_problem(cfg: AttentionConfig, p: AttentionProblem) -> AttentionProblem:
    return p


def with_options(cfg: AttentionConfig, p: AttentionProblem, options: int) -> AttentionProblem | str:
    return p if options == 0 else "attention instances have no run-time scheduler options"


def footprint(cfg: AttentionConfig, p: AttentionProblem) -> Footprint:
    e = p.elements()
    size = cfg.dtype.bytes
    dev = (e["q"] + e["k"] + e["v"] + e["o"]) * size + e["lse"] * 4
    if max(cfg.head_dim, cfg.head_dim_v) > cfg.tile_kv:         # sm80 multi-pass: f32 accumulator workspace (an upper bound)
        dev += e["o"] * 4
    pairs = sum(sq * sk for sq, sk in p.lengths()) * p.heads_q
    host = dev + 8 * (e["q"] + e["k"] + e["v"] + 3 * e["o"] + 2 * e["lse"]) + 8 * 4 * pairs
    return Footprint(device=dev, host=host)


def flops(cfg: AttentionConfig, p: AttentionProblem) -> int:
    return _flops(cfg, p)


# ---------------------------------------------------------------------------------------------- backends
def fake_run(cfg: AttentionConfig, p: AttentionProblem, buffers: Mapping[str, Any],
             faults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return _fake_run(cfg, p, buffers, faults)


__all__ = ["NAME", "DATA_KINDS", "PROBLEM_KEYS", "FAKE_FAULTS", "BASELINES", "AttentionConfig", "config_from_entry",
           "problem_from_dict", "problem_to_dict", "problem_label", "parse_problem", "problem_from_mapping",
           "default_problems", "not_supported_reasons", "resolve_problem", "with_options", "footprint", "flops",
           "make_inputs", "reference", "compare", "c_problem", "fake_run", "BASELINE_PROVIDERS", "baseline",
           "kernel_launch", "profile_allocate", "profile_applies", "profile_check", "profile_fake_problem", "profile_min_bytes",
           "profile_op", "profile_op_from_json", "profile_poison", "profile_problem", "profile_problem_from_dict",
           "profile_set_bytes"]


# ---------------------------------------------------------------------------------------------- op: backward
# A manifest config with `op: backward` is an attention backward instance: the hooks below take it to
# emitter/families/attention/backward_runtime.py (same problems and labels; its own inputs, reference, check,
# shim struct and fake computation); forward configs go where they always went.
import functools as _functools  # noqa: E402

from emitter.families.attention import backward_runtime as _bwd_rt  # noqa: E402

FAKE_FAULTS = tuple(FAKE_FAULTS) + _bwd_rt.BACKWARD_FAULTS
_forward_config_from_entry = config_from_entry


def config_from_entry(entry: Mapping[str, Any], root: Any = None):  # noqa: F811
    cfg = entry.get("config") if isinstance(entry, Mapping) else None
    if isinstance(cfg, Mapping) and cfg.get("op") == "backward":
        return _bwd_rt.config_from_entry(entry, root)
    return _forward_config_from_entry(entry, root)


def _by_op(name: str):
    forward, backward = globals()[name], getattr(_bwd_rt, name)

    @_functools.wraps(forward)
    def hook(cfg, *args, **kwargs):
        return (backward if _bwd_rt.is_backward(cfg) else forward)(cfg, *args, **kwargs)
    return hook


for _name in ("default_problems", "not_supported_reasons", "footprint", "flops", "make_inputs", "reference",
              "compare", "c_problem", "fake_run"):
    globals()[_name] = _by_op(_name)
_fake_run_by_op = fake_run


def fake_run(cfg, p, buffers, faults):  # noqa: F811
    """Each op's fake sees only its own planted faults (a plan may name both kinds for a mixed manifest)."""
    mine = set(_bwd_rt.BACKWARD_FAULTS)
    keep = {k: v for k, v in dict(faults or {}).items() if (k in mine) == _bwd_rt.is_backward(cfg)}
    return _fake_run_by_op(cfg, p, buffers, keep)


# profile: a backward instance has its own op (BackwardProfileOp) and its measurements their own problem (the
# forward's sizes and key, 2.5x its FLOPs); the hooks go to backward_profile.py by the op, the operand sets or the
# config they are handed
from emitter.families.attention import backward_profile as _bwd_prof  # noqa: E402

profile_op = _by_op("profile_op")
_fwd_profile = {name: globals()[name] for name in (
    "profile_op_from_json", "profile_applies", "profile_problem_from_dict", "profile_min_bytes", "profile_set_bytes",
    "profile_allocate", "profile_poison", "profile_check", "kernel_launch", "baseline", "profile_fake_problem")}


def profile_op_from_json(d: Mapping[str, Any]):  # noqa: F811
    return _bwd_rt.BackwardProfileOp.from_json(d) if d.get("op") == "backward" else _fwd_profile["profile_op_from_json"](d)


def profile_problem_from_dict(d: Mapping[str, Any]):  # noqa: F811
    return _bwd_prof.problem_from_dict(d)


def profile_op_problem(op, problem):
    """The problem a measurement of `op` on `problem` carries (the profile stage asks once per op and problem)."""
    return _bwd_prof.op_problem(op, problem)


def _by_profile_op(name: str):
    forward, backward = _fwd_profile[name], getattr(_bwd_prof, name)

    @_functools.wraps(forward)
    def hook(op, *args, **kwargs):
        return (backward if _bwd_prof.is_backward_op(op) else forward)(op, *args, **kwargs)
    return hook


def _by_data(name: str, position: int):
    forward, backward = _fwd_profile[name], getattr(_bwd_prof, name)

    @_functools.wraps(forward)
    def hook(*args, **kwargs):
        return (backward if isinstance(args[position], _bwd_prof.BackwardData) else forward)(*args, **kwargs)
    return hook


for _name in ("profile_applies", "profile_min_bytes", "profile_set_bytes", "profile_allocate"):
    globals()[_name] = _by_profile_op(_name)
for _name, _pos in (("profile_poison", 0), ("profile_check", 0), ("kernel_launch", 1), ("baseline", 1)):
    globals()[_name] = _by_data(_name, _pos)


def profile_fake_problem(cfg, problem, settings, limit: int = 64, **run_options):  # noqa: F811
    hook = _bwd_prof.profile_fake_problem if _bwd_rt.is_backward(cfg) else _fwd_profile["profile_fake_problem"]
    return hook(cfg, problem, settings, limit, **run_options)


__all__ += ["profile_op_problem"]

# measured / modelled one-GPU profile seconds of this family's problems (emitter.profile.cost's queue order), from the
# 2026-11-27 2 x H200 run of scripts/multigpu_check.sh (docs/scale-out.md): as modelled
PROFILE_COST_FACTOR = 0.98
