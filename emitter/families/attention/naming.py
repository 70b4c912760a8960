"""One deterministic, readable name per resolved attention instance: file name, C symbol, manifest key.

attn_<arch>_<dtype>_d<head_dim>[v<head_dim_v>]_<tile_q>x<tile_kv>[_wg<warp_groups>, not 2]_<schedule>[_persistent]_s<stages|auto>
    _<mask: nomask|causaltl|causalbr>[_notail]_<layout>[_lse][_gqa][_varlen]
Every configuration field appears (or is at its stated default), so different configs get different names.
"""

from __future__ import annotations

from emitter.families.attention.model import AttentionInstance, Mask

_MASK = {Mask.none: "nomask", Mask.causal_top_left: "causaltl", Mask.causal_bottom_right: "causalbr"}


def instance_name(inst: AttentionInstance) -> str:
    parts = ["attn", inst.arch.yaml, inst.dtype.yaml]
    d = f"d{inst.head_dim}"
    if inst.head_dim_v != inst.head_dim:
        d += f"v{inst.head_dim_v}"
    parts.append(d)
    parts.append(f"{inst.tile_q}x{inst.tile_kv}")
    if inst.warp_groups != 2:
        parts.append(f"wg{inst.warp_groups}")
    parts.append(inst.schedule.value)
    if inst.persistent:
        parts.append("persistent")
    parts.append(f"s{inst.stages}" if inst.stages else "sauto")
    parts.append(_MASK[inst.mask])
    if not inst.key_tail:
        parts.append("notail")
    parts.append(inst.layout.value)
    if inst.lse:
        parts.append("lse")
    if inst.gqa:
        parts.append("gqa")
    if inst.varlen:
        parts.append("varlen")
    return "_".join(parts).lower()
