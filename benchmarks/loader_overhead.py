"""Per-call cost of the exported library's Python loader against torch.matmul (issue 26 must-have 4).

Back-to-back loops of N calls of `lib.gemm(a, b)` and `torch.matmul(a, b)` on the same bf16 buffers (TN: a is
row-major m x k, b = w.t() column-major k x n), for 1024^3, 16x4096x4096 and 2048^3, each also with `out=`
given. Two figures per row:
  host us/call  the time to enqueue N calls (no synchronization inside the loop; N small enough that the
                launch queue never fills, so it is the CPU cost of one call: Python + ctypes + the C API's
                dispatch + the launch)
  wall us/call  N back-to-back calls including the final synchronize (GPU time once the GPU is the bottleneck)
and the ratio lib / torch of each. Also: the C API through ctypes with a prebuilt problem (the floor the
loader stands on) and what reading torch's current stream costs.

    python3 benchmarks/loader_overhead.py                 # emits + exports + builds 2 sm90a kernels (-j 16)
    python3 benchmarks/loader_overhead.py --library DIR   # an exported library already built (DIR/build)

Run on a GPU machine (sm_90); expect about 2-3 minutes with the build on 16 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "lobench"
SPEC = """\
description: loader_overhead.py's kernels (sm90a bf16 TN)
defaults:
  family: gemm
  arch: sm90a
  dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
  layout: tn
  stages: auto
kernels:
  - tile: 128x256x64
    cluster: 2x1x1
    schedule: {kernel: cooperative, tile_scheduler: persistent}
  - tile: 64x128x64
    cluster: 1x1x1
    schedule: {kernel: pingpong}
"""
SHAPES = [(1024, 1024, 1024), (16, 4096, 4096), (2048, 2048, 2048)]


def run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def build_library(work: Path, jobs: int) -> Path:
    """emit -> export -> cmake build; returns the exported tree (its build in <tree>/build)."""
    spec = work / "loader_overhead.yaml"
    spec.write_text(SPEC)
    py = sys.executable
    run([py, "-m", "emitter", "emit", str(spec), "-o", str(work / "gen")], cwd=ROOT)
    tree = work / NAME
    run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree)], cwd=ROOT)
    if shutil.which("cmake") is None:
        sys.exit("cmake not found: build the exported tree yourself and pass --library DIR")
    run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_CUDA_ARCHITECTURES=90a",
         "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", str(tree / "build"), "-j", str(jobs)])
    return tree


def load_loader(tree: Path):
    pys = sorted((tree / "python").glob("*.py"))
    if not pys:
        sys.exit(f"{tree}: no python/<lib>.py (is it an exported library?)")
    name = pys[0].stem
    so = next((p for p in sorted(tree.rglob(f"lib{name}.so"))), None)
    if so is None:
        sys.exit(f"{tree}: lib{name}.so not found under it: build it first (cmake --build {tree}/build)")
    spec = importlib.util.spec_from_file_location(name, pys[0])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    mod.load(str(so))
    return mod


def timed(torch, fn, n: int) -> tuple[float, float]:
    """(host us/call, wall us/call) of n back-to-back calls."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def best(torch, fn, n: int, reps: int = 7) -> tuple[float, float]:
    for _ in range(20):
        fn()
    runs = [timed(torch, fn, n) for _ in range(reps)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", type=Path, help="an exported library tree, already built (default: build one)")
    ap.add_argument("--jobs", "-j", type=int, default=16)
    ap.add_argument("--host-calls", type=int, default=200, help="calls per host-time loop (below the launch queue)")
    ap.add_argument("--wall-calls", type=int, default=1000, help="calls per wall-time loop")
    ap.add_argument("--keep", type=Path, help="build in this directory (kept) instead of a temporary one")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    t_start = time.perf_counter()
    if args.library:
        tree = args.library
    else:
        work = args.keep or Path(tempfile.mkdtemp(prefix="loader_overhead_"))
        work.mkdir(parents=True, exist_ok=True)
        tree = build_library(work, args.jobs)
    t_build = time.perf_counter() - t_start
    lib = load_loader(tree)
    props = torch.cuda.get_device_properties(0)
    print(f"\nGPU: {torch.cuda.get_device_name(0)} (sm_{props.major}{props.minor}); torch {torch.__version__}; "
          f"library {lib.version()}; build {t_build:.0f} s")

    # what reading torch's current stream costs (the loader uses torch._C._cuda_getCurrentRawStream)
    n = 20000
    probes = {"torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
              "torch.cuda.current_stream(0).cuda_stream": lambda: torch.cuda.current_stream(0).cuda_stream}
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):
        probes["torch._C._cuda_getCurrentRawStream(0)"] = lambda: torch._C._cuda_getCurrentRawStream(0)
    for label, fn in probes.items():
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        print(f"  {label:45s} {(time.perf_counter() - t0) / n * 1e6:6.2f} us")

    rows = []
    for m, nn, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(nn, k, device="cuda", dtype=torch.bfloat16)
        b = w.t()
        out = torch.empty(m, nn, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a.float(), b.float())
        got = lib.gemm(a, b)
        torch.cuda.synchronize()
        err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
        again = lib.gemm(a, b)          # the planned fast path (output from empty_like of the plan's template)
        torch.cuda.synchronize()
        assert again.shape == got.shape and again.stride() == got.stride() and again.dtype == got.dtype, again
        err = max(err, ((again.float() - ref).abs().max() / ref.abs().max()).item())
        sel = lib.select(a, b)
        # the C API's floor: a prebuilt problem through the bound ctypes function
        packed, _, dev, _keep = lib._problem(a, b, out, None, 1.0, 0.0, None, None, "identity", None, None, None, None,
                                             None, True, None, False)
        stream = torch._C._cuda_getCurrentRawStream(0) if hasattr(torch._C, "_cuda_getCurrentRawStream") else \
            torch.cuda.current_stream().cuda_stream
        capi = lambda: lib._GEMM(packed, None, 0, stream or None)   # noqa: E731
        for label, fl, ft in (("alloc", lambda: lib.gemm(a, b), lambda: torch.matmul(a, b)),
                              ("out=", lambda: lib.gemm(a, b, out), lambda: torch.matmul(a, b, out=out))):
            hl, wl = best(torch, fl, args.host_calls)
            ht, wt = best(torch, ft, args.host_calls)
            _, wl = best(torch, fl, args.wall_calls, reps=3)
            _, wt = best(torch, ft, args.wall_calls, reps=3)
            rows.append((f"{m}x{nn}x{k}", label, hl, ht, wl, wt))
        hc, _ = best(torch, capi, args.host_calls)
        rows.append((f"{m}x{nn}x{k}", "C API", hc, float("nan"), float("nan"), float("nan")))
        print(f"  {m}x{nn}x{k}: kernel {sel['kernel']} ({sel['reason']}), max rel error vs fp32 {err:.2e}")

    print(f"\n{'problem':16s} {'call':6s} {'host us/call':>21s} {'ratio':>6s}   {'wall us/call':>21s} {'ratio':>6s}")
    print(f"{'':16s} {'':6s} {'lib':>10s} {'torch':>10s} {'':>6s}   {'lib':>10s} {'torch':>10s}")
    worst = 0.0
    for shape, label, hl, ht, wl, wt in rows:
        if label == "C API":
            print(f"{shape:16s} {label:6s} {hl:10.2f} {'':>10s} {'':>6s}   (ctypes + C API + launch, problem prebuilt)")
            continue
        worst = max(worst, hl / ht)
        print(f"{shape:16s} {label:6s} {hl:10.2f} {ht:10.2f} {hl / ht:6.2f}   {wl:10.2f} {wt:10.2f} {wl / wt:6.2f}")
    print(f"\nworst host-time ratio lib/torch: {worst:.2f} (goal <= 1.2); total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
