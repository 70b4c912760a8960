"""YAML loading that remembers where every value came from (file, line), for errors that teach.

Specs are written by hand and may come from anyone, so loading is bounded and explicit:

- files: only regular files (a FIFO, a device, a symlink loop or a directory is a SpecError), at most
  MAX_FILE_BYTES; the text must be UTF-8 (a bad byte is reported with its line);
- structure: at most MAX_DEPTH levels of nesting and MAX_NODES values after alias expansion (a
  "billion laughs" document ends in a SpecError instead of filling memory); an alias that refers to the
  node it is inside of (`&a [x, *a]`) is refused;
- scalars: YAML 1.1's surprises are not taken silently. `yes/no/on/off/y/n` stay strings (only
  true/false are booleans: `split_k: off` is the string "off"); an integer with a leading zero
  (`010`, which YAML 1.1 reads as octal 8) or in base 60 (`1:30`) is refused; `1e5` is a number (YAML
  1.1 wants `1.0e+5`); integers have at most MAX_INT_DIGITS digits and floats must fit a double;
- reader errors (control characters, NUL) and syntax errors carry a line; an unterminated quote or
  bracket is reported where it opens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
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

MAX_FILE_BYTES = 4 << 20      # a spec is a page or two; the tuned candidate set is 20 kB
MAX_DEPTH = 64                # nesting levels (mappings and lists)
MAX_NODES = 250_000           # values after alias expansion (the tuned candidate set holds ~3,000)
MAX_INT_DIGITS = 30           # far beyond any tile, stage or size; below Python's 4300-digit limit

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_STR_TAG = "tag:yaml.org,2002:str"
_TRUE_FALSE = {"true", "True", "TRUE", "false", "False", "FALSE"}
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")
_EXP_FLOAT = re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")   # YAML 1.2 reads 1e5 as a number


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


class _Builder:
    """Nodes -> plain data with a line per key path, within the depth and node budgets."""

    def __init__(self, file: str):
        self.file = file
        self.lines: dict[KeyPath, int] = {}
        self.nodes = 0
        self.active: set[int] = set()          # ids of the nodes being built (a cycle returns to one)
        self.constructor = yaml.constructor.SafeConstructor()

    def err(self, node: yaml.Node, path: KeyPath, message: str, **kw: Any) -> SpecError:
        return SpecError(message, file=self.file, line=node.start_mark.line + 1, key_path=format_path(path), **kw)

    def build(self, node: yaml.Node, path: KeyPath, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.err(node, path, f"the document expands to more than {MAX_NODES:,} values (YAML aliases "
                                       f"repeat what they refer to)", allowed=f"at most {MAX_NODES:,} values",
                           fix="write the values out, or use fewer and smaller aliases (*name)")
        if depth > MAX_DEPTH:
            raise self.err(node, path[:8] + ("...",), f"nested more than {MAX_DEPTH} levels deep",
                           allowed=f"at most {MAX_DEPTH} levels", fix="flatten the structure")
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            raise self.err(node, path, "an alias refers to the node it is inside of (a recursive anchor)",
                           fix="an alias (*name) may only repeat a node defined before and outside it")
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path, depth)
            return [self.build(v, path + (i,), depth + 1) for i, v in enumerate(node.value)]
        finally:
            self.active.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: KeyPath, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.err(key_node, path, "YAML merge keys (<<) are not supported in specs",
                               fix="use a `defaults:` section instead")
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.err(key_node, path, "keys must be strings", value="a list or mapping used as a key")
            key = self.scalar(key_node, path)
            if not isinstance(key, str):
                raise self.err(key_node, path, "keys must be strings", value=key)
            if key in out:
                raise self.err(key_node, path + (key,), f"duplicate key '{key}'",
                               fix="remove one of the two; to sweep values, give a list")
            out[key] = self.build(value_node, path + (key,), depth + 1)
        return out

    def scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        text = node.value
        plain = not node.style             # None (pure-Python loader) or "" (C loader)
        if node.tag == _BOOL_TAG and plain and text not in _TRUE_FALSE:
            return text                          # yes/no/on/off/y/n: a string, as in YAML 1.2
        if node.tag == _INT_TAG and plain:
            digits = text.lstrip("+-")
            if _LEADING_ZERO.match(text):
                raise self.err(node, path, f"integer with a leading zero: YAML 1.1 reads {text} as an octal number "
                                           f"({self._safe(node)})", value=text, allowed="decimal integers",
                               fix=f"write {text.lstrip('+-').lstrip('0_') or '0'} (or quote it if a string is meant)")
            if ":" in text:
                raise self.err(node, path, f"YAML 1.1 reads {text} as a base-60 number", value=text,
                               allowed="decimal integers", fix="quote it if a string is meant")
            if len(digits.replace("_", "")) > MAX_INT_DIGITS:
                raise self.err(node, path, f"integer of {len(digits)} digits is out of range",
                               value=text[:20] + "...", allowed=f"at most {MAX_INT_DIGITS} digits",
                               fix="use a value in the range the key allows")
        if node.tag == _STR_TAG and plain and _EXP_FLOAT.match(text):
            node = yaml.ScalarNode(_FLOAT_TAG, text, node.start_mark, node.end_mark)   # 1e5: YAML 1.1 says string
        if node.tag == _FLOAT_TAG and plain and len(text) > 400:
            raise self.err(node, path, f"number of {len(text)} characters is too long", value=text[:20] + "...",
                           allowed="a number that fits a double")
        try:
            value = self.constructor.construct_object(node)
        except (ValueError, OverflowError, IndexError, TypeError, KeyError, yaml.YAMLError) as e:   # `!!int ` (empty)
            raise self.err(node, path, f"cannot read the value: {e}", value=text[:40]) from None
        if isinstance(value, float) and value in (float("inf"), float("-inf")) and node.tag == _FLOAT_TAG \
                and plain and not text.lstrip("+-").lower().startswith(".inf"):
            raise self.err(node, path, "number beyond the range of a double", value=text[:40],
                           allowed="magnitudes up to about 1.8e308", fix="use a smaller number")
        return value

    def _safe(self, node: yaml.ScalarNode) -> str:
        try:
            return f"= {self.constructor.construct_object(node)}"
        except Exception:
            return "not what it looks like"


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, max(0, position)) + 1


def parse_text(text: str, file: str) -> Document:
    if len(text) > MAX_FILE_BYTES:
        raise SpecError(f"the spec is {len(text):,} characters long", file=file,
                        allowed=f"at most {MAX_FILE_BYTES:,}", fix="split it into several spec files")
    builder = _Builder(file)
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = None if node is None else builder.build(node, ())
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as e:
        line = _line_of(text, e.position) if isinstance(e.position, int) else None
        char = e.character if isinstance(e.character, int) else None
        what = f"character #x{char:04x}" if char is not None else "character"
        raise SpecError(f"invalid YAML: unacceptable {what}: {e.reason}", file=file, line=line,
                        fix="remove the control character (or NUL byte); specs are plain UTF-8 text") from None
    except yaml.MarkedYAMLError as e:
        problem, context = e.problem_mark, e.context_mark
        # an unterminated quote runs to the end of the file: where it opens is the line to show
        opens = bool(e.context) and e.context.startswith(("while scanning a quoted", "while scanning a block scalar"))
        mark = context if (opens and context is not None) else (problem or context)
        line = mark.line + 1 if mark is not None else None
        message = f"invalid YAML: {e.problem or e.context}"
        if opens and context is not None:
            message = f"invalid YAML: {e.context[6:]} that opens here is never closed ({e.problem}"
            message += f" at line {problem.line + 1})" if problem is not None else ")"
        elif e.context and context is not None and problem is not None and context.line != problem.line:
            message += f" ({e.context} opened at line {context.line + 1})"
        raise SpecError(message, file=file, line=line,
                        fix="check indentation, colons, quotes and brackets near this line") from None
    except yaml.YAMLError as e:
        raise SpecError(f"invalid YAML: {e}", file=file) from None
    except RecursionError:
        raise SpecError(f"nested too deeply", file=file, allowed=f"at most {MAX_DEPTH} levels",
                        fix="flatten the structure") from None
    return Document(file=file, data=data, lines=builder.lines, text=text)


def display_path(path: str | os.PathLike[str]) -> str:
    """A file name as text fit for a message, a manifest or a C++ comment: bytes that are not UTF-8
    are written as \\xNN and control characters (a newline would end a // comment) as escapes."""
    raw = os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def read_spec_bytes(path: str | os.PathLike[str], *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a SpecError for anything else."""
    shown = display_path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError("spec file not found", file=shown, fix="check the path") from None
    except OSError as e:
        why = "a symlink loop" if e.errno == 40 else (e.strerror or str(e))
        raise SpecError(f"cannot read the spec file: {why}", file=shown, fix="check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError("is a directory, not a spec file", file=shown, fix="name the .yaml files inside it")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
                else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise SpecError(f"is {kind}, not a regular file", file=shown, allowed="a regular .yaml file",
                        fix="save the spec to a file and pass that") from None
    if st.st_size > limit:
        raise SpecError(f"the spec file is {st.st_size:,} bytes", file=shown, allowed=f"at most {limit:,} bytes",
                        fix="split it into several spec files")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):       # swapped for something else since the stat
                raise SpecError("is not a regular file", file=shown, allowed="a regular .yaml file")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as e:
        raise SpecError(f"cannot read the spec file: {e.strerror or e}", file=shown, fix="check the path") from None
    data = b"".join(chunks)
    if len(data) > limit:
        raise SpecError("the spec file grew past the size limit while being read", file=shown,
                        allowed=f"at most {limit:,} bytes")
    return data


def load_file(path: str | Path) -> Document:
    shown = display_path(path)
    raw = read_spec_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(f"not UTF-8 text: byte 0x{raw[e.start]:02x} at column {col} ({e.reason})", file=shown,
                        line=line, fix="save the file as UTF-8 (a Latin-1 editor writes é as one byte)") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_text(text, shown)


def content_hash(data: Any) -> str:
    """A stable hash of plain data (sorted-key JSON)."""
    try:
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    except ValueError:      # an int past Python's 4,300-digit text limit (API data): hashed by its hex digits
        blob = json.dumps(_huge_ints_as_hex(data), sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _huge_ints_as_hex(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _huge_ints_as_hex(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_huge_ints_as_hex(v) for v in data]
    if isinstance(data, int) and not isinstance(data, bool) and data.bit_length() > 4000:
        return f"int:{data:#x}"
    return data
