"""YAML loading that remembers where every value came from (file, line), for errors that teach."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from emitter.errors import SpecError

try:  # the C loader is several times faster; fall back to the pure-Python one
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader

KeyPath = tuple[Any, ...]  # ("kernels", 0, "tile") ; ints are list indexes


def format_path(path: KeyPath) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or "<root>"


@dataclass
class Document:
    """A parsed YAML file: plain Python data plus the line of every key path (1-based)."""

    file: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    text: str = ""

    def line(self, path: KeyPath) -> int | None:
        # the nearest enclosing path that has a line
        p = tuple(path)
        while True:
            if p in self.lines:
                return self.lines[p]
            if not p:
                return None
            p = p[:-1]

    def error(self, path: KeyPath, message: str, *, value: Any = None, allowed: Any = None,
              fix: str | None = None) -> SpecError:
        return SpecError(message, file=self.file, line=self.line(path), key_path=format_path(path),
                         value=value, allowed=allowed, fix=fix)


def _construct(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str,
               constructor: yaml.constructor.SafeConstructor) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise SpecError("YAML merge keys (<<) are not supported in specs", file=file,
                                line=key_node.start_mark.line + 1, key_path=format_path(path),
                                fix="use a `defaults:` section instead")
            key = constructor.construct_object(key_node)
            if not isinstance(key, str):
                raise SpecError("keys must be strings", file=file, line=key_node.start_mark.line + 1,
                                key_path=format_path(path), value=key)
            if key in out:
                raise SpecError(f"duplicate key '{key}'", file=file, line=key_node.start_mark.line + 1,
                                key_path=format_path(path + (key,)),
                                fix="remove one of the two; to sweep values, give a list")
            out[key] = _construct(value_node, path + (key,), lines, file, constructor)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), lines, file, constructor) for i, v in enumerate(node.value)]
    return constructor.construct_object(node)


def parse_text(text: str, file: str) -> Document:
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            constructor = yaml.constructor.SafeConstructor()
            lines: dict[KeyPath, int] = {}
            data = None if node is None else _construct(node, (), lines, file, constructor)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise SpecError(f"invalid YAML: {e.problem or e.context}", file=file, line=line,
                        fix="check indentation, colons and brackets near this line") from None
    except yaml.YAMLError as e:
        raise SpecError(f"invalid YAML: {e}", file=file) from None
    return Document(file=file, data=data, lines=lines, text=text)


def load_file(path: str | Path) -> Document:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("spec file not found", file=str(path), fix="check the path") from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a spec file", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text ({e.reason})", file=str(path)) from None
    return parse_text(text, str(path))


def content_hash(data: Any) -> str:
    """A stable hash of plain data (sorted-key JSON)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()
