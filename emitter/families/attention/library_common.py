"""What the attention forward and backward library pieces share (library.py, backward_library.py): the mask codes
of the C API, the long-sequence threshold of the dispatch order, the tuning record and its distance to a problem,
the kernel-name check and reading an instance's source from its manifest directory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from emitter.families.attention.model import Mask

MASKS = {Mask.none: 0, Mask.causal_top_left: 1, Mask.causal_bottom_right: 2}
LONG_SEQ = 512          # seq_q at and above which larger tiles come first
_NAME_RE = re.compile(r"^[a-z0-9_]+$")


def _read_source(root: Path, rel: str, name: str, error: type[Exception]) -> str:
    from emitter.fsutil import PathEscape, resolve_inside

    try:
        return resolve_inside(root, rel, f"source of {name}").read_text(encoding="utf-8")
    except PathEscape as ex:
        raise error(str(ex)) from None
    except FileNotFoundError:
        raise error(f"{Path(root) / rel}: missing (listed in {Path(root) / 'manifest.json'}); run `emitter emit` "
                    f"again") from None


@dataclass(frozen=True)
class AttentionTuningRecord:
    """A profiled problem and its winner (the C table's kAttentionTuning row)."""
    kernel: int
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    cc: int = 0          # compute capability x 10 of the GPU it was measured on; 0 = unknown (used on any)


def tuning_distance(t: AttentionTuningRecord, *, batch: int, heads_q: int, heads_kv: int, seq_q: int, seq_k: int) -> int:
    """|log2| distance between a record and a problem (templates/attention/library/api.cpp.j2 and
    backward_api.cpp.j2 compute the same)."""
    from emitter.kit.library import log2_fixed

    def d(a: int, b: int) -> int:
        return abs(log2_fixed(max(a, 1)) - log2_fixed(max(b, 1)))

    return (d(t.batch * t.heads_q, batch * heads_q) + d(t.heads_q // max(t.heads_kv, 1), heads_q // max(heads_kv, 1))
            + d(t.seq_q, seq_q) + d(t.seq_k, seq_k))


def checked_tuning_records(kernels: Sequence[Any], entries: Sequence[dict[str, Any]], *, other_names: Sequence[str],
                           other_pass: str, missing: str, no_options: str,
                           first: Callable[..., list[Any]]) -> tuple[list[AttentionTuningRecord], list[dict[str, Any]]]:
    """Tuning records from one pass's tuning-table entries (forward or backward), and the entries not used with the
    reason. `other_names`: the other pass's kernels (an entry naming one gets `other_pass`); `missing` / `no_options`:
    the reasons for a kernel not exported and for run-time options; `first(kernels, record_list, kernel, cc, d, dv,
    hq, hkv, sq, sk, b)`: the pass's dispatch order at a record's own problem, which must try its kernel first."""
    from emitter.kit.library import tuning_problem_label

    by_name = {k.name: k for k in kernels}
    records: list[AttentionTuningRecord] = []
    dropped: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    for e in entries:
        prob = e.get("problem") if isinstance(e.get("problem"), dict) else {}

        def drop(reason: str, missing_kernel: bool = False) -> None:
            dropped.append({"kernel": str(e.get("kernel")), "problem": [tuning_problem_label(prob)],
                            "source": str(e.get("source")), "position": e.get("position"),
                            "missing_kernel": missing_kernel, "reason": reason})

        k = by_name.get(e.get("kernel"))
        if k is None:
            if e.get("kernel") in other_names:
                drop(other_pass)
            else:
                drop(missing, missing_kernel=True)
            continue
        try:
            b, hq, hkv, sq, sk, d, dv = (int(prob[f]) for f in ("batch", "heads_q", "heads_kv", "seq_q", "seq_k",
                                                                "head_dim", "head_dim_v"))
        except (KeyError, TypeError, ValueError):
            drop("problem lacks batch, heads_q, heads_kv, seq_q, seq_k, head_dim or head_dim_v (integers)")
            continue
        if min(b, hq, hkv, sq, sk) < 1 or max(b, hq, hkv, sq, sk) >= 2 ** 31 or hq % hkv:
            drop("problem sizes out of range (>= 1, heads_kv dividing heads_q)")
            continue
        op = e.get("op") if isinstance(e.get("op"), dict) else {}
        i = k.inst
        want = {"dtype": i.dtype.yaml, "head_dim": i.head_dim, "head_dim_v": i.head_dim_v, "mask": i.mask.value}
        diff = [f"{f}={op[f]!r} (kernel: {v!r})" for f, v in want.items() if f in op and op[f] != v]
        if d != i.head_dim or dv != i.head_dim_v:
            diff.append(f"problem head dims {d}/{dv} (kernel: {i.head_dim}/{i.head_dim_v})")
        if hkv != hq and not i.gqa:
            diff.append(f"heads {hq}/{hkv} need a GQA kernel")
        if diff:
            drop(f"does not fit {k.name}: {', '.join(diff)}")
            continue
        if int(e.get("split_k") or 1) != 1 or int(e.get("options") or 0) != 0:
            drop(f"split_k {e.get('split_k')} / options {e.get('options')}: {no_options}")
            continue
        cc = int(e.get("gpu_cc") or 0)
        key = (k.dtype_code, i.head_dim, i.head_dim_v, k.mask_code, i.varlen, b, hq, hkv, sq, sk, cc)
        if key in seen:
            drop(f"a second winner for this problem ({seen[key]} came first and is kept)")
            continue
        rec = AttentionTuningRecord(k.index, b, hq, hkv, sq, sk, cc)
        # at its own problem the dispatch must try the record's kernel first (as GEMM's check_tuning_invariant)
        got = first(kernels, records + [rec], k, cc or k.cc, d, dv, hq, hkv, sq, sk, b)
        if not got or got[0].index != k.index:
            drop(f"at its own problem the dispatch would try {got[0].name if got else 'no kernel'} first "
                 f"(its kernel does not compute this problem, or another record claims it)")
            continue
        seen[key] = k.name
        records.append(rec)
    return records, dropped
