"""Benchmark on the GPU machine: emit the sm90a example specs, build, (verify), profile a shape sweep
against cuBLAS, print the table.

    python3 benchmarks/profile_sm90a.py                       # all configs/gemm/sm90a_*.yaml, square + llm
    python3 benchmarks/profile_sm90a.py --shapes quick -j 16  # a short sweep (square 1024..8192 + 6 LLM shapes)
    python3 benchmarks/profile_sm90a.py --select 'a=bf16,e4m3' --shapes square --verify

Writes under --out (default results/sm90a): gen/ (manifest, .cu, build/), profile.yaml (the config it
ran), profile/{profile.csv, profile.json, tuning.json, plots/}, logs. Each step is the project's own CLI
(`python3 -m emitter ...`), so the commands printed are the ones a user would run. Exits non-zero if a step
fails; the last lines printed are the best kernel per problem with its ratio to cuBLAS.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHAPES = {
    "square": ["- set: square"],
    "llm": ["- set: llm"],
    "all": ["- set: square", "- set: llm"],
    "quick": ["- square: [1024, 2048, 4096, 8192]",
              "- {m: [16, 128, 2048], n: 4096, k: 4096}",
              "- {m: [16, 8192], n: 14336, k: 4096}",
              "- {m: 2048, n: 128256, k: 4096}"],
}


def step(title: str, argv: list[str], log: Path) -> float:
    print(f"\n== {title}: {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:      # flushed line by line: a run cut short keeps its log
            f.write(line)
            f.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
        code = proc.wait()
    dt = time.perf_counter() - t0
    print(f"== {title}: exit {code} in {dt:.1f} s (log {log})", flush=True)
    if code not in (0,):
        raise SystemExit(f"{title} failed (exit {code}); see {log}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/sm90a", help="output directory")
    ap.add_argument("--specs", action="append", default=[], help="spec glob to emit (repeatable; default "
                    "configs/gemm/sm90a_*.yaml)")
    ap.add_argument("--gen", default=None, help="where to emit and build (default OUT/gen)")
    ap.add_argument("--select", action="append", default=[], help="instance selection (repeatable)")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="all", help="problem sweep")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 4, help="nvcc processes")
    ap.add_argument("--verify", action="store_true", help="also run `emitter verify --quick` before profiling")
    ap.add_argument("--min-duration-ms", type=float, default=20.0, help="timed launches per repeat (ms)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-build", action="store_true", help="reuse the build in --out/gen")
    ap.add_argument("--stall-timeout", type=float, default=300.0, help="seconds before a hung kernel is killed")
    args = ap.parse_args()

    out = (ROOT / args.out).resolve()
    gen = Path(args.gen).resolve() if args.gen else out / "gen"
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "emitter"]
    sel: list[str] = []
    for s in args.select:
        sel += ["--select", s]
    patterns = args.specs or ["configs/gemm/sm90a_*.yaml"]
    specs = sorted({f for pat in patterns for f in glob.glob(str(ROOT / pat))})
    if not specs:
        raise SystemExit(f"no spec matches {patterns}")
    times = {}
    times["emit"] = step("emit", py + ["emit", *specs, "-o", str(gen), "-q"], out / "emit.log")
    if not args.skip_build:
        times["build"] = step("build", py + ["build", str(gen), "-j", str(args.jobs), "--no-progress", *sel],
                              out / "build.log")
    if args.verify:
        times["verify"] = step("verify", py + ["verify", str(gen), "--quick", "-q", *sel], out / "verify.log")

    select_lines = "".join(f"\n  - {json.dumps(s)}" for s in args.select)
    config = out / "profile.yaml"
    config.write_text(
        "# written by benchmarks/profile_sm90a.py\n"
        f"manifests: [{json.dumps(str(gen))}]\n"
        + (f"select:{select_lines}\n" if args.select else "")
        + "problems:\n" + "".join(f"  {line}\n" for line in SHAPES[args.shapes])
        + f"timing: {{warmup: 10, warmup_ms: 100, min_duration_ms: {args.min_duration_ms}, max_iterations: 400, repeats: {args.repeats}}}\n"
        + "baselines: [cublas]\n"
        + f"output: {{dir: {json.dumps(str(out / 'profile'))}}}\n")
    times["profile"] = step("profile", py + ["profile", str(config), "-o", str(out / "profile"), "--stall-timeout",
                                             str(args.stall_timeout)], out / "profile.log")

    # the closing summary: best kernel per problem against cuBLAS (also in profile/tuning.json)
    data = json.loads((out / "profile" / "profile.json").read_text())
    env = data["environment"]
    print(f"\n{env.get('name')} | {env.get('sm_count')} SMs | driver {env.get('driver')} | CUDA {env.get('nvcc')} | "
          f"CUTLASS {env.get('cutlass')} | baseline {'; '.join(data['baselines']) or 'none'}")
    print(f"{'op':<30} {'problem':>18} {'best kernel':<58} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6} ties")
    for r in data["rows"]:
        if r["best"]:
            base = (2 * r["m"] * r["n"] * r["k"] * r["batch"] / (r["baseline_ms"] * 1e-3) / 1e12) if r["baseline_ms"] else None
            from emitter.profile.report import compact_name

            print(f"{r['op']:<30} {r['m']}x{r['n']}x{r['k']:<8} {compact_name(r['name'])[:58]:<58} "
                  f"{r['tflops'] or 0:8.1f} {base or 0:8.1f} {r['ratio_to_baseline'] or 0:6.3f} {'tie' if r['tied'] else ''}")
    for op, g in data["summary"]["geomean"].items():
        print(f"{op}: geomean best/cuBLAS {g['geomean_ratio']:.3f}x over {g['problems']} problems, worst {g['min_ratio']:.3f}x")
    print("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
