"""Which problems each instance is verified on: a default set per instance, or the user's own.

Default set: sizes that are and are not tile multiples (1, 7, 127, 129, 1000, 4096 and tile +/- 1),
rounded up only where an alignment forces it (the contiguous extent of an operand must be a multiple of
its alignment); beta = 0 and beta != 0; alpha != 1; padded leading dimensions (a kernel that ignores
ld reads the wrong rows); batched and split-K problems where the instance enables them. Each problem
says which data it runs on: `int` (small integers: results exact, checked bit for bit) or `normal`
(random normal values, checked with the dtype's tolerance).

User problems: --m/--n/--k (comma-separated lists make a product) with --batch/--split-k/--alpha/--beta,
or a YAML file:

    problems:
      - {m: 1000, n: 517, k: 129}
      - {m: 4096, n: 4096, k: 4096, alpha: 1.0, beta: 0.5, data: normal}
      - {m: 256, n: 256, k: 8192, split_k: 4, batch: 1, lda: 8200}

Errors in either name the key, the value and the fix (emitter.errors.SpecError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from emitter.errors import SpecError
from emitter.runtime.backend import GemmProblem
from emitter.runtime.config import GemmConfig

DATA_KINDS = ("int", "normal")
PROBLEM_KEYS = ("m", "n", "k", "batch", "split_k", "alpha", "beta", "lda", "ldb", "ldc", "ldd",
                "batch_stride_a", "batch_stride_b", "batch_stride_c", "batch_stride_d", "data", "label")
_INT_KEYS = ("m", "n", "k", "batch", "split_k", "lda", "ldb", "ldc", "ldd",
             "batch_stride_a", "batch_stride_b", "batch_stride_c", "batch_stride_d")
MAX_DIM = 1 << 20


@dataclass(frozen=True)
class VerifyProblem:
    gemm: GemmProblem
    data: str = "normal"            # int | normal
    label: str = ""
    source: str = "default"         # default | user

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", problem_label(self.gemm, self.data))

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "data": self.data, "source": self.source, **self.gemm.as_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VerifyProblem":
        return cls(GemmProblem.from_dict(d), str(d.get("data", "normal")), str(d.get("label", "")),
                   str(d.get("source", "default")))


def _num(v: float) -> str:
    return f"{v:g}".replace("-", "m")


def problem_label(p: GemmProblem, data: str) -> str:
    parts = [f"{p.m}x{p.n}x{p.k}"]
    if p.batch > 1:
        parts.append(f"batch{p.batch}")
    if p.split_k > 1:
        parts.append(f"splitk{p.split_k}")
    parts.append(f"alpha{_num(p.alpha)}")
    parts.append(f"beta{_num(p.beta)}")
    lds = [f"{n}{v}" for n, v in (("lda", p.lda), ("ldb", p.ldb), ("ldc", p.ldc), ("ldd", p.ldd)) if v]
    if lds:
        parts.append("_".join(lds))
    if any((p.batch_stride_a, p.batch_stride_b, p.batch_stride_c, p.batch_stride_d)):
        parts.append("strided")
    if p.options:
        from emitter.runtime.options import SchedulerOptions
        parts.append("_".join(SchedulerOptions.decode(p.options).label().split()))
    parts.append(data)
    return "_".join(parts)


# ---------------------------------------------------------------------------------------------- alignment
def dim_multiples(cfg: GemmConfig) -> tuple[int, int, int]:
    """The multiple each of m, n, k must be, so every operand's contiguous extent meets its alignment."""
    mm, mn, mk = 1, 1, 1
    if cfg.row_major_a:
        mk = math.lcm(mk, cfg.alignment_a)
    else:
        mm = math.lcm(mm, cfg.alignment_a)
    if cfg.row_major_b:
        mn = math.lcm(mn, cfg.alignment_b)
    else:
        mk = math.lcm(mk, cfg.alignment_b)
    if cfg.row_major_c:
        mn = math.lcm(mn, cfg.alignment_c)
    else:
        mm = math.lcm(mm, cfg.alignment_c)
    return mm, mn, mk


def cannot_run_reason(cfg: GemmConfig, p: GemmProblem) -> str | None:
    """Why `cfg` cannot run `p` (alignment, batching, split-K), or None. The shim's can_implement still decides
    for the rest; this names the reason in words before anything is launched."""
    if p.batch > 1 and not cfg.batched:
        return f"batch={p.batch}: the instance is not batched (batched: true in the spec enables it)"
    if p.split_k > 1 and cfg.split_k == "none":
        return f"split_k={p.split_k}: the instance has no split-K (split_k: serial|parallel in the spec)"
    if p.beta != 0.0 and not cfg.source:
        return (f"beta={p.beta:g}: the instance has no C operand (epilogue source: false), so it computes "
                f"beta = 0 only")
    mm, mn, mk = dim_multiples(cfg)
    for name, v, mult in (("m", p.m, mm), ("n", p.n, mn), ("k", p.k, mk)):
        if v % mult:
            return (f"{name}={v} is not a multiple of {mult} (alignment of an operand whose contiguous "
                    f"dimension is {name}; layouts {cfg.layout_letters})")
    for name, v, al in (("lda", p.lda, cfg.alignment_a), ("ldb", p.ldb, cfg.alignment_b),
                        ("ldc", p.ldc, cfg.alignment_c), ("ldd", p.ldd, cfg.alignment_c)):
        if v and v % al:
            return f"{name}={v} is not a multiple of the alignment {al}"
    r = p.resolved(cfg)
    for name, ld, lo in (("lda", r.lda, p.k if cfg.row_major_a else p.m),
                         ("ldb", r.ldb, p.n if cfg.row_major_b else p.k),
                         ("ldc", r.ldc, p.n if cfg.row_major_c else p.m),
                         ("ldd", r.ldd, p.n if cfg.row_major_c else p.m)):
        if ld < lo:
            return f"{name}={ld} is smaller than the matrix's contiguous extent {lo}"
    return None


def _up(x: int, mult: int) -> int:
    return max(mult, -(-x // mult) * mult)


# ---------------------------------------------------------------------------------------------- defaults
def default_problems(cfg: GemmConfig, quick: bool = False) -> list[VerifyProblem]:
    """The default problem set for one instance (deduplicated, in a stable order).

    quick=True leaves out the 4096^3 problem and the long-K problems (CI / fake backend)."""
    mm, mn, mk = dim_multiples(cfg)
    tm, tn, tk = cfg.problem_tile

    def P(m: int, n: int, k: int, data: str, alpha: float = 1.0, beta: float = 0.0, **kw: Any) -> VerifyProblem:
        if not cfg.source:   # no C operand: the same shapes with beta = 0 (duplicates drop out below)
            beta = 0.0
        return VerifyProblem(GemmProblem(_up(m, mm), _up(n, mn), _up(k, mk), alpha=alpha, beta=beta, **kw), data)

    out = [
        P(1, 7, 7, "int"),
        P(7, 1, 127, "int", beta=2.0),
        P(127, 129, 127, "int", alpha=2.0, beta=-1.0),
        P(129, 127, 129, "normal", alpha=1.25, beta=0.5),
        P(tm + 1, tn - 1, 3 * tk + 1, "int", beta=1.0),
        P(2 * tm - 1, tn + 1, tk - 1, "normal"),
        P(1000, 1000, 1000, "normal", alpha=1.0, beta=0.0),
        P(1000, 517, 129, "normal", alpha=-0.75, beta=1.5),
    ]
    # padded leading dimensions (in whole alignment units, so aligned kernels can still run them)
    base = P(200, 136, 72, "int", beta=1.0).gemm
    pad = math.lcm(cfg.alignment_a, cfg.alignment_b, cfg.alignment_c, 8)
    r = base.resolved(cfg)
    out.append(VerifyProblem(replace(base, lda=r.lda + pad, ldb=r.ldb + 2 * pad, ldc=r.ldc + 3 * pad,
                                     ldd=r.ldd + pad), "int"))
    if not quick:
        out.append(P(256, 256, 4096, "int", beta=0.0))
        out.append(P(4096, 4096, 4096, "normal", alpha=1.0, beta=1.5))
    if cfg.batched:
        out.append(P(129, 127, 64, "normal", alpha=1.0, beta=0.5, batch=3))
        b = P(64, 72, 40, "int", beta=1.0, batch=4).gemm
        rb = b.resolved(cfg)
        out.append(VerifyProblem(replace(b, batch_stride_a=rb.batch_stride_a + pad,
                                         batch_stride_b=rb.batch_stride_b + 2 * pad,
                                         batch_stride_c=rb.batch_stride_c + pad,
                                         batch_stride_d=rb.batch_stride_d + 3 * pad), "int"))
    if cfg.split_k != "none":
        out.append(P(tm + 1, tn + 1, 1024 if quick else 4096, "normal", alpha=1.0, beta=0.5, split_k=4))
        out.append(P(127, 129, 1000, "int", beta=0.0, split_k=3))
        out.append(P(tm, tn, 16 * tk, "int", beta=1.0, split_k=2))
        if cfg.batched:
            out.append(P(64, 64, 512, "normal", beta=0.5, batch=2, split_k=2))
    seen: set[str] = set()
    uniq = []
    for vp in out:
        if vp.label not in seen:
            seen.add(vp.label)
            uniq.append(vp)
    return uniq


# ---------------------------------------------------------------------------------------------- user problems
def _check_value(key: str, value: Any, where: str, line: int | None) -> Any:
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"problem {key} must be an integer", file=where, line=line, key_path=key, value=value,
                            fix=f"write {key}: 128")
        lo = 1 if key in ("m", "n", "k", "batch", "split_k") else 0
        if value < lo or value > (MAX_DIM if key in ("m", "n", "k") else 1 << 40):
            rng = f"{lo}..{MAX_DIM}" if key in ("m", "n", "k") else f">= {lo}"
            raise SpecError(f"problem {key} is out of range", file=where, line=line, key_path=key, value=value,
                            allowed=rng, fix=f"use a {key} in {rng}")
        return value
    if key in ("alpha", "beta"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpecError(f"problem {key} must be a finite number", file=where, line=line, key_path=key,
                            value=value, fix=f"write {key}: 1.0")
        return float(value)
    if key == "data":
        if value not in DATA_KINDS + ("both",):
            raise SpecError("problem data must name the input kind", file=where, line=line, key_path=key,
                            value=value, allowed=DATA_KINDS + ("both",),
                            fix="data: int (exact, bit-for-bit) or normal (random, with tolerance)")
        return value
    if key == "label":
        if not isinstance(value, str) or not value or not all(c.isalnum() or c in "_-.+" for c in value):
            raise SpecError("problem label must be a word of letters, digits and _-.+", file=where, line=line,
                            key_path=key, value=value)
        return value
    raise AssertionError(key)


def make_problems(items: Iterable[tuple[Mapping[str, Any], str, int | None, str]]) -> list[VerifyProblem]:
    """Problems from (mapping, file, line, key_path) items, checked key by key."""
    out: list[VerifyProblem] = []
    for item, where, line, path in items:
        unknown = [k for k in item if k not in PROBLEM_KEYS]
        if unknown:
            raise SpecError(f"unknown problem key {unknown[0]!r}", file=where, line=line, key_path=f"{path}.{unknown[0]}",
                            value=unknown[0], allowed=PROBLEM_KEYS, fix="remove it or fix its spelling")
        missing = [k for k in ("m", "n", "k") if k not in item]
        if missing:
            raise SpecError(f"problem lacks {', '.join(missing)}", file=where, line=line, key_path=path,
                            fix="every problem needs m, n and k, e.g. {m: 1000, n: 517, k: 129}")
        vals = {k: _check_value(k, v, where, line) for k, v in item.items()}
        data = vals.pop("data", "both")
        label = vals.pop("label", "")
        gp = GemmProblem(**vals)
        kinds = DATA_KINDS if data == "both" else (data,)
        for d in kinds:
            lab = f"{label}_{d}" if label and len(kinds) > 1 else label
            out.append(VerifyProblem(gp, d, lab, source="user"))
    return out


def _split_ints(text: str | None, key: str) -> list[int | None]:
    if text is None:
        return [None]
    vals = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            vals.append(int(part))
        except ValueError:
            raise SpecError(f"--{key.replace('_', '-')} takes integers (comma-separated for several)",
                            file="<command line>", key_path=f"--{key.replace('_', '-')}", value=text,
                            fix=f"--{key.replace('_', '-')} 128 or --{key.replace('_', '-')} 127,129") from None
    return vals


def _split_floats(text: str | None, key: str) -> list[float | None]:
    if text is None:
        return [None]
    vals = []
    for part in str(text).split(","):
        try:
            vals.append(float(part))
        except ValueError:
            raise SpecError(f"--{key} takes numbers (comma-separated for several)", file="<command line>",
                            key_path=f"--{key}", value=text, fix=f"--{key} 0.5") from None
    return vals


def problems_from_options(m: str | None, n: str | None, k: str | None, batch: str | None = None,
                          split_k: str | None = None, alpha: str | None = None, beta: str | None = None,
                          data: str = "both") -> list[VerifyProblem]:
    """Problems from --m/--n/--k (and friends); each option may list values (127,129): their product."""
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
    items = []
    for mv in _split_ints(m, "m"):
        for nv in _split_ints(n, "n"):
            for kv in _split_ints(k, "k"):
                for bv in _split_ints(batch, "batch"):
                    for sv in _split_ints(split_k, "split_k"):
                        for av in _split_floats(alpha, "alpha"):
                            for bev in _split_floats(beta, "beta"):
                                item: dict[str, Any] = {"m": mv, "n": nv, "k": kv, "data": data}
                                for key, v in (("batch", bv), ("split_k", sv), ("alpha", av), ("beta", bev)):
                                    if v is not None:
                                        item[key] = v
                                items.append((item, "<command line>", None, "--" + "/".join(given)))
    return make_problems(items)


def load_problem_file(path: str | Path) -> list[VerifyProblem]:
    """Problems from a YAML file (a list, or a mapping with `problems:`), with line numbers in errors."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read the problems file: {e.strerror or e}", file=where,
                        fix="pass an existing YAML file to --problems") from None
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
        data = yaml.safe_load(yaml.serialize(node))
        # per-key lines for errors about one value
        for kn, vn in node.value:
            if kn.value not in PROBLEM_KEYS:
                raise SpecError(f"unknown problem key {kn.value!r}", file=where, line=kn.start_mark.line + 1,
                                key_path=f"problems[{i}].{kn.value}", allowed=PROBLEM_KEYS,
                                fix="remove it or fix its spelling")
            _check_value(kn.value, data[kn.value], where, vn.start_mark.line + 1)
        items.append((data, where, line, f"problems[{i}]"))
    return make_problems(items)


def plan_problems(cfg: GemmConfig, user: Sequence[VerifyProblem] | None, quick: bool = False,
                  data: str = "both", scheduler: int = 0) -> list[tuple[VerifyProblem, str | None]]:
    """(problem, skip reason or None) for one instance: the user's problems, else the default set; with
    `scheduler` (run-time scheduler options, emitter.runtime.options) set on every problem."""
    problems = list(user) if user else default_problems(cfg, quick=quick)
    if not user and data != "both":
        problems = [p for p in problems if p.data == data]
    if scheduler:
        problems = [VerifyProblem(replace(p.gemm, options=scheduler), p.data, "", p.source)
                    for p in problems]
    return [(p, cannot_run_reason(cfg, p.gemm)) for p in problems]
