#!/usr/bin/env python3
"""Nsight Compute, side by side: cuBLAS's kernel and emitted kernels on one GEMM problem (on the GPU machine).

    python3 benchmarks/ncu_compare.py --run /tmp/emitter-bench/sm90a --problem 512x4096x4096 \\
        --kernel '*128x128x64_c1x2x1*pingpong*swz4*' --kernel '*128x256x64_c2x1x1*' [--op bf16-tn] [--out DIR]

For each side it runs one process under `ncu` that launches the GEMM many times and profiles one launch past
the warm-up, with the sections that say where the time goes (speed of light, memory workload, launch
statistics, occupancy, warp states). The clocks are left alone (`--clock-control none`: the device's
METHOD.md). cuBLAS runs through torch exactly as the profiler's baseline calls it (emitter/families/gemm/baselines.py:
`A @ B` on the op's layouts; fp8 through `torch._scaled_mm`); the emitted kernels run through `emitter profile
--quick` on the run's own build (RUN/profile.yaml, written by benchmarks/profile_sm90a.py), so ncu sees the
launch the profiler timed. Writes DIR/ncu_<side>.csv (ncu's details page) and DIR/ncu_compare.{md,json}, and
prints the table. Issue 6 asks what ncu shows where a goal is missed: this is the command that answers it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SECTIONS = ["SpeedOfLight", "MemoryWorkloadAnalysis", "LaunchStats", "Occupancy", "WarpStateStats"]
# (label, section, metric name as ncu's details page spells it); shown in this order when present
SHOWN = [
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("SM clock", "GPU Speed Of Light Throughput", "SM Frequency"),
    ("compute (SM) %", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("memory %", "GPU Speed Of Light Throughput", "Memory Throughput"),
    ("DRAM %", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("L2 %", "GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    ("L1/TEX %", "GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"),
    ("memory bandwidth", "Memory Workload Analysis", "Memory Throughput"),
    ("L2 hit rate", "Memory Workload Analysis", "L2 Hit Rate"),
    ("grid", "Launch Statistics", "Grid Size"),
    ("cluster", "Launch Statistics", "Cluster Size"),
    ("block", "Launch Statistics", "Block Size"),
    ("registers / thread", "Launch Statistics", "Registers Per Thread"),
    ("dynamic smem / block", "Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("waves / SM", "Launch Statistics", "Waves Per SM"),
    ("achieved occupancy", "Occupancy", "Achieved Occupancy"),
    ("cycles between issues", "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
]

OPS = {  # --op: torch dtype name, A row-major?, B column-major?, fp8 fast accumulation
    "bf16-tn": ("bfloat16", True, True, False), "bf16-nn": ("bfloat16", False, True, False),
    "f16-tn": ("float16", True, True, False),
    "e4m3-tn": ("float8_e4m3fn", True, True, False), "e4m3-tn-fast": ("float8_e4m3fn", True, True, True),
}

CUBLAS_SCRIPT = r"""
import sys, torch
m, n, k = map(int, sys.argv[1].split("x"))
t, a_row, b_col, fast, launches = getattr(torch, sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1", sys.argv[5] == "1", int(sys.argv[6])
A = torch.randn(m, k, device="cuda").to(t) if a_row else torch.randn(k, m, device="cuda").to(t).t()
B = torch.randn(n, k, device="cuda").to(t).t() if b_col else torch.randn(k, n, device="cuda").to(t)
if t is torch.float8_e4m3fn:
    one = torch.ones((), device="cuda")
    run = lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)
else:
    run = lambda: A @ B
for _ in range(launches):
    run()
torch.cuda.synchronize()
"""


def parse_details(text: str) -> list[dict]:
    """ncu --csv --page details: one row per (kernel launch, section, metric). Returns one dict per profiled
    launch: {"kernel": name, "metrics": {(section, metric): (value, unit)}}."""
    start = text.find('"ID"')
    if start < 0:
        return []
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        lid = row.get("ID")
        if lid is None or row.get("Metric Name") is None:
            continue
        entry = launches.setdefault(lid, {"kernel": row.get("Kernel Name", ""), "metrics": {}})
        entry["metrics"][(row.get("Section Name", ""), row["Metric Name"])] = (row.get("Metric Value", ""),
                                                                               row.get("Metric Unit", ""))
    return list(launches.values())


def shown(launch: dict) -> dict[str, str]:
    out = {}
    for label, section, metric in SHOWN:
        v = launch["metrics"].get((section, metric))
        if v is not None:
            out[label] = f"{v[0]} {v[1]}".strip()
    return out


def table(sides: list[tuple[str, dict]]) -> str:
    labels = [label for label, _s, _m in SHOWN if any(label in vals for _n, vals in sides)]
    head = "| metric | " + " | ".join(name for name, _ in sides) + " |"
    lines = [head, "|---|" + "---:|" * len(sides)]
    lines += [f"| {label} | " + " | ".join(vals.get(label, "-") for _n, vals in sides) + " |" for label in labels]
    return "\n".join(lines)


def best_kernels(tuning: dict, op: str, problem: str) -> list[tuple[str, int]]:
    """The run's chosen kernel for `problem` under `op` (benchmarks' --op spelling), from its tuning table
    (RUN/profile/tuning.json): [(kernel name, run-time scheduler options)], empty when the run has no entry."""
    dtype = op.split("-")[0]
    layout = op.split("-")[1]
    fast = op.endswith("-fast")
    m, n, k = (int(x) for x in problem.split("x"))
    out = []
    for e in tuning.get("entries", []):
        o, p = e.get("op", {}), e.get("problem", {})
        if (o.get("a") == dtype and str(o.get("layout", "")).startswith(layout) and bool(o.get("fast_accum")) == fast
                and (p.get("m"), p.get("n"), p.get("k"), p.get("batch", 1)) == (m, n, k, 1)):
            out.append((e["kernel"], int(e.get("options") or 0)))
    return out


def options_text(options: int) -> str:
    """`emitter profile --options` text for an options encoding ('' = the compiled-in choices), so that the
    profiled launch is the one the tuning table chose."""
    from emitter.kit.scheduler import SchedulerOptions

    return SchedulerOptions.decode(options).text()


def _ncu() -> str:
    found = shutil.which("ncu") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/ncu"))), None)
    if not found:
        raise SystemExit("ncu (Nsight Compute) is not on this machine")
    return found


def run_ncu(ncu: str, kernel_regex: str, skip: int, argv: list[str], csv_path: Path, env: dict) -> list[dict]:
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "-k", f"regex:{kernel_regex}",
           "--launch-skip", str(skip), "--launch-count", "1", "--csv", "--page", "details"]
    for s in SECTIONS:
        cmd += ["--section", s]
    r = subprocess.run(cmd + argv, capture_output=True, text=True, env=env, timeout=600)
    csv_path.write_text(r.stdout + ("\n# stderr\n" + r.stderr if r.stderr else ""))
    launches = parse_details(r.stdout)
    if not launches:
        print(f"ncu found no matching launch ({' '.join(cmd[:4])} ... exit {r.returncode}); see {csv_path}",
              file=sys.stderr)
    return launches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a benchmarks/profile_sm90a.py run directory")
    ap.add_argument("--problem", required=True, help="MxNxK")
    ap.add_argument("--kernel", action="append", default=[],
                    help="emitted kernel selection matching one built kernel (repeatable; default: the run's "
                         "chosen kernel for the problem, from RUN/profile/tuning.json, with its scheduler options)")
    ap.add_argument("--op", choices=sorted(OPS), default="bf16-tn")
    ap.add_argument("--out", type=Path, help="output directory (default RUN/ncu/<problem>)")
    ap.add_argument("--skip", type=int, default=20, help="launches before the profiled one")
    args = ap.parse_args()
    if not re.fullmatch(r"\d+x\d+x\d+", args.problem):
        raise SystemExit(f"--problem {args.problem!r}: write MxNxK, e.g. 512x4096x4096")
    out = args.out or args.run / "ncu" / args.problem
    out.mkdir(parents=True, exist_ok=True)
    ncu = _ncu()
    env = dict(os.environ)
    dtype, a_row, b_col, fast = OPS[args.op]
    sides: list[tuple[str, dict]] = []
    record: dict = {"problem": args.problem, "op": args.op, "sides": []}

    script = out / "cublas_gemm.py"
    script.write_text(CUBLAS_SCRIPT)
    launches = run_ncu(ncu, "nvjet|gemm|xmma|cutlass", args.skip,
                       [sys.executable, str(script), args.problem, dtype, str(int(a_row)), str(int(b_col)),
                        str(int(fast)), str(args.skip + 5)], out / "ncu_cublas.csv", env)
    if launches:
        sides.append(("cuBLAS", shown(launches[-1])))
        record["sides"].append({"side": "cuBLAS", "kernel": launches[-1]["kernel"], "metrics": sides[-1][1]})
    a = {"bf16": "bf16", "f16": "f16", "e4m3": "e4m3"}[args.op.split("-")[0]]
    layout = args.op.split("-")[1]
    chosen = [(sel, 0) for sel in args.kernel]
    if not chosen:
        tuning_path = args.run / "profile" / "tuning.json"
        tuning = json.loads(tuning_path.read_text()) if tuning_path.is_file() else {}
        chosen = best_kernels(tuning, args.op, args.problem)
        if not chosen:
            print(f"no --kernel given and {tuning_path} has no entry for {args.problem} ({args.op}): "
                  "cuBLAS only", file=sys.stderr)
    for i, (sel, options) in enumerate(chosen):
        launches = run_ncu(ncu, "emitter_gemm", args.skip,
                           [sys.executable, "-m", "emitter", "profile", str(args.run / "profile.yaml"), "--select",
                            f"{sel} a={a} layout={layout}", "--problem", args.problem, "--quick", "--no-baseline",
                            "--options", options_text(options), "--no-plots", "-o", str(out / f"profile_{i}")], out / f"ncu_kernel{i}.csv", env)
        if launches:
            name = launches[-1]["kernel"]
            short = re.sub(r"^emitter_gemm_sm90a_|_kernel.*$", "", name)[:48]
            if options:
                from emitter.kit.scheduler import SchedulerOptions

                short += "@" + SchedulerOptions.decode(options).label().replace(" ", "_")
            sides.append((f"`{short}`", shown(launches[-1])))
            record["sides"].append({"side": sel, "kernel": name, "metrics": sides[-1][1]})
    text = table(sides) if sides else "(no launch was profiled)"
    (out / "ncu_compare.md").write_text(f"ncu on {args.problem} ({args.op})\n\n{text}\n")
    (out / "ncu_compare.json").write_text(json.dumps(record, indent=1))
    print(text)
    return 0 if sides else 1


if __name__ == "__main__":
    raise SystemExit(main())
