#!/usr/bin/env python3
"""fp8 accumulation accuracy on the GPU machine: how much a longer promotion interval costs, against cuBLASLt.

    python3 benchmarks/fp8_accuracy.py --out $OUT/fp8acc [-j 16] [--mn 1024] [--k 1024,4096,16384]

Hopper's fp8 wgmma adds its products in the tensor core with a narrower adder than f32 (about 14 kept bits);
CUTLASS's full-accumulation mainloop promotes those partial sums into f32 registers every
`mma_promotion_interval` k-steps (4 by default: one 128-deep k-block), and fast accumulation never does. A
longer interval is faster (docs/performance_notes.md) and less exact. With a bf16 output, the output's own
rounding (2^-9) hides the difference; this script writes f32 instead, so the accumulation is what is measured.

It emits and builds three instances of its own (e4m3 x e4m3 -> f32, TN, 128x128x128 cluster 1x2: cooperative
full accumulation, the same with emitter's overlapped promotion, ping-pong fast accumulation), runs the
full-accumulation one at promotion intervals 4 (CUTLASS's), 8, 12 and 16 through the run-time option
(emitter.kit.scheduler), the overlapped one (it must match interval 4) and the fast one as they are, and
cuBLASLt (torch._scaled_mm, f32 output, use_fast_accum False / True) on the same inputs; the reference is the
float64 product of the decoded fp8 inputs. Two input kinds: standard normal (sums cancel) and uniform [0, 1)
(all positive: the partial sums grow with K, which is where a short adder drops most). Prints one table of
relative Frobenius errors ||D - ref|| / ||ref|| and the largest elementwise error relative to max |ref|;
writes OUT/fp8_accuracy.json. The rule it feeds (docs/performance_notes.md): an interval joins the tuned set
only if its error stays at or below cuBLASLt's full-accumulation error on every row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = """\
# written by benchmarks/fp8_accuracy.py: f32 output, so the accumulation's error is not hidden by bf16 rounding
defaults:
  arch: sm90a
  dtype: {a: e4m3, b: e4m3, c: f32, d: f32, accumulator: f32}
  layout: tn
  tile: 128x128x128
  cluster: 1x2x1
kernels:
  - schedule: {kernel: cooperative}
  - schedule: {kernel: cooperative, promotion: overlap}
  - schedule: {kernel: pingpong, fp8_fast_accum: true}
"""
INTERVALS = (4, 8, 12, 16)


def sh(argv: list[str], log: Path) -> None:
    t = time.time()
    with log.open("w") as f:
        rc = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"[{time.time() - t:6.1f} s] {' '.join(argv)} -> rc {rc}", flush=True)
    if rc:
        print(log.read_text()[-3000:])
        raise SystemExit(f"step failed: {argv[2] if len(argv) > 2 else argv}")


def errors(d: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = d.astype(np.float64)
    if not np.all(np.isfinite(d)):
        return float("nan"), float("nan")
    diff = d - ref
    return float(np.linalg.norm(diff) / np.linalg.norm(ref)), float(np.abs(diff).max() / np.abs(ref).max())


def cublaslt_errors(torch, a_bits: np.ndarray, b_bits: np.ndarray, ref: np.ndarray) -> dict:
    """cuBLASLt (torch._scaled_mm, unit scales, f32 output) on the same fp8 inputs, both accumulation modes."""
    ta = torch.from_numpy(a_bits.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b_bits.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    out = {}
    for fast in (False, True):
        d = torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        out["cublaslt_fast" if fast else "cublaslt"] = errors(d.cpu().numpy(), ref)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("results/fp8_accuracy"))
    ap.add_argument("-j", "--jobs", type=int, default=4)
    ap.add_argument("--mn", type=int, default=1024, help="M = N")
    ap.add_argument("--k", default="1024,4096,16384", help="K values, comma-separated")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--backend", choices=["pycuda", "fake"], default="pycuda",
                    help="fake: no GPU and no build (numpy's exact product; a smoke test of this script)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.yaml").write_text(SPEC)
    py = sys.executable
    sh([py, "-m", "emitter", "emit", str(out / "spec.yaml"), "-o", str(out / "gen")], out / "emit.log")
    if args.backend == "pycuda":
        sh([py, "-m", "emitter", "build", str(out / "gen"), "-j", str(args.jobs)], out / "build.log")
        import torch
    else:
        torch = None

    from emitter.dtypes import DType
    from emitter.families.gemm.inputs import gemm_buffers
    from emitter.families.gemm.problem import GemmProblem
    from emitter.kit.hostdata import decode, encode
    from emitter.kit.scheduler import SchedulerOptions
    from emitter.runtime import create_backend

    backend = create_backend(args.backend)
    manifest = json.loads((out / "gen" / "manifest.json").read_text())
    def role(cfg: dict) -> str:
        return "fast" if cfg.get("fp8_fast_accum") else "overlap" if cfg.get("promotion") == "overlap" else "full"

    kernels = {role(e["config"]): backend.load(out / "gen", e) for e in manifest["instances"]}
    rng = np.random.default_rng(args.seed)
    m = n = args.mn
    rows = []
    for dist in ("normal", "uniform"):
        for k in (int(x) for x in args.k.split(",")):
            draw = (lambda s: rng.standard_normal(s)) if dist == "normal" else (lambda s: rng.random(s))
            a_bits = encode(draw((m, k)), DType.e4m3)          # A row-major m x k
            b_bits = encode(draw((n, k)), DType.e4m3)          # B column-major k x n = row-major n x k
            a, b = decode(a_bits, DType.e4m3), decode(b_bits, DType.e4m3)
            ref = a @ b.T
            row = {"dist": dist, "m": m, "n": n, "k": k}

            outputs = {}

            def ours(kernel, options: int, key: str = "") -> tuple[float, float]:
                buf = gemm_buffers(A=a_bits, B=b_bits, C=np.zeros((m, n), np.float32),
                                   D=np.full((m, n), np.nan, np.float32))
                res = backend.run(kernel, GemmProblem(m, n, k, options=options), buf)
                outputs[key] = res.D.reshape(m, n)
                return errors(outputs[key], ref)

            for p in INTERVALS:
                opt = SchedulerOptions(promotion_interval=p).encode() if p != 4 else 0
                row[f"promo{p}"] = ours(kernels["full"], opt, f"promo{p}")
            row["overlap"] = ours(kernels["overlap"], 0, "overlap")
            # the overlapped promotion adds the same partial sums in the same order: the same bits
            row["overlap_equals_promo4"] = bool(np.array_equal(outputs["overlap"], outputs["promo4"]))
            row["fastacc"] = ours(kernels["fast"], 0)
            if torch is None:
                row["cublaslt"] = row["cublaslt_fast"] = (float("nan"), float("nan"))
            else:
                row.update(cublaslt_errors(torch, a_bits, b_bits, ref))
            rows.append(row)
            print(f"{dist:8s} K={k:6d} " + "  ".join(f"{key} {v[0]:.2e}" for key, v in row.items()
                                                      if isinstance(v, tuple)), flush=True)
    cols = [f"promo{p}" for p in INTERVALS] + ["overlap", "fastacc", "cublaslt", "cublaslt_fast"]
    env = {"gpu": backend.device_name(), "torch": torch.__version__ if torch else None, "m": m, "n": n, "seed": args.seed}
    (out / "fp8_accuracy.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(f"\nfp8 e4m3 -> f32, {m}x{n}, {env['gpu']}: relative Frobenius error (max elementwise / max |ref|)")
    print("| inputs | K | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for r in rows:
        print(f"| {r['dist']} | {r['k']} | " + " | ".join(f"{r[c][0]:.2e} ({r[c][1]:.1e})" for c in cols) + " |")
    print("overlapped promotion bit-identical to CUTLASS's interval 4 on every row: "
          + str(all(r["overlap_equals_promo4"] for r in rows)))
    worst = {c: max(r[c][0] / r["cublaslt"][0] for r in rows) for c in cols if torch is not None}
    print("\nworst ratio to cuBLASLt full accumulation: " + ", ".join(f"{c} {v:.2f}" for c, v in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
