"""GEMM's entries of tuning tables (`emitter profile` -> tuning.json) for the exported library's dispatch.

Format (emitter/profile/selection.py `tuning_table`, schema_version 1):
    {"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {...},
     "entries": [{"op": {...}, "problem": {"m": .., "n": .., "k": .., "batch": 1}, "kernel": "<instance name>",
                  "split_k": 1, "median_ms": .., "tflops": .., ...}, ...]}
Only `problem` and `kernel` are required of an entry; `op` (when present) is checked against the kernel
(`op.fast_accum: true` -- its `key` then ends in `_fastacc` -- marks a choice among sm90a fp8 fast-accumulation
kernels; the library applies it only to callers who opt in to fast accumulation, see `check_op`);
`split_k` (optional, default 1) is the split-K slice count the winner was timed with -- the library launches
it with that count (see emitter/families/gemm/library_dispatch.py `effective_split_k`), so it must be 1 unless the kernel
is a split-K instance (`check_split_k`); `options` (optional, default 0) are the run-time scheduler options
(emitter.kit.scheduler) it was timed with, launched with it too, so they must be ones the kernel has
(`check_options`); `gpu.cc` (when present) tells the dispatch which GPU generation the
choices were measured on.

Beside each table, the profile.json of the same `emitter profile -o DIR` run (when there is one) gives every kernel's
time on each profiled shape, not just the winner's (`load_measurements`): the dispatch ranks candidates between
profiled shapes by the time it predicts from them (library_dispatch.py, rule step 4). A profile.json that lacks
one of the table's winners is another run's and is not used (a note says so); without one, the winners-only
rule applies as before.

`emitter profile` writes one table for every family it timed: entries whose `problem.family` (or `op.family`) names
another family are not read by `load`; the library stage hands them to that family's library hook
(emitter/library/tuning.py `family_entries`). The table's own checks are the kit's (emitter/kit/tuning.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from emitter.kit.tuning import TUNING_SCHEMA_VERSION, TuningError, entry_family, read_table, table_cc  # noqa: F401

FAMILY = "gemm"


@dataclass(frozen=True)
class TuningEntry:
    source: str
    position: int
    kernel: str
    m: int
    n: int
    k: int
    batch: int
    gpu_cc: int = 0                 # compute capability x 10 of the GPU the table was measured on; 0 = unknown
    op: dict[str, Any] | None = None
    median_ms: float | None = None
    split_k: int = 1                # split-K slices the kernel was timed with (1 = no split)
    options: int = 0                # run-time scheduler options it was timed with (emitter.kit.scheduler)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.batch)


def _positive_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2 ** 31:
        raise TuningError(f"{where}: problem.{key} must be a positive integer, got {value!r}")
    return value


def _split_k(e: dict[str, Any], where: str) -> int:
    value = e.get("split_k")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2 ** 31:
        raise TuningError(f"{where}: split_k must be a positive integer (the split-K slice count the kernel was "
                          f"timed with; 1 = no split), got {value!r}")
    return value


def _options(e: dict[str, Any], where: str) -> int:
    from emitter.kit.scheduler import OptionsError, SchedulerOptions

    value = e.get("options", 0)
    if value is None:
        return 0
    try:
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionsError(f"an integer is expected, got {value!r}")
        SchedulerOptions.decode(value)
    except OptionsError as err:
        raise TuningError(f"{where}: options (the run-time scheduler options the kernel was timed with, as "
                          f"`emitter profile` writes them): {err}") from None
    return value


def check_options(entry: TuningEntry, arch: str, config: dict[str, Any]) -> None:
    """An entry's run-time scheduler options must be ones its kernel has (the library launches it with them)."""
    from emitter.families.gemm.options import unsupported_config
    from emitter.kit.scheduler import SchedulerOptions

    why = unsupported_config(arch, config, entry.options)
    if why:
        raise TuningError(f"{entry.source}: entries[{entry.position}]: options {entry.options} "
                          f"({SchedulerOptions.decode(entry.options).label()}) cannot run on kernel {entry.kernel}: "
                          f"{why}; is the tuning table from another manifest, or edited? (set options to 0 or drop "
                          "the entry)")


def check_split_k(entry: TuningEntry, kernel_split_k: bool) -> None:
    """An entry with split_k > 1 must name a split-K instance (config split_k: serial): the library would
    otherwise launch a kernel with slices it cannot run."""
    if entry.split_k > 1 and not kernel_split_k:
        raise TuningError(f"{entry.source}: entries[{entry.position}]: split_k is {entry.split_k}, but kernel "
                          f"{entry.kernel} is not a split-K instance (its config has split_k: none), so it cannot "
                          f"run with {entry.split_k} slices; is the tuning table from another manifest, or edited? "
                          f"(set split_k to 1 or drop the entry)")


FAST_ACC_SUFFIX = "_fastacc"


def check_op(op: Any, where: str) -> dict[str, Any] | None:
    """An entry's `op` object, with `fast_accum` checked and filled in. `fast_accum` must be a bool; the op
    key (emitter/families/gemm/profile.py Op.key) ends in `_fastacc` exactly when it is true, so a key that says one
    thing and a flag that says the other is an error (which one is the table's intent cannot be told); a
    table without `fast_accum` but with a `_fastacc` key gets fast_accum: true. Not a dict: None (no check)."""
    if not isinstance(op, dict):
        return None
    op = dict(op)
    key = op.get("key")
    keyed = key.endswith(FAST_ACC_SUFFIX) if isinstance(key, str) else None
    if "fast_accum" in op:
        flag = op["fast_accum"]
        if not isinstance(flag, bool):
            raise TuningError(f"{where}: op.fast_accum must be true or false, got {flag!r}")
        if keyed is not None and keyed != flag:
            raise TuningError(f"{where}: op.fast_accum is {str(flag).lower()} but op.key {key!r} "
                              f"{'ends' if keyed else 'does not end'} in {FAST_ACC_SUFFIX!r}: fast accumulation is its "
                              f"own operation (different numerics), so the entry must say one thing; was the table "
                              f"edited? (fix op.key or op.fast_accum, or drop the entry)")
    elif keyed:
        op["fast_accum"] = True
    return op


def _own(e: Any) -> bool:
    return entry_family(e) in (None, FAMILY)


def load(path: str | Path, allow_unmeasured: bool = False) -> list[TuningEntry]:
    """The library's own family's entries of a tuning table (another family's go to `family_entries`)."""
    p = Path(path)
    data = read_table(p, allow_unmeasured)
    gpu_cc = table_cc(data.get("gpu"))
    out = []
    for i, e in enumerate(data["entries"]):
        if not _own(e):
            continue
        where = f"{p}: entries[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("kernel"), str) or not isinstance(e.get("problem"), dict):
            raise TuningError(f"{where}: needs 'kernel' (an instance name) and 'problem' ({{m, n, k[, batch]}})")
        prob = e["problem"]
        for key in ("m", "n", "k"):
            if key not in prob:
                raise TuningError(f"{where}: problem lacks {key!r}")
        m, n, k = (_positive_int(prob[key], where, key) for key in ("m", "n", "k"))
        batch = _positive_int(prob.get("batch", 1), where, "batch")
        split_k = _split_k(e, where)
        options = _options(e, where)
        med = e.get("median_ms")
        out.append(TuningEntry(source=str(p), position=i, kernel=e["kernel"], m=m, n=n, k=k, batch=batch, gpu_cc=gpu_cc,
                               op=check_op(e.get("op"), where),
                               median_ms=float(med) if isinstance(med, (int, float)) else None, split_k=split_k,
                               options=options,
                               extra={key: e[key] for key in ("tflops", "ratio_to_baseline", "baseline") if key in e}))
    return out


def load_all(paths: Sequence[str | Path], allow_unmeasured: bool = False) -> list[TuningEntry]:
    out: list[TuningEntry] = []
    for p in paths:
        out.extend(load(p, allow_unmeasured))
    return out


# ---- every kernel's time per profiled shape (profile.json beside the tuning table) ---------------------------

@dataclass(frozen=True)
class MeasuredEntry:
    """One kernel's measured time on one profiled shape, from the profile.json that `emitter profile` writes beside
    its tuning.json (the tuning table names only each shape's winner; the dispatch predicts every measured
    kernel's time between profiled shapes from these)."""

    source: str
    kernel: str
    m: int
    n: int
    k: int
    batch: int
    gpu_cc: int
    split_k: int
    options: int
    median_ms: float
    sms: int
    op: dict[str, Any] | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.batch)


PROFILE_NAME = "profile.json"


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError):
        return default


def profile_measurements(profile: Path, table_entries: Sequence[TuningEntry] = ()) -> tuple[list[MeasuredEntry], str]:
    """GEMM's correct, timed kernel measurements of a profile.json, and a note on what was read or why nothing
    was. A profile.json that is not the tuning table's own run (it lacks one of the table's winners: same kernel,
    shape, split-K count and options) is not used: its times would rank kernels against another run's."""
    import json

    from emitter.kit.tuning import table_cc as cc_of

    try:
        data = json.loads(profile.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        return [], f"tuning: {profile} not read ({e}); dispatch between profiled shapes uses the winners only"
    if not isinstance(data, dict) or data.get("kind") != "emitter.profile" or not isinstance(data.get("measurements"), list):
        return [], (f"tuning: {profile} is not an `emitter profile` result (kind emitter.profile with measurements); "
                    "dispatch between profiled shapes uses the winners only")
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    gpu_cc, sms = cc_of(env), max(_int(env.get("sm_count")), 0)
    out: list[MeasuredEntry] = []
    for d in data["measurements"]:
        if not isinstance(d, dict) or d.get("kind") != "kernel" or d.get("status") != "ok" or not _own(d):
            continue
        stats, prob = d.get("stats"), d.get("problem")
        med = stats.get("median_ms") if isinstance(stats, dict) else None
        if not isinstance(med, (int, float)) or not med > 0 or not isinstance(prob, dict) or not isinstance(d.get("name"), str):
            continue
        m, n, k, b = (_int(prob.get(key), 1 if key == "batch" else 0) for key in ("m", "n", "k", "batch"))
        if min(m, n, k, b) < 1:
            continue
        out.append(MeasuredEntry(source=str(profile), kernel=d["name"], m=m, n=n, k=k, batch=b, gpu_cc=gpu_cc,
                                 split_k=max(_int(d.get("split_k"), 1), 1), options=_int(d.get("options")),
                                 median_ms=float(med), sms=sms, op=d.get("op") if isinstance(d.get("op"), dict) else None))
    have = {(e.kernel, e.shape, e.split_k, e.options) for e in out}
    missing = [e for e in table_entries if (e.kernel, e.shape, e.split_k, e.options) not in have]
    if missing:
        e = missing[0]
        return [], (f"tuning: {profile} does not hold the tuning table's winner {e.kernel} at "
                    f"{'x'.join(map(str, e.shape))} ({len(missing)} of {len(table_entries)} missing): not that table's "
                    "run, so its times are not used; dispatch between profiled shapes uses the winners only")
    shapes = len({e.shape for e in out})
    return out, (f"tuning: {len(out)} kernel timings on {shapes} shapes from {profile} rank the candidates between "
                 f"profiled shapes (predicted time: FLOPs x wave quantization on {sms or 'unknown'} SMs)")


def load_measurements(paths: Sequence[str | Path], allow_unmeasured: bool = False) -> tuple[list[MeasuredEntry], list[str]]:
    """For each tuning table, the measurements of the profile.json beside it (`emitter profile -o DIR` writes both),
    when there is one; notes say what was used."""
    out: list[MeasuredEntry] = []
    notes: list[str] = []
    for p in paths:
        p = Path(p)
        prof = p.parent / PROFILE_NAME
        if p.name == PROFILE_NAME or not prof.is_file():
            continue
        got, note = profile_measurements(prof, load(p, allow_unmeasured))
        out.extend(got)
        notes.append(note)
    return out, notes
