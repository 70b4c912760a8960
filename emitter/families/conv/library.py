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

Tuning: `benchmarks/conv_bench.py` writes <out>/conv.json next to the kernels it built (<out>/kernels); when a
conv manifest directory's parent (or the directory itself) holds such a conv.json, or ctx["conv_tuning"] names
tables, each verified row (check "ok") becomes a tuning record: (op, dtype, N, H, W, C, K, R, S, stride) -> best
kernel. Rows naming kernels that are not exported are left out (listed in the table's comment).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from emitter.kit.library import ACTIVATIONS, DTYPES, LibraryError, LibraryPieces

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
            cutlass_major=3 if cfg.arch == "sm90a" else 2))
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


def tuning_records(kernels: Sequence[ConvKernelRecord], paths: Sequence[Path]) -> tuple[list[ConvTuningRecord], list[str]]:
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


def _tuning_paths(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any]) -> list[Path]:
    given = ctx.get("conv_tuning") or ctx.get("family_tuning")   # family_tuning: the --tuning tables export routes here
    if given:
        return [Path(p) for p in given]
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
    tuning, notes = tuning_records(kernels, paths)
    env = environment()
    c = dict(ctx, conv_kernels=kernels, conv_tuning=tuning, conv_tuning_paths=[str(p) for p in paths],
             conv_notes=notes, conv_ops=OPS, conv_iterators=ITERATORS)

    def render(name: str, **more: Any) -> str:
        return env.get_template(f"conv/library/{name}").render(**c, **more)

    lib = ctx["lib"]
    files = {"src/emitter_conv_abi.h": (templates_root() / "conv" / "common" / "conv_abi.h").read_text(encoding="utf-8")}
    files[f"src/{lib}_conv_table.h"] = render("conv_table.h.j2")
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
        python_names=("conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv_select", "conv_kernels",
                      "ConvProblem"),
        files=files,
        sources=tuple(sources),
        context={"kernels": [k.name for k in kernels], "tuning": len(tuning), "tuning_paths": [str(p) for p in paths],
                 "notes": notes, "lib": lib},
        kernels=len(kernels))
