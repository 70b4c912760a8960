"""Profile configs (YAML): which kernels, on which problems, timed how, against which baselines.

    manifests: [generated/demo]          # manifest dirs (or manifest.json paths); relative to the
                                         #   working directory, else to this file's directory
    select: "arch=sm90a"                 # shared --select / --exclude syntax; a string or a list
    exclude: []
    problems:                            # each entry: a named set, square sizes, or m/n/k(/batch)
      - set: llm                         #   square (1024..16384, powers of two) | llm (5 M x 6 (N,K))
      - square: {from: 1024, to: 8192, mul: 2}
      - {m: [16, 128], n: 4096, k: {from: 1024, to: 4096, step: 1024}, batch: 1}
    timing:
      warmup: 10                         # launches before timing (or warmup_ms)
      iterations: 100                    # timed launches per repeat, or min_duration_ms per repeat
      repeats: 5                         # blocks of iterations; their medians show the run-to-run spread
      rotate: auto                       # auto: input sets cycled past 2x the L2 size; or bytes; or false
      blocking_kernel: true              # hold the stream while launches queue (times GPU work, not Python)
      prune: 4                           # a kernel whose probe launch (after its check) takes more than 4x
                                         #   the best time so far on the problem (cuBLAS's included) is
                                         #   recorded as pruned with that probe time, not timed; 0: time all
      workspace_reset: library           # library: a kernel whose host shim zeroes workspace (stream-K /
                                         #   split-K locks) pays that memset before every timed launch, as
                                         #   each call into the exported library does; settled: only where a
                                         #   launch leaves the workspace non-zero (the kernel alone)
    check: true                          # each kernel is verified once per problem before its time counts
    alpha: 1.0
    beta: 0.0
    baselines: [cublas]                  # cuBLAS through torch (matmul / _scaled_mm for fp8); or []
    selection: {tie_tolerance: 0.01}     # ties: within max(tolerance, measured spread) of the best
    scheduler: {swizzle: [1, 4], raster: [heuristic, along_n]}
                                         # sm90a run-time scheduler options to time each kernel with too
                                         #   (a product of lists: swizzle, raster, reduction,
                                         #   promotion_interval; null = the compiled-in choice), beside
                                         #   its compiled-in choices; a variant a kernel cannot take
                                         #   is not timed on it
                                         # scheduler: {swizzle: [null, 4, 8], raster: [null, along_m], top: 3}
                                         #   top: K times the variants on the K fastest kernels of each
                                         #   problem only (ranked at their compiled-in choices, each at its
                                         #   best split-K count): a coarse pass over every kernel, a fine
                                         #   pass over the few that can win; 0 / absent: every kernel
    gpus: all                            # all | a count | a list of device indexes
    output: {dir: results, plots: true}

Layouts and data types come from each instance. Bad configs raise SpecError with file, line and key
path, like specs do.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from emitter.errors import SpecError
from emitter.kit import workspace
from emitter.spec.loader import Document, KeyPath, load_file, parse_text

SCHEMA_KEYS = ("description", "manifests", "manifest", "select", "exclude", "problems", "timing", "check",
               "alpha", "beta", "baselines", "selection", "gpus", "output", "peaks", "scheduler")
TIMING_KEYS = ("warmup", "warmup_ms", "iterations", "min_duration_ms", "max_iterations", "repeats", "rotate",
               "blocking_kernel", "prune", "workspace_reset")
WORKSPACE_RESETS = workspace.MODES           # ("library", "settled")
OUTPUT_KEYS = ("dir", "csv", "json", "tuning", "plots")
SELECTION_KEYS = ("tie_tolerance",)
PROBLEM_KEYS = ("m", "n", "k", "batch")
RANGE_KEYS = ("from", "to", "step", "mul")
BASELINES = ("cublas",)
BASELINE_ALIASES = {"cublaslt": "cublas", "torch": "cublas", "cuda": "cublas"}
PEAK_KEYS = ("tflops", "hbm_tbs")
SCHEDULER_KEYS = ("swizzle", "raster", "reduction", "promotion_interval")
MAX_PROBLEMS = 20000
MAX_DIM = 1 << 20

# The named problem sets the performance goals use.


def problem_from_json(d: dict[str, Any]) -> Any:
    """A profile problem from its JSON (as_dict), by the family it names (the default family's without one)."""
    from emitter.families.registry import entry_family, runtime_family

    return runtime_family(entry_family(d), need=("profile_problem_from_dict",)).profile_problem_from_dict(d)


def problems_from_text(texts: Any, families: Any = None, where: str = "<command line>") -> list[Any]:
    """Profile problems from problem strings the kernel families parse (`4096x4096x4096`,
    `b=2,hq=16,hkv=4,sq=4096,sk=4096,d=128`): each family's profile_problem of what it parsed. SpecError for a
    string no family parses, or one that sets what a profile problem cannot hold."""
    from emitter.verify.problems import hooks_of, problems_from_strings

    out = []
    for vp in problems_from_strings(tuple(texts), "both", families, where):
        hook = getattr(hooks_of(vp.problem), "profile_problem", None)
        got = hook(vp.problem) if hook else f"the {vp.family} family has no profile problems (profile_problem)"
        if isinstance(got, str):
            raise SpecError(got, file=where, key_path="--problem" if where == "<command line>" else "problems",
                            value=vp.label, fix="--problem 4096x4096x4096 (or square, llm)")
        out.append(got)
    return list(dict.fromkeys(out))


def problem_ident(p: Any) -> tuple:
    """What identifies a profile problem in groupings and sort orders: its own `ident` (GEMM: m, n, k, batch),
    else its key."""
    ident = getattr(p, "ident", None)
    return tuple(ident) if ident is not None else (p.key,)


def named_sets() -> dict[str, str]:
    """The named problem sets (`--problem square`, a profile YAML's `set:`) -> the family whose run-time hooks
    hold them (PROFILE_SETS, profile_named_set), in registry order."""
    from emitter.families.registry import FAMILIES, runtime_family

    out: dict[str, str] = {}
    for fam in FAMILIES:
        for name in getattr(runtime_family(fam, need=()), "PROFILE_SETS", ()):
            out.setdefault(name, fam)
    return out


def named_set(name: str) -> list[Any]:
    """The problems of a named set (KeyError for a name no family has)."""
    from emitter.families.registry import runtime_family

    return list(runtime_family(named_sets()[name], need=()).profile_named_set(name))


@dataclass(frozen=True)
class Timing:
    warmup: int = 10                  # launches
    warmup_ms: float | None = None    # or: warm up for at least this long
    iterations: int | None = 100      # timed launches per repeat ...
    min_duration_ms: float | None = None   # ... or enough launches to fill this much time per repeat
    max_iterations: int = 10000
    repeats: int = 5
    rotate: int | str | bool = "auto"     # "auto" | bytes | False
    blocking_kernel: bool = True
    prune: float = 4.0                # skip timing a kernel slower than this x the best so far (0: never)
    workspace_reset: str = "library"  # "library": the shim's workspace memset before each timed launch | "settled"


@dataclass(frozen=True)
class Output:
    dir: str = "results"
    csv: str = "profile.csv"
    json: str = "profile.json"
    tuning: str = "tuning.json"
    plots: bool = True


@dataclass(frozen=True)
class ProfileConfig:
    file: str
    manifests: tuple[str, ...]
    problems: tuple[Any, ...]
    select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    timing: Timing = field(default_factory=Timing)
    check: bool = True
    alpha: float = 1.0
    beta: float = 0.0
    baselines: tuple[str, ...] = ("cublas",)
    tie_tolerance: float = 0.01
    gpus: str | int | tuple[int, ...] = "all"
    output: Output = field(default_factory=Output)
    peaks: dict[str, Any] = field(default_factory=dict)   # overrides: {"tflops": {"bf16": 989}, "hbm_tbs": 3.35}
    description: str = ""
    # run-time scheduler options (emitter.kit.scheduler encodings) each kernel is also timed with; 0 (the
    # compiled-in choices) always comes first
    scheduler: tuple[int, ...] = (0,)
    # scheduler `top: K`: the variants after the first are timed on the K fastest kernels of each (op, problem)
    # at the compiled-in choices only; 0: on every kernel
    scheduler_top: int = 0

    def replace(self, **changes: Any) -> "ProfileConfig":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["problems"] = [p.as_dict() for p in self.problems]
        d["manifests"] = list(self.manifests)
        d["select"], d["exclude"], d["baselines"] = list(self.select), list(self.exclude), list(self.baselines)
        d["scheduler"] = list(self.scheduler)
        if isinstance(self.gpus, tuple):
            d["gpus"] = list(self.gpus)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProfileConfig":
        gpus = d.get("gpus", "all")
        return cls(file=d["file"], manifests=tuple(d["manifests"]),
                   problems=tuple(problem_from_json(p) for p in d["problems"]),
                   select=tuple(d.get("select", ())), exclude=tuple(d.get("exclude", ())),
                   # a record from before timing.workspace_reset timed the kernel alone: "settled"
                   timing=Timing(**{"workspace_reset": "settled", **d.get("timing", {})}), check=d.get("check", True),
                   alpha=d.get("alpha", 1.0), beta=d.get("beta", 0.0), baselines=tuple(d.get("baselines", ())),
                   tie_tolerance=d.get("tie_tolerance", 0.01),
                   gpus=tuple(gpus) if isinstance(gpus, list) else gpus,
                   output=Output(**d.get("output", {})), peaks=d.get("peaks", {}),
                   description=d.get("description", ""), scheduler=tuple(d.get("scheduler", (0,))),
                   scheduler_top=int(d.get("scheduler_top", 0)))


# ------------------------------------------------------------------------------------------ parsing

def _unknown_keys(doc: Document, path: KeyPath, data: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    for key in data:
        if key not in allowed:
            import difflib

            close = difflib.get_close_matches(key, allowed, n=1)
            raise doc.error(path + (key,), f"unknown key '{key}' in {what}", value=key, allowed=allowed,
                            fix=f"did you mean '{close[0]}'?" if close else "remove it or use one of the allowed keys")


def _mapping(doc: Document, path: KeyPath, v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise doc.error(path, f"{what} must be a mapping (key: value lines)", value=v)
    return v


def _int(doc: Document, path: KeyPath, v: Any, lo: int, hi: int, what: str = "an integer") -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise doc.error(path, f"{what} is expected", value=v, allowed=f"an integer {lo}..{hi}")
    if not lo <= v <= hi:
        raise doc.error(path, f"{v} is out of range", value=v, allowed=f"{lo}..{hi}")
    return v


def _num(doc: Document, path: KeyPath, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise doc.error(path, "a number is expected", value=v, allowed=f"{lo}..{hi}")
    if not lo <= v <= hi:
        raise doc.error(path, f"{v} is out of range", value=v, allowed=f"{lo}..{hi}")
    return float(v)


def _bool(doc: Document, path: KeyPath, v: Any) -> bool:
    if not isinstance(v, bool):
        raise doc.error(path, "true or false is expected", value=v, allowed=["true", "false"])
    return v


def _strings(doc: Document, path: KeyPath, v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and s.strip() for s in items):
        raise doc.error(path, f"{what} must be a string or a list of strings", value=v)
    return tuple(s.strip() for s in items)


def _dim_values(doc: Document, path: KeyPath, v: Any, what: str) -> list[int]:
    """An int, a list of ints, or a range {from, to, step | mul} (inclusive)."""
    if isinstance(v, list):
        if not v:
            raise doc.error(path, f"{what}: an empty list gives no problems", value=v)
        return [_int(doc, path + (i,), x, 1, MAX_DIM, f"{what}: a positive integer") for i, x in enumerate(v)]
    if isinstance(v, dict):
        _unknown_keys(doc, path, v, RANGE_KEYS, f"a range for {what}")
        for key in ("from", "to"):
            if key not in v:
                raise doc.error(path, f"a range needs '{key}'", value=v,
                                fix="write {from: 1024, to: 16384, mul: 2} or {from: 128, to: 1024, step: 128}")
        start = _int(doc, path + ("from",), v["from"], 1, MAX_DIM)
        stop = _int(doc, path + ("to",), v["to"], 1, MAX_DIM)
        if stop < start:
            raise doc.error(path + ("to",), f"'to' ({stop}) is below 'from' ({start})", value=stop)
        if ("step" in v) == ("mul" in v):
            raise doc.error(path, "a range needs exactly one of 'step' (add) or 'mul' (multiply)", value=v,
                            fix="add `step: 128` for an arithmetic range or `mul: 2` for powers")
        out: list[int] = []
        if "step" in v:
            step = _int(doc, path + ("step",), v["step"], 1, MAX_DIM)
            out = list(range(start, stop + 1, step))
        else:
            mul = _int(doc, path + ("mul",), v["mul"], 2, 1024)
            x = start
            while x <= stop:
                out.append(x)
                x *= mul
        if len(out) > MAX_PROBLEMS:
            raise doc.error(path, f"the range gives {len(out)} values (at most {MAX_PROBLEMS})", value=v)
        return out
    return [_int(doc, path, v, 1, MAX_DIM, f"{what}: a positive integer, a list or a range")]


def _problems(doc: Document, path: KeyPath, v: Any) -> tuple[Any, ...]:
    fix = "e.g. `problems: [{set: llm}, {m: 4096, n: 4096, k: 4096}, {square: [1024, 2048]}]`"
    if v is None:
        raise doc.error(path, "the config needs a 'problems' list", fix=fix)
    if not isinstance(v, list) or not v:
        raise doc.error(path, "'problems' must be a non-empty list", value=v, fix=fix)
    out: list[Any] = []
    for i, entry in enumerate(v):
        p = path + (i,)
        if isinstance(entry, str) and ("=" in entry or entry.strip()[:1].isdigit()):
            # a problem string the kernel families parse: `- 4096x4096x4096`, `- b=2,hq=16,sq=4096,sk=4096,d=128`
            try:
                out += problems_from_text([entry], None, doc.file)
            except SpecError as e:
                raise doc.error(p, e.message, value=entry, allowed=e.allowed, fix=e.fix or fix) from None
            continue
        if isinstance(entry, str):   # shorthand: `- llm`
            entry = {"set": entry}
        entry = _mapping(doc, p, entry, "a problem entry")
        if "set" in entry:
            _unknown_keys(doc, p, entry, ("set",), "a named-set entry")
            name = entry["set"]
            sets = tuple(named_sets())
            if not isinstance(name, str) or name.strip().lower() not in sets:
                raise doc.error(p + ("set",), f"unknown problem set {name!r}", value=name, allowed=sets)
            out += named_set(name.strip().lower())
        elif "square" in entry:
            _unknown_keys(doc, p, entry, ("square", "batch"), "a square-size entry")
            sizes = _dim_values(doc, p + ("square",), entry["square"], "square")
            batches = _dim_values(doc, p + ("batch",), entry.get("batch", 1), "batch")
            out += [problem_from_json({"m": s, "n": s, "k": s, "batch": b}) for s in sizes for b in batches]
        else:
            _unknown_keys(doc, p, entry, PROBLEM_KEYS, "a problem entry (or use `set:` / `square:`)")
            for key in ("m", "n", "k"):
                if key not in entry:
                    raise doc.error(p, f"problem entry lacks '{key}'", value=entry, fix=fix)
            axes = [_dim_values(doc, p + (key,), entry[key], key) for key in ("m", "n", "k")]
            axes.append(_dim_values(doc, p + ("batch",), entry.get("batch", 1), "batch"))
            count = 1
            for a in axes:
                count *= len(a)
            if count > MAX_PROBLEMS:
                raise doc.error(p, f"this entry gives {count} problems (at most {MAX_PROBLEMS})", value=entry)
            out += [problem_from_json(dict(zip(("m", "n", "k", "batch"), t))) for t in itertools.product(*axes)]
        if len(out) > MAX_PROBLEMS:
            raise doc.error(p, f"the config gives more than {MAX_PROBLEMS} problems", fix="narrow the ranges")
    seen: set[Any] = set()
    unique = []
    for prob in out:           # keep the written order, drop repeats
        if prob not in seen:
            seen.add(prob)
            unique.append(prob)
    return tuple(unique)


def _scheduler(doc: Document, path: KeyPath, v: Any) -> tuple[tuple[int, ...], int]:
    """`scheduler: {swizzle: [1, 4], raster: along_n, top: 3}`: the product of the value lists, as option
    encodings, after 0 (the compiled-in choices); and `top` (0: every kernel gets every variant)."""
    from emitter.kit.scheduler import OptionsError, SchedulerOptions

    v = _mapping(doc, path, v, "'scheduler'")
    _unknown_keys(doc, path, v, SCHEDULER_KEYS + ("top",), "'scheduler'")
    top = 0
    if "top" in v:
        t = v["top"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise doc.error(path + ("top",), "top is how many of each problem's fastest kernels get the "
                            "variants: a whole number >= 1 (0 or no key: every kernel)", value=t)
        top = t
    axes = []
    for key in SCHEDULER_KEYS:
        vals = v.get(key)
        if vals is None:
            axes.append([None])
            continue
        vals = vals if isinstance(vals, list) else [vals]
        if not vals:
            raise doc.error(path + (key,), "an empty list sweeps nothing", value=vals)
        axis = []
        for i, x in enumerate(vals):   # null: keep the kernel's compiled-in choice for this key
            try:
                axis.append(None if x is None else getattr(SchedulerOptions.parse(f"{key}={x}"), key))
            except OptionsError as e:
                raise doc.error(path + (key, i) if isinstance(v.get(key), list) else path + (key,), str(e),
                                value=x) from None
        axes.append(axis)
    out = [0]
    for combo in itertools.product(*axes):
        code = SchedulerOptions(*combo).encode()
        if code not in out:
            out.append(code)
    return tuple(out), top


def _timing(doc: Document, path: KeyPath, v: Any) -> Timing:
    if v is None:
        return Timing()
    v = _mapping(doc, path, v, "'timing'")
    _unknown_keys(doc, path, v, TIMING_KEYS, "'timing'")
    kw: dict[str, Any] = {}
    if "warmup" in v:
        kw["warmup"] = _int(doc, path + ("warmup",), v["warmup"], 0, 100000)
    if "warmup_ms" in v:
        kw["warmup_ms"] = _num(doc, path + ("warmup_ms",), v["warmup_ms"], 0, 600000)
    if "iterations" in v and "min_duration_ms" in v:
        raise doc.error(path + ("min_duration_ms",), "give 'iterations' or 'min_duration_ms', not both",
                        fix="iterations fixes the count; min_duration_ms picks the count from a warm-up estimate")
    if "iterations" in v:
        kw["iterations"] = _int(doc, path + ("iterations",), v["iterations"], 1, 1000000)
    if "min_duration_ms" in v:
        kw["min_duration_ms"] = _num(doc, path + ("min_duration_ms",), v["min_duration_ms"], 0.001, 600000)
        kw["iterations"] = None
    if "max_iterations" in v:
        kw["max_iterations"] = _int(doc, path + ("max_iterations",), v["max_iterations"], 1, 1000000)
    if "repeats" in v:
        kw["repeats"] = _int(doc, path + ("repeats",), v["repeats"], 1, 1000)
    if "rotate" in v:
        r = v["rotate"]
        if r == "auto" or r is False:
            kw["rotate"] = r
        elif isinstance(r, int) and not isinstance(r, bool) and r > 0:
            kw["rotate"] = r
        else:
            raise doc.error(path + ("rotate",), "rotate takes 'auto', a byte count, or false", value=r,
                            allowed=["auto", "<bytes>", "false"],
                            fix="keep 'auto' (input sets cycled past twice the L2 size read off the device)")
    if "blocking_kernel" in v:
        kw["blocking_kernel"] = _bool(doc, path + ("blocking_kernel",), v["blocking_kernel"])
    if "prune" in v:
        pr = v["prune"]
        if pr is False:
            pr = 0
        pr = _num(doc, path + ("prune",), pr, 0, 1000000)
        if 0 < pr < 1.5:
            raise doc.error(path + ("prune",), "prune below 1.5x would skip kernels that can still win within "
                            "the run-to-run noise", value=pr, allowed=["0 (time every kernel)", ">= 1.5"],
                            fix="use 0 to time every kernel, or a factor such as 4")
        kw["prune"] = float(pr)
    if "workspace_reset" in v:
        kw["workspace_reset"] = workspace_reset(v["workspace_reset"], doc, path + ("workspace_reset",))
    return Timing(**kw)


def workspace_reset(v: Any, doc: Document | None = None, path: KeyPath = ("timing", "workspace_reset"),
                    file: str = "<command line>") -> str:
    """timing.workspace_reset (or --workspace-reset): one of WORKSPACE_RESETS, else a SpecError."""
    if isinstance(v, str) and v.strip().lower() in WORKSPACE_RESETS:
        return v.strip().lower()
    msg = "workspace_reset takes 'library' or 'settled'"
    fix = ("keep 'library' (time what a call into the exported library costs, its workspace memset included); "
           "'settled' times the kernel alone")
    if doc is not None:
        raise doc.error(path, msg, value=v, allowed=list(WORKSPACE_RESETS), fix=fix)
    raise SpecError(msg, file=file, key_path=".".join(map(str, path)), value=v, allowed=list(WORKSPACE_RESETS),
                    fix=fix)


def known_baselines() -> tuple[str, ...]:
    """GEMM's baselines, then every other family's whose run-time hooks import (each op is timed against the
    config's baselines its own family has)."""
    from emitter.families.registry import DEFAULT_FAMILY, FAMILIES, runtime_family

    out = list(BASELINES)
    for fam in FAMILIES:
        if fam == DEFAULT_FAMILY:
            continue
        try:
            out += [b for b in getattr(runtime_family(fam, need=()), "BASELINES", ()) if b not in out]
        except Exception:  # noqa: BLE001 - a family in progress: its baselines are not offered
            continue
    return tuple(out)


def _baselines(doc: Document, path: KeyPath, v: Any) -> tuple[str, ...]:
    if v is None or v is False or v == "none":
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise doc.error(path, "baselines must be a list of names", value=v, allowed=BASELINES)
    out = []
    known = known_baselines()
    for i, b in enumerate(items):
        name = BASELINE_ALIASES.get(str(b).strip().lower(), str(b).strip().lower()) if isinstance(b, str) else None
        if name not in known:
            raise doc.error(path + (i,), f"unknown baseline {b!r}", value=b, allowed=known,
                            fix="cublas: torch.matmul (fp8: torch._scaled_mm, cuBLASLt) in the same process")
        if name not in out:
            out.append(name)
    return tuple(out)


def _gpus(doc: Document, path: KeyPath, v: Any) -> str | int | tuple[int, ...]:
    if v == "all":
        return "all"
    if isinstance(v, int) and not isinstance(v, bool):
        return _int(doc, path, v, 1, 64, "a GPU count")
    if isinstance(v, list) and v:
        idx = tuple(_int(doc, path + (i,), x, 0, 63, "a device index") for i, x in enumerate(v))
        if len(set(idx)) != len(idx):
            raise doc.error(path, "a device index is listed twice", value=v)
        return idx
    raise doc.error(path, "gpus takes 'all', a count or a list of device indexes", value=v,
                    allowed=["all", "<count>", "[0, 1, ...]"])


def _output(doc: Document, path: KeyPath, v: Any) -> Output:
    if v is None:
        return Output()
    v = _mapping(doc, path, v, "'output'")
    _unknown_keys(doc, path, v, OUTPUT_KEYS, "'output'")
    kw: dict[str, Any] = {}
    for key in ("dir", "csv", "json", "tuning"):
        if key in v:
            if not isinstance(v[key], str) or not v[key].strip():
                raise doc.error(path + (key,), f"output.{key} must be a path", value=v[key])
            if key != "dir" and ("/" in v[key] or v[key] in (".", "..")):
                raise doc.error(path + (key,), f"output.{key} is a file name inside output.dir", value=v[key],
                                fix="put directories in output.dir (or -o on the command line)")
            kw[key] = v[key].strip()
    if "plots" in v:
        kw["plots"] = _bool(doc, path + ("plots",), v["plots"])
    return Output(**kw)


def _peaks(doc: Document, path: KeyPath, v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    v = _mapping(doc, path, v, "'peaks'")
    _unknown_keys(doc, path, v, PEAK_KEYS, "'peaks'")
    out: dict[str, Any] = {}
    if "tflops" in v:
        t = _mapping(doc, path + ("tflops",), v["tflops"], "peaks.tflops")
        out["tflops"] = {str(k): _num(doc, path + ("tflops", k), x, 0.001, 1e6) for k, x in t.items()}
    if "hbm_tbs" in v:
        out["hbm_tbs"] = _num(doc, path + ("hbm_tbs",), v["hbm_tbs"], 0.001, 1e3)
    return out


def _check_patterns(doc: Document, path: KeyPath, patterns: tuple[str, ...]) -> None:
    from emitter.selection import SelectionError, parse

    for i, text in enumerate(patterns):
        try:
            parse(text)
        except SelectionError as e:
            where = path + (i,) if isinstance(doc.data.get(path[0]), list) else path
            raise doc.error(where, str(e),
                            value=text, fix="a name glob (`*bf16*`) or key=value terms (`arch=sm90a tile=128x256x64`)")


def parse_config(doc: Document) -> ProfileConfig:
    data = doc.data
    if data is None:
        raise doc.error((), "the profile config is empty",
                        fix="start from configs/profile/square.yaml (manifests, problems, timing)")
    root = _mapping(doc, (), data, "a profile config")
    _unknown_keys(doc, (), root, SCHEMA_KEYS, "the profile config")
    if "manifest" in root and "manifests" in root:
        raise doc.error(("manifest",), "give 'manifests' (a list) or 'manifest', not both")
    mkey = "manifest" if "manifest" in root else "manifests"
    manifests = _strings(doc, (mkey,), root.get(mkey), "manifests")
    if not manifests:
        raise doc.error((mkey,), "the config names no manifest", fix="add `manifests: [generated/demo]` "
                        "(the output directory of `emitter emit`)")
    select = _strings(doc, ("select",), root.get("select"), "select")
    exclude = _strings(doc, ("exclude",), root.get("exclude"), "exclude")
    _check_patterns(doc, ("select",), select)
    _check_patterns(doc, ("exclude",), exclude)
    tie = 0.01
    if "selection" in root:
        s = _mapping(doc, ("selection",), root["selection"], "'selection'")
        _unknown_keys(doc, ("selection",), s, SELECTION_KEYS, "'selection'")
        if "tie_tolerance" in s:
            tie = _num(doc, ("selection", "tie_tolerance"), s["tie_tolerance"], 0.0, 0.5)
    desc = root.get("description", "")
    if not isinstance(desc, str):
        raise doc.error(("description",), "description must be text", value=desc)
    sched = _scheduler(doc, ("scheduler",), root["scheduler"]) if "scheduler" in root else ((0,), 0)
    return ProfileConfig(
        file=doc.file,
        manifests=manifests,
        problems=_problems(doc, ("problems",), root.get("problems")),
        select=select,
        exclude=exclude,
        timing=_timing(doc, ("timing",), root.get("timing")),
        check=_bool(doc, ("check",), root["check"]) if "check" in root else True,
        alpha=_num(doc, ("alpha",), root["alpha"], -1e6, 1e6) if "alpha" in root else 1.0,
        beta=_num(doc, ("beta",), root["beta"], -1e6, 1e6) if "beta" in root else 0.0,
        baselines=_baselines(doc, ("baselines",), root["baselines"]) if "baselines" in root else ("cublas",),
        tie_tolerance=tie,
        scheduler=sched[0],
        scheduler_top=sched[1],
        gpus=_gpus(doc, ("gpus",), root["gpus"]) if "gpus" in root else "all",
        output=_output(doc, ("output",), root.get("output")),
        peaks=_peaks(doc, ("peaks",), root.get("peaks")),
        description=desc,
    )


def load_config(path: str | Path) -> ProfileConfig:
    return parse_config(load_file(path))


def parse_config_text(text: str, file: str = "profile.yaml") -> ProfileConfig:
    return parse_config(parse_text(text, file))


def resolve_manifest(config: ProfileConfig, entry: str, cwd: Path | None = None) -> Path:
    """A manifest path from the config: relative to the working directory, else to the config's folder."""
    from emitter.manifest import manifest_path

    p = Path(entry).expanduser()
    if p.is_absolute():
        return manifest_path(p)
    here = manifest_path((cwd or Path.cwd()) / p)
    if here.exists():
        return here
    beside = manifest_path(Path(config.file).resolve().parent / p)
    return beside if beside.exists() else here
