"""The data that ships inside the package: templates/ and configs/ (example specs, profile configs).

In a source checkout they are the repository's top-level folders; in an installed wheel they are
emitter/templates and emitter/configs (setup.py maps them), found through importlib.resources.
`importlib.resources.files("emitter.templates")` is not used: a folder without __init__.py is a
namespace package, whose files() is a MultiplexedPath that str() does not turn into a directory
(the TemplateNotFound of a pip-installed emitter, issue 26)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["templates_root", "configs_root", "example_specs", "example_config"]

_SOURCE = Path(__file__).resolve().parent.parent


def _root(folder: str, marker: str) -> Path:
    src = _SOURCE / folder
    if (src / marker).exists():   # a checkout (an editable install included) uses its own folders
        return src
    return Path(str(importlib.resources.files("emitter").joinpath(folder)))


def templates_root() -> Path:
    return _root("templates", "common/emitter_abi.h")


def configs_root() -> Path:
    return _root("configs", "demo.yaml")


def example_specs(family: str) -> list[Path]:
    """The shipped example spec files of a family (configs/<family>/*.yaml)."""
    return sorted((configs_root() / family).glob("*.yaml"))


def example_config(relative: str) -> Path:
    """One shipped config by its path under configs/ (`profile/square.yaml`); FileNotFoundError if absent."""
    p = configs_root() / relative
    if not p.is_file():
        raise FileNotFoundError(f"{relative} is not among the shipped configs in {configs_root()}")
    return p
