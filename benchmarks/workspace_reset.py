"""What the per-launch workspace memset costs the split-K / stream-K kernels (issue 6), on the GPU machine.

    python3 benchmarks/workspace_reset.py --gen /tmp/emitter-bench/sm90a/gen \\
        --kernel '*tnt_128x16x128*splitkserial' --problem 16x4096x4096 --split-k 1,2,4

For each (kernel, problem, split count): the kernel launched as the profiler launched it before 2026-11-25 (the bytes
initialize() zeroed re-zeroed by a memset on the stream before every launch, as CUTLASS's device adapter does in
run()), the same kernel launched alone (its stream-K scheduler leaves those bytes zeroed:
templates/gemm/sm90a/stream_k.cu.j2), and cuBLAS, timed launch by launch in alternation on the same rotated inputs
(EventTimer.interleave, 5 rounds; each figure the median of its launches). Both kernel launches are checked against
the reference first, the one without memset again after its timed launches. Prints one row each.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gen", required=True, help="an emitted and built tree (manifest.json)")
    ap.add_argument("--kernel", action="append", required=True, help="name glob (repeatable)")
    ap.add_argument("--problem", action="append", required=True, help="MxNxK (repeatable)")
    ap.add_argument("--split-k", default="1", help="split counts for split-K kernels, e.g. 1,2,4")
    ap.add_argument("--options", default="", help="run-time scheduler options for every launch, e.g. "
                    "'reduction=nondeterministic' (emitter/runtime/options.py)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()

    from emitter.manifest import load
    from emitter.families.gemm import workload as wl
    from emitter.families.gemm.baselines import cublas
    from emitter.families.gemm.profile_check import check, poison_d
    from emitter.profile.config import Problem, parse_config_text
    from emitter.profile.records import Op
    from emitter.profile.worker import GpuEngine
    from emitter.runtime.options import SchedulerOptions

    options = SchedulerOptions.parse(args.options).encode() if args.options else 0

    gen = Path(args.gen)
    entries = [e for e in load(gen)["instances"] if any(fnmatch.fnmatch(e["name"], g) for g in args.kernel)]
    if not entries:
        raise SystemExit(f"no instance in {gen} matches {args.kernel}")
    cfg = parse_config_text("manifests: [.]\nproblems: [{m: 128, n: 128, k: 128}]\n"
                            "timing: {warmup: 10, warmup_ms: 25, min_duration_ms: 10, repeats: 1}\n", "ab.yaml")
    eng = GpuEngine(cfg, 0)
    rows = []
    print(f"{'kernel':72s} {'problem':>14s} {'split':>5s} {'memset us':>10s} {'none us':>9s} {'cuBLAS us':>9s} "
          f"{'gain':>6s} {'ratio before':>12s} {'ratio now':>9s} {'reset':>6s}")
    for e in entries:
        kernel = eng.load(gen, e)
        op = Op.from_config(e["config"])
        splits = [int(s) for s in args.split_k.split(",")] if "splitk" in e["name"] else [1]
        for text in args.problem:
            m_, n_, k_ = (int(v) for v in text.split("x"))
            data = eng.prepare(op, Problem(m_, n_, k_))
            try:
                for split in splits:
                    alone = wl.KernelLaunch(kernel, data, eng.stream, split_k=split, options=options)
                    memset = None
                    try:
                        # the launch as it was: memset before each one
                        memset = wl.KernelLaunch(kernel, data, eng.stream, split_k=split, options=options,
                                                 settle=False)
                        ok = []
                        for launch in (memset, alone):
                            poison_d(data, 0)
                            launch(0)
                            eng.stream.synchronize()
                            ok.append(check(data, kernel.config, eng.use_torch, split)["passed"])
                        base = cublas(data, eng.stream)
                        med = [[], [], []]
                        for _ in range(args.rounds):
                            stats = eng.timer.interleave([memset, alone, base.launch], len(data.sets))
                            for i, s in enumerate(stats):
                                med[i].append(s.median_ms * 1e3)
                        poison_d(data, 0)
                        alone(0)
                        eng.stream.synchronize()
                        ok.append(check(data, kernel.config, eng.use_torch, split)["passed"])
                        a, b, c = (statistics.median(x) for x in med)
                        reset = "none" if not any(alone.resets) else "memset"
                        row = {"kernel": e["name"], "problem": text, "split_k": split, "options": args.options,
                               "memset_us": a, "none_us": b,
                               "cublas_us": c, "gain": a / b, "ratio_before": c / a, "ratio_now": c / b,
                               "reset": reset, "checks_passed": all(ok), "workspace_bytes": alone.workspace_bytes}
                        rows.append(row)
                        print(f"{e['name'][-72:]:72s} {text:>14s} {split:5d} {a:10.2f} {b:9.2f} {c:9.2f} {a / b:6.3f} "
                              f"{c / a:12.3f} {c / b:9.3f} {reset:>6s}" + ("" if all(ok) else "  CHECK FAILED"))
                    finally:
                        alone.free()
                        if memset is not None:
                            memset.free()
            finally:
                data.free()
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": eng.env(), "rows": rows}, indent=1))
    return 0 if rows and all(r["checks_passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
