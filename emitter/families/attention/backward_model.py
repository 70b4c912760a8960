"""The attention backward instance record: one fully resolved fused multi-head attention backward kernel
(dQ, dK, dV from Q, K, V, O, dO and the forward's LSE), and its one deterministic name.

A spec entry with `op: backward` (emitter/families/attention/backward_spec.py) expands into candidate
AttentionBackwardInstance records; the arch module (attention/backward_sm80.py: CUTLASS examples/41's
kernel_backward.h, the xFormers backward) resolves them or returns a Rejection naming the rule and the fix.
Run-time facts (sizes, scale, strides, cu_seqlens) are the problem's, as for the forward
(attention/problem.py, templates/attention/common/attention_backward_abi.h). The instance fixes:

  dtype          Q/K/V/O/dO and dQ/dK/dV element type (f16, bf16); accumulation, LSE and rowsum(dO*O) f32
  head_dim       D of Q and K; head_dim_v: D of V, O and dO
  tile_q         queries per step of the key loop (upstream's kBlockSizeI)
  tile_kv        keys per block (kBlockSizeJ): the block that holds its dK / dV
  mask           none | causal_top_left | causal_bottom_right (the forward's alignments)
  layout         bshd | bhsd: the packed layout a problem gets when it gives no strides
  gqa            heads_kv may divide heads_q: dK / dV of a KV head summed over its query heads
  varlen         variable sequence lengths (cu_seqlens)
  deterministic  True: one block per (batch, query head) walks every key block, so the dQ partials of a query
                 block are added in key order and the same inputs give the same bits; False: the key blocks
                 are split over several blocks that add their dQ partials under a lock in arrival order
                 (more parallelism for small batch x heads, run-to-run differences in the last bits)
  dq_split       sm90a: dQ = dS K split over both MMA warp groups (emitter's own mainloop level) instead of
                 upstream's one group computing the whole dQ tile (backward_sm90a.py says when it applies)

Name: attn_bwd_<arch>_<dtype>_d<head_dim>[v<head_dim_v>]_<tile_q>x<tile_kv>_<nomask|causaltl|causalbr>_<layout>
      [_gqa][_varlen][_det][_dqsplit]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from emitter.dtypes import DType
from emitter.families.attention.model import Arch, Layout, Mask

OP = "backward"


@dataclass(frozen=True)
class AttentionBackwardInstance:
    arch: Arch
    dtype: DType
    head_dim: int
    head_dim_v: int
    tile_q: int
    tile_kv: int
    mask: Mask = Mask.none
    layout: Layout = Layout.bshd
    gqa: bool = False
    varlen: bool = False
    deterministic: bool = True
    dq_split: bool = False
    # where it came from (not part of identity)
    spec_file: str = field(default="", compare=False)
    spec_index: int = field(default=0, compare=False)
    spec_hash: str = field(default="", compare=False)

    @property
    def family(self) -> str:
        return "attention"

    @property
    def op(self) -> str:
        return OP

    @property
    def causal(self) -> bool:
        return self.mask.causal

    def replace(self, **changes: Any) -> "AttentionBackwardInstance":
        return dataclasses.replace(self, **changes)

    def config(self) -> dict[str, Any]:
        """The manifest's `config`: `op: backward` first, then every field as plain JSON."""
        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value[0] if isinstance(v.value, tuple) else v.value
            return v
        skip = {"spec_file", "spec_index", "spec_hash"}
        out: dict[str, Any] = {"op": OP}
        out.update({f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip})
        return out

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AttentionBackwardInstance":
        """The inverse of config(); KeyError / ValueError on a malformed config."""
        if config.get("op") != OP:
            raise ValueError(f"op {config.get('op')!r} is not {OP!r}")
        return cls(
            arch=Arch[config["arch"]], dtype=DType.parse(config["dtype"]),
            head_dim=int(config["head_dim"]), head_dim_v=int(config["head_dim_v"]),
            tile_q=int(config["tile_q"]), tile_kv=int(config["tile_kv"]),
            mask=Mask(config["mask"]), layout=Layout(config["layout"]), gqa=bool(config["gqa"]),
            varlen=bool(config["varlen"]), deterministic=bool(config["deterministic"]),
            dq_split=bool(config.get("dq_split", False)),
        )


_MASK = {Mask.none: "nomask", Mask.causal_top_left: "causaltl", Mask.causal_bottom_right: "causalbr"}


def instance_name(inst: AttentionBackwardInstance) -> str:
    d = f"d{inst.head_dim}" + (f"v{inst.head_dim_v}" if inst.head_dim_v != inst.head_dim else "")
    parts = ["attn", "bwd", inst.arch.yaml, inst.dtype.yaml, d, f"{inst.tile_q}x{inst.tile_kv}", _MASK[inst.mask],
             inst.layout.value]
    if inst.gqa:
        parts.append("gqa")
    if inst.varlen:
        parts.append("varlen")
    if inst.deterministic:
        parts.append("det")
    if inst.dq_split:
        parts.append("dqsplit")
    return "_".join(parts).lower()


def is_backward(obj: Any) -> bool:
    """Whether an instance, a run-time config or a manifest config mapping is a backward one."""
    if isinstance(obj, dict):
        return obj.get("op") == OP
    return getattr(obj, "op", None) == OP or isinstance(getattr(obj, "instance", None), AttentionBackwardInstance)


__all__ = ["OP", "AttentionBackwardInstance", "instance_name", "is_backward"]
