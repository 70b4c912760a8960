"""Which problems each instance is verified on: its family's default set, or the user's own -- for any family.

The problems themselves are the family's (emitter.families.<family>.runtime: problem type, label, default
set, parsing, not_supported_reasons); this module holds what is common: the VerifyProblem record (a
family problem + its input kind + label + where it came from), user problems from the command line or a
YAML file resolved against the families of the selected instances, and the plan of one instance.

User problems, in three spellings that all end in problem mappings parsed by the family:

    --problem 1000x517x129   --problem m=1000,n=517,k=129,beta=0.5       (repeatable; the family parses it)
    --m 127,129 --n 64 --k 32 --beta 0,0.5                                (GEMM's legacy flags: a product)
    --problems FILE.yaml:
        problems:
          - {m: 1000, n: 517, k: 129}
          - {m: 4096, n: 4096, k: 4096, alpha: 1.0, beta: 0.5, data: normal}

`data` (an input kind of the family, or `both` for every kind) and `label` are common keys. A problem
applies to the instances of every family that accepts it; one that no selected family accepts is an
error naming the family whose keys it matches best. Errors name file, line, key, value and fix (SpecError).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from emitter.errors import SpecError
from emitter.families.registry import runtime_family

COMMON_KEYS = ("data", "label")


def hooks_of(obj: Any) -> Any:
    """The run-time hooks of a family config or problem (its class's FAMILY)."""
    return runtime_family(type(obj).FAMILY)


@dataclass(frozen=True)
class VerifyProblem:
    problem: Any                    # the family's problem (GemmProblem, ...)
    data: str = "normal"            # an input kind of the family (GEMM: int | normal)
    label: str = ""
    source: str = "default"         # default | user

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", hooks_of(self.problem).problem_label(self.problem, self.data))

    @property
    def family(self) -> str:
        return type(self.problem).FAMILY

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "data": self.data, "source": self.source,
                **hooks_of(self.problem).problem_to_dict(self.problem)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], family: str) -> "VerifyProblem":
        hooks = runtime_family(family)
        return cls(hooks.problem_from_dict(d), str(d.get("data", "normal")), str(d.get("label", "")),
                   str(d.get("source", "default")))


# ---------------------------------------------------------------------------------------------- defaults
def default_problems(cfg: Any, quick: bool = False) -> list[VerifyProblem]:
    """The family's default problem set for one instance."""
    return [VerifyProblem(p, data) for p, data in hooks_of(cfg).default_problems(cfg, quick=quick)]


def cannot_run_reason(cfg: Any, problem: Any) -> str | None:
    """Why the instance cannot run the problem (the family's not_supported_reasons, joined), or None."""
    reasons = hooks_of(cfg).not_supported_reasons(cfg, problem)
    return "; ".join(reasons) if reasons else None


# ---------------------------------------------------------------------------------------------- user problems
@dataclass(frozen=True)
class _Item:
    """One user problem before a family parses it."""

    mapping: Mapping[str, Any]
    where: str
    line: int | None
    key_path: str
    key_lines: Mapping[str, int] | None = None


def _check_common(key: str, value: Any, kinds: Sequence[str], where: str, line: int | None) -> Any:
    if key == "data":
        if value not in tuple(kinds) + ("both",):
            raise SpecError("problem data must name the input kind", file=where, line=line, key_path=key,
                            value=value, allowed=tuple(kinds) + ("both",),
                            fix="data: int (exact, bit-for-bit) or normal (random, with tolerance)")
        return value
    if key == "label":
        if not isinstance(value, str) or not value or not all(c.isalnum() or c in "_-.+" for c in value):
            raise SpecError("problem label must be a word of letters, digits and _-.+", file=where, line=line,
                            key_path=key, value=value)
        return value
    raise AssertionError(key)


def _takes_key_lines(hooks: Any) -> bool:
    """Whether the family's problem_from_mapping takes the optional `key_lines` (per-key line numbers)."""
    import inspect

    try:
        return "key_lines" in inspect.signature(hooks.problem_from_mapping).parameters
    except (TypeError, ValueError):
        return False


def _as_spec_error(e: Exception, hooks: Any, where: str, line: int | None, key_path: str, value: Any) -> SpecError:
    """A family hook's own exception (a bug or an unexpected shape) as a SpecError naming the family."""
    if isinstance(e, SpecError):
        return e
    return SpecError(f"not a {hooks.NAME} problem ({type(e).__name__}: {e})", file=where, line=line,
                     key_path=key_path, value=value)


def _resolve_item(item: _Item, hooks: Any) -> list[VerifyProblem]:
    lines = item.key_lines or {}
    common = {k: _check_common(k, v, hooks.DATA_KINDS, item.where, lines.get(k, item.line))
              for k, v in item.mapping.items() if k in COMMON_KEYS}
    rest = {k: v for k, v in item.mapping.items() if k not in COMMON_KEYS}
    if _takes_key_lines(hooks):
        problem = hooks.problem_from_mapping(rest, item.where, item.line, item.key_path, key_lines=lines)
    else:
        problem = hooks.problem_from_mapping(rest, item.where, item.line, item.key_path)
    data = common.get("data", "both")
    label = common.get("label", "")
    kinds = tuple(hooks.DATA_KINDS) if data == "both" else (data,)
    out = []
    for d in kinds:
        lab = f"{label}_{d}" if label and len(kinds) > 1 else label
        out.append(VerifyProblem(problem, d, lab, source="user"))
    return out


def _families(families: Iterable[str] | None) -> list[Any]:
    from emitter.families.registry import FAMILIES

    names = list(dict.fromkeys(families)) if families is not None else list(FAMILIES)
    out = []
    for name in names:
        try:
            out.append(runtime_family(name))
        except Exception:  # noqa: BLE001 - a family whose hooks do not import: asked for, an error; else left out
            if families is not None:
                raise
    return out


def resolve(items: Sequence[_Item], families: Iterable[str] | None = None) -> list[VerifyProblem]:
    """Each user problem parsed by every family that accepts it (`families`: those of the selected instances;
    None: every family with run-time hooks). A problem no family accepts raises the SpecError of the family
    whose problem keys it shares most (ties: registry order)."""
    hooks_list = _families(families)
    out: list[VerifyProblem] = []
    for item in items:
        errors: list[tuple[int, int, SpecError]] = []
        got: list[VerifyProblem] = []
        for order, hooks in enumerate(hooks_list):
            try:
                got += _resolve_item(item, hooks)
            except Exception as e:  # noqa: BLE001 - another family's parser may fail in its own way
                overlap = len(set(item.mapping) & set(hooks.PROBLEM_KEYS))
                errors.append((-overlap, order, _as_spec_error(e, hooks, item.where, item.line, item.key_path,
                                                               dict(item.mapping))))
        if not got:
            if not errors:
                raise SpecError("no kernel family here can run user problems", file=item.where, line=item.line,
                                key_path=item.key_path)
            raise sorted(errors, key=lambda t: (t[0], t[1]))[0][2]
        out += got
    return out


def problems_from_strings(texts: Sequence[str], data: str = "both", families: Iterable[str] | None = None,
                          where: str = "<command line>") -> list[VerifyProblem]:
    """`--problem TEXT` (repeatable): each family parses the strings it understands (parse_problem)."""
    hooks_list = _families(families)
    out: list[VerifyProblem] = []
    for text in texts:
        errors: list[tuple[int, SpecError]] = []
        got: list[VerifyProblem] = []
        for order, hooks in enumerate(hooks_list):
            try:
                for mapping in hooks.parse_problem(text, where):
                    m = dict(mapping)
                    if data != "both":
                        m.setdefault("data", data)
                    got += _resolve_item(_Item(m, where, None, "--problem"), hooks)
            except Exception as e:  # noqa: BLE001 - another family's parser may fail in its own way
                errors.append((order, _as_spec_error(e, hooks, where, None, "--problem", text)))
        if not got:
            if not errors:
                raise SpecError("no kernel family here can run user problems", file=where, key_path="--problem",
                                value=text)
            raise errors[0][1]
        out += got
    return out


def _split(text: str | None, key: str, cast: type) -> list[Any]:
    if text is None:
        return [None]
    vals = []
    flag = f"--{key.replace('_', '-')}"
    for part in str(text).split(","):
        part = part.strip()
        try:
            vals.append(cast(part))
        except ValueError:
            what = "integers" if cast is int else "numbers"
            raise SpecError(f"{flag} takes {what} (comma-separated for several)", file="<command line>",
                            key_path=flag, value=text,
                            fix=f"{flag} 128 or {flag} 127,129" if cast is int else f"{flag} 0.5") from None
    return vals


def problems_from_options(m: str | None, n: str | None, k: str | None, batch: str | None = None,
                          split_k: str | None = None, alpha: str | None = None, beta: str | None = None,
                          data: str = "both", families: Iterable[str] | None = None) -> list[VerifyProblem]:
    """Problems from the size flags --m/--n/--k (and friends); each flag may list values (127,129): their
    product. (GEMM's flags, kept from before --problem; they build problem mappings like any other.)"""
    given = {"m": m, "n": n, "k": k}
    if all(v is None for v in given.values()):
        if any(v is not None for v in (batch, split_k, alpha, beta)):
            raise SpecError("--batch/--split-k/--alpha/--beta need a problem size", file="<command line>",
                            fix="add --m, --n and --k, e.g. --m 1000 --n 517 --k 129")
        return []
    missing = [f"--{key}" for key, v in given.items() if v is None]
    if missing:
        raise SpecError(f"a problem from the command line needs --m, --n and --k; missing {', '.join(missing)}",
                        file="<command line>", fix="e.g. --m 1000 --n 517 --k 129")
    lists = [("m", _split(m, "m", int)), ("n", _split(n, "n", int)), ("k", _split(k, "k", int)),
             ("batch", _split(batch, "batch", int)), ("split_k", _split(split_k, "split_k", int)),
             ("alpha", _split(alpha, "alpha", float)), ("beta", _split(beta, "beta", float))]
    items: list[_Item] = []

    def product(i: int, acc: dict[str, Any]) -> None:
        if i == len(lists):
            items.append(_Item({**acc, "data": data}, "<command line>", None, "--m/n/k"))
            return
        key, values = lists[i]
        for v in values:
            product(i + 1, {**acc, key: v} if v is not None else acc)

    product(0, {})
    return resolve(items, families)


def load_problem_file(path: str | Path, families: Iterable[str] | None = None) -> list[VerifyProblem]:
    """Problems from a YAML file (a list, or a mapping with `problems:`), with line numbers in errors."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read the problems file: {e.strerror or e}", file=where,
                        fix="pass an existing YAML file to --problems") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"the problems file is not UTF-8 text ({e.reason} at byte {e.start})", file=where) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SpecError(f"not valid YAML: {getattr(e, 'problem', None) or e}", file=where,
                        line=(mark.line + 1) if mark else None) from None
    if root is None:
        raise SpecError("the problems file is empty", file=where, fix="list problems: [{m: 128, n: 128, k: 128}]")
    if isinstance(root, yaml.MappingNode):
        keys = {kn.value: vn for kn, vn in root.value}
        if set(keys) - {"problems"} or "problems" not in keys:
            extra = sorted(set(keys) - {"problems"})
            raise SpecError("the problems file must hold `problems:` (a list)", file=where, line=root.start_mark.line + 1,
                            key_path=extra[0] if extra else None, allowed=["problems"],
                            fix="problems:\n    - {m: 1000, n: 517, k: 129}")
        root = keys["problems"]
    if not isinstance(root, yaml.SequenceNode):
        raise SpecError("`problems` must be a list", file=where, line=root.start_mark.line + 1, key_path="problems",
                        fix="problems:\n    - {m: 1000, n: 517, k: 129}")
    if not root.value:
        raise SpecError("`problems` is empty", file=where, line=root.start_mark.line + 1, key_path="problems")
    items = []
    for i, node in enumerate(root.value):
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            raise SpecError("each problem must be a mapping", file=where, line=line, key_path=f"problems[{i}]",
                            fix="- {m: 1000, n: 517, k: 129}")
        try:
            data = yaml.safe_load(yaml.serialize(node))
        except (yaml.YAMLError, RecursionError) as e:
            raise SpecError(f"problem cannot be read: {e}", file=where, line=line, key_path=f"problems[{i}]") from None
        key_lines = {kn.value: vn.start_mark.line + 1 for kn, vn in node.value if isinstance(kn.value, str)}
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            raise SpecError("problem keys must be words", file=where, line=line, key_path=f"problems[{i}]",
                            fix="- {m: 1000, n: 517, k: 129}")
        items.append(_Item(data, where, line, f"problems[{i}]", key_lines))
    return resolve(items, families)


# ---------------------------------------------------------------------------------------------- plan
def plan_problems(cfg: Any, user: Sequence[VerifyProblem] | None, quick: bool = False,
                  data: str = "both", scheduler: int = 0) -> list[tuple[VerifyProblem, str | None]]:
    """(problem, skip reason or None) for one instance: the user's problems of its family, else the default
    set; with `scheduler` (run-time scheduler options, emitter.kit.scheduler) set on every problem."""
    hooks = hooks_of(cfg)
    family = type(cfg).FAMILY
    mine = [p for p in (user or ()) if p.family == family]
    problems = mine if user else default_problems(cfg, quick=quick)
    if not user and data != "both":
        problems = [p for p in problems if p.data == data]
    if scheduler:
        out = []
        for p in problems:
            q = hooks.with_options(cfg, p.problem, scheduler)
            if isinstance(q, str):
                out.append((p, f"--scheduler: {q}"))
            else:
                vp = VerifyProblem(q, p.data, "", p.source)
                out.append((vp, cannot_run_reason(cfg, q)))
        return out
    return [(p, cannot_run_reason(cfg, p.problem)) for p in problems]
