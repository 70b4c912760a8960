"""The facts about a manifest GEMM instance that running and checking it need, parsed from its `config`
(the GEMM family's run-time config: emitter.families.gemm.runtime.config_from_entry).

The manifest is the contract (docs/architecture.md): runtime and verify read `config` (GemmInstance.config()
as JSON), never the YAML and never the .cu text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

from emitter.dtypes import DType
from emitter.errors import ManifestError

ACTIVATIONS = ("identity", "relu", "gelu", "silu", "sigmoid", "clamp")


@dataclass(frozen=True)
class GemmConfig:
    FAMILY: ClassVar[str] = "gemm"

    name: str
    arch: str
    a: DType
    b: DType
    c: DType
    d: DType
    accumulator: DType
    epilogue_compute: DType
    row_major_a: bool
    row_major_b: bool
    row_major_c: bool
    op_class: str
    tile: tuple[int, int, int]
    alignment_a: int
    alignment_b: int
    alignment_c: int
    activation: str = "identity"
    bias: str = "none"             # none | row (length M) | column (length N)
    clamp_min: float = 0.0
    clamp_max: float = 6.0
    split_k: str = "none"          # none | serial | parallel
    batched: bool = False
    gelu: str = "erf"              # which GELU the epilogue computes: erf (CUTLASS GELU) or tanh (GELU_taylor)
    fast_accum: bool = False       # fp8 fast accumulation (KernelTmaWarpSpecialized*FP8FastAccum)
    swap_ab: bool = False          # sm90a: the kernel computes D^T = B^T A^T; `tile` is over (N, M, K)
    stream_k: bool = False         # sm90a: on the stream-K scheduler (stream-K or serial split-K): has a reduction
    promotion_interval: int = 0    # sm90a fp8 full accumulation: k-steps between promotions (0: no promotion)
    promotion_overlap: bool = False  # ... by emitter's overlapped collective (its compiled interval only)
    # sm90a, the compiled-in tile-scheduler choices (options.launch_key models what they resolve to)
    cluster: tuple[int, int, int] | None = None   # the kernel's cluster (over (N, M) when swap_ab), None on 2.x
    persistent: bool = False       # on CUTLASS's persistent tile scheduler (not stream-K)
    swizzle: int = 1               # max_swizzle_size
    raster: str = "heuristic"      # heuristic | along_m | along_n, in the caller's terms
    source: bool = True            # False: no C operand (sm90a `epilogue: {source: false}`): beta must be 0

    @property
    def problem_tile(self) -> tuple[int, int, int]:
        """The CTA tile over the caller's (M, N, K): a swap_ab kernel's tile m runs along N."""
        tm, tn, tk = self.tile
        return (tn, tm, tk) if self.swap_ab else (tm, tn, tk)

    @property
    def layout_letters(self) -> str:
        return "".join("t" if r else "n" for r in (self.row_major_a, self.row_major_b, self.row_major_c))

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], root: str | Path | None = None) -> "GemmConfig":
        """Parse a manifest entry. With `root` (the manifest dir) a GELU instance's source is read to tell
        CUTLASS's erf GELU from GELU_taylor (the tanh form), which the manifest config does not record."""
        name = str(entry.get("name", "?"))
        cfg = entry.get("config")
        if not isinstance(cfg, Mapping):
            raise ManifestError(f"instance {name}: manifest entry has no config")
        if entry.get("family", "gemm") != "gemm":
            raise ManifestError(f"instance {name}: family {entry.get('family')!r} is not supported by verify (gemm)")

        def dt(key: str, default: str | None = None) -> DType:
            text = cfg.get(key, default)
            try:
                return DType.parse(str(text))
            except KeyError:
                raise ManifestError(f"instance {name}: config.{key}={text!r} is not a known dtype "
                                    f"({', '.join(DType.names())})") from None

        def layout(key: str) -> bool:
            v = cfg.get(key)
            if v not in ("row", "col"):
                raise ManifestError(f"instance {name}: config.{key}={v!r} must be row or col")
            return v == "row"

        ep = cfg.get("epilogue") or {}
        act = str(ep.get("activation", "identity"))
        if act not in ACTIVATIONS:
            raise ManifestError(f"instance {name}: epilogue activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
        tile = tuple(int(x) for x in (cfg.get("tile") or (128, 128, 32)))
        acc = dt("accumulator", "f32")
        return cls(
            name=name,
            arch=str(entry.get("arch", cfg.get("arch", "?"))),
            a=dt("a"), b=dt("b"), c=dt("c"), d=dt("d", cfg.get("c")),
            accumulator=acc,
            epilogue_compute=dt("epilogue_compute", acc.yaml),
            row_major_a=layout("layout_a"), row_major_b=layout("layout_b"), row_major_c=layout("layout_c"),
            op_class=str(cfg.get("op_class", "tensorop")),
            tile=(tile[0], tile[1], tile[2]),
            alignment_a=int(cfg.get("alignment_a") or 1),
            alignment_b=int(cfg.get("alignment_b") or 1),
            alignment_c=int(cfg.get("alignment_c") or 1),
            activation=act,
            bias=str(ep.get("bias", "none")),
            clamp_min=float(ep.get("clamp_min", 0.0)),
            clamp_max=float(ep.get("clamp_max", 6.0)),
            split_k=str(cfg.get("split_k", "none")),
            batched=bool(cfg.get("batched", False)),
            gelu=str(ep.get("gelu", cfg.get("gelu", "")) or _gelu_variant(root, entry, act)),
            fast_accum=bool(cfg.get("fp8_fast_accum", False)),
            swap_ab=bool(cfg.get("swap_ab", False)),
            stream_k=cfg.get("tile_scheduler") == "stream_k" or cfg.get("split_k") == "serial",
            promotion_interval=int(cfg.get("promotion_interval") or 0),
            promotion_overlap=cfg.get("promotion") == "overlap",
            cluster=tuple(int(x) for x in cfg["cluster"]) if cfg.get("cluster") else None,  # type: ignore[arg-type]
            persistent=cfg.get("tile_scheduler") == "persistent" and cfg.get("split_k", "none") == "none",
            swizzle=int(cfg.get("swizzle") or 1),
            raster=str(cfg.get("raster") or "heuristic"),
            source=bool(ep.get("source", True)),
        )


def _gelu_variant(root: str | Path | None, entry: Mapping[str, Any], activation: str) -> str:
    if activation != "gelu" or root is None or not entry.get("source"):
        return "erf"
    try:
        text = (Path(root) / str(entry["source"])).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "erf"
    return "tanh" if "GELU_taylor" in text else "erf"
