"""Fresh inputs for one conv case: random normal or small integers (never zeros), the output poisoned."""

from __future__ import annotations

import numpy as np

from emitter.dtypes import DType
from emitter.families.base import Inputs
from emitter.families.conv.problem import ConvProblem
from emitter.kit import hostdata


def make_inputs(cfg, p: ConvProblem, data: str, seed: int) -> Inputs:
    """Buffers x, w, y (5-D NDHWC / KTRSC / NZPQK storage), source (beta != 0), bias; the op's output poisoned.
    `cfg` is a ConvConfig."""
    rng = np.random.default_rng(seed)
    in_dt = DType.f32 if cfg.a in (DType.tf32, DType.f32) else cfg.a
    out_name = {"fprop": "y", "dgrad": "x", "wgrad": "w"}[cfg.op]
    values: dict[str, np.ndarray] = {}
    buffers: dict[str, np.ndarray | None] = {}
    for name in ("x", "w", "y"):
        shape = p.shape(name)
        if name == out_name:
            buffers[name] = np.full(shape, hostdata.poison_value(cfg.c), dtype=hostdata.storage_dtype(cfg.c))
            continue
        if data == "int":
            v = rng.integers(-2, 3, size=shape).astype(np.float64)
        else:
            v = rng.standard_normal(shape)
        v = hostdata.quantize(v, in_dt if cfg.a is not DType.tf32 else DType.tf32)
        values[name] = v
        buffers[name] = hostdata.encode(v, in_dt)
    for name in ("x", "w", "y"):      # the output's logical value is not an input
        values.setdefault(name, np.zeros(p.shape(name)))
    if p.beta != 0.0:
        src = rng.integers(-2, 3, size=p.shape(out_name)).astype(np.float64) if data == "int" else rng.standard_normal(p.shape(out_name))
        src = hostdata.quantize(src, cfg.c)
        values["source"] = src
        buffers["source"] = hostdata.encode(src, cfg.c)
    else:
        buffers["source"] = None
    if p.bias:
        b = hostdata.quantize(rng.standard_normal(p.k), cfg.c)
        values["bias"] = b
        buffers["bias"] = hostdata.encode(b, cfg.c)
    else:
        buffers["bias"] = None
    return Inputs(buffers=buffers, outputs=(out_name,), values=values, exact=False,
                  info={"int_range": [-2, 2]} if data == "int" else {})
