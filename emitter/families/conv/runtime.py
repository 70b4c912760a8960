"""The conv family's run-time hooks (emitter.families.base.RuntimeFamily): what verify, profile and the runtime
backends call for a manifest entry with `family: conv`. The profile hooks (PROFILE_HOOKS, cuDNN baseline) are in
profile.py; split_k_choices / profile_splits pick split-K slice counts per problem.

    config.py     ConvConfig (config_from_entry)
    problem.py    ConvProblem, labels, default problems, not_supported_reasons, problem strings
    inputs.py     make_inputs (random / small-integer tensors, output poisoned)
    reference.py  float64 reference (numpy; torch on a GPU), tolerance, compare
    fake.py       the fake backend's independent computation and its planted faults
    abi.py        the host shim's emitter_conv_problem (c_problem)
    profile.py    ConvOp, ConvProfileProblem, operand sets, ConvLaunch, the cuDNN baseline, the profile check
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from emitter.dtypes import DType
from emitter.families.base import Footprint, Inputs
from emitter.families.conv import fake as _fake
from emitter.families.conv import problem as _problem
from emitter.families.conv import reference as _reference
from emitter.families.conv.abi import c_problem_from
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.flops import conv_flops
from emitter.families.conv.inputs import make_inputs  # noqa: F401
from emitter.families.conv.problem import PROBLEM_KEYS, ConvProblem, parse_problem  # noqa: F401
from emitter.kit import hostdata
from emitter.kit.failures import CannotImplement

NAME = "conv"
DATA_KINDS = ("normal", "int")
FAKE_FAULTS = _fake.FAKE_FAULTS
BASELINES: tuple[str, ...] = ("cudnn",)
PROBLEM_HELP = ""       # the CLI help does not spell conv's syntax; docs/conv.md does
DATA_HELP = ""          # normal and int, as GEMM's, which the help states first


def config_from_entry(entry: Mapping[str, Any], root: Any = None) -> ConvConfig:
    return ConvConfig.from_entry(entry, root)


def problem_from_dict(d: Mapping[str, Any]) -> ConvProblem:
    return ConvProblem.from_dict(d)


def problem_to_dict(p: ConvProblem) -> dict[str, Any]:
    return p.as_dict()


def problem_label(p: ConvProblem, data: str) -> str:
    return p.label(data)


def problem_from_mapping(item: Mapping[str, Any], where: str, line: int | None, key_path: str) -> ConvProblem:
    clean = {k: v for k, v in item.items() if k not in ("data", "label")}
    return _problem.problem_from_mapping(clean, where, line, key_path)


def default_problems(cfg: ConvConfig, quick: bool = False) -> list[tuple[ConvProblem, str]]:
    return _problem.default_problems(cfg.cfg, quick)


def not_supported_reasons(cfg: ConvConfig, p: ConvProblem) -> list[str]:
    return _problem.not_supported_reasons(cfg.cfg, p)


def resolve_problem(cfg: ConvConfig, p: ConvProblem) -> ConvProblem:
    return p


def with_options(cfg: ConvConfig, p: ConvProblem, options: int) -> ConvProblem | str:
    return p if options == 0 else "conv instances have no run-time scheduler options"


SPLIT_K_MAX = 64             # serial split-K slices at most (each slice's epilogue waits for the one before it)
MIN_SLICE_K_ITERS = 8        # main-loop iterations a slice keeps at least


def _split_k_bounds(cfg: ConvConfig, p: ConvProblem) -> tuple[int, int]:
    """(output tiles, the most slices worth having) of cfg's implicit GEMM on p."""
    m, n, k = p.gemm(cfg.op)
    tm, tn, tk = cfg.tile
    tiles = -(-m // tm) * -(-n // tn)
    if cfg.split_k == "parallel" and cfg.op == "wgrad":   # sm90a tiles wgrad's N = (C, S, R, T) along C only
        cl = cfg.raw.get("cluster") or [1, 1, 1]          # and pads the tile counts to whole clusters
        tiles_m, tiles_n = -(-m // tm), -(-p.c // tn) * p.t * p.r * p.s
        tiles = -(-tiles_m // cl[0]) * cl[0] * -(-tiles_n // cl[1]) * cl[1]
    return tiles, max(1, min(SPLIT_K_MAX, -(-k // tk) // MIN_SLICE_K_ITERS))


def split_k_choices(cfg: ConvConfig, p: ConvProblem, sm_count: int = 132) -> list[int]:
    """Split-K slice counts worth timing for a split-K instance on p ([1] for any other instance), each slice
    keeping at least MIN_SLICE_K_ITERS tile-k iterations. wgrad's implicit GEMM (M = K, N = C*R*S, K-dim = N*P*Q)
    has few output tiles and a huge reduction: C64 K64 3x3 is 5 tiles of 128x128, so 1 slice leaves 127 of 132
    SMs idle.
    serial (sm80, one CTA a slice): the count that makes output tiles x slices fill one wave of `sm_count` CTAs,
    its half and its double.
    parallel (sm90a, a persistent grid of sm_count CTAs walking tiles x slices units): the most slices whose units
    fit one wave (floor: one unit more than the SMs is a second wave), its half and its double, and 1 -- the
    stream-K heuristic's own split of the k-tiles over the SMs."""
    if cfg.split_k == "serial":
        tiles, most = _split_k_bounds(cfg, p)
        wave = -(-max(sm_count, 1) // tiles)
        return sorted({max(1, min(most, s)) for s in (wave // 2, wave, 2 * wave)})
    if cfg.split_k == "parallel":
        tiles, most = _split_k_bounds(cfg, p)
        wave = max(1, max(sm_count, 1) // tiles)
        return sorted({1} | {max(1, min(most, s)) for s in (wave // 2, wave, 2 * wave)})
    return [1]


def choose_split_k(cfg: ConvConfig, p: ConvProblem, sm_count: int = 132) -> int:
    """The one slice count to run without timing: the one-wave count of split_k_choices (the library's
    conv_split_k in templates/conv/library/api.cpp.j2 computes the serial one)."""
    if cfg.split_k not in ("serial", "parallel"):
        return 1
    tiles, most = _split_k_bounds(cfg, p)
    if cfg.split_k == "parallel":
        return max(1, min(most, max(sm_count, 1) // tiles))
    return max(1, min(most, -(-max(sm_count, 1) // tiles)))


def profile_splits(cfg: ConvConfig, problem: Any, sm_count: int) -> list[int]:
    """The profile's split-K sweep (GEMM's optional hook of the same name)."""
    p = problem.conv if hasattr(problem, "conv") else problem
    return split_k_choices(cfg, p, sm_count)


def flops(cfg: ConvConfig, p: ConvProblem) -> int:
    return conv_flops(p)


def footprint(cfg: ConvConfig, p: ConvProblem) -> Footprint:
    elems = {t: math.prod(p.shape(t)) for t in ("x", "w", "y")}
    out = {"fprop": "y", "dgrad": "x", "wgrad": "w"}[cfg.op]
    dev = sum(elems.values()) * max(cfg.a.bytes, cfg.c.bytes) + (elems[out] * cfg.c.bytes if p.beta else 0)
    dev += p.k * cfg.c.bytes + (1 << 20)
    host = sum(elems.values()) * (8 * 3 + 4) + elems[out] * 8 * 3
    return Footprint(device=int(dev), host=int(host))


def reference(cfg: ConvConfig, p: ConvProblem, inputs: Inputs, device: str | None = None) -> np.ndarray:
    return _reference.reference(cfg.cfg, p, inputs.values, device)


def compare(cfg: ConvConfig, p: ConvProblem, inputs: Inputs, outputs: Mapping[str, np.ndarray],
            reference: np.ndarray) -> dict[str, Any]:
    name = inputs.outputs[0]
    got_storage = np.asarray(outputs[name])
    poison = hostdata.bits_of(np.asarray(hostdata.poison_value(cfg.c)).reshape(1))[0]
    poisoned = hostdata.bits_of(got_storage) == poison
    got = hostdata.decode(got_storage, cfg.c)
    m, n, k = p.gemm(cfg.op)
    tol = _reference.tolerance(cfg.c.yaml if cfg.a not in (DType.tf32,) else "tf32", k)
    if cfg.a is DType.bf16:
        tol = max(tol, _reference.tolerance("bf16", k))
    if not cfg.c.is_float:      # what the kernel's float -> int conversion writes: rounded, saturated
        reference = hostdata.quantize(reference, cfg.c)
        # every integer is a legal output (s8's poison 127 is where saturation lands): an element holding the
        # poison counts as unwritten only where the right answer is something else
        poisoned &= reference != hostdata.decode(np.asarray(hostdata.poison_value(cfg.c)).reshape(1), cfg.c)[0]
    return _reference.compare(got, reference, poisoned, tol)


def c_problem(cfg: ConvConfig, p: ConvProblem, pointers: Mapping[str, int]) -> Any:
    return c_problem_from(p, dict(pointers))


def fake_run(cfg: ConvConfig, p: ConvProblem, buffers: Mapping[str, Any],
             faults: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The output storage as a kernel would write it, computed by fake.py (independent of reference.py)."""
    why = not_supported_reasons(cfg, p)
    if why:
        raise CannotImplement(f"{cfg.name}: EMITTER_CANNOT_IMPLEMENT ({why[0]})")
    in_dt = DType.f32 if cfg.a is DType.tf32 else cfg.a
    vals = {t: hostdata.decode(np.asarray(buffers[t]), in_dt) for t in ("x", "w", "y") if buffers.get(t) is not None}
    out_name = {"fprop": "y", "dgrad": "x", "wgrad": "w"}[cfg.op]
    if cfg.op == "dgrad" and cfg.arch == "sm90a" and cfg.stride_support == "strided" and max(p.stride) > 1:
        acc = _fake.phased_dgrad(p, vals["w"], vals["y"], faults)     # the stride phases of sm90a's strided dgrad
    else:
        acc = _fake.fake_conv(cfg.op, p, vals.get("x"), vals.get("w"), vals.get("y"), faults)
    # the epilogue, written out here (not reference.py's): alpha, beta * source, bias, activation
    res = acc * p.alpha
    if p.beta != 0.0:
        res = res + p.beta * hostdata.decode(np.asarray(buffers["source"]), cfg.c)
    if p.bias:
        res = res + hostdata.decode(np.asarray(buffers["bias"]), cfg.c)[None, None, None, None, :]
    if cfg.activation == "relu":
        res = np.where(res > 0, res, 0.0)
    elif cfg.activation == "sigmoid":
        res = 1 / (1 + np.exp(-res))
    elif cfg.activation == "silu":
        res = res * (1 / (1 + np.exp(-res)))
    elif cfg.activation == "gelu":
        from math import erf, sqrt
        res = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in res.reshape(-1)]).reshape(res.shape)
    elif cfg.activation == "clamp":
        res = np.minimum(np.maximum(res, cfg.clamp_min), cfg.clamp_max)
    out = hostdata.encode(res, cfg.c)
    if "conv_row_short" in faults:
        keep = np.asarray(buffers[out_name]).copy()
        mask = _fake.row_short_mask(cfg.op, out.shape)
        out[mask] = keep[mask]
    return {out_name: out}


__all__ = ["NAME", "DATA_KINDS", "FAKE_FAULTS", "BASELINES", "PROBLEM_KEYS", "replace"]


# ---- profile (emitter.families.base.PROFILE_HOOKS): emitter/families/conv/profile.py
from emitter.families.conv.profile import (  # noqa: E402,F401
    BASELINE_PROVIDERS, ConvOp, ConvProfileProblem, baseline, kernel_launch, profile_allocate, profile_check,
    profile_fake_problem, profile_min_bytes, profile_op, profile_op_from_json, profile_poison, profile_problem,
    profile_problem_from_dict, profile_set_bytes,
)
from emitter.families.conv.profile import BASELINES  # noqa: E402,F401,F811

# measured / modelled one-GPU profile seconds of this family's problems (emitter.profile.cost's queue order), from the
# 2026-11-27 2 x H200 run of scripts/multigpu_check.sh (docs/scale-out.md): small problems: per-launch and reference costs dominate
PROFILE_COST_FACTOR = 4.05
