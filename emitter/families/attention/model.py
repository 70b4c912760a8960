"""The attention instance record: one fully resolved fused multi-head attention (forward) kernel.

A spec expands into candidate AttentionInstance records (fields may still be AUTO / Schedule.auto meaning
"derive"). The arch module (attention/sm80.py: the xFormers-lineage CUTLASS kernel of examples/41;
attention/sm90a.py: the Hopper FMHA collectives of examples/88) resolves them: fills derived values and
checks every constraint, returning the resolved instance or a Rejection naming the rule and the fix.
Templates only see resolved instances.

Run-time facts (batch, heads, sequence lengths, scale, strides, cu_seqlens) are the problem's
(attention/problem.py, templates/attention/common/attention_abi.h), never the instance's. The instance
fixes what the kernel is compiled for:

  dtype        Q/K/V/O element type (f16, bf16; e4m3 on sm90a only); accumulation and LSE are f32
  head_dim     D of Q and K; head_dim_v: D of V and O (equal to head_dim unless the spec says otherwise)
  tile_q       queries per CTA (BlockQ); tile_kv: keys per mainloop step (BlockKV)
  schedule     auto | multistage (sm80) | tma, cooperative, pingpong (sm90a)
  persistent   a persistent tile scheduler (sm90a); False on sm80
  stages       K/V pipeline stages; AUTO (0) = derive
  mask         none | causal_top_left (query i sees keys j <= i) | causal_bottom_right (j <= i + sk - sq)
  key_tail     mask keys past seq_k inside the last KV tile (seq_k not a multiple of tile_kv);
               False: the kernel requires seq_k % tile_kv == 0 (can_implement refuses otherwise)
  layout       bshd | bhsd: the packed layout a problem gets when it gives no strides (stride 0); the
               kernel takes any strides with the head dim contiguous unless the arch module says otherwise
  lse          writes the row log-sum-exp (f32, natural log, of the scaled scores) when the problem
               passes an LSE pointer; False: no LSE (the problem's pointer must be NULL)
  gqa          heads_kv may divide heads_q (grouped-query attention, MQA included); query head h reads
               KV head h // (heads_q // heads_kv). False: heads_kv must equal heads_q
  varlen       variable sequence lengths (cu_seqlens_q / cu_seqlens_k, packed [total, heads, dim])
  warp_groups  sm90a: consumer (MMA) warp groups of the warp-specialized kernel, 64 query rows each
               (tile_q = 64 x warp_groups); 2 unless the spec says otherwise (sm80: always 2). config() leaves
               the default out, so manifests of 2-group instances read as before
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from emitter.dtypes import DType


class Arch(Enum):
    sm80 = ("sm80", 80)
    sm90a = ("sm90a", 90)

    @property
    def yaml(self) -> str:
        return self.value[0]

    @property
    def cc(self) -> int:
        return self.value[1]

    def __str__(self) -> str:
        return self.yaml


class Schedule(Enum):
    auto = "auto"
    multistage = "multistage"      # sm80: the xFormers kernel's cp.async multistage mainloops
    tma = "tma"                    # sm90a: FmhaKernelTma (no warp specialization)
    cooperative = "cooperative"    # sm90a: FmhaKernelTmaWarpSpecialized, consumer warp groups share a tile
    pingpong = "pingpong"          # sm90a: FmhaKernelTmaWarpSpecialized, consumer warp groups alternate
    split_kv = "split_kv"          # sm90a: cooperative, a tile's keys split over CTAs, partials combined in-kernel

    def __str__(self) -> str:
        return self.value


class Mask(Enum):
    none = "none"
    causal_top_left = "causal_top_left"          # query i attends keys j <= i
    causal_bottom_right = "causal_bottom_right"  # query i attends keys j <= i + (seq_k - seq_q)

    @property
    def causal(self) -> bool:
        return self is not Mask.none

    def __str__(self) -> str:
        return self.value


class Layout(Enum):
    bshd = "bshd"   # [batch, seq, heads, dim]: strides (seq*heads*dim, heads*dim, dim) for (batch, seq, head)
    bhsd = "bhsd"   # [batch, heads, seq, dim]: strides (heads*seq*dim, dim, seq*dim)

    def __str__(self) -> str:
        return self.value


AUTO = 0  # integer fields: 0 means "derive" (stages)

DTYPES = {Arch.sm80: (DType.f16, DType.bf16), Arch.sm90a: (DType.f16, DType.bf16, DType.e4m3)}
SCHEDULES = {Arch.sm80: (Schedule.auto, Schedule.multistage),
             Arch.sm90a: (Schedule.auto, Schedule.tma, Schedule.cooperative, Schedule.pingpong, Schedule.split_kv)}
HEAD_DIMS = (32, 64, 96, 128, 256)   # the spec's vocabulary; each arch module narrows it with a reason


@dataclass(frozen=True)
class AttentionInstance:
    arch: Arch
    dtype: DType
    head_dim: int
    head_dim_v: int
    tile_q: int
    tile_kv: int
    schedule: Schedule = Schedule.auto
    persistent: bool = False
    stages: int = AUTO
    mask: Mask = Mask.none
    key_tail: bool = True
    layout: Layout = Layout.bshd
    lse: bool = False
    gqa: bool = False
    varlen: bool = False
    warp_groups: int = 2
    # where it came from (not part of identity)
    spec_file: str = field(default="", compare=False)
    spec_index: int = field(default=0, compare=False)
    spec_hash: str = field(default="", compare=False)

    @property
    def family(self) -> str:
        return "attention"

    @property
    def causal(self) -> bool:
        return self.mask.causal

    def replace(self, **changes: Any) -> "AttentionInstance":
        return dataclasses.replace(self, **changes)

    def config(self) -> dict[str, Any]:
        """The full resolved configuration as plain JSON data (the manifest's `config`)."""
        def plain(v: Any) -> Any:
            if isinstance(v, Enum):
                return v.value[0] if isinstance(v.value, tuple) else v.value
            return v
        skip = {"spec_file", "spec_index", "spec_hash"} | ({"warp_groups"} if self.warp_groups == 2 else set())
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AttentionInstance":
        """The inverse of config() (manifest -> instance); KeyError / ValueError on a malformed config."""
        return cls(
            arch=Arch[config["arch"]], dtype=DType.parse(config["dtype"]),
            head_dim=int(config["head_dim"]), head_dim_v=int(config["head_dim_v"]),
            tile_q=int(config["tile_q"]), tile_kv=int(config["tile_kv"]),
            schedule=Schedule(config["schedule"]), persistent=bool(config["persistent"]),
            stages=int(config["stages"]), mask=Mask(config["mask"]), key_tail=bool(config["key_tail"]),
            layout=Layout(config["layout"]), lse=bool(config["lse"]), gqa=bool(config["gqa"]),
            varlen=bool(config["varlen"]), warp_groups=int(config.get("warp_groups", 2)),
        )


from emitter.families.base import Rejection  # noqa: E402  (shared by every family; re-exported here)

__all__ = ["Arch", "Schedule", "Mask", "Layout", "AUTO", "DTYPES", "SCHEDULES", "HEAD_DIMS",
           "AttentionInstance", "Rejection"]
