"""Run-time tile-scheduler options of an sm90a instance: `emitter_gemm_problem.options` (ABI version 3).

One compiled CUTLASS 3.x kernel takes its scheduler's swizzle and raster order, its stream-K reduction mode
and its fp8 promotion interval as run-time Arguments, so one instance can run with any of them; the spec keys
of the same names (`swizzle`, `raster`, `schedule.reduction`, `schedule.promotion_interval`) only set what
is compiled in as the default. `options` packs the overrides into one int (0 = none, the compiled-in choices):

    bits 0-3   swizzle        k > 0: max_swizzle_size = 1 << (k - 1)   (1, 2, 4, 8)
    bits 4-5   raster         1 heuristic, 2 along M, 3 along N         (the caller's M and N, also under swap_ab)
    bits 6-7   reduction      1 deterministic, 2 nondeterministic      (stream-K / serial split-K only)
    bits 8-15  promotion      fp8 full accumulation: promote every N wgmma k-steps (1..255)

The sm90a host shim (templates/gemm/sm90a/device.cu.j2) applies them and answers EMITTER_CANNOT_IMPLEMENT
where the kernel has no such choice; 2.x instances refuse any nonzero value. `unsupported` says the same
from a manifest config, without a GPU (the fake backend and the planners use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emitter.errors import EmitterError

SWIZZLES = (1, 2, 4, 8)
RASTERS = ("heuristic", "along_m", "along_n")
REDUCTIONS = ("deterministic", "nondeterministic")
_RASTER_ALIASES = {"m": "along_m", "n": "along_n", "along_m": "along_m", "along_n": "along_n",
                   "heuristic": "heuristic"}
_REDUCTION_ALIASES = {"deterministic": "deterministic", "det": "deterministic",
                      "nondeterministic": "nondeterministic", "nondet": "nondeterministic"}
FP8_K_STEP_BYTES = 32     # one fp8 wgmma k-step: 32 elements of one byte


class OptionsError(EmitterError):
    exit_code = 2


@dataclass(frozen=True)
class SchedulerOptions:
    """None = keep the instance's compiled-in choice."""

    swizzle: int | None = None
    raster: str | None = None
    reduction: str | None = None
    promotion_interval: int | None = None

    def __post_init__(self) -> None:
        if self.swizzle is not None and self.swizzle not in SWIZZLES:
            raise OptionsError(f"swizzle={self.swizzle!r}: use one of {', '.join(map(str, SWIZZLES))}")
        if self.raster is not None and self.raster not in RASTERS:
            raise OptionsError(f"raster={self.raster!r}: use one of {', '.join(RASTERS)}")
        if self.reduction is not None and self.reduction not in REDUCTIONS:
            raise OptionsError(f"reduction={self.reduction!r}: use one of {', '.join(REDUCTIONS)}")
        p = self.promotion_interval
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 255):
            raise OptionsError(f"promotion_interval={p!r}: use an integer 1..255 (wgmma k-steps)")

    @property
    def empty(self) -> bool:
        return self.encode() == 0

    def encode(self) -> int:
        v = 0
        if self.swizzle is not None:
            v |= SWIZZLES.index(self.swizzle) + 1
        if self.raster is not None:
            v |= (RASTERS.index(self.raster) + 1) << 4
        if self.reduction is not None:
            v |= (REDUCTIONS.index(self.reduction) + 1) << 6
        if self.promotion_interval is not None:
            v |= self.promotion_interval << 8
        return v

    @classmethod
    def decode(cls, value: int) -> "SchedulerOptions":
        if value < 0 or value & ~0xFFFF:
            raise OptionsError(f"options={value:#x}: only bits 0-15 are defined")
        swz, ras, red, promo = value & 0xF, (value >> 4) & 0x3, (value >> 6) & 0x3, (value >> 8) & 0xFF
        if swz > len(SWIZZLES) or red > len(REDUCTIONS):
            raise OptionsError(f"options={value:#x}: swizzle code {swz} / reduction code {red} is not defined")
        return cls(SWIZZLES[swz - 1] if swz else None, RASTERS[ras - 1] if ras else None,
                   REDUCTIONS[red - 1] if red else None, promo or None)

    @classmethod
    def parse(cls, text: str) -> "SchedulerOptions":
        """`swizzle=4,raster=along_n,reduction=nondet,promotion_interval=8` (any subset; `promotion` and `m`/`n`
        are accepted too); empty text = no options."""
        kw: dict[str, Any] = {}
        for part in (p.strip() for p in text.replace(" ", ",").split(",")):
            if not part:
                continue
            key, sep, val = part.partition("=")
            key, val = key.strip().lower(), val.strip().lower()
            if not sep or not val:
                raise OptionsError(f"scheduler option {part!r}: write key=value (swizzle, raster, reduction, "
                                   "promotion_interval)")
            if key == "swizzle" and val.isdigit():
                kw["swizzle"] = int(val)
            elif key == "raster" and val in _RASTER_ALIASES:
                kw["raster"] = _RASTER_ALIASES[val]
            elif key == "reduction" and val in _REDUCTION_ALIASES:
                kw["reduction"] = _REDUCTION_ALIASES[val]
            elif key in ("promotion_interval", "promotion") and val.isdigit():
                kw["promotion_interval"] = int(val)
            else:
                raise OptionsError(f"scheduler option {part!r}: allowed are swizzle=1|2|4|8, "
                                   "raster=heuristic|along_m|along_n, reduction=deterministic|nondeterministic, "
                                   "promotion_interval=N")
        return cls(**kw)

    def text(self) -> str:
        """The `parse` form (`swizzle=4,raster=along_n`; empty for no options): what `emitter verify --scheduler`
        and `emitter profile --options` read."""
        fields = (("swizzle", self.swizzle), ("raster", self.raster), ("reduction", self.reduction),
                  ("promotion_interval", self.promotion_interval))
        return ",".join(f"{k}={v}" for k, v in fields if v is not None)

    def label(self) -> str:
        """Name tokens, as in instance names (`swz4 rastern nondet promo8`); empty for no options."""
        parts = []
        if self.swizzle is not None:
            parts.append(f"swz{self.swizzle}")
        if self.raster is not None:
            parts.append({"heuristic": "rasterh", "along_m": "rasterm", "along_n": "rastern"}[self.raster])
        if self.reduction is not None:
            parts.append("det" if self.reduction == "deterministic" else "nondet")
        if self.promotion_interval is not None:
            parts.append(f"promo{self.promotion_interval}")
        return " ".join(parts)


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
    from emitter.runtime.backend import family_config

    if not options:
        return None
    name = str(config.get("name", "this kernel"))
    _hooks, cfg = family_config({"name": name, "family": "gemm", "arch": arch, "config": config})
    return unsupported(cfg, options)


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
