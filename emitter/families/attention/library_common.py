"""What the attention forward and backward library pieces share (library.py, backward_library.py): the mask codes
of the C API, the long-sequence threshold of the dispatch order, the kernel-name check and reading an instance's
source from its manifest directory."""

from __future__ import annotations

import re
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
