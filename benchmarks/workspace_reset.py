"""What the per-launch workspace memset costs the split-K / stream-K kernels, and that the profiler times it (issue 26).

    python3 benchmarks/workspace_reset.py --gen /tmp/emitter-wsr --kernel '*streamk*' \\
        --problem 256x512x8192 --problem 16x4096x4096 --split-k 1,2,4 --profile

The exported library runs the instance's host shim initialize() on every call, and for these kernels it zeroes the
tile locks there, a memset on the stream before the launch (templates/gemm/sm90a/entry.cu.j2). The profiler times
that by default (timing.workspace_reset: library, emitter/kit/workspace.py); `settled` times the kernel alone
(emitter's stream-K scheduler leaves the locks zeroed: templates/common/sm90_stream_k.cu.j2).

For each (kernel, problem, split count): the kernel launched as the profiler launches it in each mode (KernelLaunch
workspace_reset="library" / "settled") and cuBLAS, timed launch by launch in alternation on the same rotated inputs
(EventTimer.interleave, --rounds rounds; each figure the median of its launches). Both kernel launches are checked
against the reference first, the settled one again after its timed launches. One row each: "memset us" is
library - settled, what a library call pays that the kernel alone does not.

With --profile, `emitter profile` itself (runner.run, in this process) is run on the same kernels and problems once
per mode, and its recorded medians and workspace_reset fields are printed: the library-mode record says
"memset before each launch (as the library's initialize())" with its reset bytes, the settled one "none: ...".
Exit status 0 when every check passed and, with --profile, every record carries the mode it was run with.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _kernel_rows(args, entries, gen, options) -> list[dict]:
    from emitter.families.gemm import workload as wl
    from emitter.families.gemm.baselines import cublas
    from emitter.families.gemm.profile_check import check, poison_d
    from emitter.profile.config import parse_config_text
    from emitter.families.gemm.profile import Problem
    from emitter.families.gemm.profile import Op
    from emitter.profile.worker import GpuEngine

    cfg = parse_config_text("manifests: [.]\nproblems: [{m: 128, n: 128, k: 128}]\n"
                            "timing: {warmup: 10, warmup_ms: 25, min_duration_ms: 10, repeats: 1}\n", "ab.yaml")
    eng = GpuEngine(cfg, 0)
    rows = []
    print(f"{'kernel':64s} {'problem':>14s} {'split':>5s} {'library us':>10s} {'settled us':>10s} {'memset us':>9s} "
          f"{'cuBLAS us':>9s} {'reset B':>8s} {'settled reset':>13s}")
    for e in entries:
        kernel = eng.load(gen, e)
        op = Op.from_config(e["config"])
        splits = [int(s) for s in args.split_k.split(",")] if "splitk" in e["name"] else [1]
        for text in args.problem:
            m_, n_, k_ = (int(v) for v in text.split("x"))
            data = eng.prepare(op, Problem(m_, n_, k_))
            try:
                for split in splits:
                    launches = {}
                    try:
                        for mode in ("library", "settled"):
                            launches[mode] = wl.KernelLaunch(kernel, data, eng.stream, split_k=split, options=options,
                                                             workspace_reset=mode)
                        lib, alone = launches["library"], launches["settled"]
                        ok = []
                        for launch in (lib, alone):
                            poison_d(data, 0)
                            launch(0)
                            eng.stream.synchronize()
                            ok.append(check(data, kernel.config, eng.use_torch, split)["passed"])
                        base = cublas(data, eng.stream)
                        med = [[], [], []]
                        for _ in range(args.rounds):
                            stats = eng.timer.interleave([lib, alone, base.launch], len(data.sets))
                            for i, s in enumerate(stats):
                                med[i].append(s.median_ms * 1e3)
                        poison_d(data, 0)
                        alone(0)
                        eng.stream.synchronize()
                        ok.append(check(data, kernel.config, eng.use_torch, split)["passed"])
                        a, b, c = (statistics.median(x) for x in med)
                        reset_bytes = max((r[1] for r in lib.resets if r), default=0)
                        settled = "none" if not any(alone.resets) else "memset"
                        row = {"kernel": e["name"], "problem": text, "split_k": split, "options": args.options,
                               "library_us": a, "settled_us": b, "memset_us": a - b, "cublas_us": c,
                               "ratio_library": c / a, "ratio_settled": c / b, "reset_bytes": reset_bytes,
                               "settled_reset": settled, "checks_passed": all(ok),
                               "workspace_bytes": lib.workspace_bytes,
                               "library_info": lib.info.get("workspace_reset"),
                               "settled_info": alone.info.get("workspace_reset")}
                        rows.append(row)
                        print(f"{e['name'][-64:]:64s} {text:>14s} {split:5d} {a:10.2f} {b:10.2f} {a - b:9.2f} "
                              f"{c:9.2f} {reset_bytes:8d} {settled:>13s}" + ("" if all(ok) else "  CHECK FAILED"))
                    finally:
                        for launch in launches.values():
                            launch.free()
            finally:
                data.free()
    return rows


def _profile_rows(args, entries, gen) -> list[dict]:
    """`emitter profile` (runner.run, in this process) on the kernels and problems, once per workspace_reset mode."""
    from emitter.profile.config import parse_config_text
    from emitter.profile.runner import plan, run

    select = "".join(f"\n  - {json.dumps(e['name'])}" for e in entries)
    probs = "".join(f"\n  - {{m: {m}, n: {n}, k: {k}}}" for m, n, k in (p.split("x") for p in args.problem))
    got: dict[tuple, dict] = {}
    for mode in ("library", "settled"):
        cfg = parse_config_text(f"manifests: [{json.dumps(str(gen.resolve()))}]\nselect:{select}\nproblems:{probs}\n"
                                f"timing: {{warmup: 10, iterations: 200, repeats: 3, workspace_reset: {mode}}}\n"
                                "baselines: []\n", f"wsr_{mode}.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            outcome = run(cfg, plan(cfg), Path(tmp), [0], backend="pycuda", isolate=False)
        for m in outcome.measurements:
            if m.kind == "kernel" and m.stats is not None:
                got.setdefault((m.name, m.problem.key, m.split_k), {})[mode] = m
    rows = []
    print(f"\nemitter profile, once per timing.workspace_reset:\n{'kernel':64s} {'problem':>14s} {'split':>5s} "
          f"{'library us':>10s} {'settled us':>10s} {'diff us':>8s} {'reset B':>8s}  recorded (library | settled)")
    for (name, prob, split), by in sorted(got.items()):
        lib, alone = by.get("library"), by.get("settled")
        if lib is None or alone is None:
            continue
        a, b = lib.stats.median_ms * 1e3, alone.stats.median_ms * 1e3
        rec = (lib.extra.get("workspace_reset_mode"), alone.extra.get("workspace_reset_mode"))
        info = (lib.extra["launch"].get("workspace_reset", "-"), alone.extra["launch"].get("workspace_reset", "-"))
        rows.append({"kernel": name, "problem": prob, "split_k": split, "library_us": a, "settled_us": b,
                     "reset_bytes": lib.extra.get("workspace_reset_bytes", 0), "recorded": rec, "info": info,
                     "records_ok": rec == ("library", "settled")})
        print(f"{name[-64:]:64s} {prob:>14s} {split:5d} {a:10.2f} {b:10.2f} {a - b:8.2f} "
              f"{lib.extra.get('workspace_reset_bytes', 0):8d}  {rec[0]}: {info[0]} | {rec[1]}: {info[1]}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gen", required=True, help="an emitted and built tree (manifest.json)")
    ap.add_argument("--kernel", action="append", required=True, help="name glob (repeatable)")
    ap.add_argument("--problem", action="append", required=True, help="MxNxK (repeatable)")
    ap.add_argument("--split-k", default="1", help="split counts for split-K kernels, e.g. 1,2,4")
    ap.add_argument("--options", default="", help="run-time scheduler options for every launch, e.g. "
                    "'reduction=nondeterministic' (emitter/families/gemm/options.py)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="also run `emitter profile` once per workspace_reset mode")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()

    from emitter.manifest import load
    from emitter.kit.scheduler import SchedulerOptions

    options = SchedulerOptions.parse(args.options).encode() if args.options else 0
    gen = Path(args.gen)
    entries = [e for e in load(gen)["instances"] if any(fnmatch.fnmatch(e["name"], g) for g in args.kernel)]
    if not entries:
        raise SystemExit(f"no instance in {gen} matches {args.kernel}")
    rows = _kernel_rows(args, entries, gen, options)
    prof = _profile_rows(args, entries, gen) if args.profile else []
    if args.json:
        from emitter.profile.device import gpu_env

        Path(args.json).write_text(json.dumps({"gpu": gpu_env(0), "rows": rows, "profile": prof}, indent=1))
    ok = bool(rows) and all(r["checks_passed"] for r in rows)
    if args.profile:
        ok = ok and bool(prof) and all(r["records_ok"] for r in prof)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
