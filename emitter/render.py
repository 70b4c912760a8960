"""Jinja2 rendering: one rooted loader, StrictUndefined, templates per CUTLASS level."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2

from emitter.version import __version__


def templates_root() -> Path:
    """templates/ in a source checkout, or emitter/templates when pip-installed (emitter/resources.py)."""
    from emitter.resources import templates_root as root

    return root()


def _cpp_float(value: float) -> str:
    """A float as a C++ float literal (the only way a spec number reaches C++ as a float)."""
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"non-finite float {value!r} cannot be rendered")
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


@functools.lru_cache(maxsize=None)
def environment(root: str | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root or str(templates_root())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        auto_reload=False,  # templates do not change under a running emit; skips a stat per include
    )
    env.filters["cpp_float"] = _cpp_float
    env.filters["cpp_bool"] = lambda b: "true" if b else "false"
    return env


def banner(spec: str, spec_hash: str) -> dict[str, str]:
    return {"version": __version__, "spec": spec, "spec_hash": spec_hash}


def render_template(template: str, **context: Any) -> str:
    """Render templates/<template> with StrictUndefined (a missing variable is an error, not blank)."""
    return environment().get_template(template).render(**context)
