"""A random point in the GEMM spec space (shared by the property tests and the compile sample)."""

from __future__ import annotations

import random
from typing import Any


def draw_spec(rng: random.Random, arch: str) -> dict[str, Any]:
    c = rng.choice
    act = c(["identity", "identity", "relu", "gelu", "silu", "sigmoid", "clamp"])
    spec: dict[str, Any] = {"arch": arch, "layout": c(["tn", "tn", "nn", "nt", "tt"])}
    if arch == "sm90a":
        dt = c(["bf16", "bf16", "f16", "e4m3", "e5m2", "f32", "s8"])
        if dt in ("e4m3", "e5m2"):
            spec["dtype"] = {"a": dt, "b": dt, "d": c(["bf16", "f16", dt])}
        else:
            spec["dtype"] = dt
        spec["tile"] = [c([64, 128, 256]), c([64, 128, 192, 256]), c([32, 64, 128])]
        spec["cluster"] = c(["1x1x1", "2x1x1", "1x2x1", "2x2x1", "4x1x1"])
        spec["schedule"] = {"kernel": c(["auto", "cooperative", "pingpong"]),
                            "tile_scheduler": c(["persistent", "persistent", "stream_k"])}
        if dt in ("e4m3", "e5m2") or rng.random() < 0.05:   # elsewhere: rejected (fp8-fast-accum)
            spec["schedule"]["fp8_fast_accum"] = c([False, True])
            if rng.random() < 0.3:   # rejected (promotion-interval-fp8-only) with fast accumulation or cp.async
                spec["schedule"]["promotion_interval"] = c([4, 8, 12, 16])
            if rng.random() < 0.3:   # emitter's overlapped promotion: rejected where nothing is promoted,
                spec["schedule"]["promotion"] = "overlap"   # past 192 registers, or off one k-tile's interval
        spec["stages"] = c(["auto", "auto", 2, 3, 4, 5, 7])
        if rng.random() < 0.15:
            spec["swap_ab"] = True
            spec["tile"][1] = c([16, 32, 64, 128])      # what swap_ab is for: a few rows as the kernel's N
        if rng.random() < 0.2:                            # the tile scheduler's arguments, set by the host shim
            spec["swizzle"] = c([1, 2, 4, 8])
            spec["raster"] = c(["heuristic", "along_m", "along_n"])
            if rng.random() < 0.5:   # rejected (reduction-needs-stream-k) unless stream-K or split-K
                spec["schedule"]["reduction"] = "nondeterministic"
    else:
        dt = c(["f16", "f16", "bf16", "f32", "f64", "s8"])
        spec["dtype"] = dt
        tk = c([16, 32, 64])
        tm, tn = c([64, 128, 256]), c([64, 128, 256])
        spec["tile"] = [tm, tn, tk]
        spec["warp"] = [c([32, 64, tm]), c([32, 64, tn]), tk]
        spec["stages"] = c([2, 3, 4, 5, 6])
        spec["swizzle"] = c([1, 2, 4, 8])
    spec["epilogue"] = {"activation": act, "bias": c(["none", "none", "row", "column"])}
    if rng.random() < 0.15:
        spec["batched"] = True
    elif rng.random() < 0.1:
        spec["split_k"] = "serial"
    return spec
