"""The library stage's side of tuning tables: the entries of every family but the default one go to their family's
library hook (ctx["tuning_entries"][family]), which turns them into its own records and reports the ones it cannot
use. Reading and checking a table is the kit's (emitter/kit/tuning.py); the default family reads its own entries
in its library hook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from emitter.kit.tuning import entry_family, read_table, table_cc


def family_entries(paths: Sequence[str | Path], allow_unmeasured: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The entries of the other families (those naming a family other than the registry's default) in tuning
    tables, by family, each a copy of the entry with `source` (the table's path), `position` (its index in
    `entries`) and `gpu_cc` added. The tables are checked as the default family's reader checks them."""
    from emitter.families.registry import DEFAULT_FAMILY

    out: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        data = read_table(Path(path), allow_unmeasured)
        gpu_cc = table_cc(data.get("gpu"))
        for i, e in enumerate(data["entries"]):
            if entry_family(e) not in (None, DEFAULT_FAMILY):
                out.setdefault(str(entry_family(e)), []).append({**e, "source": str(path), "position": i,
                                                                 "gpu_cc": gpu_cc})
    return out
