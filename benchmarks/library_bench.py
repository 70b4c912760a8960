#!/usr/bin/env python3
"""The exported library's speed, as a user gets it: emit, profile on a tuning set, export, build, time on other shapes.

Per family (gemm, attention, conv; configs/bench/library_<family>.yaml holds each one's specs, kernel selection,
tuning shapes and evaluation shapes; no evaluation shape is a tuning shape; `--config PATH` runs another config of a
family, e.g. configs/bench/library_conv_bf16.yaml, whose `variant: bf16` names its work dir <out>/conv-bf16, its
record conv-bf16-<date>-<gpu>.json and its table "conv bf16", apart from the family's default ones):

  --stage build     emit the family's starter specs, `emitter build -j` the selected kernels (emitter's runtime
                    profiles them), export them without tuning (`emitter library`) and build that CMake project
                    once (-j), so that the rebuild after tuning recompiles one file (src/<lib>_table.cpp);
  --stage profile   `emitter profile` the kernels on the tuning shapes (a profile config written to the work
                    dir), export again with its tuning.json, rebuild;
  --stage measure   load the library's Python loader and time, on the evaluation shapes, with the same tensors
                    for all: the library's torch function (what a user calls: Python loader, dispatch, workspace
                    reset, output allocation), the same dispatch through the C API with a prebuilt problem, the
                    vendor path (GEMM torch.matmul; attention SDPA with the cuDNN and the flash backend named;
                    conv F.conv2d and aten.convolution_backward, emitter/families/conv/baseline.py) and the oracle:
                    every exported kernel that runs the case, forced by name through the C API (split-K kernels
                    also at other slice counts: conv split_k_choices', GEMM its tuned counts and 2, 4). Equal warm-up, inputs rotated past the
                    L2, batches of back-to-back calls between CUDA events, the functions in alternation, medians
                    (benchmarks/conv_bench.py's Timer); the library, its C call, the vendors and the oracle's best
                    are then timed again in a fresh alternation (the best of many is biased low) and those are the
                    figures reported. The library's output is checked against the vendor's on every case. Host
                    cost: per-call host us of the library's Python call and the vendor's on a tiny problem
                    (benchmarks/loader_overhead.py's loop). Writes <out>/<family>/library_bench.json, a record
                    under --records (docs/perf/library/<family>[-<variant>]-<date>-<gpu>.json) and, with --doc, the
                    generated table of every family's (and variant's) newest record per GPU
                    (docs/library_performance.md) and plots.
  (default: all three, in order; --out persists between calls, so each stage can be its own 10-minute command)

On the GPU machine, from the repository root, with one --out for every call (16 cores; estimates: the build is two
nvcc passes over the selected kernels, emitter's and CMake's, 4-7 minutes a family; the profile 1-4 minutes a
family; the measurement 2-3 minutes for all three):

    python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage build --family gemm
    python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage build --family attention
    python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage build --family conv
    python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage profile
    python3 benchmarks/library_bench.py --out generated/libbench --stage measure --doc docs/library_performance.md

The conv sets (issue 38): tuning on ResNet-50's layers at N = 128 and 32 (3x3, 1x1, the 7x7 stem, the stride-2 3x3
and 1x1 ones); evaluation on 16 other shapes x fprop / dgrad / wgrad: held-out ResNet-50 layers at N = 128 and at
N = 32, Stable Diffusion's UNet ResBlock 3x3s (C320 64^2, C640 32^2, C1280 16^2) and a detection backbone's stride-2
3x3s on odd sizes. f16 is library_conv.yaml, bf16 the same shapes in library_conv_bf16.yaml (one build each: both
in one would not fit a 10-minute command); per dtype the build is ~4 minutes at -j 18, the profile ~2.5, the
measurement ~5 (48 cases):

    python3 benchmarks/library_bench.py --out generated/libbench -j 18 --family conv --stage build
    python3 benchmarks/library_bench.py --out generated/libbench -j 18 --stage build \
        --config configs/bench/library_conv_bf16.yaml
    (then --stage profile, then --stage measure, each with the same --family conv or --config)

The attention backward (issue 40 item 4): configs/bench/library_attention_backward.yaml (`ops: [backward]`,
`variant: backward`: work dir <out>/attention-backward, record attention-backward-<date>-<gpu>.json, table
"attention backward"). The starter sm90a backward set's bf16 BSHD kernels (6, plus the bf16 forward the export
needs beside them), tuned on issue 40's anchor set (B*S = 16k tokens, H*D = 2048, d64 / d128, S 1k / 4k, full /
causal), evaluated on 16 other shapes (odd and cross lengths, S = 16k, GQA 32/8 at d128, ViT / CLIP / Whisper
lengths). Per case and rotation set: Q, K, V, dO, and O and the LSE from torch in float32 (O rounded to bf16, as a
forward kernel saves them); timed: lib.attention_backward (dispatch, workspace, gradient allocation), SDPA's
backward alone with the cuDNN and the flash backend named (torch.autograd.grad of its forward's output, the graph
kept: tests/attention/test_attention_backward_sm90a_gpu.py's way), and every exported backward kernel forced by
name (kernel=..., the same call: the oracle); no C-API column (the loader has no prebuilt backward problem).
TFLOP/s = 2.5 x the forward's FLOPs (visible pairs). dQ, dK, dV checked against cuDNN's (flash's, or float32
autograd, where cuDNN does not take the case); `why` replays the dispatch (backward_candidates on the export's
tuning records). Estimates on 16 cores: build ~5 minutes (7 instances, ~45-60 s each, twice: emitter's and
CMake's), profile ~3, measure ~2-3:

    python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage build \
        --config configs/bench/library_attention_backward.yaml
    (then --stage profile, then --stage measure --doc docs/library_performance.md, with the same --config)

Without a GPU: `--backend fake` (or --dry-run) runs emit, the fake profiler and the export (no nvcc, no CMake, no
measurement), and `--report-only` regenerates --doc from the records.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FAMILIES = ("gemm", "attention", "conv")
STAGES = ("build", "profile", "measure")
BENCH_DIR = ROOT / "configs" / "bench"
RECORDS = ROOT / "docs" / "perf" / "library"
CONFIG_KEYS = {"family", "variant", "specs", "select", "exclude", "dtype", "dtypes", "ops", "profile", "tune", "eval",
               "host"}
_VARIANT_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")
# the ops a config's `ops` may name per family (attention: the forward by default; `ops: [backward]` times the
# library's attention_backward, configs/bench/library_attention_backward.yaml)
FAMILY_OPS = {"gemm": (), "attention": ("forward", "backward"), "conv": ("fprop", "dgrad", "wgrad")}
GOAL_GEOMEAN, GOAL_CASE = 0.97, 0.90       # library / oracle: within 3% in geomean, 10% on every case
TOLERANCE = {"f16": 1e-2, "bf16": 2e-2}    # relative Frobenius error of the library's output against the vendor's
T0 = time.perf_counter()


def log(msg: str) -> None:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")
    print(f"[{stamp} +{time.perf_counter() - T0:6.0f}s] {msg}", flush=True)


class BenchError(Exception):
    """A bad bench config or a failed stage: printed as one message, no traceback."""


# ------------------------------------------------------------------------------------------------- configs

def _shown(path: Path) -> str:
    """The path relative to the project when it lies inside it (records stay machine-independent), else whole."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _where(path: Path, key: str) -> str:
    return f"{_shown(path)}: key '{key}'"


def load_config(family: str, path: Path | None = None) -> dict[str, Any]:
    """configs/bench/library_<family>.yaml, checked: every shape parses (the family's own profile syntax), the
    specs exist, no evaluation shape is a tuning shape."""
    import yaml

    path = path or BENCH_DIR / f"library_{family}.yaml"
    if not path.is_file():
        raise BenchError(f"{path}: no bench config for family {family!r} (allowed: {', '.join(FAMILIES)})")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict):
        raise BenchError(f"{path}: a bench config is a mapping of {sorted(CONFIG_KEYS)}")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise BenchError(f"{_where(path, unknown[0])}: unknown key (allowed: {', '.join(sorted(CONFIG_KEYS))}); "
                         f"fix: remove or rename it")
    if cfg.get("family") != family:
        raise BenchError(f"{_where(path, 'family')}: value {cfg.get('family')!r}, this file is read for {family!r}")
    if "variant" in cfg and not (isinstance(cfg["variant"], str) and _VARIANT_RE.match(cfg["variant"])):
        raise BenchError(f"{_where(path, 'variant')}: value {cfg['variant']!r}: needs a short name of lower-case "
                         f"letters, digits and '_' (e.g. bf16): it names the work dir, the record and the table")
    for key in ("specs", "tune", "eval"):
        v = cfg.get(key)
        if not isinstance(v, list) or not v or not all(isinstance(e, str) for e in v):
            raise BenchError(f"{_where(path, key)}: value {v!r}: needs a non-empty list of strings")
    for key in ("select", "exclude", "dtypes", "ops"):
        v = cfg.get(key, [])
        if not isinstance(v, list) or not all(isinstance(e, str) for e in v):
            raise BenchError(f"{_where(path, key)}: value {v!r}: needs a list of strings")
    bad_ops = [o for o in cfg.get("ops", []) if o not in FAMILY_OPS.get(family, ())]
    if bad_ops or ("ops" in cfg and not cfg["ops"]):
        allowed = ", ".join(FAMILY_OPS.get(family, ())) or f"none: a {family} config has no 'ops'"
        raise BenchError(f"{_where(path, 'ops')}: value {bad_ops[0] if bad_ops else cfg['ops']!r}: not an op of the "
                         f"{family} bench (allowed: {allowed}); fix: remove it or name one of those")
    if not isinstance(cfg.get("profile", {}), dict):
        raise BenchError(f"{_where(path, 'profile')}: value {cfg.get('profile')!r}: needs a mapping of profile "
                         f"config keys (timing, scheduler, ...)")
    for spec in cfg["specs"]:
        if not (ROOT / spec).is_file():
            raise BenchError(f"{_where(path, 'specs')}: value {spec!r}: no such file under {ROOT}")
    for key in ("tune", "eval"):
        for i, text in enumerate(cfg[key]):
            try:
                shape_key(family, text)
            except Exception as e:  # noqa: BLE001 (the family's parser says what is wrong)
                raise BenchError(f"{_where(path, f'{key}[{i}]')}: value {text!r}: {e}") from None
    if "host" in cfg:
        try:
            shape_key(family, cfg["host"])
        except Exception as e:  # noqa: BLE001
            raise BenchError(f"{_where(path, 'host')}: value {cfg['host']!r}: {e}") from None
    shared = shared_shapes(family, cfg)
    if shared:
        raise BenchError(f"{_where(path, 'eval')}: {', '.join(shared)} also in 'tune': the evaluation set must be "
                         f"shapes the library was not tuned on; fix: change the batch, lengths or sizes")
    cfg["path"] = str(path)
    return cfg


_GEMM_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*(?:x\s*(\d+))?\s*$")


def gemm_shape(text: str) -> tuple[int, int, int, int]:
    m = _GEMM_RE.match(text)
    if not m or min(int(g) for g in m.groups() if g) < 1:
        raise ValueError("a GEMM shape is MxNxK or MxNxKxBATCH with positive integers (e.g. 4096x4096x4096)")
    return int(m[1]), int(m[2]), int(m[3]), int(m[4] or 1)


def shape_key(family: str, text: str) -> tuple:
    """The identity of a shape (what a tuning record keys on), from the family's own parser."""
    if family == "gemm":
        return gemm_shape(text)
    if family == "attention":
        from emitter.families.attention.problem import parse_problem

        p = parse_problem(text)
        return (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, bool(p.causal))
    if family == "conv":
        from emitter.families.conv.problem import parse_problem, problem_from_mapping

        p = problem_from_mapping(parse_problem(text)[0])
        return (p.n, p.d, p.h, p.w, p.c, p.k, p.t, p.r, p.s, p.pad_front, p.pad_back, p.stride, p.dilation, p.groups)
    raise BenchError(f"family {family!r} is not one of {', '.join(FAMILIES)}")


def shared_shapes(family: str, cfg: dict[str, Any]) -> list[str]:
    tune = {shape_key(family, t) for t in cfg["tune"]}
    return [e for e in cfg["eval"] if shape_key(family, e) in tune]


# ------------------------------------------------------------------------------------------------- stages

def run(cmd: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log(f"{what}: rc={p.returncode} in {time.perf_counter() - t0:.1f} s")
    for line in (p.stdout + p.stderr).strip().splitlines()[-(6 if p.returncode == 0 else 30):]:
        print(f"    {line}", flush=True)
    if check and p.returncode != 0:
        raise BenchError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}")
    return p


def lib_name(family: str) -> str:
    return f"lb_{family}"


def run_name(family: str, variant: str | None) -> str:
    """A config's name in the work dir (<out>/<name>), its record's file name and its table: the family, or
    <family>-<variant> for a config with a `variant` (configs/bench/library_conv_bf16.yaml: conv-bf16)."""
    return f"{family}-{variant}" if variant else family


def _patterns(flag: str, cfg: dict[str, Any], key: str) -> list[str]:
    return [a for p in cfg.get(key, []) for a in (flag, p)]


def export(family: str, cfg: dict[str, Any], work: Path, tuning: Path | None, fake: bool) -> None:
    cmd = [sys.executable, "-m", "emitter", "library", str(work / "kernels"), "--name", lib_name(family),
           "-o", str(work / "lib"), *_patterns("--select", cfg, "select"), *_patterns("--exclude", cfg, "exclude")]
    if tuning is not None:
        cmd += ["--tuning", str(tuning)] + (["--allow-unmeasured-tuning"] if fake else [])
    run(cmd, f"{family}: export{' with ' + str(tuning.relative_to(work)) if tuning else ' (no tuning yet)'}")


def cmake_build(family: str, work: Path, jobs: int) -> None:
    if shutil.which("cmake") is None:
        raise BenchError("cmake not found on PATH: the exported library cannot be built")
    tree, build = work / "lib", work / "lib" / "build"
    if not (build / "CMakeCache.txt").is_file():
        run(["cmake", "-S", str(tree), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"], f"{family}: cmake configure")
    run(["cmake", "--build", str(build), "-j", str(jobs)], f"{family}: cmake build -j {jobs}")


def stage_build(family: str, cfg: dict[str, Any], work: Path, jobs: int, fake: bool) -> None:
    py = sys.executable
    run([py, "-m", "emitter", "emit", *cfg["specs"], "-o", str(work / "kernels"), "-q"], f"{family}: emit")
    if not fake:
        # a kernel whose build fails is a result, not the end of the run: the export leaves it out and says so
        run([py, "-m", "emitter", "build", str(work / "kernels"), "-j", str(jobs), "--no-progress",
             *_patterns("--select", cfg, "select"), *_patterns("--exclude", cfg, "exclude")],
            f"{family}: emitter build -j {jobs}", check=False)
    export(family, cfg, work, None, fake)
    if not fake:
        cmake_build(family, work, jobs)


def profile_config(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    """The profile config `emitter profile` runs: the bench's kernels on its tuning shapes, no baseline (the
    tuning needs none; the measure stage times the vendor)."""
    doc = {"description": f"library bench tuning set ({Path(cfg['path']).name})",
           "manifests": [str((work / "kernels").resolve())], "problems": list(cfg["tune"]), "baselines": [],
           "output": {"dir": str((work / "profile").resolve()), "plots": False}}
    if cfg.get("select"):
        doc["select"] = list(cfg["select"])
    if cfg.get("exclude"):
        doc["exclude"] = list(cfg["exclude"])
    doc.update(cfg.get("profile", {}))
    return doc


def stage_profile(family: str, cfg: dict[str, Any], work: Path, jobs: int, fake: bool) -> None:
    import yaml

    if not (work / "kernels" / "manifest.json").is_file():
        raise BenchError(f"{work / 'kernels'}: no manifest: run --stage build first (same --out)")
    path = work / "profile.yaml"
    path.write_text(yaml.safe_dump(profile_config(cfg, work), sort_keys=False), encoding="utf-8")
    cmd = [sys.executable, "-m", "emitter", "profile", str(path), "-o", str(work / "profile"), "--no-plots"]
    tuning = work / "profile" / "tuning.json"
    tuning.unlink(missing_ok=True)
    # a kernel that fails its check or faults is a result of the profile (not timed); no tuning table is the error
    run(cmd + (["--backend", "fake"] if fake else []), f"{family}: emitter profile ({len(cfg['tune'])} shapes)",
        check=False)
    if not tuning.is_file():
        raise BenchError(f"{family}: emitter profile wrote no {tuning} (its output above says why)")
    export(family, cfg, work, work / "profile" / "tuning.json", fake)
    if not fake:
        cmake_build(family, work, jobs)


# ------------------------------------------------------------------------------------------------- measuring

def load_library(work: Path, family: str):
    from loader_overhead import load_loader

    tree = work / "lib"
    if not list(tree.rglob(f"lib{lib_name(family)}.so")):
        raise BenchError(f"{tree}: lib{lib_name(family)}.so not built: run --stage build and --stage profile first")
    return load_loader(tree)


def tuning_entries(work: Path, family: str) -> list[dict[str, Any]]:
    p = work / "profile" / "tuning.json"
    if not p.is_file():
        return []

    def fam(e: Any) -> str:       # the family an entry names (problem.family; GEMM's entries name none)
        prob = e.get("problem") if isinstance(e, dict) else None
        return str(prob.get("family") or "gemm") if isinstance(prob, dict) else "gemm"

    return [e for e in json.loads(p.read_text()).get("entries", []) if fam(e) == family]


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def rel_err(torch, got, want) -> float:
    g, w = got.float(), want.float()
    e = float((g - w).norm() / max(float(w.norm()), 1e-30))
    return e if math.isfinite(e) else float("inf")


def checked(fn: Callable[[int], int], what: str) -> Callable[[int], None]:
    """A C API call whose status is checked on every call: a refused launch returns at once, and timing it
    would record a kernel that did no work as the fastest."""
    def call(i: int) -> None:
        status = fn(i)
        if status != 0:
            raise BenchError(f"{what}: the C API returned status {status}")
    return call


class Family:
    """One family's measurement: its eval cases, the tensors of a case, and each function to time on them.
    Subclasses hold what differs (the loader's calls, the vendor, FLOPs); Case records are plain dicts."""

    name = ""

    def __init__(self, torch, lib, cfg: dict[str, Any], work: Path, sm_count: int, l2_bytes: int) -> None:
        self.torch, self.lib, self.cfg, self.work, self.sm_count, self.l2 = torch, lib, cfg, work, sm_count, l2_bytes
        self.entries = tuning_entries(work, self.name)

    def nsets(self, set_bytes: int) -> int:
        return max(1, min(8, math.ceil(2 * self.l2 / max(set_bytes, 1))))

    def gen(self, label: str):
        return self.torch.Generator(device="cuda").manual_seed(zlib.crc32(label.encode()) & 0xFFFFFFFF)

    def kernel_count(self) -> int:
        """The exported kernels the record counts."""
        return len(self.lib.kernels()) if self.name == "gemm" else len(getattr(self.lib, f"{self.name}_kernels")())


class GemmBench(Family):
    name = "gemm"

    def cases(self) -> list[dict[str, Any]]:
        return [{"case": t, "dtype": self.cfg.get("dtype", "bf16")} for t in self.cfg["eval"]]

    def setup(self, c: dict[str, Any]) -> dict[str, Any]:
        torch, lib = self.torch, self.lib
        m, n, k, _ = gemm_shape(c["case"])
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
        g = self.gen(c["case"])
        ns = self.nsets(2 * (m * k + n * k + m * n))
        sets = []
        for _ in range(ns):
            a = torch.randn(m, k, device="cuda", generator=g).to(td)
            w = torch.randn(n, k, device="cuda", generator=g).to(td) * (1.0 / math.sqrt(k))
            sets.append({"a": a, "b": w.t(), "out": torch.empty(m, n, device="cuda", dtype=td)})
        stream = torch.cuda.current_stream().cuda_stream or None

        def packed(s, kernel, split):
            p, _, _, keep = lib._problem(s["a"], s["b"], s["out"], None, 1.0, 0.0, None, None, "identity", None, None,
                                         kernel, None, None, True, split if split > 1 else None, False)
            return p, keep

        def c_call(kernel, split=1):
            probs = [packed(s, kernel, split) for s in sets]
            return checked(lambda i: lib._GEMM(probs[i % ns][0], None, 0, stream), f"gemm {kernel or 'dispatch'}")

        sel = lib.select(sets[0]["a"], sets[0]["b"])
        why = sel["reason"] + (f" (nearest record {'x'.join(map(str, sel['tuned_shape'][:3]))})"
                               if sel.get("tuned_shape") else "")
        fns = {"library": lambda i: lib.gemm(sets[i % ns]["a"], sets[i % ns]["b"]),
               "library_c": c_call(None),
               "cublas": lambda i: torch.matmul(sets[i % ns]["a"], sets[i % ns]["b"])}
        # forced kernels run at their compiled-in scheduler options (the C problem has no options field: tuned
        # options reach a kernel only through a tuning record) and at the slice count asked for: split-K kernels
        # also at the counts their tuning records won and at 2 and 4
        tuned_splits: dict[str, set] = {}
        for e in self.entries:
            tuned_splits.setdefault(e.get("kernel"), set()).add(int(e.get("split_k") or 1))
        oracle = {}
        for kinfo in lib.kernels():
            name = kinfo["name"]
            splits = sorted({1} | (tuned_splits.get(name, set()) | {2, 4} if "splitk" in name else set()))
            for sp in splits:
                try:
                    lib.select(sets[0]["a"], sets[0]["b"], sets[0]["out"], kernel=name,
                               split_k=sp if sp > 1 else None)
                except lib.Error:
                    continue
                oracle[name if sp == 1 else f"{name}@splitk{sp}"] = c_call(name, sp)
        ref = lambda: torch.matmul(sets[0]["a"], sets[0]["b"])   # noqa: E731
        return {"fns": fns, "vendors": ["cublas"], "oracle": oracle, "kernel": sel["kernel"], "why": why,
                "split_k": sel.get("split_k_slices"), "flops": 2 * m * n * k, "out0": sets[0]["out"], "ref": ref,
                "check": lambda: rel_err(torch, lib.gemm(sets[0]["a"], sets[0]["b"]), ref())}

    def host(self) -> dict[str, Any]:
        torch, lib = self.torch, self.lib
        m, n, k, _ = gemm_shape(self.cfg["host"])
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[self.cfg.get("dtype", "bf16")]
        a = torch.randn(m, k, device="cuda", dtype=td)
        b = torch.randn(n, k, device="cuda", dtype=td).t()
        return {"case": self.cfg["host"], "library": lambda: lib.gemm(a, b), "vendor": lambda: torch.matmul(a, b),
                "vendor_name": "torch.matmul"}


class AttentionBench(Family):
    """The forward (default) and, with `ops: [backward]` (configs/bench/library_attention_backward.yaml), the
    backward: lib.attention_backward against SDPA's backward (cuDNN, flash) on the same tensors."""

    name = "attention"
    BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}
    SCORE_ELEMS = 1 << 27      # float32 scores per piece of the backward's O / LSE computation (0.5 GiB)

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        from emitter.families.attention.backward_library import is_backward_entry

        self.ops = list(self.cfg.get("ops") or ["forward"])
        self.backward_entries = [e for e in self.entries if is_backward_entry(e)]
        self.forward_entries = [e for e in self.entries if not is_backward_entry(e)]
        if self.ops == ["backward"]:     # the record counts the tuning records of what it measures
            self.entries = self.backward_entries
        self._mirror: Any = None

    def cases(self) -> list[dict[str, Any]]:
        dt = self.cfg.get("dtype", "bf16")
        return [{"case": t, "dtype": dt, **({"op": "backward"} if op == "backward" else {})}
                for op in self.ops for t in self.cfg["eval"]]

    def kernel_count(self) -> int:
        if self.ops == ["backward"]:
            return len(self.lib.attention_backward_kernels())
        return len(self.lib.attention_kernels())

    def _sdpa(self, backend: str, q, k, v, causal: bool, gqa: bool):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F

        b = getattr(SDPBackend, self.BACKENDS[backend])
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [B, H, S, D] views, same buffers
        kw = {"enable_gqa": True} if gqa else {}

        def fn():
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **kw).transpose(1, 2)
        return fn

    def setup(self, c: dict[str, Any]) -> dict[str, Any]:
        from emitter.families.attention.flops import visible_pairs
        from emitter.families.attention.problem import parse_problem

        if c.get("op") == "backward":
            return self.setup_backward(c)
        torch, lib = self.torch, self.lib
        p = parse_problem(c["case"])
        causal = bool(p.causal)
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
        g = self.gen(c["case"])
        qn, kvn = p.batch * p.seq_q * p.heads_q * p.head_dim, p.batch * p.seq_k * p.heads_kv * p.head_dim
        ns = self.nsets(2 * (2 * qn + 2 * kvn))
        sets = []
        for _ in range(ns):
            sets.append({"q": torch.randn(p.batch, p.seq_q, p.heads_q, p.head_dim, device="cuda", generator=g).to(td),
                         "k": torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim, device="cuda", generator=g).to(td),
                         "v": torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim_v, device="cuda",
                                          generator=g).to(td)})
            sets[-1]["out"] = torch.empty(p.batch, p.seq_q, p.heads_q, p.head_dim_v, device="cuda", dtype=td)
        stream = torch.cuda.current_stream().cuda_stream or None
        run_c = lib._attention_fn("attention")

        def c_call(kernel):
            probs = [lib._attention_problem(s["q"], s["k"], s["v"], s["out"], causal, "top_left", None, False, None,
                                            None, None, None, kernel, False) for s in sets]
            return checked(lambda i: run_c(probs[i % ns][0], None, 0, stream), f"attention {kernel or 'dispatch'}")

        s0 = sets[0]
        sel = lib.attention_select(s0["q"], s0["k"], s0["v"], causal=causal)
        fns = {"library": lambda i: lib.attention(sets[i % ns]["q"], sets[i % ns]["k"], sets[i % ns]["v"],
                                                  causal=causal),
               "library_c": c_call(None)}
        vendors = []
        gqa = p.heads_kv != p.heads_q
        for backend in self.BACKENDS:
            fs = [self._sdpa(backend, s["q"], s["k"], s["v"], causal, gqa) for s in sets]
            try:
                fs[0]()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (this backend does not take this case: reported, not timed)
                log(f"    sdpa {backend}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
                continue
            fns[backend] = (lambda fs: lambda i: fs[i % ns]())(fs)
            vendors.append(backend)
        oracle = {}
        for name in lib.attention_kernels():
            try:
                lib.attention_select(s0["q"], s0["k"], s0["v"], causal=causal, kernel=name)
            except lib.Error:
                continue
            oracle[name] = c_call(name)
        pairs = visible_pairs("causal_top_left" if causal else "none", p.seq_q, p.seq_k)
        flops = 2 * pairs * (p.head_dim + p.head_dim_v) * p.heads_q * p.batch
        if vendors:
            ref = self._sdpa(vendors[0], s0["q"], s0["k"], s0["v"], causal, gqa)
        else:      # no named backend takes the case (GQA on some builds): the check still runs, on repeated K/V
            def ref():
                import torch.nn.functional as F

                rep = p.heads_q // p.heads_kv
                kk, vv = (t.repeat_interleave(rep, dim=2).transpose(1, 2) for t in (s0["k"], s0["v"]))
                return F.scaled_dot_product_attention(s0["q"].transpose(1, 2), kk, vv, is_causal=causal
                                                      ).transpose(1, 2)
        return {"fns": fns, "vendors": vendors, "oracle": oracle, "kernel": sel["kernel"],
                "why": self.why(sel, p, c["dtype"], causal), "flops": flops, "out0": s0["out"], "ref": ref,
                "check": lambda: rel_err(torch, lib.attention(s0["q"], s0["k"], s0["v"], causal=causal), ref())}

    def why(self, sel: dict[str, Any], p, dtype: str, causal: bool) -> str:
        """attention_select names the kernel, not the reason: the tuned walk (nearest record of this op first,
        emitter.families.attention.library.tuning_distance) is replayed on the profile's entries."""
        from emitter.families.attention.library import AttentionTuningRecord, tuning_distance

        if sel.get("forced"):
            return "forced"
        mask = ("causal_top_left", "causal_bottom_right") if causal else ("none",)
        recs = []
        for e in self.forward_entries:
            op, pr = e.get("op", {}), e.get("problem", {})
            if (op.get("dtype") != dtype or op.get("head_dim") != p.head_dim or op.get("mask") not in mask
                    or (p.heads_kv != p.heads_q and not str(e.get("kernel", "")).endswith(("_gqa", "_gqa_varlen")))):
                continue
            r = AttentionTuningRecord(0, pr["batch"], pr["heads_q"], pr["heads_kv"], pr["seq_q"], pr["seq_k"])
            d = tuning_distance(r, batch=p.batch, heads_q=p.heads_q, heads_kv=p.heads_kv, seq_q=p.seq_q,
                                seq_k=p.seq_k)
            recs.append((d, e["kernel"], f"b={r.batch},hq={r.heads_q},hkv={r.heads_kv},sq={r.seq_q}"))
        recs.sort()
        for i, (_, kernel, label) in enumerate(recs):
            if kernel == sel["kernel"]:
                return f"tuned (record {label}{'' if i == 0 else f', nearest {i} refused'})"
        return "static order" + (" (no tuning record of this op)" if not recs else " (tuned kernels refused)")

    def host(self) -> dict[str, Any]:
        from emitter.families.attention.problem import parse_problem

        torch, lib = self.torch, self.lib
        p = parse_problem(self.cfg["host"])
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[self.cfg.get("dtype", "bf16")]
        q = torch.randn(p.batch, p.seq_q, p.heads_q, p.head_dim, device="cuda", dtype=td)
        k = torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim, device="cuda", dtype=td)
        v = torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim_v, device="cuda", dtype=td)
        if self.ops == ["backward"]:
            s = {"q": q, "k": k, "v": v, "do": torch.randn_like(q)}
            s["o"], s["lse"] = self._o_lse(q, k, v, bool(p.causal))
            return {"case": self.cfg["host"],
                    "library": lambda: lib.attention_backward(q, k, v, s["o"], s["lse"], s["do"]),
                    "vendor": self._sdpa_backward("cudnn", s, False, False), "vendor_name": "SDPA backward (cuDNN)"}
        return {"case": self.cfg["host"], "library": lambda: lib.attention(q, k, v),
                "vendor": self._sdpa("cudnn", q, k, v, False, False), "vendor_name": "SDPA (cuDNN)"}

    # ----------------------------------------------------------------------------------------- the backward

    def _o_lse(self, q, k, v, causal: bool):
        """O (rounded to q's dtype) and the float32 LSE [B, Hq, Sq] that a forward kernel saves, from torch in
        float32 (no TF32) on the GPU, in pieces of at most ~0.5 GiB of scores; GQA by repeated K / V heads."""
        torch = self.torch
        B, Sq, Hq, D = q.shape
        Sk, Hkv = k.shape[1], k.shape[2]
        grp, scale = Hq // Hkv, D ** -0.5
        o = torch.empty(B, Sq, Hq, v.shape[3], device=q.device, dtype=q.dtype)
        lse = torch.empty(B, Hq, Sq, device=q.device, dtype=torch.float32)
        rows = max(1, min(Sq, self.SCORE_ELEMS // max(Sk * Hq, 1)))
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for b in range(B):
                kb = k[b].float().repeat_interleave(grp, dim=1).transpose(0, 1)     # [Hq, Sk, D]
                vb = v[b].float().repeat_interleave(grp, dim=1).transpose(0, 1)
                for r0 in range(0, Sq, rows):
                    r1 = min(Sq, r0 + rows)
                    sc = torch.matmul(q[b, r0:r1].float().transpose(0, 1), kb.transpose(1, 2)) * scale
                    if causal:       # top-left: query row i sees keys 0..i
                        cols = torch.arange(Sk, device=q.device)[None, :]
                        sc.masked_fill_(cols > torch.arange(r0, r1, device=q.device)[:, None], float("-inf"))
                    ls = torch.logsumexp(sc, dim=-1)                                 # [Hq, rows]
                    o[b, r0:r1] = torch.matmul(torch.exp(sc - ls[..., None]), vb).transpose(0, 1).to(q.dtype)
                    lse[b, :, r0:r1] = ls
                    del sc
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return o, lse

    def _sdpa_backward(self, backend: str, s: dict[str, Any], causal: bool, gqa: bool):
        """SDPA's backward alone with `backend` named (tests/attention/test_attention_backward_sm90a_gpu.py's speed
        table): its forward runs once, untimed, on [B, H, S, D] views of the set's Q, K, V; the timed call is
        torch.autograd.grad of that output with the set's dO (the graph kept)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F

        torch = self.torch
        qt, kt, vt = (s[x].transpose(1, 2).detach().requires_grad_() for x in ("q", "k", "v"))
        with sdpa_kernel(getattr(SDPBackend, self.BACKENDS[backend])):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **({"enable_gqa": True} if gqa else {}))
        dot = s["do"].transpose(1, 2)

        def fn():      # (dq, dk, dv) as [B, S, H, D] views
            return tuple(g.transpose(1, 2) for g in torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True))
        return fn

    def _ref_backward_f32(self, s: dict[str, Any], causal: bool):
        """dQ, dK, dV by autograd through a float32 forward, one (batch, KV head) at a time: the check's reference
        where neither named SDPA backend takes the case (GQA on some builds)."""
        torch = self.torch
        q, k, v, do = s["q"], s["k"], s["v"], s["do"]
        B, Sq, Hq, D = q.shape
        Sk, Hkv = k.shape[1], k.shape[2]
        grp = Hq // Hkv
        dq, dk, dv = (torch.empty(x.shape, device=x.device, dtype=torch.float32) for x in (q, k, v))
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for b in range(B):
                for j in range(Hkv):
                    hs = slice(j * grp, (j + 1) * grp)
                    qf = q[b, :, hs].float().transpose(0, 1).requires_grad_()          # [grp, Sq, D]
                    kf, vf = (x[b, :, j].float().requires_grad_() for x in (k, v))      # [Sk, D]
                    sc = torch.matmul(qf, kf.t()) * D ** -0.5
                    if causal:
                        sc = sc.masked_fill(torch.ones(Sq, Sk, device=q.device, dtype=torch.bool).triu(1),
                                            float("-inf"))
                    of = torch.matmul(torch.softmax(sc, dim=-1), vf)
                    gq, gk, gv = torch.autograd.grad(of, (qf, kf, vf), do[b, :, hs].float().transpose(0, 1))
                    dq[b, :, hs], dk[b, :, j], dv[b, :, j] = gq.transpose(0, 1), gk, gv
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return dq, dk, dv

    def backward_mirror(self):
        """The library's backward dispatch replayed in Python (backward_library.backward_candidates, the C++ rule's
        mirror): its exported backward kernels and the tuning records the export made of the profile's table."""
        if self._mirror is None:
            from emitter.families.attention.backward_library import (
                backward_records, backward_tuning_records, is_backward_entry,
            )
            from emitter.library.tuning import family_entries

            names = set(self.lib.attention_backward_kernels())
            manifest = json.loads((self.work / "kernels" / "manifest.json").read_text())
            inst = [e for e in manifest["instances"] if e["name"] in names]
            kernels = backward_records(inst, {"f16": 1, "bf16": 2}, BenchError)
            table = self.work / "profile" / "tuning.json"
            # as the export read it (a fake-profiled table too: the bench exports that one with
            # --allow-unmeasured-tuning)
            entries = family_entries([table], allow_unmeasured=True).get("attention", []) if table.is_file() else []
            records, _ = backward_tuning_records(kernels, [e for e in entries if is_backward_entry(e, sorted(names))],
                                                 [n for n in self.lib.attention_kernels()])
            self._mirror = (kernels, records)
        return self._mirror

    def backward_choice(self, p, dtype: str, causal: bool, cc: int) -> tuple[str | None, str]:
        """(kernel, why) of the library's backward dispatch for the problem: the first candidate (sm90a's shims take
        any sequence length, so the first candidate is the one that runs)."""
        from emitter.families.attention.backward_library import backward_candidates
        from emitter.families.attention.library_common import MASKS
        from emitter.families.attention.model import Mask

        kernels, records = self.backward_mirror()
        mask = MASKS[Mask.causal_top_left if causal else Mask.none]
        got = backward_candidates(kernels, cc=cc, dtype={"f16": 1, "bf16": 2}[dtype], head_dim=p.head_dim,
                                  head_dim_v=p.head_dim_v, mask=mask, varlen=False, heads_q=p.heads_q,
                                  heads_kv=p.heads_kv, seq_q=p.seq_q, seq_k=p.seq_k, batch=p.batch, tuning=records)
        if not got:
            return None, "no exported backward kernel computes it"
        first = got[0]
        by_index = {k.index: k for k in kernels}
        mine = [r for r in records if by_index[r.kernel].name == first.name and r.cc in (0, cc)]
        if mine:
            from emitter.families.attention.library_common import tuning_distance

            r = min(mine, key=lambda r: tuning_distance(r, batch=p.batch, heads_q=p.heads_q, heads_kv=p.heads_kv,
                                                        seq_q=p.seq_q, seq_k=p.seq_k))
            return first.name, f"tuned (record b={r.batch},hq={r.heads_q},hkv={r.heads_kv},sq={r.seq_q})"
        return first.name, "static order" + ("" if records else " (no backward tuning record)")

    @staticmethod
    def backward_flops(p) -> float:
        """2.5 x the forward's FLOPs over the visible (query, key) pairs (causal: top-left), the convention of the
        issue's anchors, of FlashAttention's and cuDNN's backward figures and of `emitter profile`'s backward ops."""
        from emitter.families.attention.flops import visible_pairs

        pairs = visible_pairs("causal_top_left" if p.causal else "none", p.seq_q, p.seq_k)
        return 2.5 * 2 * pairs * (p.head_dim + p.head_dim_v) * p.heads_q * p.batch

    def setup_backward(self, c: dict[str, Any]) -> dict[str, Any]:
        """One backward case: per rotation set Q, K, V, dO and the forward's O and LSE (_o_lse); the library's
        attention_backward (what a user calls: dispatch, workspace, gradient allocation), SDPA's backward with the
        cuDNN and the flash backend named, and every exported backward kernel forced by name (kernel=...) through
        the same call. FLOPs = 2.5 x the forward's (visible pairs). The check: the library's dQ, dK, dV against
        cuDNN's (flash's, or float32 autograd, where cuDNN does not take the case), the largest relative error."""
        from emitter.families.attention.problem import parse_problem

        torch, lib = self.torch, self.lib
        p = parse_problem(c["case"])
        causal, gqa = bool(p.causal), p.heads_kv != p.heads_q
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
        g = self.gen(f"{c['case']} backward")
        qn, kvn = p.batch * p.seq_q * p.heads_q * p.head_dim, p.batch * p.seq_k * p.heads_kv * p.head_dim
        # read: q, k, v, o, do, lse; written: dq, dk, dv
        ns = self.nsets(2 * (3 * qn + 2 * kvn) + 4 * p.batch * p.heads_q * p.seq_q + 2 * (qn + 2 * kvn))
        sets = []
        for _ in range(ns):
            s = {"q": torch.randn(p.batch, p.seq_q, p.heads_q, p.head_dim, device="cuda", generator=g).to(td),
                 "k": torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim, device="cuda", generator=g).to(td),
                 "v": torch.randn(p.batch, p.seq_k, p.heads_kv, p.head_dim_v, device="cuda", generator=g).to(td),
                 "do": torch.randn(p.batch, p.seq_q, p.heads_q, p.head_dim_v, device="cuda", generator=g).to(td)}
            s["o"], s["lse"] = self._o_lse(s["q"], s["k"], s["v"], causal)
            sets.append(s)

        def lib_call(s, kernel=None):
            return lib.attention_backward(s["q"], s["k"], s["v"], s["o"], s["lse"], s["do"], causal=causal,
                                          kernel=kernel)

        props = torch.cuda.get_device_properties(0)
        kernel, why = self.backward_choice(p, c["dtype"], causal, props.major * 10 + props.minor)
        fns: dict[str, Callable[[int], Any]] = {}
        s0 = sets[0]
        if kernel is not None:
            fns["library"] = lambda i: lib_call(sets[i % ns])
        vendors, vendor_grads = [], {}
        for backend in self.BACKENDS:
            try:
                fs = [self._sdpa_backward(backend, s, causal, gqa) for s in sets]
                vendor_grads[backend] = fs[0]()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (this backend does not take this case: reported, not timed)
                log(f"    sdpa {backend} backward: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:120] if str(e) else ''}")
                continue
            fns[backend] = (lambda fs: lambda i: fs[i % ns]())(fs)
            vendors.append(backend)
        ref_name = vendors[0] if vendors else "float32 autograd"
        ref = vendor_grads[vendors[0]] if vendors else self._ref_backward_f32(s0, causal)
        del vendor_grads

        def err_of(grads) -> dict[str, float]:
            return {n: rel_err(torch, got, want) for n, got, want in zip(("dq", "dk", "dv"), grads, ref)}

        oracle = {}
        if kernel is not None:
            for name in lib.attention_backward_kernels():
                try:      # a forced kernel that cannot compute the case raises (NOT_SUPPORTED)
                    lib_call(s0, kernel=name)
                    torch.cuda.synchronize()
                except lib.Error:
                    continue
                oracle[name] = (lambda name: lambda i: lib_call(sets[i % ns], kernel=name))(name)
        detail: dict[str, Any] = {"reference": ref_name}

        def check() -> float:
            detail.update(err_of(lib_call(s0)))
            return max(detail[n] for n in ("dq", "dk", "dv"))

        return {"fns": fns, "vendors": vendors, "oracle": oracle, "kernel": kernel, "why": why,
                "flops": self.backward_flops(p), "out0": None, "ref": None, "check_detail": detail,
                "oracle_err": lambda name: max(err_of(lib_call(s0, kernel=name)).values()),
                "check": check if kernel is not None else None}


class ConvBench(Family):
    name = "conv"

    def cases(self) -> list[dict[str, Any]]:
        return [{"case": t, "op": op, "dtype": dt} for op in self.cfg.get("ops", ["fprop", "dgrad", "wgrad"])
                for t in self.cfg["eval"] for dt in self.cfg.get("dtypes", ["f16"])]

    def problem(self, text: str):
        from emitter.families.conv.problem import parse_problem, problem_from_mapping

        return problem_from_mapping(parse_problem(text)[0])

    def setup(self, c: dict[str, Any]) -> dict[str, Any]:
        from dataclasses import replace

        from emitter.families.conv.baseline import torch_conv
        from emitter.families.conv.config import ConvConfig
        from emitter.families.conv.flops import conv_flops
        from emitter.families.conv.runtime import split_k_choices

        torch, lib = self.torch, self.lib
        p = self.problem(c["case"])
        op = c["op"]
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
        _, P, Q = p.output_extents()
        st, pad = (p.stride[1], p.stride[2]), (p.pad_front[1], p.pad_front[2])
        g = self.gen(f"{c['case']} {op} {c['dtype']}")
        ns = self.nsets(2 * 2 * (p.n * p.h * p.w * p.c + p.k * p.r * p.s * p.c + p.n * P * Q * p.k))
        cl = torch.channels_last
        sets = []
        for _ in range(ns):
            sets.append({"x": torch.randn(p.n, p.c, p.h, p.w, device="cuda", generator=g).to(td).to(memory_format=cl),
                         "w": (torch.randn(p.k, p.c, p.r, p.s, device="cuda", generator=g) / math.sqrt(p.c * p.r * p.s)
                               ).to(td).to(memory_format=cl),
                         "y": torch.randn(p.n, p.k, P, Q, device="cuda", generator=g).to(td).to(memory_format=cl)})
            out = {"fprop": "y", "dgrad": "x", "wgrad": "w"}[op]
            sets[-1]["out"] = torch.empty_like(sets[-1][out])
        geo = {"stride": st, "padding": pad}

        def lib_call(s, kernel=None):
            if op == "fprop":
                return lib.conv2d(s["x"], s["w"], **geo, kernel=kernel)
            if op == "dgrad":
                return lib.conv2d_input_grad(s["y"], s["w"], tuple(s["x"].shape), **geo, kernel=kernel)
            return lib.conv2d_weight_grad(s["x"], s["y"], tuple(s["w"].shape), **geo, kernel=kernel)

        # the C API: the loader's checked problem for these tensors, written to the set's own output, then the
        # kernel and slice count set on the struct (lib.ConvProblem mirrors <lib>_conv_problem)
        fn_c = getattr(lib.load(), f"{lib.NAME}_conv")
        stream = torch.cuda.current_stream().cuda_stream or None

        def packed(s, kernel, split):
            xs, ws, ys = s["x"], s["w"], s["y"]
            if op == "fprop":
                head, ptrs, _, _, _ = lib._conv_plan(op, xs, ws, None, s["out"], None, None, st, pad, 1, "bench")
            elif op == "dgrad":
                head, ptrs, _, _, _ = lib._conv_plan(op, None, ws, ys, s["out"], None, tuple(xs.shape), st, pad, 1,
                                                     "bench")
            else:
                head, ptrs, _, _, _ = lib._conv_plan(op, xs, None, ys, s["out"], None, tuple(ws.shape), st, pad, 1,
                                                     "bench")
            prob = lib.ConvProblem.from_buffer_copy(head + lib._CONV_PTRS.pack(ptrs[0], ptrs[1], ptrs[2], 0, ptrs[3],
                                                                               0))
            name = kernel.encode() if kernel else None
            prob.kernel = name
            prob.split_k_slices = split
            return bytes(prob), prob, name      # prob and name keep the kernel name's buffer alive

        def c_call(kernel, split=1):
            probs = [packed(s, kernel, split) for s in sets]
            return checked(lambda i: fn_c(probs[i % ns][0], None, 0, stream), f"conv {kernel or 'dispatch'}")

        shape = {"fprop": None, "dgrad": tuple(sets[0]["x"].shape), "wgrad": tuple(sets[0]["w"].shape)}[op]
        s0 = sets[0]
        sel_args = {"fprop": (s0["x"], s0["w"], None), "dgrad": (None, s0["w"], s0["y"]),
                    "wgrad": (s0["x"], None, s0["y"])}[op]
        try:
            sel = lib.conv_select(op, *sel_args, **geo, shape=shape)
        except lib.Error as e:
            sel = {"kernel": None, "reason": f"not supported: {str(e)[:160]}"}

        def vendor(i):
            s = sets[i % ns]
            return torch_conv(torch, op, s["x"], s["w"], s["y"], stride=st, padding=pad)
        fns = {"cudnn": vendor}
        oracle = {}
        if sel["kernel"] is not None:
            fns["library"] = lambda i: lib_call(sets[i % ns])
            fns["library_c"] = c_call(None)
            manifest = json.loads((self.work / "kernels" / "manifest.json").read_text())
            by_name = {e["name"]: e for e in manifest["instances"]}
            for name in lib.conv_kernels():
                try:      # a forced kernel that cannot run the case raises (NOT_SUPPORTED)
                    lib_call(s0, kernel=name)
                    torch.cuda.synchronize()
                except lib.Error:
                    continue
                splits = [1]
                if name in by_name:
                    cfgk = ConvConfig.from_entry(by_name[name])
                    splits = split_k_choices(cfgk, replace(p, split_k=1), self.sm_count)
                for sp in splits:
                    oracle[name if sp == 1 else f"{name}@splitk{sp}"] = c_call(name, sp)
        return {"fns": fns, "vendors": ["cudnn"], "oracle": oracle, "kernel": sel["kernel"],
                "why": sel["reason"] + (f", tried {sel['tried']}" if sel.get("tried") else ""),
                "flops": conv_flops(p), "out0": s0["out"], "ref": lambda: vendor(0),
                "check": (lambda: rel_err(torch, lib_call(s0), vendor(0))) if sel["kernel"] else None}

    def host(self) -> dict[str, Any]:
        import torch.nn.functional as F

        torch, lib = self.torch, self.lib
        p = self.problem(self.cfg["host"])
        td = {"f16": torch.float16, "bf16": torch.bfloat16}[self.cfg.get("dtypes", ["f16"])[0]]
        x = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=td).to(memory_format=torch.channels_last)
        w = torch.randn(p.k, p.c, p.r, p.s, device="cuda", dtype=td).to(memory_format=torch.channels_last)
        pad = (p.pad_front[1], p.pad_front[2])
        return {"case": self.cfg["host"], "library": lambda: lib.conv2d(x, w, padding=pad),
                "vendor": lambda: F.conv2d(x, w, padding=pad), "vendor_name": "F.conv2d"}


BENCHES = {"gemm": GemmBench, "attention": AttentionBench, "conv": ConvBench}


def measure_case(timer, fam: Family, c: dict[str, Any]) -> dict[str, Any]:
    s = fam.setup(c)
    row = {**c, "kernel": s["kernel"], "why": s["why"], "vendors": s["vendors"], "flops": s["flops"]}
    if s.get("split_k"):
        row["split_k"] = s["split_k"]
    fns = dict(s["fns"])
    if "library" not in fns:
        t = timer.time(fns)
        row["ms"] = t
        row["tflops"] = {k: s["flops"] / (v * 1e-3) / 1e12 for k, v in t.items()}
        return row
    oracle = {}
    for k, fn in s["oracle"].items():
        try:        # a forced kernel the C API refuses at launch (can_implement) is no candidate: dropped, said
            fn(0)
            oracle[f"k:{k}"] = fn
        except BenchError as e:
            log(f"    oracle: {e}")
    row["oracle_refused"] = len(s["oracle"]) - len(oracle)
    search = timer.time({**fns, **oracle})
    best = min(oracle, key=lambda k: search[k]) if oracle else None
    # the best of many samples is biased low: the reported figures come from a fresh alternation
    again = timer.time({**fns, **({best: oracle[best]} if best else {})})
    row["search_ms"] = search
    row["ms"] = again
    row["tflops"] = {k: s["flops"] / (v * 1e-3) / 1e12 for k, v in again.items()}
    row["oracle_kernel"] = best[2:] if best else None
    row["oracle_candidates"] = len(oracle)
    if best and s.get("oracle_err"):
        # a family whose oracle call returns its outputs (attention backward: dQ, dK, dV) checks them itself
        err = s["oracle_err"](best[2:])
        row["oracle_check"] = "ok" if err < TOLERANCE.get(c["dtype"], 2e-2) else "MISMATCH"
    elif best and s.get("out0") is not None and s.get("ref"):
        # the oracle's best is a kernel forced on a shape it was not verified on: its output is checked too
        s["out0"].fill_(float("nan"))
        oracle[best](0)
        err = rel_err(fam.torch, s["out0"], s["ref"]())
        row["oracle_check"] = "ok" if err < TOLERANCE.get(c["dtype"], 2e-2) else "MISMATCH"
    if s.get("check"):
        err = s["check"]()
        row["check_rel_err"] = err
        row["check"] = "ok" if err < TOLERANCE.get(c["dtype"], 2e-2) else "MISMATCH"
        if s.get("check_detail"):      # per output (attention backward: dq, dk, dv) and the reference's name
            row["check_detail"] = dict(s["check_detail"])
    return row


def ratios(row: dict[str, Any]) -> dict[str, Any]:
    """vendor time / library time (> 1: the library is faster), per vendor; oracle ones; library / oracle."""
    t = row.get("ms", {})
    out: dict[str, Any] = {}
    lib = t.get("library")
    if not lib:
        return out
    for v in row.get("vendors", []):
        if v in t:
            out[f"vs_{v}"] = t[v] / lib
            if row.get("oracle_kernel"):
                out[f"oracle_vs_{v}"] = t[v] / t[f"k:{row['oracle_kernel']}"]
    if row.get("oracle_kernel"):
        o = t[f"k:{row['oracle_kernel']}"]
        out["lib_vs_oracle"] = o / lib
        if t.get("library_c"):
            out["lib_c_vs_oracle"] = o / t["library_c"]
    return out


def measure(family: str, cfg: dict[str, Any], work: Path, args) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: --stage measure needs the GPU (use --backend fake for the CPU path)")
    from conv_bench import Timer
    from loader_overhead import best as host_best

    torch.backends.cudnn.benchmark = True
    props = torch.cuda.get_device_properties(0)
    gpu = torch.cuda.get_device_name(0)
    if not (work / "profile" / "tuning.json").is_file():
        raise BenchError(f"{work / 'profile'}: no tuning.json: run --stage profile first (same --out); the bench "
                         f"measures the library exported with its tuning")
    lib = load_library(work, family)
    fam = BENCHES[family](torch, lib, cfg, work, props.multi_processor_count,
                          int(getattr(props, "L2_cache_size", 0) or 60 << 20))
    timer = Timer(torch, args.reps, args.min_ms, args.warmup)
    log(f"{family}: measuring on {gpu} (library {lib.version()}, torch {torch.__version__}, "
        f"cuDNN {torch.backends.cudnn.version()})")
    rows = []
    for c in fam.cases():
        try:
            row = measure_case(timer, fam, c)
        except Exception as e:  # noqa: BLE001 (one case's failure is a result; the run goes on)
            row = {**c, "error": f"{type(e).__name__}: {e}"}
        row["ratios"] = ratios(row)
        rows.append(row)
        r, tf = row["ratios"], row.get("tflops", {})
        log(f"  {label_of(family, row):44s} lib {fmt(tf.get('library'))} TFLOP/s "
            + " ".join(f"{v} {fmt(tf.get(v))}" for v in row.get("vendors", []))
            + f"  x{fmt(r.get('vs_' + (row.get('vendors') or ['-'])[0]), '.2f')}  lib/oracle "
              f"{fmt(r.get('lib_vs_oracle'), '.3f')}  {row.get('check', row.get('error', ''))}  "
              f"{short(row.get('kernel'))} [{row.get('why', '')}]")
        torch.cuda.empty_cache()
    host: dict[str, Any] = {"case": cfg.get("host"), "calls": args.host_calls}
    if cfg.get("host"):
        try:
            h = fam.host()
            hl, _ = host_best(torch, h["library"], args.host_calls)
            hv, _ = host_best(torch, h["vendor"], args.host_calls)
            host.update(library_us=hl, vendor_us=hv, vendor=h["vendor_name"])
            log(f"  host cost ({h['case']}): library {hl:.2f} us/call, {h['vendor_name']} {hv:.2f} us/call")
        except Exception as e:  # noqa: BLE001 (reported in the record; the timed cases stand)
            host["error"] = f"{type(e).__name__}: {e}"
            log(f"  host cost ({cfg['host']}): {host['error']}")
    return {"family": family, "variant": cfg.get("variant"), "gpu": gpu, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "library": lib.version(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": _shown(Path(cfg["path"])), "tune": cfg["tune"], "eval": cfg["eval"],
            "kernels": fam.kernel_count(),
            "tuning_entries": len(fam.entries), "rows": rows, "host": host, "summary": summarize(rows),
            "method": {"reps": args.reps, "min_ms": args.min_ms, "warmup": args.warmup, "median": True,
                       "alternating": True, "retimed": True, "l2_rotation": True, "cudnn_benchmark": True,
                       "gpu_time_only": "a GPU-side sleep covers the batch's host enqueue; host cost timed apart"}}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("check") == "ok"]
    out: dict[str, Any] = {"cases": len(rows), "checked_ok": len(ok),
                           "mismatches": sum(r.get("check") == "MISMATCH" for r in rows),
                           "not_run": sum("library" not in r.get("ms", {}) for r in rows)}
    vendors = sorted({v for r in rows for v in r.get("vendors", [])})
    for v in vendors:
        xs = [r["ratios"][f"vs_{v}"] for r in ok if f"vs_{v}" in r["ratios"]]
        out[f"geomean_vs_{v}"] = geomean(xs)
        out[f"min_vs_{v}"] = min(xs) if xs else None
        out[f"oracle_geomean_vs_{v}"] = geomean([r["ratios"].get(f"oracle_vs_{v}") for r in ok])
    # a case whose oracle kernel computed a wrong result has no oracle figure (counted apart)
    out["oracle_mismatches"] = sum(r.get("oracle_check") == "MISMATCH" for r in rows)
    lo = [r["ratios"]["lib_vs_oracle"] for r in ok if "lib_vs_oracle" in r["ratios"]
          and r.get("oracle_check") != "MISMATCH"]
    out["lib_vs_oracle_geomean"] = geomean(lo)
    out["lib_vs_oracle_min"] = min(lo) if lo else None
    out["lib_c_vs_oracle_geomean"] = geomean([r["ratios"].get("lib_c_vs_oracle") for r in ok
                                              if r.get("oracle_check") != "MISMATCH"])
    out["goal_met"] = bool(lo) and geomean(lo) >= GOAL_GEOMEAN and min(lo) >= GOAL_CASE
    return out


# ------------------------------------------------------------------------------------------------- reports

def fmt(x: Any, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)


def short(name: str | None) -> str:
    if not name:
        return "—"
    for cut in ("_accf32", "_identity", "_epitma", "_al8x8x8", "_bshd", "_strided"):
        name = name.replace(cut, "")
    return name


def label_of(family: str, row: dict[str, Any]) -> str:
    if family == "conv":
        return f"{row['op']} {row['dtype']} {row['case']}"
    if row.get("op") == "backward":
        return f"{row.get('dtype', '')} bwd {row['case']}"
    return f"{row.get('dtype', '')} {row['case']}"


def gpu_slug(gpu: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", gpu.lower().replace("nvidia", "")).strip("-")
    return s or "gpu"


def record_stem(rec: dict[str, Any]) -> str:
    """<family>[-<variant>]-<date>-<gpu>: the record's file name under --records, and its plot's."""
    return f"{run_name(rec['family'], rec.get('variant'))}-{rec['date'][:10]}-{gpu_slug(rec['gpu'])}"


def record_path(records: Path, rec: dict[str, Any]) -> Path:
    return records / f"{record_stem(rec)}.json"


def record_key(rec: dict[str, Any]) -> tuple[str, str, str]:
    return rec["family"], rec.get("variant") or "", rec.get("gpu", "?")


def latest_records(records: Path) -> list[dict[str, Any]]:
    """The newest record per (family, variant, GPU) under `records`, in family order (a config's variant, e.g. conv's
    bf16 set, is its own table beside the family's default one)."""
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for p in sorted(records.glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict) or rec.get("family") not in FAMILIES or "rows" not in rec:
            continue
        key = record_key(rec)
        if key not in newest or rec.get("date", "") >= newest[key].get("date", ""):
            newest[key] = rec
    return sorted(newest.values(), key=lambda r: (FAMILIES.index(r["family"]), r.get("variant") or "",
                                                   r.get("gpu", "")))


VENDOR_NAMES = {"cublas": "torch.matmul (cuBLAS)", "cudnn": "cuDNN", "flash": "FA2 (SDPA flash)"}


def family_section(rec: dict[str, Any], plot: str | None = None) -> str:
    fam, gpu = rec["family"], rec["gpu"]
    vendors = sorted({v for r in rec["rows"] for v in r.get("vendors", [])},
                     key=lambda v: list(VENDOR_NAMES).index(v) if v in VENDOR_NAMES else 99)
    s = rec["summary"]
    head = ["eval case", "kernel chosen", "why", "library TFLOP/s"] + [f"{VENDOR_NAMES.get(v, v)} TFLOP/s"
                                                                          for v in vendors]
    head += [f"x {v}" for v in vendors] + [f"best-of-N x {vendors[0]}" if vendors else "best-of-N",
                                           "lib / oracle", "C API / oracle", "check", "GPU"]
    title = fam + (f" {rec['variant']}" if rec.get("variant") else "")
    lines = [f"## {title} ({gpu})", "",
             f"Record: `{rec.get('config', '')}` run {rec['date']}, torch {rec.get('torch')}, cuDNN {rec.get('cudnn')}; "
             f"{rec.get('kernels')} exported kernels, {rec.get('tuning_entries')} tuning records from "
             f"{len(rec.get('tune', []))} tuning shapes; {len(rec['rows'])} evaluation cases, none of them tuned "
             "on." + (" Backward: the library's attention_backward (dQ, dK, dV) against SDPA's backward alone with the "
                      "backend named; TFLOP/s = 2.5 x the forward's FLOPs (visible pairs); `check`: the largest "
                      "relative error of dQ, dK, dV against cuDNN's (`check_detail` in the record)."
                      if any(r.get("op") == "backward" for r in rec["rows"]) else ""),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rec["rows"]:
        tf, ra = r.get("tflops", {}), r.get("ratios", {})
        why = r.get("why", "") + (f", split_k {r['split_k']}" if r.get("split_k", 1) not in (None, 1) else "")
        cells = [label_of(fam, r), f"`{short(r.get('kernel'))}`" if r.get("kernel") else "—",
                 why if "error" not in r else f"error: {r['error'][:80]}", fmt(tf.get("library"))]
        cells += [fmt(tf.get(v)) for v in vendors] + [fmt(ra.get(f"vs_{v}"), ".2f") for v in vendors]
        cells += [fmt(ra.get(f"oracle_vs_{vendors[0]}") if vendors else None, ".2f"),
                  fmt(ra.get("lib_vs_oracle"), ".3f"), fmt(ra.get("lib_c_vs_oracle"), ".3f"),
                  r.get("check", "—") + (" (oracle MISMATCH)" if r.get("oracle_check") == "MISMATCH" else ""), gpu]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    parts = [f"geomean x {VENDOR_NAMES.get(v, v)} {fmt(s.get(f'geomean_vs_{v}'), '.3f')} (lowest "
             f"{fmt(s.get(f'min_vs_{v}'), '.2f')}, best-of-N {fmt(s.get(f'oracle_geomean_vs_{v}'), '.3f')})"
             for v in vendors]
    lo_g, lo_m = s.get("lib_vs_oracle_geomean"), s.get("lib_vs_oracle_min")
    lines.append(f"Over the {s.get('checked_ok')} cases whose output matched the vendor's ({s.get('mismatches')} "
                 f"mismatches, {s.get('not_run')} the library could not run): " + "; ".join(parts) + ". "
                 f"Library / oracle: geomean {fmt(lo_g, '.3f')}, lowest {fmt(lo_m, '.3f')}"
                 + (f" ({s['oracle_mismatches']} cases whose oracle kernel mismatched left out)"
                    if s.get("oracle_mismatches") else "") + f" (goal >= "
                 f"{GOAL_GEOMEAN} and >= {GOAL_CASE}: {'met' if s.get('goal_met') else 'NOT met'}).")
    h = rec.get("host")
    if h and h.get("error"):
        lines += ["", f"Host cost per call ({h.get('case')}): not measured ({h['error'][:160]})."]
    elif h and h.get("library_us"):
        lines += ["", f"Host cost per call ({h['case']}, {h['calls']} back-to-back calls, no synchronization): "
                      f"library {h['library_us']:.2f} us, {h['vendor']} {h['vendor_us']:.2f} us "
                      f"({h['library_us'] / h['vendor_us']:.2f}x)."]
    if plot:
        lines += ["", f"![{title} on {gpu}]({plot})"]
    return "\n".join(lines) + "\n"


def render_doc(records: list[dict[str, Any]], plots: dict[tuple[str, str], str] | None = None) -> str:
    head = ("# The exported library's speed (generated by benchmarks/library_bench.py: do not edit)\n\n"
            "What a user gets: the family's starter specs emitted, `emitter profile` on a tuning shape set, `emitter "
            "library --tuning` and CMake, then the library's torch functions called through its Python loader on an "
            "evaluation set of other shapes (configs/bench/library_<family>.yaml; none is a tuning shape; a "
            "config's variant, e.g. conv's bf16 set in library_conv_bf16.yaml, is its own table), against "
            "the vendor path on the same tensors: GEMM torch.matmul; attention SDPA with the cuDNN and the flash "
            "backend named; conv F.conv2d / aten.convolution_backward on channels_last tensors. Same warm-up, inputs "
            "rotated past the L2, CUDA-event-timed batches in alternation, medians; the reported figures are a "
            "second, fresh alternation. `x vendor` is the vendor's time over the library's (> 1: the library is "
            "faster). The figures are GPU time: a GPU-side sleep holds the stream while the host enqueues each "
            "batch, so neither side's host latency is timed as GPU time; the library call's GPU work (dispatch's "
            "workspace reset, output allocation) counts, and each family's host cost per call (the Python loader "
            "against the vendor's Python call) is the line under its table. "
            "The oracle is every exported kernel that runs the case, forced by name through the C API (split-K "
            "kernels also at other slice counts: conv the ones the profiler tries, GEMM its tuned counts and 2, 4; "
            "forced GEMM kernels run at their compiled-in scheduler options, which a tuning record may change, so "
            "there the library can beat the oracle): `best-of-N` is its best against the vendor, `lib / oracle` the oracle's time over the library's (1.0: dispatch and call path lose "
            "nothing), `C API / oracle` the same dispatch called through the C API with a prebuilt problem. "
            "`why`: tuned (a tuning record's kernel), predicted (GEMM and conv, with the profile.json beside the tuning "
            "table: the kernel whose time, measured at the nearest profiled shape and scaled by the FLOPs of its tiles "
            "(the problem padded to whole tiles) and wave quantization (conv: padded work, the same filter size and "
            "stride), is lowest) or the static order. The best-of-N kernel tables "
            "(docs/performance.md, docs/attention_performance.md, docs/conv_performance.md) are kernel "
            "capability; this page is the headline.\n\n"
            "Commands (GPU machine): `python3 benchmarks/library_bench.py --out generated/libbench -j 16 --stage "
            "build`, then `--stage profile`, then `--stage measure --doc docs/library_performance.md` "
            "(`make bench-library` runs all three); conv's bf16 set: the same with `--config "
            "configs/bench/library_conv_bf16.yaml`; the attention backward (the library's attention_backward against "
            "SDPA's backward, cuDNN and flash; TFLOP/s = 2.5 x the forward's FLOPs): `--config "
            "configs/bench/library_attention_backward.yaml`.\n\n")
    if not records:
        return head + "No records yet.\n"
    return head + "\n".join(family_section(r, (plots or {}).get(record_key(r))) for r in records)


def plot_record(rec: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not importable: no plot")
        return False
    rows = [r for r in rec["rows"] if r.get("ratios")]
    vendor = next((v for r in rows for v in r.get("vendors", [])), None)
    if not rows or vendor is None:
        return False
    labels = [label_of(rec["family"], r) for r in rows]
    lib = [r["ratios"].get(f"vs_{vendor}") or 0 for r in rows]
    orc = [r["ratios"].get(f"oracle_vs_{vendor}") or 0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows) + 2), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], lib, 0.4, label="library (what users call)")
    ax.bar([x + 0.2 for x in xs], orc, 0.4, label="best of the exported kernels (oracle)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"speed vs {VENDOR_NAMES.get(vendor, vendor)} (x)")
    ax.set_title(f"{run_name(rec['family'], rec.get('variant'))} library vs {VENDOR_NAMES.get(vendor, vendor)}, {rec['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_doc(doc: Path, records: Path) -> None:
    recs = latest_records(records)
    plots = {}
    for r in recs:
        png = records / f"{record_stem(r)}.png"
        if png.is_file() or plot_record(r, png):
            try:
                plots[record_key(r)] = str(png.relative_to(doc.parent.resolve()))
            except ValueError:
                plots[record_key(r)] = str(png)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render_doc(recs, plots), encoding="utf-8")
    log(f"wrote {doc} ({len(recs)} family records)")


# ------------------------------------------------------------------------------------------------- main

def config_family(path: Path, asked: list[str] | None) -> str:
    """The family a --config file is read for: its `family` key (load_config checks the rest); --family, if given,
    must name that one family."""
    import yaml

    if not path.is_file():
        raise BenchError(f"--config {path}: no such file")
    try:
        fam = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("family")
    except (yaml.YAMLError, AttributeError) as e:
        raise BenchError(f"--config {path}: not a YAML mapping ({str(e).splitlines()[0] if str(e) else e})") from None
    if fam not in FAMILIES:
        raise BenchError(f"{_where(path, 'family')}: value {fam!r} (allowed: {', '.join(FAMILIES)})")
    if asked and asked != [fam]:
        raise BenchError(f"--config {_shown(path)} is a {fam!r} config; --family {' --family '.join(asked)} asks for "
                         f"another: give --family {fam} or none")
    return fam


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", choices=FAMILIES, help="repeatable (default: all three)")
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--out", type=Path, default=ROOT / "generated" / "libbench", help="work dir, kept between calls")
    ap.add_argument("-j", "--jobs", type=int, default=16)
    ap.add_argument("--backend", choices=("pycuda", "fake"), default="pycuda",
                    help="fake: emit, the fake profiler and the export only (no nvcc, CMake or GPU)")
    ap.add_argument("--dry-run", action="store_true", help="the same as --backend fake")
    ap.add_argument("--config-dir", type=Path, default=BENCH_DIR, help="where library_<family>.yaml are")
    ap.add_argument("--config", type=Path, default=None,
                    help="one bench config read instead of <config-dir>/library_<family>.yaml (its family key names "
                         "the family; e.g. configs/bench/library_conv_bf16.yaml)")
    ap.add_argument("--records", type=Path, default=RECORDS, help="where the measure stage writes its JSON record")
    ap.add_argument("--doc", type=Path, default=None, help="write the generated markdown table here")
    ap.add_argument("--report-only", action="store_true", help="only regenerate --doc from --records")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--min-ms", type=float, default=2.0, help="GPU time of one timed batch of calls")
    ap.add_argument("--warmup", type=int, default=10, help="calls of each function before timing")
    ap.add_argument("--host-calls", type=int, default=200)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fake = args.dry_run or args.backend == "fake"
    try:
        if args.report_only:
            if args.doc is None:
                raise BenchError("--report-only needs --doc")
            write_doc(args.doc, args.records)
            return 0
        families = args.family or list(FAMILIES)
        if args.config is not None:
            families = [config_family(args.config, args.family)]
        stages = STAGES if args.stage == "all" else (args.stage,)
        if fake and "measure" in stages:
            stages = tuple(s for s in stages if s != "measure")
            if not stages:
                raise BenchError("--stage measure needs the GPU (no fake measurement: it would be a made-up figure)")
        cfgs = {f: load_config(f, args.config or args.config_dir / f"library_{f}.yaml") for f in families}
        for f in families:
            work = (args.out / run_name(f, cfgs[f].get("variant"))).resolve()
            work.mkdir(parents=True, exist_ok=True)
            for stage in stages:
                log(f"{f}: stage {stage}")
                if stage == "build":
                    stage_build(f, cfgs[f], work, args.jobs, fake)
                elif stage == "profile":
                    stage_profile(f, cfgs[f], work, args.jobs, fake)
                else:
                    rec = measure(f, cfgs[f], work, args)
                    (work / "library_bench.json").write_text(json.dumps(rec, indent=1, default=str))
                    args.records.mkdir(parents=True, exist_ok=True)
                    path = record_path(args.records, rec)
                    path.write_text(json.dumps(rec, indent=1, default=str))
                    plot_record(rec, path.with_suffix(".png"))
                    print(family_section(rec), flush=True)
                    log(f"{f}: wrote {path}")
        if args.doc is not None and "measure" in stages:
            write_doc(args.doc, args.records)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
