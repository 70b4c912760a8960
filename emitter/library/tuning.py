"""Reading tuning tables (`emitter profile` -> tuning.json) for the exported library's dispatch.

Format (emitter/profile/selection.py `tuning_table`, schema_version 1):
    {"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {...},
     "entries": [{"op": {...}, "problem": {"m": .., "n": .., "k": .., "batch": 1}, "kernel": "<instance name>",
                  "split_k": 1, "median_ms": .., "tflops": .., ...}, ...]}
Only `problem` and `kernel` are required of an entry; `op` (when present) is checked against the kernel
(`op.fast_accum: true` -- its `key` then ends in `_fastacc` -- marks a choice among sm90a fp8 fast-accumulation
kernels; the library applies it only to callers who opt in to fast accumulation, see `check_op`);
`split_k` (optional, default 1) is the split-K slice count the winner was timed with -- the library launches
it with that count (see emitter/library/dispatch.py `effective_split_k`), so it must be 1 unless the kernel
is a split-K instance (`check_split_k`); `options` (optional, default 0) are the run-time scheduler options
(emitter.kit.scheduler) it was timed with, launched with it too, so they must be ones the kernel has
(`check_options`); `gpu.cc` (when present) tells the dispatch which GPU generation the
choices were measured on.

`emitter profile` writes one table for every family it timed: entries whose `problem.family` (or `op.family`) names
another family than the library's own are not read by `load`; `family_entries` hands them to that family's library
hook (ctx["tuning_entries"][family]), which turns them into its own records and reports the ones it cannot use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from emitter.errors import EmitterError

TUNING_SCHEMA_VERSION = 1


class TuningError(EmitterError):
    exit_code = 2


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


def _cc(gpu: Any) -> int:
    """The table's GPU compute capability ("9.0", "90", 90, [9, 0]) as 90; 0 when absent or unreadable."""
    cc = gpu.get("cc") if isinstance(gpu, dict) else None
    try:
        if isinstance(cc, (list, tuple)) and len(cc) == 2:
            return int(cc[0]) * 10 + int(cc[1])
        if isinstance(cc, str) and "." in cc:
            major, minor = cc.split(".", 1)
            return int(major) * 10 + int(minor)
        if cc is not None:
            return int(cc)
    except (TypeError, ValueError):
        pass
    return 0


def unmeasured(data: dict[str, Any]) -> str | None:
    """Why a tuning table was not measured on a real GPU (None when nothing says so): `emitter profile
    --backend fake` writes gpu.name "fake GPU (numpy backend)" (and gpu.cc 9.0, which would otherwise pass for an
    H100's); a table may also say backend: fake (top level or under gpu)."""
    gpu = data.get("gpu")
    backend = data.get("backend") or (gpu.get("backend") if isinstance(gpu, dict) else None)
    if isinstance(backend, str) and backend.lower() == "fake":
        return "its backend is 'fake'"
    name = gpu.get("name") if isinstance(gpu, dict) else None
    if isinstance(name, str) and name.lower().startswith("fake"):
        return f"its gpu.name is {name!r} (`emitter profile --backend fake`: modelled times, not measurements)"
    return None


def entry_family(e: Any) -> str | None:
    """The family a tuning entry belongs to: `problem.family` (or `op.family`), as `emitter profile` writes for
    every family but the library's own (whose entries carry none); None when the entry names no family."""
    if not isinstance(e, dict):
        return None
    for part in ("problem", "op"):
        fam = e.get(part).get("family") if isinstance(e.get(part), dict) else None
        if isinstance(fam, str):
            return fam
    return None


def _own(e: Any) -> bool:
    from emitter.families.registry import DEFAULT_FAMILY

    return entry_family(e) in (None, DEFAULT_FAMILY)


def family_entries(paths: Sequence[str | Path], allow_unmeasured: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The entries of the other families (attention, conv, ...) in tuning tables, by family, each a copy of the
    entry with `source` (the table's path), `position` (its index in `entries`) and `gpu_cc` added: the family's
    library hook reads them (ctx["tuning_entries"][family]). The tables are checked as `load` checks them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        data = _read(Path(path), allow_unmeasured)
        gpu_cc = _cc(data.get("gpu"))
        for i, e in enumerate(data["entries"]):
            if not _own(e):
                out.setdefault(str(entry_family(e)), []).append({**e, "source": str(path), "position": i,
                                                                 "gpu_cc": gpu_cc})
    return out


def _read(p: Path, allow_unmeasured: bool) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TuningError(f"{p}: no tuning table here; `emitter profile` writes one (tuning.json)") from None
    except json.JSONDecodeError as e:
        raise TuningError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise TuningError(f"{p}: not a tuning table (expected an object with an 'entries' list)")
    if data.get("schema_version") != TUNING_SCHEMA_VERSION:
        raise TuningError(f"{p}: schema_version {data.get('schema_version')!r} is not supported (this emitter reads "
                          f"{TUNING_SCHEMA_VERSION})")
    kind = data.get("kind")
    if kind is not None and kind != "emitter.tuning_table":
        raise TuningError(f"{p}: kind {kind!r} is not a tuning table (expected 'emitter.tuning_table')")
    why = unmeasured(data)
    if why and not allow_unmeasured:
        raise TuningError(f"{p}: this tuning table was not measured on a real GPU: {why}. Its choices would be "
                          f"dispatched as if timed on a cc {_cc(data.get('gpu')) / 10:.1f} GPU. Profile on the GPU "
                          f"(emitter profile without --backend fake), or pass --allow-unmeasured-tuning to export it "
                          f"anyway (tests, demos)")
    return data


def load(path: str | Path, allow_unmeasured: bool = False) -> list[TuningEntry]:
    """The library's own family's entries of a tuning table (another family's go to `family_entries`)."""
    p = Path(path)
    data = _read(p, allow_unmeasured)
    gpu_cc = _cc(data.get("gpu"))
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
