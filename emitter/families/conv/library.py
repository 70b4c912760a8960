"""The conv family's pieces of an exported library (emitter.kit.library.LibraryPieces; docs/library.md "Convolution").

`library_pieces(entries, roots, ctx)` turns the selected conv instances into:
  header  <lib>_conv_problem / <lib>_conv_selection and <lib>_conv, _conv_can_implement, _conv_workspace_size,
          _conv_select, _conv_problem_init, _conv_kernel_count, _conv_kernel_name
  api     validation of every field (sizes, int32/int64 overflow, strides, the written tensor's overlap), the
          candidate walk (tuned records, then the static priority) over the instances' host shims, one launch
  table   the conv kernel table (op, dims, dtypes, alignments, tile, iterator, stride support, split-K,
          epilogue) and the conv tuning records
  python  conv2d / conv2d_input_grad / conv2d_weight_grad on channels_last torch tensors (+ torch custom ops)
  files   each instance's .cu (byte for byte), its launch translation unit, src/emitter_conv_abi.h

Tuning: `emitter profile` on a conv manifest writes tuning.json entries (problem.family "conv"); the export hands
them over as ctx["tuning_entries"]["conv"] and each becomes a tuning record (op, dtype, N, H, W, C, K, R, S, stride
-> kernel and its split-K slices; `entry_records`). The conv bench's older table stays readable:
`benchmarks/conv_bench.py` writes <out>/conv.json next to the kernels it built (<out>/kernels); when --tuning names
one (ctx["family_tuning"]), or, with no profile entries either, a conv manifest directory's parent (or the
directory itself) holds one, each verified row (check "ok") becomes a record the same way. Entries and rows naming
kernels that are not exported, or that do not fit, are left out: listed in the table's comment and reported by the
export (context["dropped_tuning"]).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from emitter.kit.library import ACTIVATIONS, DTYPES, LibraryError, LibraryPieces, tuning_problem_label

OPS = {"fprop": 1, "dgrad": 2, "wgrad": 3}
ITERATORS = {"analytic": 0, "optimized": 1, "few_channels": 2, "fixed_channels": 3}
_ARCH_CC = {"sm75": (75, False), "sm80": (80, False), "sm86": (86, False), "sm89": (89, False), "sm90a": (90, True)}
_BITS = {"f16": 16, "bf16": 16, "f32": 32, "tf32": 32, "f64": 64, "s8": 8, "s32": 32, "e4m3": 8, "e5m2": 8}
_LABEL = re.compile(r"^C(\d+) (\d+)² K(\d+) (\d+)x(\d+)(?: s(\d+))?$")


@dataclass(frozen=True)
class ConvKernelRecord:
    index: int
    name: str
    arch: str
    cc: int
    arch_specific: bool
    op: str
    dims: int
    a: str
    c: str
    accumulator: str
    alignment_a: int
    alignment_b: int
    alignment_c: int
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    iterator: str
    unity_stride: bool
    split_k: bool
    activation: str
    bias: bool
    clamp_min: float
    clamp_max: float
    cutlass_major: int
    # output tiles one SM works on at once (the predicted-time rule's wave model): 2 for the pingpong schedule, whose
    # two consumer warp groups each own a tile
    tiles_per_sm: int = 1
    # kernel: depthwise_direct (sm80 depthwise direct convolution; its tile is P x Q x channels): the dispatch tries it
    # first for a depthwise problem (groups = C = K), ahead of the grouped implicit GEMMs
    depthwise_direct: bool = False
    # kernel: depthwise_simt (emitter's SIMT depthwise kernel, wgrad / fprop): tried before the direct kernels
    depthwise_simt: bool = False

    @property
    def align_bytes(self) -> int:
        return self.alignment_a * _BITS.get(self.a, 16) // 8


@dataclass(frozen=True)
class ConvTuningRecord:
    kernel: int
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: int
    p: int
    q: int
    split_k: int = 1     # serial split-K slices the bench timed as best (conv.json row "split_k"); 1 = none


def _error(msg: str) -> Exception:
    return LibraryError(msg)


def kernel_records(entries: Sequence[dict[str, Any]]) -> list[ConvKernelRecord]:
    from emitter.families.conv.config import ConvConfig, ConvManifestError

    out = []
    for i, e in enumerate(sorted(entries, key=lambda e: e["name"])):
        try:
            cfg = ConvConfig.from_entry(e)
        except ConvManifestError as ex:
            raise _error(f"conv instance {e.get('name')}: {ex}") from None
        raw = cfg.raw
        if cfg.arch not in _ARCH_CC:
            raise _error(f"conv instance {cfg.name}: arch {cfg.arch} cannot be exported")
        a, c, acc = (str(raw.get("a")), str(raw.get("c")), str(raw.get("accumulator")))
        for what, v in (("a", a), ("c", c), ("accumulator", acc)):
            if v not in DTYPES:
                raise _error(f"conv instance {cfg.name}: {what} = {v!r} has no library dtype code ({', '.join(DTYPES)})")
        if cfg.activation not in ACTIVATIONS:
            raise _error(f"conv instance {cfg.name}: activation {cfg.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if cfg.iterator not in ITERATORS:
            raise _error(f"conv instance {cfg.name}: iterator {cfg.iterator!r} is not one of {', '.join(ITERATORS)}")
        cluster = raw.get("cluster") or [1, 1, 1]
        cc, specific = _ARCH_CC[cfg.arch]
        out.append(ConvKernelRecord(
            index=i, name=cfg.name, arch=cfg.arch, cc=cc, arch_specific=specific, op=cfg.op, dims=cfg.dims,
            a=a, c=c, accumulator=acc, alignment_a=cfg.alignment_a, alignment_b=cfg.alignment_b,
            alignment_c=cfg.alignment_c, tile=tuple(cfg.tile), cluster=tuple(int(v) for v in cluster),
            iterator=cfg.iterator, unity_stride=cfg.stride_support == "unity", split_k=cfg.split_k != "none",
            activation=cfg.activation, bias=cfg.bias, clamp_min=cfg.clamp_min, clamp_max=cfg.clamp_max,
            cutlass_major=3 if cfg.arch == "sm90a" else 2, tiles_per_sm=2 if raw.get("schedule") == "pingpong" else 1,
            depthwise_direct=cfg.kernel == "depthwise_direct", depthwise_simt=cfg.kernel == "depthwise_simt"))
    return out


def _parse_row(row: dict[str, Any], n_default: int) -> tuple[int, int, int, int, int, int, int, int, int, int] | None:
    """(n, h, w, c, k, r, s, stride, p, q) of a conv_bench row: its `problem` mapping when present, else its layer
    label ('C64 56² K64 3x3', ' s2' for stride 2; padding (R-1)/2 as the bench's layers use)."""
    prob = row.get("problem")
    if isinstance(prob, dict):
        try:
            vals = [int(prob[k]) for k in ("n", "h", "w", "c", "k", "r", "s")]
            stride = int(prob.get("stride", 1))
            pad = int(prob.get("pad", (vals[5] - 1) // 2))
        except (KeyError, TypeError, ValueError):
            return None
        n, h, w, c, k, r, s = vals
    else:
        m = _LABEL.match(str(row.get("layer", "")))
        if not m:
            return None
        c, h, k, r, s = (int(m.group(i)) for i in (1, 2, 3, 4, 5))
        stride = int(m.group(6) or 1)
        n, w, pad = n_default, h, (r - 1) // 2
    if min(n, h, w, c, k, r, s, stride) < 1 or max(n, h, w, c, k, r, s, stride) >= 2 ** 31:
        return None
    p = (h + 2 * pad - r) // stride + 1
    q = (w + 2 * pad - s) // stride + 1
    if p < 1 or q < 1:
        return None
    return n, h, w, c, k, r, s, stride, p, q


def tuning_records(kernels: Sequence[ConvKernelRecord], paths: Sequence[Path],
                   dropped: list[dict[str, Any]] | None = None) -> tuple[list[ConvTuningRecord], list[str]]:
    """Records from conv bench tables (conv.json, an older format a user may have); a row naming a kernel the
    export does not hold also goes to `dropped` (the export reports it)."""
    by_name = {k.name: k for k in kernels}
    records: list[ConvTuningRecord] = []
    notes: list[str] = []
    seen = set()
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise _error(f"{path}: conv tuning table unreadable ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise _error(f"{path}: not a conv tuning table (benchmarks/conv_bench.py's conv.json has a 'rows' list)")
        n_default = data.get("n", 128)
        if isinstance(n_default, bool) or not isinstance(n_default, int) or n_default < 1:
            raise _error(f"{path}: 'n' = {n_default!r} is not a positive batch size")
        for i, row in enumerate(data["rows"]):
            if not isinstance(row, dict) or not row.get("kernel"):
                continue
            where = f"{Path(path).name} row {i}"
            if row.get("check") != "ok":
                notes.append(f"{where}: check {row.get('check')!r}, not used")
                continue
            k = by_name.get(row["kernel"])
            if k is None:
                notes.append(f"{where}: kernel {row['kernel']} is not exported")
                if dropped is not None:
                    dropped.append({"kernel": str(row["kernel"]), "problem": [str(row.get("layer") or row.get("problem"))],
                                    "source": str(path), "position": f"rows[{i}]", "missing_kernel": True,
                                    "reason": "kernel not in this library"})
                continue
            shape = _parse_row(row, n_default)
            if shape is None:
                notes.append(f"{where}: layer {row.get('layer')!r} has no readable shape")
                continue
            if row.get("op") not in (None, k.op) or row.get("dtype") not in (None, k.a):
                notes.append(f"{where}: op/dtype {row.get('op')}/{row.get('dtype')} do not fit {k.name}")
                continue
            key = (k.op, k.a, shape)
            if key in seen:
                notes.append(f"{where}: a second winner for {k.op} {k.a} {shape}; the first one is kept")
                continue
            seen.add(key)
            split = row.get("split_k", 1)
            if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= 1024 or (split > 1 and not k.split_k):
                notes.append(f"{where}: split_k {split!r} does not fit {k.name} (1..1024, > 1 for split-K kernels only): 1 used")
                split = 1
            records.append(ConvTuningRecord(k.index, *shape, split_k=split))
    return records, notes


def _entry_shape(prob: Any) -> tuple[tuple[int, ...] | None, str]:
    """(n, h, w, c, k, r, s, stride, p, q) of a 2-D `emitter profile` conv problem (ConvProblem.as_dict), or None
    with why the table's records cannot hold it."""
    if not isinstance(prob, dict):
        return None, "no problem object"
    try:
        n, d, h, w, c, k, t, r, s = (int(prob.get(f, 1 if f in "dt" else 0)) for f in "ndhwcktrs")
        pf, pb = [int(v) for v in prob.get("pad_front", (0, 0, 0))], [int(v) for v in prob.get("pad_back", (0, 0, 0))]
        st, dil = [int(v) for v in prob.get("stride", (1, 1, 1))], [int(v) for v in prob.get("dilation", (1, 1, 1))]
    except (TypeError, ValueError):
        return None, "its problem fields are not integers"
    if len(pf) != 3 or len(pb) != 3 or len(st) != 3 or len(dil) != 3:
        return None, "pad_front, pad_back, stride and dilation must have 3 values (d, h, w)"
    if d != 1 or t != 1 or pf[0] or pb[0] or st[0] != 1 or dil[0] != 1:
        return None, "a 3-D problem (the exported conv kernels are 2-D)"
    if prob.get("groups", 1) != 1:
        return None, (f"groups={prob.get('groups')}: the conv tuning records hold ungrouped problems (a grouped one's "
                      f"time would rank kernels for the ungrouped problem of its shape)")
    if st[1] != st[2] or dil != [1, 1, 1]:
        return None, (f"stride {st[1]}x{st[2]} / dilation {dil[1]}x{dil[2]}: the conv tuning records hold one "
                      "stride for both dimensions and no dilation")
    if min(n, h, w, c, k, r, s, st[1]) < 1 or max(n, h, w, c, k, r, s) >= 2 ** 31:
        return None, "sizes out of range"
    p = (h + pf[1] + pb[1] - r) // st[1] + 1
    q = (w + pf[2] + pb[2] - s) // st[1] + 1
    if p < 1 or q < 1:
        return None, "an empty output"
    return (n, h, w, c, k, r, s, st[1], p, q), ""


def entry_records(kernels: Sequence[ConvKernelRecord], entries: Sequence[dict[str, Any]],
                  seen: set | None = None) -> tuple[list[ConvTuningRecord], list[str], list[dict[str, Any]]]:
    """Records from `emitter profile`'s tuning-table entries of the conv family (problem.family "conv"; the
    export hands them over as ctx["tuning_entries"]["conv"], each with its table's `source` and `position`):
    (op, dtype, geometry) -> kernel and its split-K slices. Entries it cannot use come back in `dropped`."""
    by_name = {k.name: k for k in kernels}
    records: list[ConvTuningRecord] = []
    notes: list[str] = []
    dropped: list[dict[str, Any]] = []
    seen = set() if seen is None else seen
    for e in entries:
        where = f"{Path(str(e.get('source'))).name} entries[{e.get('position')}]"

        def drop(reason: str, missing: bool = False) -> None:
            notes.append(f"{where}: {reason}")
            dropped.append({"kernel": str(e.get("kernel")), "problem": [tuning_problem_label(e.get("problem"))],
                            "source": str(e.get("source")), "position": e.get("position"), "missing_kernel": missing,
                            "reason": reason})

        k = by_name.get(e.get("kernel"))
        if k is None:
            drop(f"kernel {e.get('kernel')} is not exported", missing=True)
            continue
        op = e.get("op") if isinstance(e.get("op"), dict) else {}
        if op.get("op", k.op) != k.op or op.get("a", k.a) != k.a:
            drop(f"op/dtype {op.get('op')}/{op.get('a')} do not fit {k.name}")
            continue
        shape, why = _entry_shape(e.get("problem"))
        if shape is None:
            drop(f"problem not usable: {why}")
            continue
        key = (k.op, k.a, shape)
        if key in seen:
            drop(f"a second winner for {k.op} {k.a} {shape}; the first one is kept")
            continue
        seen.add(key)
        split = e.get("split_k", 1)
        if isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= 1024 or (split > 1 and not k.split_k):
            drop(f"split_k {split!r} does not fit {k.name} (1..1024, > 1 for split-K kernels only)")
            continue
        records.append(ConvTuningRecord(k.index, *shape, split_k=split))
    return records, notes, dropped


PROFILE_NAME = "profile.json"


def measured_entries(kernels: Sequence[ConvKernelRecord], profiled: Sequence[dict[str, Any]]):
    """Every exported kernel's time on each profiled problem, from the profile.json that `emitter profile -o DIR`
    writes beside the tuning.json the conv entries came from (their `source`): (measured records, notes). A
    profile.json that lacks one of its table's winners (same kernel, problem and split-K count) is not that table's
    run and is not used: its times would rank kernels against another run's."""
    from emitter.families.conv.library_dispatch import measured_records
    from emitter.kit.tuning import table_cc

    by_name = {k.name: k for k in kernels}
    rows: list[tuple[int, ...]] = []
    notes: list[str] = []
    for source in dict.fromkeys(str(e.get("source")) for e in profiled):
        prof = Path(source).parent / PROFILE_NAME
        if Path(source).name == PROFILE_NAME or not prof.is_file():
            continue
        try:
            data = json.loads(prof.read_text(encoding="utf-8"))
        except (OSError, ValueError) as ex:
            notes.append(f"{prof} not read ({ex}): between profiled layers the nearest winner ranks")
            continue
        if not isinstance(data, dict) or data.get("kind") != "emitter.profile" or not isinstance(data.get("measurements"), list):
            notes.append(f"{prof} is not an `emitter profile` result (kind emitter.profile with measurements): between "
                         "profiled layers the nearest winner ranks")
            continue
        env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
        gpu_cc = table_cc(env)
        try:
            sms = max(int(env.get("sm_count") or 0), 0)
        except (TypeError, ValueError):
            sms = 0
        got: dict[tuple[int, ...], int] = {}
        for m in data["measurements"]:
            if not isinstance(m, dict) or m.get("kind") != "kernel" or m.get("status") != "ok":
                continue
            k = by_name.get(m.get("name"))
            op = m.get("op") if isinstance(m.get("op"), dict) else {}
            if k is None or op.get("family", "conv") != "conv" or op.get("op", k.op) != k.op or op.get("a", k.a) != k.a:
                continue
            shape, _ = _entry_shape(m.get("problem"))
            med = (m.get("stats") or {}).get("median_ms") if isinstance(m.get("stats"), dict) else None
            split = m.get("split_k", 1)
            if (shape is None or isinstance(med, bool) or not isinstance(med, (int, float)) or not med > 0
                    or isinstance(split, bool) or not isinstance(split, int) or not 1 <= split <= 1024
                    or (split > 1 and not k.split_k)):
                continue
            key = (k.index, *shape, split)
            ps = max(int(round(med * 1e9)), 1)
            got[key] = min(got.get(key, ps), ps)      # repeats of one kernel, problem and split: the fastest
        want = []
        for e in profiled:
            shape, _ = _entry_shape(e.get("problem"))
            if str(e.get("source")) == source and e.get("kernel") in by_name and shape is not None:
                want.append((by_name[e["kernel"]].index, *shape, e.get("split_k", 1)))
        missing = [w for w in want if w not in got]
        if missing:
            notes.append(f"{prof} does not hold its tuning table's winner {kernels[missing[0][0]].name} at "
                         f"{'x'.join(map(str, missing[0][1:8]))} ({len(missing)} of {len(want)} missing): not that "
                         "table's run, not used; between profiled layers the nearest winner ranks")
            continue
        rows += [(*key, ps, sms, gpu_cc) for key, ps in got.items()]
        notes.append(f"{len(got)} kernel timings on {len({key[1:11] for key in got})} problems from {prof} rank the "
                     f"candidates between profiled layers (predicted time: padded work on {sms or 'unknown'} SMs)")
    return measured_records(rows), notes


def _tuning_paths(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any]) -> list[Path]:
    given = ctx.get("conv_tuning") or ctx.get("family_tuning")   # family_tuning: the --tuning tables export routes here
    if given:
        return [Path(p) for p in given]
    if (ctx.get("tuning_entries") or {}).get("conv"):
        return []       # a tuning table from `emitter profile` was given: no bench table is looked for
    found: list[Path] = []
    for e in entries:
        root = Path(roots[e["name"]])
        for cand in (root / "conv.json", root.parent / "conv.json"):
            if cand.is_file() and cand.resolve() not in [f.resolve() for f in found]:
                found.append(cand)
    return found


def _source(root: Path, entry: dict[str, Any]) -> str:
    root = Path(root).resolve()
    src = (root / entry["source"]).resolve()
    if root not in src.parents:
        raise _error(f"{root / 'manifest.json'}: source {entry['source']!r} of {entry['name']} lies outside the manifest "
                     f"directory")
    try:
        return src.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _error(f"{src}: missing (listed in {root / 'manifest.json'}); run `emitter emit` again") from None


def library_pieces(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any]) -> LibraryPieces:
    from emitter.render import environment, templates_root

    kernels = kernel_records(entries)
    by_name = {e["name"]: e for e in entries}
    paths = _tuning_paths(entries, roots, ctx)
    dropped: list[dict[str, Any]] = []
    tuning, notes = tuning_records(kernels, paths, dropped)
    profiled = (ctx.get("tuning_entries") or {}).get("conv") or []
    if profiled:
        seen = {(kernels[t.kernel].op, kernels[t.kernel].a, (t.n, t.h, t.w, t.c, t.k, t.r, t.s, t.stride, t.p, t.q))
                for t in tuning}
        more, more_notes, more_dropped = entry_records(kernels, profiled, seen)
        tuning, notes, dropped = tuning + more, notes + more_notes, dropped + more_dropped
        paths = paths + [Path(p) for p in dict.fromkeys(str(e.get("source")) for e in profiled)]
    measured, measured_notes = measured_entries(kernels, profiled) if profiled else ([], [])
    env = environment()
    c = dict(ctx, conv_kernels=kernels, conv_tuning=tuning, conv_tuning_paths=[str(p) for p in paths],
             conv_notes=notes, conv_ops=OPS, conv_iterators=ITERATORS, conv_measured=measured,
             conv_measured_notes=measured_notes)

    def render(name: str, **more: Any) -> str:
        return env.get_template(f"conv/library/{name}").render(**c, **more)

    lib = ctx["lib"]
    files = {"src/emitter_conv_abi.h": (templates_root() / "conv" / "common" / "conv_abi.h").read_text(encoding="utf-8")}
    files[f"src/{lib}_conv_table.h"] = render("conv_table.h.j2")
    if measured:    # the predicted-time rule and its probe (without measurements the export is what it was)
        files[f"src/{lib}_conv_dispatch.h"] = render("conv_dispatch.h.j2")
        files[f"tools/{lib}_conv_dispatch_probe.cpp"] = render("conv_dispatch_probe.cpp.j2")
    sources = []
    for k in kernels:
        files[f"src/conv/{k.name}.cu"] = _source(roots[k.name], by_name[k.name])
        files[f"src/conv/{k.name}.launch.cu"] = render("launch.cu.j2", k=k)
        sources.append((f"src/conv/{k.name}.launch.cu", k.arch))
    P = "ctypes.c_char_p"
    c_functions = (
        ("conv_problem_init", "None", ("ctypes.c_void_p",)),
        ("conv", "ctypes.c_int", (P, "ctypes.c_void_p", "ctypes.c_size_t", "ctypes.c_void_p")),
        ("conv_can_implement", "ctypes.c_int", (P,)),
        ("conv_workspace_size", "ctypes.c_int", (P, "ctypes.POINTER(ctypes.c_size_t)")),
        ("conv_select", "ctypes.c_int", (P, "ctypes.c_void_p")),
        ("conv_kernel_count", "ctypes.c_int", ()),
        ("conv_kernel_name", "ctypes.c_char_p", ("ctypes.c_int",)),
    )
    return LibraryPieces(
        family="conv",
        header=(render("header.h.j2"),),
        api=(render("api.cpp.j2"),),
        table=(render("table.cpp.j2"),),
        python=(render("loader.py.j2"),),
        c_functions=c_functions,
        python_names=("conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv3d", "conv3d_input_grad",
                      "conv3d_weight_grad", "conv_select", "conv_kernels",
                      "ConvProblem"),
        files=files,
        sources=tuple(sources),
        context={"kernels": [k.name for k in kernels], "tuning": len(tuning), "tuning_paths": [str(p) for p in paths],
                 "notes": notes, "lib": lib, **({"dropped_tuning": dropped} if dropped else {}),
                 **({"measured": len(measured), "measured_notes": measured_notes} if measured_notes else {})},
        kernels=len(kernels))
