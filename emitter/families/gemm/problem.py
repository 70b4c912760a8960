"""The GEMM family's run-time problem: GemmProblem, its label, what an instance can run, the default verify
set and the parsing of user problems (mappings from YAML problem files, `--problem` strings).

Default set: sizes that are and are not tile multiples (1, 7, 127, 129, 1000, 4096 and tile +/- 1),
rounded up only where an alignment forces it (the contiguous extent of an operand must be a multiple of
its alignment); beta = 0 and beta != 0; alpha != 1; padded leading dimensions (a kernel that ignores
ld reads the wrong rows); batched and split-K problems where the instance enables them. Each problem
says which data it runs on: `int` (small integers: results exact, checked bit for bit) or `normal`
(random normal values, checked with the dtype's tolerance).

User problems: `--problem MxNxK[xB]` or `--problem m=1000,n=517,k=129,beta=0.5` (repeatable), the legacy
--m/--n/--k flags, or a YAML file:

    problems:
      - {m: 1000, n: 517, k: 129}
      - {m: 4096, n: 4096, k: 4096, alpha: 1.0, beta: 0.5, data: normal}
      - {m: 256, n: 256, k: 8192, split_k: 4, batch: 1, lda: 8200}

Errors name the key, the value and the fix (emitter.errors.SpecError).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping

from emitter.errors import SpecError
from emitter.families.gemm.config import GemmConfig

DATA_KINDS = ("int", "normal")
PROBLEM_KEYS = ("m", "n", "k", "batch", "split_k", "alpha", "beta", "lda", "ldb", "ldc", "ldd",
                "batch_stride_a", "batch_stride_b", "batch_stride_c", "batch_stride_d")
_INT_KEYS = ("m", "n", "k", "batch", "split_k", "lda", "ldb", "ldc", "ldd",
             "batch_stride_a", "batch_stride_b", "batch_stride_c", "batch_stride_d")
MAX_DIM = 1 << 20


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM launch: D = act(alpha * A @ B + beta * C + bias). Leading dims / strides in elements, 0 = packed."""

    m: int
    n: int
    k: int
    batch: int = 1
    split_k: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    ldd: int = 0
    batch_stride_a: int = 0
    batch_stride_b: int = 0
    batch_stride_c: int = 0
    batch_stride_d: int = 0
    options: int = 0      # run-time scheduler options (emitter.kit.scheduler.SchedulerOptions.encode()), 0 = none

    FAMILY: ClassVar[str] = "gemm"

    def resolved(self, cfg: GemmConfig) -> "GemmProblem":
        """Packed (0) leading dimensions and batch strides replaced by their values for cfg's layouts."""
        lda = self.lda or (self.k if cfg.row_major_a else self.m)
        ldb = self.ldb or (self.n if cfg.row_major_b else self.k)
        ldc = self.ldc or (self.n if cfg.row_major_c else self.m)
        ldd = self.ldd or (self.n if cfg.row_major_c else self.m)
        rows_a = self.m if cfg.row_major_a else self.k
        rows_b = self.k if cfg.row_major_b else self.n
        rows_c = self.m if cfg.row_major_c else self.n
        return GemmProblem(
            self.m, self.n, self.k, self.batch, self.split_k, self.alpha, self.beta, lda, ldb, ldc, ldd,
            self.batch_stride_a or lda * rows_a, self.batch_stride_b or ldb * rows_b,
            self.batch_stride_c or ldc * rows_c, self.batch_stride_d or ldd * rows_c, self.options,
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GemmProblem":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _num(v: float) -> str:
    return f"{v:g}".replace("-", "m")


def problem_label(p: GemmProblem, data: str) -> str:
    """The case label: sizes, modes, alpha/beta, padded lds, options and the data kind."""
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
        from emitter.kit.scheduler import SchedulerOptions
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


def not_supported_reasons(cfg: GemmConfig, p: GemmProblem) -> list[str]:
    """Why `cfg` cannot run `p` (alignment, batching, split-K), [] when it can (the first rule broken: the
    rules depend on each other). The shim's can_implement still decides for the rest; this names the reason
    in words before anything is launched."""
    why = cannot_run_reason(cfg, p)
    return [why] if why else []


def cannot_run_reason(cfg: GemmConfig, p: GemmProblem) -> str | None:
    """The first of not_supported_reasons, or None."""
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
def default_problems(cfg: GemmConfig, quick: bool = False) -> list[tuple[GemmProblem, str]]:
    """The default problem set for one instance (deduplicated, in a stable order).

    quick=True leaves out the 4096^3 problem and the long-K problems (CI / fake backend)."""
    mm, mn, mk = dim_multiples(cfg)
    tm, tn, tk = cfg.problem_tile

    def P(m: int, n: int, k: int, data: str, alpha: float = 1.0, beta: float = 0.0, **kw: Any) -> tuple[GemmProblem, str]:
        if not cfg.source:   # no C operand: the same shapes with beta = 0 (duplicates drop out below)
            beta = 0.0
        return (GemmProblem(_up(m, mm), _up(n, mn), _up(k, mk), alpha=alpha, beta=beta, **kw), data)

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
    base = P(200, 136, 72, "int", beta=1.0)[0]
    pad = math.lcm(cfg.alignment_a, cfg.alignment_b, cfg.alignment_c, 8)
    r = base.resolved(cfg)
    out.append((replace(base, lda=r.lda + pad, ldb=r.ldb + 2 * pad, ldc=r.ldc + 3 * pad, ldd=r.ldd + pad), "int"))
    if not quick:
        out.append(P(256, 256, 4096, "int", beta=0.0))
        out.append(P(4096, 4096, 4096, "normal", alpha=1.0, beta=1.5))
    if cfg.batched:
        out.append(P(129, 127, 64, "normal", alpha=1.0, beta=0.5, batch=3))
        b = P(64, 72, 40, "int", beta=1.0, batch=4)[0]
        rb = b.resolved(cfg)
        out.append((replace(b, batch_stride_a=rb.batch_stride_a + pad, batch_stride_b=rb.batch_stride_b + 2 * pad,
                            batch_stride_c=rb.batch_stride_c + pad, batch_stride_d=rb.batch_stride_d + 3 * pad), "int"))
    if cfg.split_k != "none":
        out.append(P(tm + 1, tn + 1, 1024 if quick else 4096, "normal", alpha=1.0, beta=0.5, split_k=4))
        out.append(P(127, 129, 1000, "int", beta=0.0, split_k=3))
        out.append(P(tm, tn, 16 * tk, "int", beta=1.0, split_k=2))
        if cfg.batched:
            out.append(P(64, 64, 512, "normal", beta=0.5, batch=2, split_k=2))
    seen: set[str] = set()
    uniq = []
    for gp, data in out:
        label = problem_label(gp, data)
        if label not in seen:
            seen.add(label)
            uniq.append((gp, data))
    return uniq



# ---------------------------------------------------------------------------------------------- user problems
def check_value(key: str, value: Any, where: str, line: int | None) -> Any:
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
    raise AssertionError(key)



def problem_from_mapping(item: Mapping[str, Any], where: str, line: int | None, key_path: str,
                         key_lines: Mapping[str, int] | None = None) -> GemmProblem:
    """A checked GemmProblem from a mapping of PROBLEM_KEYS (the caller took `data` and `label` out);
    key_lines: the line of each key, where the mapping came from a file."""
    key_lines = key_lines or {}
    unknown = [k for k in item if k not in PROBLEM_KEYS]
    if unknown:
        k = unknown[0]
        raise SpecError(f"unknown problem key {k!r}", file=where, line=key_lines.get(k, line),
                        key_path=f"{key_path}.{k}", value=k, allowed=PROBLEM_KEYS + ("data", "label"),
                        fix="remove it or fix its spelling")
    vals = {k: check_value(k, v, where, key_lines.get(k, line)) for k, v in item.items()}
    missing = [k for k in ("m", "n", "k") if k not in item]
    if missing:
        raise SpecError(f"problem lacks {', '.join(missing)}", file=where, line=line, key_path=key_path,
                        fix="every problem needs m, n and k, e.g. {m: 1000, n: 517, k: 129}")
    return GemmProblem(**vals)


_SIZE_RE = re.compile(r"^(\d+)x(\d+)x(\d+)(?:x(\d+))?$")


def parse_problem(text: str, where: str = "<command line>") -> list[dict[str, Any]]:
    """One `--problem` string: `MxNxK` or `MxNxKxBATCH`, or `key=value,...` over PROBLEM_KEYS (and data,
    label), e.g. `m=1000,n=517,k=129,beta=0.5`. Values are checked by problem_from_mapping."""
    t = str(text).strip().lower()
    m = _SIZE_RE.match(t)
    if m:
        d: dict[str, Any] = {"m": int(m[1]), "n": int(m[2]), "k": int(m[3])}
        if m[4]:
            d["batch"] = int(m[4])
        return [d]
    if "=" not in t:
        raise SpecError("a GEMM problem is MxNxK, MxNxKxBATCH or key=value pairs", file=where,
                        key_path="--problem", value=text, fix="--problem 1000x517x129 or --problem m=1000,n=517,k=129,beta=0.5")
    d = {}
    for part in t.split(","):
        key, sep, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if not sep or not key:
            raise SpecError("a GEMM problem's key=value pairs are separated by commas", file=where,
                            key_path="--problem", value=text, fix="--problem m=1000,n=517,k=129")
        if key in ("data", "label"):
            d[key] = val
            continue
        if key not in PROBLEM_KEYS:
            raise SpecError(f"unknown problem key {key!r}", file=where, key_path=f"--problem.{key}", value=text,
                            allowed=PROBLEM_KEYS + ("data", "label"), fix="remove it or fix its spelling")
        try:
            d[key] = float(val) if key in ("alpha", "beta") else int(val)
        except ValueError:
            raise SpecError(f"problem {key} must be a number", file=where, key_path=f"--problem.{key}",
                            value=val, fix=f"{key}={'1.0' if key in ('alpha', 'beta') else '128'}") from None
    return [d]
