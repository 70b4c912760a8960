"""Run-time tile-scheduler options: one int a launch carries (the problem struct's `options`; 0 = the choices
compiled into the instance), parsed from `emitter verify --scheduler`, a profile config's `scheduler:` sweep and a
tuning entry's `options`, and labelled in launch names (`<name>@swz4_rastern`):

    bits 0-3   swizzle        k > 0: max_swizzle_size = 1 << (k - 1)   (1, 2, 4, 8)
    bits 4-5   raster         1 heuristic, 2 along M, 3 along N         (the caller's M and N, also under swap_ab)
    bits 6-7   reduction      1 deterministic, 2 nondeterministic      (stream-K / serial split-K only)
    bits 8-15  promotion      fp8 full accumulation: promote every N wgmma k-steps (1..255)

Which options an instance takes is its family's business (RuntimeFamily.with_options; GEMM:
emitter/families/gemm/options.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from emitter.errors import EmitterError

SWIZZLES = (1, 2, 4, 8)
RASTERS = ("heuristic", "along_m", "along_n")
REDUCTIONS = ("deterministic", "nondeterministic")
_RASTER_ALIASES = {"m": "along_m", "n": "along_n", "along_m": "along_m", "along_n": "along_n",
                   "heuristic": "heuristic"}
_REDUCTION_ALIASES = {"deterministic": "deterministic", "det": "deterministic",
                      "nondeterministic": "nondeterministic", "nondet": "nondeterministic"}


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
