"""Value parsers every family's spec shares: a spec value -> an enum member or a bool, or a SpecError.

Called as parser(src, path, value), where `src` raises the errors (a loader Document or a family's context object
with the same `error(path, message, value=..., allowed=..., fix=...)`), like emitter.spec.points' key groups."""

from __future__ import annotations

from typing import Any, Callable

from emitter.spec.loader import KeyPath


def enum_name(member: Any) -> str:
    """The spec name of an enum member (its value, or the first field of a tuple value)."""
    return member.value if isinstance(member.value, str) else member.value[0]


def enum_parser(enum: type, aliases: dict[str, str] | None = None, *,
                fix_on_type: bool = False) -> Callable[[Any, KeyPath, Any], Any]:
    """A parser for one of `enum`'s names (case-insensitive; `aliases` maps other spellings to names).

    fix_on_type: a value that is not a string also gets the "use one of" fix line (attention's errors do, GEMM's
    and conv's do not)."""
    allowed = [enum_name(e) for e in enum]

    def parse(src: Any, path: KeyPath, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, str):
            raise src.error(path, f"expected one of the names below, got {type(v).__name__}", value=v,
                            allowed=allowed, fix=f"use one of: {', '.join(allowed)}" if fix_on_type else None)
        text = v.strip().lower()
        if aliases:
            text = aliases.get(text, text)
        for e in enum:
            if enum_name(e) == text:
                return e
        raise src.error(path, f"unknown value '{v}'", value=v, allowed=allowed,
                        fix=f"use one of: {', '.join(allowed)}")
    return parse


def boolean(src: Any, path: KeyPath, v: Any) -> bool:
    """true or false (YAML booleans only: not "yes", not 1)."""
    if not isinstance(v, bool):
        raise src.error(path, "true or false is expected", value=v, allowed=["true", "false"],
                        fix="write true or false, unquoted")
    return v
