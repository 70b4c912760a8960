"""The attention spec's `op` axis: `op: forward` (the default when the key is absent), `op: backward`, or both.

    kernels:
      - family: attention
        op: backward                     # forward | backward | [forward, backward]
        arch: sm80
        dtype: [f16, bf16]
        head_dim: [64, 128]
        tile: [64x64, 128x128]           # BlockQ x BlockKV: queries per step x keys per block
        mask: [none, causal_top_left, causal_bottom_right]
        layout: bshd
        gqa: true
        varlen: false
        deterministic: true              # backward only: dQ partials added in key order (one block per head)
        dq_split: false                  # backward only, sm90a: dQ split over both MMA warp groups

Backward keys: arch, dtype, head_dim, head_dim_v, tile, mask, layout, gqa, varlen, deterministic, dq_split. The forward's
schedule, persistent, stages, key_tail and lse are forward-only (the backward reads the forward's LSE and masks
its key tail always); deterministic is backward-only. An entry naming both ops takes only the keys both have (an
op-specific key there is a SpecError that says to split the entry), and its `exclude:` entries may name `op`.
An entry without `op` is parsed by spec.py exactly as before (same instances, names and manifest).
"""

from __future__ import annotations

from typing import Any, Iterator

from emitter.families.attention import spec as fwd
from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.model import Layout, Mask
from emitter.spec import points, values
from emitter.spec.loader import Document, KeyPath
from emitter.spec.points import Assign

OPS = ("forward", "backward")
_OP_ALIASES = {"fwd": "forward", "fprop": "forward", "bwd": "backward", "grad": "backward", "dgrad": "backward"}


def _op(doc: Document, path: KeyPath, v: Any) -> str:
    text = v.strip().lower() if isinstance(v, str) else None
    text = _OP_ALIASES.get(text, text) if text is not None else None
    if text not in OPS:
        raise doc.error(path, f"op {v!r} is not an attention op", value=v, allowed=list(OPS),
                        fix="use op: forward, op: backward or op: [forward, backward]")
    return text


BACKWARD_KEYS = {
    "arch": fwd.SPEC_KEYS["arch"],
    "dtype": fwd.SPEC_KEYS["dtype"],
    "head_dim": fwd.SPEC_KEYS["head_dim"],
    "head_dim_v": fwd.SPEC_KEYS["head_dim_v"],
    "tile": fwd.SPEC_KEYS["tile"],
    "mask": fwd.SPEC_KEYS["mask"],
    "layout": fwd.SPEC_KEYS["layout"],
    "gqa": fwd.SPEC_KEYS["gqa"],
    "varlen": fwd.SPEC_KEYS["varlen"],
    "deterministic": points.leaf("deterministic", values.boolean),
    "dq_split": points.leaf("dq_split", values.boolean),
}
FORWARD_ONLY = tuple(k for k in fwd.SPEC_KEYS if k not in BACKWARD_KEYS)
BACKWARD_ONLY = tuple(k for k in BACKWARD_KEYS if k not in fwd.SPEC_KEYS)
_WHY_FORWARD_ONLY = {
    "lse": "the backward reads the forward's LSE (always) and writes none",
    "key_tail": "the backward masks the key tail at run time always",
    "schedule": "the backward's schedule is its arch's (sm80: upstream's key-block loop)",
    "persistent": "the backward has no persistent scheduler",
    "stages": "the backward's pipelines are fixed upstream",
}


def op_values(doc: Document, path: KeyPath, value: Any) -> list[str]:
    """The ops an entry names (a list sweeps), in spec order without repeats."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise doc.error(path, "an empty list sweeps nothing", value=value, fix="give op: forward and/or backward")
    out: list[str] = []
    for i, item in enumerate(items):
        op = _op(doc, path + (i,) if isinstance(value, list) else path, item)
        if op not in out:
            out.append(op)
    return out


def build_backward(point: Assign) -> AttentionBackwardInstance:
    """A backward candidate from one sweep point (defaults for the keys the spec left out)."""
    tq, tkv = point["tile"]
    return AttentionBackwardInstance(
        arch=point["arch"], dtype=point["dtype"],
        head_dim=point["head_dim"], head_dim_v=point.get("head_dim_v", point["head_dim"]),
        tile_q=tq, tile_kv=tkv,
        mask=point.get("mask", Mask.none),
        layout=point.get("layout", Layout.bshd),
        gqa=point.get("gqa", False),
        varlen=point.get("varlen", False),
        deterministic=point.get("deterministic", True),
        dq_split=point.get("dq_split", False),
    )


def expand_op_entry(doc: Document, path: KeyPath, entry: dict[str, Any],
                    key_paths: dict[str, KeyPath] | None = None) -> Iterator[tuple[Any, Assign]]:
    """Candidates of an entry that has an `op` key: forward ones built by spec.build (the same records an entry
    without `op` gives), backward ones by build_backward."""
    kp = key_paths or {}
    ops = op_values(doc, kp.get("op", path + ("op",)), entry["op"])
    if ops == ["forward"]:
        table = dict(fwd.SPEC_KEYS)
    elif ops == ["backward"]:
        table = dict(BACKWARD_KEYS)
    else:
        table = {k: v for k, v in fwd.SPEC_KEYS.items() if k in BACKWARD_KEYS}
    for key in entry:
        where = kp.get(key, path + (key,))
        if key in FORWARD_ONLY and ops == ["backward"]:
            raise doc.error(where, f"'{key}' is a forward-only key: {_WHY_FORWARD_ONLY.get(key, 'the backward has no such choice')}",
                            value=key, allowed=sorted(BACKWARD_KEYS),
                            fix=f"remove '{key}' from this op: backward entry")
        if key in BACKWARD_ONLY and ops == ["forward"]:
            raise doc.error(where, f"'{key}' is a backward-only key (the forward's dQ-free pass has no such choice)",
                            value=key, allowed=sorted(fwd.SPEC_KEYS), fix=f"remove '{key}' or use op: backward")
        if len(ops) > 1 and (key in FORWARD_ONLY or key in BACKWARD_ONLY):
            only = "forward" if key in FORWARD_ONLY else "backward"
            raise doc.error(where, f"'{key}' is a {only}-only key and this entry names both ops", value=key,
                            allowed=sorted(table) + ["op"],
                            fix=f"split the entry: one with op: forward, one with op: backward (and '{key}' in the "
                                f"{only} one)")
    for key in fwd.REQUIRED:
        if key not in entry:
            raise doc.error(path, f"missing required key '{key}'", allowed=list(fwd.REQUIRED),
                            fix=f"add `{key}:` to this spec")
    table["op"] = points.leaf("op", _op)
    spec_name = f"an attention {'/'.join(ops)} spec"

    def axes(p: KeyPath, item: dict[str, Any], what: str, paths: dict[str, KeyPath] | None = None):
        return points.axes(doc, p, item, table, fwd.META_KEYS, spec_name=spec_name, key_paths=paths, what=what)

    entry_axes = axes(path, entry, "this spec", kp)
    excl_path = kp.get("exclude", path + ("exclude",))
    example = "exclude: [{op: backward, head_dim: 256}]"
    if hasattr(points, "exclude_entries"):      # the checked expansion (exclude work cap, unset-key warnings)
        excl = points.exclude_entries(doc, excl_path, entry.get("exclude"), table, fwd.META_KEYS, spec_name=spec_name,
                                      what="an exclude entry", example=example)
        expanded = points.expand_checked(doc, path, entry_axes, excl, excl_path)
    else:
        excl = points.exclusions(doc, excl_path, entry.get("exclude"), lambda p, item: axes(p, item, "an exclude entry"),
                                 example=example)
        expanded = points.expand(entry_axes, excl)
    for point in expanded:
        op = point.pop("op")
        yield (fwd.build(point) if op == "forward" else build_backward(point)), point


__all__ = ["OPS", "BACKWARD_KEYS", "FORWARD_ONLY", "BACKWARD_ONLY", "expand_op_entry", "build_backward", "op_values"]
