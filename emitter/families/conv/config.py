"""ConvConfig: what running and checking one conv instance needs, read from its manifest entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from emitter.dtypes import DType
from emitter.errors import EmitterError


class ConvManifestError(EmitterError):
    exit_code = 2


_OPS = ("fprop", "dgrad", "wgrad")
_KERNELS = ("implicit", "gemm_1x1", "depthwise_direct", "depthwise_simt")
_GROUP_MODES = ("none", "single", "multiple")


@dataclass(frozen=True)
class ConvConfig:
    FAMILY: ClassVar[str] = "conv"

    name: str
    arch: str
    op: str
    dims: int
    a: DType
    c: DType
    accumulator: DType
    alignment_a: int
    alignment_b: int
    alignment_c: int
    tile: tuple[int, int, int]
    iterator: str = "optimized"
    stride_support: str = "strided"
    split_k: str = "none"
    activation: str = "identity"
    bias: bool = False
    clamp_min: float = 0.0
    clamp_max: float = 6.0
    kernel: str = "implicit"        # implicit | gemm_1x1 (sm90a 1x1 conv as a persistent GEMM)
    scheduler: str = "auto"         # gemm_1x1: persistent | stream_k
    group_mode: str = "none"        # none | single | multiple (sm80 grouped fprop)
    # depthwise_direct: the compiled filter (R, S), stride and dilation ((0, 0) = any); () for other kernels
    stages: int = 0                 # as resolved (depthwise_direct: the shared memory a run-time stride needs)
    filter: tuple[int, ...] = ()
    conv_stride: tuple[int, ...] = ()
    conv_dilation: tuple[int, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def from_entry(entry: Mapping[str, Any], root: Any = None) -> "ConvConfig":
        name = str(entry.get("name", "?")) if isinstance(entry, Mapping) else "?"
        cfg = entry.get("config") if isinstance(entry, Mapping) else None
        if not isinstance(cfg, Mapping):
            raise ConvManifestError(f"instance {name}: manifest entry has no config mapping")

        def get(key: str, kind: type, allowed: tuple = ()) -> Any:
            v = cfg.get(key)
            if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool or (allowed and v not in allowed):
                raise ConvManifestError(f"instance {name}: config key {key!r} = {v!r} is not valid"
                                        + (f" (allowed: {', '.join(map(str, allowed))})" if allowed else ""))
            return v

        def dtype(key: str) -> DType:
            try:
                return DType.parse(get(key, str))
            except KeyError:
                raise ConvManifestError(f"instance {name}: config key {key!r} = {cfg.get(key)!r} is no data type") from None

        ep = cfg.get("epilogue") if isinstance(cfg.get("epilogue"), Mapping) else {}
        tile = get("tile", list)
        if len(tile) != 3 or not all(isinstance(v, int) and v > 0 for v in tile):
            raise ConvManifestError(f"instance {name}: config key 'tile' = {tile!r} is not three positive integers")
        return ConvConfig(
            name=name, arch=get("arch", str), op=get("op", str, _OPS), dims=get("dims", int, (2, 3)),
            a=dtype("a"), c=dtype("c"), accumulator=dtype("accumulator"),
            alignment_a=get("alignment_a", int), alignment_b=get("alignment_b", int),
            alignment_c=get("alignment_c", int), tile=tuple(tile),
            iterator=str(cfg.get("iterator", "optimized")), stride_support=str(cfg.get("stride_support", "strided")),
            split_k=str(cfg.get("split_k", "none")), activation=str(ep.get("activation", "identity")),
            bias=bool(ep.get("bias", False)), clamp_min=float(ep.get("clamp_min", 0.0)),
            clamp_max=float(ep.get("clamp_max", 6.0)),
            kernel=get("kernel", str, _KERNELS) if "kernel" in cfg else "implicit",
            scheduler=str(cfg.get("scheduler", "auto")),
            group_mode=get("group_mode", str, _GROUP_MODES) if "group_mode" in cfg else "none",
            stages=int(cfg.get("stages") or 0) if isinstance(cfg.get("stages", 0), int) else 0,
            filter=_pair(name, cfg, "filter"), conv_stride=_pair(name, cfg, "conv_stride"),
            conv_dilation=_pair(name, cfg, "conv_dilation"), raw=dict(cfg))

    @property
    def cfg(self) -> dict[str, Any]:
        """The plain mapping problem.py / reference.py read."""
        return {"op": self.op, "arch": self.arch, "dims": self.dims, "alignment_a": self.alignment_a,
                "alignment_b": self.alignment_b, "alignment_c": self.alignment_c, "iterator": self.iterator,
                "stride_support": self.stride_support, "split_k": self.split_k, "kernel": self.kernel,
                "scheduler": self.scheduler, "group_mode": self.group_mode, "tile": list(self.tile),
                "stages": self.stages, "a": str(self.a), "accumulator": str(self.accumulator),
                "warp": self.raw.get("warp"),
                "filter": list(self.filter), "conv_stride": list(self.conv_stride),
                "conv_dilation": list(self.conv_dilation),
                "epilogue": {"activation": self.activation, "bias": self.bias, "clamp_min": self.clamp_min,
                             "clamp_max": self.clamp_max}}


def _pair(name: str, cfg: Mapping[str, Any], key: str) -> tuple[int, ...]:
    v = cfg.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                         for x in v):
        raise ConvManifestError(f"instance {name}: config key {key!r} = {v!r} is not two integers >= 0")
    return tuple(v)
