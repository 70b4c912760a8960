"""Which run-time tile-scheduler options (emitter.kit.scheduler: `emitter_gemm_problem.options`, ABI version 3) a
GEMM instance takes, and which of them launch alike.

One compiled CUTLASS 3.x kernel takes its scheduler's swizzle and raster order, its stream-K reduction mode
and its fp8 promotion interval as run-time Arguments, so one instance can run with any of them; the spec keys
of the same names (`swizzle`, `raster`, `schedule.reduction`, `schedule.promotion_interval`) only set what
is compiled in as the default.

The sm90a host shim (templates/gemm/sm90a/device.cu.j2) applies them and answers EMITTER_CANNOT_IMPLEMENT
where the kernel has no such choice; 2.x instances refuse any nonzero value. `unsupported` says the same
from a manifest config, without a GPU (the fake backend and the planners use it).
"""

from __future__ import annotations

from typing import Any

from emitter.kit.scheduler import OptionsError, SchedulerOptions

FP8_K_STEP_BYTES = 32     # one fp8 wgmma k-step: 32 elements of one byte


def unsupported(cfg: Any, options: int) -> str | None:
    """Why an instance (a GEMM family config) cannot run with `options`, or None: the shim's refusals."""
    if not options:
        return None
    try:
        o = SchedulerOptions.decode(options)
    except OptionsError as e:
        return str(e)
    if getattr(cfg, "arch", "") != "sm90a":
        return (f"run-time scheduler options ({o.label()}) are arguments of CUTLASS 3.x (sm90a) kernels; "
                f"{getattr(cfg, 'name', 'this')} is {getattr(cfg, 'arch', '?')}")
    if o.reduction == "nondeterministic" and not getattr(cfg, "stream_k", False):
        return "reduction=nondeterministic needs a stream-K or serial split-K instance (nothing to reduce here)"
    if o.promotion_interval is not None:
        interval = getattr(cfg, "promotion_interval", 0)
        if not interval:
            return "promotion_interval needs an fp8 full-accumulation instance (nothing is promoted here)"
        if getattr(cfg, "promotion_overlap", False) and o.promotion_interval != interval:
            return (f"promotion_interval={o.promotion_interval}: the overlapped-promotion mainloop promotes once per "
                    f"k-tile, at its compiled interval ({interval})")
        tile_k = cfg.tile[2]
        steps = max(tile_k // FP8_K_STEP_BYTES, 1)
        if o.promotion_interval % steps:
            return (f"promotion_interval={o.promotion_interval} is not a multiple of the {steps} wgmma k-steps of "
                    f"one {tile_k}-deep k-block (CUTLASS's can_implement)")
    return None


def unsupported_config(arch: str, config: dict[str, Any], options: int) -> str | None:
    """unsupported() for a manifest entry's `config` (the library exporter's view of a kernel)."""
    from emitter.families.gemm.config import GemmConfig

    if not options:
        return None
    name = str(config.get("name", "this kernel"))
    return unsupported(GemmConfig.from_entry({"name": name, "arch": arch, "config": config}), options)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _log_swizzle(ctas_m: int, ctas_n: int, max_swizzle: int) -> int:
    """CUTLASS's PersistentTileSchedulerSm90Params::get_log_swizzle_size: the swizzle the scheduler uses."""
    smaller = min(ctas_m, ctas_n)
    if max_swizzle >= 8 and smaller >= 6:
        return 3
    if max_swizzle >= 4 and smaller >= 3:
        return 2
    if max_swizzle >= 2 and smaller >= 2:
        return 1
    return 0


def launch_key(cfg: Any, m: int, n: int, options: int) -> tuple[Any, ...] | None:
    """What an sm90a kernel on CUTLASS's persistent tile scheduler makes of `options` on an M x N problem:
    (log2 of the swizzle it uses, the raster order it walks in the kernel's terms, the promotion interval).
    Two option sets with the same key are the same launch, so a sweep times one of them. The scheduler caps
    the swizzle by the smaller side of the tile grid (swizzle 8 needs at least 6 tiles a side, 4 needs 3) and
    resolves `heuristic` to along M when the grid has more columns than rows (tile_scheduler_params.h,
    CUTLASS 4.2). None where this is not modelled (2.x kernels, the stream-K scheduler): time every variant."""
    modelled = getattr(cfg, "arch", "") == "sm90a" and getattr(cfg, "persistent", False)
    if not modelled or not getattr(cfg, "cluster", None):
        return None
    o = SchedulerOptions.decode(options) if options else SchedulerOptions()
    swizzle = o.swizzle if o.swizzle is not None else int(cfg.swizzle)
    raster = o.raster if o.raster is not None else str(cfg.raster)
    km, kn = (n, m) if cfg.swap_ab else (m, n)
    blocks_m = _round_up(-(-km // cfg.tile[0]), cfg.cluster[0])
    blocks_n = _round_up(-(-kn // cfg.tile[1]), cfg.cluster[1])
    log = _log_swizzle(blocks_m, blocks_n, swizzle)
    blocks_m = _round_up(blocks_m, (1 << log) * cfg.cluster[0])
    blocks_n = _round_up(blocks_n, (1 << log) * cfg.cluster[1])
    if raster == "heuristic":
        order = "along_m" if blocks_n > blocks_m else "along_n"
    else:   # the caller's M is a swap_ab kernel's N
        order = {"along_m": "along_n", "along_n": "along_m"}[raster] if cfg.swap_ab else raster
    interval = o.promotion_interval if o.promotion_interval is not None else getattr(cfg, "promotion_interval", 0)
    return (log, order, interval)


def distinct(cfg: Any, m: int, n: int, variants: list[int] | tuple[int, ...]) -> list[int]:
    """`variants` without those that launch like an earlier one (launch_key); order kept, the first wins."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for v in variants:
        key = launch_key(cfg, m, n, v)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        out.append(v)
    return out
