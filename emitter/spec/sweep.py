"""The sweep-size cap every family's spec parser applies before it expands a cartesian product.

A spec sweeps the product of its list-valued fields. Twelve fields of twenty values each are 4e15
instances: expanding first and counting later would grow without bound. So a family's parser computes the
product from the axis lengths (which are known once each field is parsed) and calls `check_sweep` before
it builds a single combination; the SpecError names the fields that multiply and the product.

Use from a family's `expand_entry` (any family; nothing here is GEMM-specific):

    from emitter.spec.sweep import check_sweep
    check_sweep(doc, entry_path, [("dtype", 2), ("tile", 20), ...])        # raises SpecError if too many
    for combo in itertools.product(*axes): ...

and for nested products (a mapping whose sub-keys sweep) the same call with the sub-keys. The limit is
`max_instances()`: DEFAULT_MAX_INSTANCES unless a caller raised it for a block of code with
`with sweep_limit(n):` (`emitter emit --max-instances N` does; `emit(..., max_instances=N)` too).
The cap counts combinations before `exclude:` drops any (counting after would mean expanding first);
emit also caps the total over all spec entries and files with the same number.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator, Sequence

from emitter.errors import SpecError

DEFAULT_MAX_INSTANCES = 100_000

_limit: contextvars.ContextVar[int] = contextvars.ContextVar("emitter_max_instances", default=DEFAULT_MAX_INSTANCES)


def max_instances() -> int:
    """The cap on one sweep's (and one emit's) number of candidates now in force."""
    return _limit.get()


@contextlib.contextmanager
def sweep_limit(limit: int | None) -> Iterator[None]:
    """Raise (or lower) the cap for the code inside the block; None keeps the current one."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"max_instances must be a positive integer, not {limit!r}")
    token = _limit.set(limit if limit is not None else _limit.get())
    try:
        yield
    finally:
        _limit.reset(token)


def _fix() -> str:
    return ("narrow the lists (the cap counts combinations before `exclude:`), split the spec and emit the parts "
            "into separate directories, or raise the cap with `emitter emit --max-instances N`")


def check_sweep(doc: Any, path: Sequence[Any], axes: Sequence[tuple[str, int]], *, what: str = "this spec") -> int:
    """The product of the axis lengths; a SpecError naming the multiplying fields if it is over the cap.

    `doc` is the spec's loader Document (for file, line and key path), `path` the entry's key path,
    `axes` (field name, number of values) in spec order. Fields with one value do not multiply."""
    limit = max_instances()
    product = math.prod(max(0, int(n)) for _, n in axes)
    if product > limit:
        multiplying = [(name, n) for name, n in axes if n > 1]
        shown = " x ".join(f"{name} ({n})" for name, n in multiplying)
        raise doc.error(tuple(path), f"{what} sweeps {product:,} combinations: {shown}",
                        value=product, allowed=f"at most {limit:,} instances per emit", fix=_fix())
    return product


def check_total(doc: Any, path: Sequence[Any], total: int) -> None:
    """The running number of candidates over every entry and file of one emit; SpecError past the cap."""
    if total > max_instances():
        raise doc.error(tuple(path), f"the specs together expand to more than {max_instances():,} candidates "
                                     f"({total:,} so far, at this entry)", value=total,
                        allowed=f"at most {max_instances():,} instances per emit", fix=_fix())
