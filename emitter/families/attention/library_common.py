"""What the attention forward and backward library pieces share (library.py, backward_library.py): the mask codes
of the C API, the long-sequence threshold of the dispatch order, the tuning record and its distance to a problem,
the kernel-name check and reading an instance's source from its manifest directory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
