"""Issue 6 benchmark, on the GPU machine: emit the sm90a specs, build, verify, profile the shape set against
cuBLAS, print the table and write the performance report.

    python3 benchmarks/profile_sm90a.py --out $OUT/sm90a            # everything (make bench-gpu)
    python3 benchmarks/profile_sm90a.py --shapes quick -j 16        # a short sweep
    python3 benchmarks/profile_sm90a.py --out $OUT/sm90a --resume   # finish a run that was cut short
    python3 benchmarks/profile_sm90a.py --report-only results/sm90a --doc docs/performance.md
                                                                    # no GPU: the report from a run's outputs

Shape set (issue 6): square 1024..16384; LLM projections, M in {16, 128, 512, 2048, 8192} against (N, K) in
{(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 8192), (128256, 4096)}; ops bf16 and f16
(TN, and NN for bf16) and fp8 e4m3 -> bf16 (TN; full-precision and fast accumulation, each against cuBLASLt
in the same mode). Every step is the project's own CLI (`python3 -m emitter ...`), so the printed commands
are the ones a user would run. Writes under --out: gen/ (manifest, sources, build), verify.json,
profile/{profile.json, profile.csv, tuning.json, plots/}, logs, report.md (the table, with the goals) and
summary.json. Exits non-zero when a step fails.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from emitter.profile.config import LLM_M, LLM_NK  # noqa: E402  (the issue's shape set, one definition)

DEFAULT_SPECS = ["configs/gemm/sm90a_bf16.yaml", "configs/gemm/sm90a_fp8.yaml", "configs/tuning/sm90a_candidates.yaml"]
# plain GEMMs only: the fused-epilogue f16 examples have no cuBLAS counterpart
DEFAULT_SELECT = ["arch=sm90a activation=identity bias=none"]

SHAPES = {
    "all": ["- set: square", "- set: llm"],
    "square": ["- set: square"],
    "llm": ["- set: llm"],
    # M <= 512 rows of the LLM set: the decode / few-output-tile shapes
    "small-m": [f"- {{m: {[m for m in LLM_M if m <= 512]}, n: {n}, k: {k}}}" for n, k in LLM_NK],
    # small-m and the two largest squares: where the emitted kernels are furthest behind (make bench-gpu-small)
    "explore": [f"- {{m: {[m for m in LLM_M if m <= 512]}, n: {n}, k: {k}}}" for n, k in LLM_NK]
               + ["- square: [8192, 16384]"],
    # the square and M >= 2048 LLM shapes: the fp8 goal's set, where the large-tile kernels run
    "large": ["- set: square"] + [f"- {{m: {[m for m in LLM_M if m >= 2048]}, n: {n}, k: {k}}}" for n, k in LLM_NK],
    "quick": ["- square: [1024, 2048, 4096, 8192]",
              "- {m: [16, 128, 2048], n: 4096, k: 4096}",
              "- {m: [16, 8192], n: 14336, k: 4096}",
              "- {m: 2048, n: 128256, k: 4096}"],
}

# The goals of issue 6, checked in the report (ratios are best emitted kernel / cuBLAS, same run).
GOAL_GEOMEAN_16BIT = 1.05
GOAL_MIN_16BIT = 0.97
GOAL_8192_RATIO = 1.03
GOAL_8192_PEAK = 0.82
GOAL_FP8_GEOMEAN = 1.0
DENSE_PEAK = {"bf16": 989.0, "f16": 989.0, "e4m3": 1979.0, "e5m2": 1979.0}


def step(title: str, argv: list[str], log: Path, ok_codes: tuple[int, ...] = (0,)) -> float:
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
    if code not in ok_codes:
        raise SystemExit(f"{title} failed (exit {code}); see {log}")
    return dt


# ------------------------------------------------------------------------------------------ the report
def _large_llm(r: dict) -> bool:
    return r["m"] >= 2048 and not (r["m"] == r["n"] == r["k"])


def _square(r: dict) -> bool:
    return r["m"] == r["n"] == r["k"]


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _kernel_text(r: dict) -> str:
    from emitter.profile.report import compact_name

    text = compact_name(r["name"])
    return text + (f" split-K {r['split_k']}" if int(r.get("split_k") or 1) > 1 else "")


def summarize(profile_json: Path) -> dict:
    """Best kernel per (op, problem) with its ratio to the baseline, geomeans and the goal checks."""
    data = json.loads(profile_json.read_text())
    best = [r for r in data["rows"] if r.get("best")]
    base = {(r["op"], r["m"], r["n"], r["k"]): r for r in data["rows"] if r["kind"] == "baseline"}
    ops: dict[str, list[dict]] = {}
    for r in sorted(best, key=lambda r: (r["op"], r["m"] * r["n"] * r["k"], r["m"], r["n"], r["k"])):
        b = base.get((r["op"], r["m"], r["n"], r["k"]), {})
        peak = DENSE_PEAK.get(r["a"])
        ops.setdefault(r["op"], []).append({
            "m": r["m"], "n": r["n"], "k": r["k"], "kernel": r["name"], "split_k": int(r.get("split_k") or 1),
            "tflops": r["tflops"], "baseline_tflops": b.get("tflops"), "baseline": b.get("provider"),
            "ratio": r["ratio_to_baseline"], "pct_peak": (100 * r["tflops"] / peak) if peak and r["tflops"] else None,
            "tied": r.get("tied", False)})
    summary: dict = {"environment": data["environment"], "baselines": data["baselines"], "ops": {}, "goals": []}
    every = {(r["m"], r["n"], r["k"]) for r in data["rows"]}
    for op, rows in ops.items():
        ratios = [x["ratio"] for x in rows if x["ratio"]]
        have = {(x["m"], x["n"], x["k"]) for x in rows}
        g = {"rows": rows, "problems": len(rows), "with_baseline": len(ratios), "geomean": _geomean(ratios),
             "missing": [f"{m}x{n}x{k}" for m, n, k in sorted(every - have)],
             "min": min(ratios) if ratios else None,
             "below_0.97": sum(1 for x in ratios if x < GOAL_MIN_16BIT)}
        if op.startswith("e4m3") or op.startswith("e5m2"):
            sub = [x["ratio"] for x in rows if x["ratio"] and (_square(x) or _large_llm(x))]
            g["geomean_square_and_large_llm"] = _geomean(sub)
            g["problems_square_and_large_llm"] = len(sub)
        summary["ops"][op] = g
    goals = summary["goals"]
    for op, g in summary["ops"].items():
        if op.startswith(("bf16", "f16")) and g["geomean"] is not None:
            goals.append((f"{op}: geomean best/cuBLAS >= {GOAL_GEOMEAN_16BIT}", f"{g['geomean']:.3f}",
                          g["geomean"] >= GOAL_GEOMEAN_16BIT))
            goals.append((f"{op}: no shape below {GOAL_MIN_16BIT}x", f"min {g['min']:.3f}, {g['below_0.97']} below",
                          g["below_0.97"] == 0))
            if op == "bf16bf16_bf16bf16_accf32_tnt":
                big = next((x for x in g["rows"] if x["m"] == x["n"] == x["k"] == 8192), None)
                if big and big["ratio"]:
                    goals.append((f"bf16 8192^3: >= {GOAL_8192_RATIO}x cuBLAS and >= {GOAL_8192_PEAK:.0%} of 989",
                                  f"{big['ratio']:.3f}x, {big['tflops']:.1f} TFLOP/s = {big['pct_peak']:.1f}%",
                                  big["ratio"] >= GOAL_8192_RATIO and big["pct_peak"] >= 100 * GOAL_8192_PEAK))
        if "geomean_square_and_large_llm" in g and g["geomean_square_and_large_llm"] is not None:
            goals.append((f"{op}: geomean over square + large LLM >= {GOAL_FP8_GEOMEAN} (cuBLASLt, same accumulation)",
                          f"{g['geomean_square_and_large_llm']:.3f} over {g['problems_square_and_large_llm']}",
                          g["geomean_square_and_large_llm"] >= GOAL_FP8_GEOMEAN))
    return summary


def table_text(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"{env.get('name')} | {env.get('sm_count')} SMs | driver {env.get('driver')} | CUDA {env.get('nvcc')} | "
             f"CUTLASS {env.get('cutlass')}",
             "baselines: " + "; ".join(summary["baselines"])]
    for op, g in summary["ops"].items():
        lines.append("")
        lines.append(f"{op}")
        lines.append(f"{'problem':>20}  {'best kernel':<66} {'TFLOP/s':>8} {'%peak':>6} {'cuBLAS':>8} {'ratio':>6}")
        for x in g["rows"]:
            prob = f"{x['m']}x{x['n']}x{x['k']}"
            kern = _kernel_text({"name": x["kernel"], "split_k": x["split_k"]})
            lines.append(f"{prob:>20}  {kern[:66]:<66} {x['tflops'] or 0:8.1f} {x['pct_peak'] or 0:6.1f} "
                         f"{x['baseline_tflops'] or 0:8.1f} {x['ratio'] or 0:6.3f}{' tie' if x['tied'] else ''}")
        if g["geomean"]:
            lines.append(f"{op}: geomean best/baseline {g['geomean']:.3f}x over {g['with_baseline']} problems, "
                         f"worst {g['min']:.3f}x, {g['below_0.97']} below 0.97x"
                         + (f"; square + large LLM {g['geomean_square_and_large_llm']:.3f}x"
                            if g.get("geomean_square_and_large_llm") else ""))
    lines.append("")
    lines.append("goals:")
    for what, got, met in summary["goals"]:
        lines.append(f"  [{'met' if met else 'NOT met'}] {what}: {got}")
    return "\n".join(lines)


def markdown(summary: dict, commands: list[str], times: dict, plots: list[str], notes: str) -> str:
    env = summary["environment"]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    out = [f"# Hopper GEMM performance (issue 6)",
           "",
           f"Written by `benchmarks/profile_sm90a.py` from the outputs of one run on the GPU machine ({date}): "
           f"{env.get('name')}, {env.get('sm_count')} SMs, driver {env.get('driver')}, CUDA {env.get('nvcc')}, "
           f"CUTLASS {env.get('cutlass')}. Do not edit by hand: regenerate with `make perf-doc RUN=<run dir>`.",
           "",
           "Ratio = cuBLAS time / emitted kernel time for the best emitted kernel of the shape (the profiler's "
           "stable winner: fastest median, ties within noise broken by name), both measured in the same process "
           "on the same buffers (rotated past L2), CUDA events, median of repeats. Each kernel was checked against "
           "a reference on that very problem before its time counted. Baselines: " + "; ".join(summary["baselines"]),
           "",
           "Commands (on the GPU machine, project root):",
           "```"] + commands + ["```", ""]
    if times:
        out += ["Step times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()), ""]
    out += ["## Goals", ""]
    for what, got, met in summary["goals"]:
        out.append(f"- {'met' if met else '**NOT met**'}: {what}: {got}")
    for op, g in summary["ops"].items():
        out += ["", f"## {op}", "", "| problem | best kernel | TFLOP/s | % of dense peak | cuBLAS TFLOP/s | ratio |",
                "|---|---|---:|---:|---:|---:|"]
        for x in g["rows"]:
            kern = _kernel_text({"name": x["kernel"], "split_k": x["split_k"]})
            out.append(f"| {x['m']}x{x['n']}x{x['k']} | `{kern}` | {x['tflops'] or 0:.1f} | {x['pct_peak'] or 0:.1f} | "
                       f"{x['baseline_tflops'] or 0:.1f} | {x['ratio'] or 0:.3f}{' (tie)' if x['tied'] else ''} |")
        if g["missing"]:
            out += ["", f"No result for {', '.join(g['missing'])} (no kernel of this op finished it, or no baseline)."]
        if g["geomean"]:
            out += ["", f"Geometric mean {g['geomean']:.3f}x over {g['with_baseline']} problems; worst {g['min']:.3f}x; "
                    f"{g['below_0.97']} below 0.97x."
                    + (f" Square + large-LLM (M >= 2048) shapes: {g['geomean_square_and_large_llm']:.3f}x."
                       if g.get("geomean_square_and_large_llm") else "")]
    out += ["", "The tuning table of this run (best kernel and split-K count per shape, for "
            "`emitter library <gen> --tuning docs/perf/tuning.json`) is in docs/perf/tuning.json; the tables above as "
            "JSON in docs/perf/summary.json."]
    if plots:
        out += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    if notes:
        out += ["", notes.rstrip()]
    return "\n".join(out) + "\n"


def write_report(run: Path, doc: Path | None, notes_file: Path | None) -> None:
    summary = summarize(run / "profile" / "profile.json")
    meta = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    (run / "summary.json").write_text(json.dumps({**summary, "goals": [list(g) for g in summary["goals"]]}, indent=1))
    print("\n" + table_text(summary))
    plots = []
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        plot_dir = doc.parent / "perf"
        plot_dir.mkdir(parents=True, exist_ok=True)
        # the ratio plots (best kernel / baseline per shape); the TFLOP/s plots of every kernel stay in RUN
        src = sorted((run / "profile" / "plots").glob("*_ratio.png")) if (run / "profile" / "plots").is_dir() else []
        if src:
            for p in src:
                shutil.copyfile(p, plot_dir / p.name)
                plots.append(f"perf/{p.name}")
        if (run / "profile" / "tuning.json").is_file():   # the measured tuning table, for `emitter library --tuning`
            shutil.copyfile(run / "profile" / "tuning.json", plot_dir / "tuning.json")
        shutil.copyfile(run / "summary.json", plot_dir / "summary.json")   # the tables as data
        notes = notes_file.read_text() if notes_file and notes_file.is_file() else ""
        if (run / "verify.json").is_file():      # the same build, verified before it was profiled
            v = json.loads((run / "verify.json").read_text())
            s = v.get("summary", {})
            notes = (f"Verify (`emitter verify --quick`, seed {v.get('seed')}, {v.get('device')}): instances "
                     f"{s.get('instances')}, cases {s.get('cases')}.\n\n" + notes)
        text = markdown(summary, meta.get("commands", []), meta.get("times", {}), plots, notes)
        tmp = doc.with_suffix(".md.tmp")
        tmp.write_text(text)
        os.replace(tmp, doc)
        print(f"wrote {doc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/sm90a", help="output directory")
    ap.add_argument("--specs", action="append", default=[], help=f"spec glob to emit (repeatable; default {DEFAULT_SPECS})")
    ap.add_argument("--gen", default=None, help="where to emit and build (default OUT/gen)")
    ap.add_argument("--select", action="append", default=[], help=f"instance selection (repeatable; default {DEFAULT_SELECT})")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="all", help="problem sweep")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 4, help="nvcc processes")
    ap.add_argument("--no-verify", action="store_true", help="skip `emitter verify --quick` before profiling")
    ap.add_argument("--min-duration-ms", type=float, default=20.0, help="timed launches per repeat (ms)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-build", action="store_true", help="reuse the build in --gen")
    ap.add_argument("--stall-timeout", type=float, default=120.0, help="seconds before a hung kernel is killed")
    ap.add_argument("--resume", action="store_true",
                    help="finish a run cut short in --out: keep its measurements (and its verify report), take the rest")
    ap.add_argument("--report-only", metavar="RUN", help="no GPU: write the report from RUN's outputs")
    ap.add_argument("--doc", default=None, help="also write this markdown report (e.g. docs/performance.md)")
    ap.add_argument("--notes", default="docs/performance_notes.md",
                    help="markdown appended to --doc (causes, what was tried: the part a person writes)")
    args = ap.parse_args()

    if args.report_only:
        write_report(Path(args.report_only).resolve(), Path(args.doc).resolve() if args.doc else None,
                     ROOT / args.notes if args.notes else None)
        return 0

    out = Path(args.out).resolve()
    gen = Path(args.gen).resolve() if args.gen else out / "gen"
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "emitter"]
    sel: list[str] = []
    for s in args.select or DEFAULT_SELECT:
        sel += ["--select", s]
    patterns = args.specs or DEFAULT_SPECS
    specs = sorted({f for pat in patterns for f in glob.glob(str(ROOT / pat))})
    if not specs:
        raise SystemExit(f"no spec matches {patterns}")
    rel = [os.path.relpath(s, ROOT) for s in specs]
    times: dict[str, float] = {}
    commands = [f"python3 -m emitter emit {' '.join(rel)} -o gen",
                f"python3 -m emitter build gen -j {args.jobs} {' '.join(shlex.quote(a) for a in sel)}"]
    times["emit"] = step("emit", py + ["emit", *specs, "-o", str(gen), "-q"], out / "emit.log")
    if not args.skip_build:
        # exit 1 = some instance failed to build: reported in the log, the rest is profiled
        times["build"] = step("build", py + ["build", str(gen), "-j", str(args.jobs), "--no-progress", *sel],
                              out / "build.log", ok_codes=(0, 1))
    if not args.no_verify and not (args.resume and (out / "verify.json").is_file()):
        commands.append(f"python3 -m emitter verify gen --quick {' '.join(shlex.quote(a) for a in sel)}")
        times["verify"] = step("verify", py + ["verify", str(gen), "--quick", "-q", "--json", str(out / "verify.json"),
                                               *sel], out / "verify.log", ok_codes=(0, 1))

    select_lines = "".join(f"\n  - {json.dumps(s)}" for s in (args.select or DEFAULT_SELECT))
    config = out / "profile.yaml"
    config.write_text(
        "# written by benchmarks/profile_sm90a.py\n"
        f"manifests: [{json.dumps(str(gen))}]\n"
        f"select:{select_lines}\n"
        + "problems:\n" + "".join(f"  {line}\n" for line in SHAPES[args.shapes])
        + f"timing: {{warmup: 10, warmup_ms: 100, min_duration_ms: {args.min_duration_ms}, max_iterations: 400, "
          f"repeats: {args.repeats}}}\n"
        + "baselines: [cublas]\n"
        + f"output: {{dir: {json.dumps(str(out / 'profile'))}}}\n")
    commands.append(f"python3 -m emitter profile profile.yaml -o profile   # profile.yaml: {SHAPES[args.shapes]}, "
                    f"repeats {args.repeats}, {args.min_duration_ms:g} ms per repeat")
    if args.resume and (out / "run.json").is_file():     # the first sitting's commands and step times
        first = json.loads((out / "run.json").read_text())
        times = {**first.get("times", {}), **{k: v for k, v in times.items() if k not in first.get("times", {})}}
    else:
        (out / "run.json").write_text(json.dumps({"commands": commands, "times": times, "argv": sys.argv[1:]}, indent=1))
    times["profile"] = times.get("profile", 0.0) + step(
        "profile", py + ["profile", str(config), "-o", str(out / "profile"), "--stall-timeout", str(args.stall_timeout)]
        + (["--resume"] if args.resume else []), out / "profile.log" if not args.resume else out / "profile.resume.log")
    (out / "run.json").write_text(json.dumps({"commands": commands, "times": times, "argv": sys.argv[1:]}, indent=1))
    write_report(out, Path(args.doc).resolve() if args.doc else None, ROOT / args.notes if args.notes else None)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
