#!/usr/bin/env python3
"""The sm90a attention anchor set against torch SDPA (cuDNN, flash = FA2, efficient = xFormers/CUTLASS), issue 27.

On the GPU machine (H100 / H200), from the repository root:

    python3 benchmarks/attention_bench.py --out $OUT/attention -j 16 [--doc docs/attention_performance.md]

1. emit the specs (default configs/attention/sm90a_bench.yaml and its alternatives sm90a_bench_sweep.yaml, 32
   instances: each case takes the fastest verified kernel of both) and build them (`emitter build -j N`; -DNDEBUG,
   a kernel whose wgmma ptxas serialized fails its build);
2. verify every built kernel on fresh random inputs against a float64 torch reference (poisoned outputs,
   key tail, seq_q != seq_k, the kernel's mask) -- a kernel that fails is not timed;
3. time the anchor set: f16 and bf16 x head dim 64, 128, 256 x S 1k, 4k, 16k x full and causal, with
   B * S = 16k tokens and H * D = 2048 (Q, K, V of 64 MiB each: past the 50 MiB L2 of an H100 without
   rotating buffers). Every function (each matching kernel, SDPA with the cuDNN, flash and efficient backends)
   gets the same warm-up, then `--reps` timings of a batch of back-to-back calls between two CUDA events
   (at least --min-ms of GPU time a batch), the functions in alternation, median per call; all on the same
   Q/K/V buffers (SDPA reads them through [B, H, S, D] views of the [B, S, H, D] tensors);
4. time each case's best kernel again against the baselines in a fresh alternation (the reported figures; the
   search's own are kept as search_ms) and cross-check it against the flash (or cuDNN) output on the full problem;
5. print the table (case, best kernel, TFLOP/s, cuDNN, FA2, efficient, ratios) with geometric means vs cuDNN
   and vs flash, and write attention.json + attention.md under --out (and --doc: the docs table).

TFLOP/s = 4 * B * H * S^2 * D / t, halved for causal (the issue's convention).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DTYPES = ("f16", "bf16")
HEAD_DIMS = (64, 128, 256)
SEQS = (1024, 4096, 16384)
TOKENS = 16384
HIDDEN = 2048
BASELINES = ("cudnn", "flash", "efficient")
DEFAULT_SPECS = ("sm90a_bench.yaml", "sm90a_bench_sweep.yaml")     # the anchor-set kernels and their alternatives


def log(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log(f"[{what}] rc={p.returncode} in {time.perf_counter() - t0:.1f} s: {' '.join(cmd[1:5])} ...")
    tail = (p.stdout + p.stderr).strip().splitlines()[-12:]
    for line in tail:
        log(f"  {line}")
    return p


def emit_and_build(specs: list[str], kernels_dir: Path, jobs: int) -> dict:
    t0 = time.perf_counter()
    p = run([sys.executable, "-m", "emitter", "emit", *specs, "-o", str(kernels_dir), "-q"], "emit")
    if p.returncode != 0:
        raise SystemExit(f"emit failed (exit {p.returncode})")
    t1 = time.perf_counter()
    run([sys.executable, "-m", "emitter", "build", str(kernels_dir), "-j", str(jobs), "--no-progress"], "build")
    return {"emit_s": round(t1 - t0, 1), "build_s": round(time.perf_counter() - t1, 1)}


def load_kernels(kernels_dir: Path) -> dict:
    from emitter.families.attention.torch_run import AttentionKernel, manifest_configs

    out = {}
    for name, cfg in manifest_configs(kernels_dir).items():
        if cfg.get("varlen"):      # the anchor set has fixed lengths
            continue
        try:
            out[name] = (cfg, AttentionKernel(kernels_dir, name))
        except Exception as e:  # not built (its build failed): reported, not timed
            log(f"  {name}: not loaded: {e}")
    return out


def verify_kernel(torch, cfg: dict, kern, seed: int) -> dict:
    """Fresh random inputs, poisoned outputs, checked against the float64 reference; several shapes."""
    from emitter.families.attention.torch_run import compare, reference

    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[cfg["dtype"]]
    d = cfg["head_dim"]
    tol = {"f16": 5e-3, "bf16": 2e-2}[cfg["dtype"]]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # the last shape has 512 query blocks (> 132 SMs): a persistent kernel's scheduler runs several rounds
    shapes = [(2, 4, 4, 512, 512, 0.0), (1, 4, 2 if cfg["gqa"] else 4, 1000, 760, 0.25),
              (1, 2, 2 if cfg["gqa"] else 2, 264, 1100, 0.0), (4, 16, 8 if cfg["gqa"] else 16, 1024, 1024, 0.0)]
    worst = 0.0
    for b, hq, hkv, sq, sk, scale in shapes:
        if not cfg["key_tail"]:
            sk = (sk + cfg["tile_kv"] - 1) // cfg["tile_kv"] * cfg["tile_kv"]
        q = torch.randn((b, sq, hq, d), generator=gen, device="cuda").to(dt)
        k = torch.randn((b, sk, hkv, d), generator=gen, device="cuda").to(dt)
        v = torch.randn((b, sk, hkv, d), generator=gen, device="cuda").to(dt)
        o = torch.full((b, sq, hq, d), float("nan"), device="cuda", dtype=dt)
        lse = torch.full((b, hq, sq), float("nan"), device="cuda") if cfg["lse"] else None
        kern(q, k, v, o, lse, scale)
        torch.cuda.synchronize()
        want_o, want_lse = reference(q, k, v, mask=cfg["mask"], scale=scale)
        r = compare(o, want_o, tol=tol)
        if not r["passed"]:
            return {"passed": False, "case": [b, hq, hkv, sq, sk, scale], **r}
        if lse is not None:
            rl = compare(lse, want_lse, tol=1e-3)
            if not rl["passed"]:
                return {"passed": False, "case": [b, hq, hkv, sq, sk, scale], "what": "lse", **rl}
        worst = max(worst, r["rel_err"])
    return {"passed": True, "rel_err": worst}


class Timer:
    def __init__(self, torch, reps: int, min_ms: float, warmup: int) -> None:
        self.torch, self.reps, self.min_ms, self.warmup = torch, reps, min_ms, warmup

    def calls_per_batch(self, fn) -> int:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        one = max(start.elapsed_time(end), 1e-3)
        return max(1, min(200, math.ceil(self.min_ms / one)))

    def time(self, fns: dict) -> dict:
        """Median ms per call of each function: equal warm-up, then reps rounds in alternation."""
        torch = self.torch
        for fn in fns.values():
            for _ in range(self.warmup):
                fn()
        torch.cuda.synchronize()
        batch = {k: self.calls_per_batch(fn) for k, fn in fns.items()}
        samples = {k: [] for k in fns}
        for _ in range(self.reps):
            for k, fn in fns.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(batch[k]):
                    fn()
                end.record()
                end.synchronize()
                samples[k].append(start.elapsed_time(end) / batch[k])
        return {k: statistics.median(v) for k, v in samples.items()}


def sdpa_fn(torch, backend: str, q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [B, H, S, D] views, same buffers
    state = {}

    def fn():
        with sdpa_kernel(b):
            state["out"] = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    fn.state = state
    return fn


def case_list(args) -> list[dict]:
    cases = []
    for dt in args.dtypes:
        for d in args.head_dims:
            for s in args.seqs:
                for causal in (False, True):
                    cases.append({"dtype": dt, "head_dim": d, "seq": s, "causal": causal,
                                  "batch": max(1, TOKENS // s), "heads": HIDDEN // d})
    return cases


def label(c: dict) -> str:
    s = f"{c['seq'] // 1024}k" if c["seq"] % 1024 == 0 else str(c["seq"])
    return f"{c['dtype']} d{c['head_dim']} {'causal ' if c['causal'] else ''}s{s}"


def bench_case(torch, timer: Timer, c: dict, kernels: dict, verified: dict) -> dict:
    from emitter.families.attention.torch_run import CannotRun, compare

    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[c["dtype"]]
    b, h, s, d = c["batch"], c["heads"], c["seq"], c["head_dim"]
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(label(c).encode()) & 0xFFFF)
    q = torch.randn((b, s, h, d), generator=gen, device="cuda").to(dt)
    k = torch.randn((b, s, h, d), generator=gen, device="cuda").to(dt)
    v = torch.randn((b, s, h, d), generator=gen, device="cuda").to(dt)
    o = torch.empty_like(q)
    flops = 4 * b * h * s * s * d // (2 if c["causal"] else 1)
    fns, notes = {}, {}
    for name, (cfg, kern) in kernels.items():
        if cfg["dtype"] != c["dtype"] or cfg["head_dim"] != d or (cfg["mask"] != "none") != c["causal"]:
            continue
        if not verified.get(name, {}).get("passed"):
            continue
        try:
            fns[name] = kern.prepare(q, k, v, o, None, 0.0)
        except CannotRun as e:
            notes[name] = str(e)
    ours = list(fns)
    for base in BASELINES:
        fn = sdpa_fn(torch, base, q, k, v, c["causal"])
        try:
            fn()
            torch.cuda.synchronize()
            fns[base] = fn
        except Exception as e:  # this backend does not take this case
            notes[base] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    times = timer.time(fns) if fns else {}
    row = {**c, "label": label(c), "flops": flops, "ms": times, "notes": notes,
           "tflops": {k: flops / (t * 1e-3) / 1e12 for k, t in times.items()}}
    if ours:
        best = min(ours, key=lambda n: times[n])
        row["best"] = best
        # winner's curse: the best of many samples is biased low, so the reported figures are the winner and the
        # baselines timed again in a fresh alternation; the search's own are kept as search_ms
        again = timer.time({best: fns[best], **{b: fns[b] for b in BASELINES if b in fns}})
        row["search_ms"] = times
        row["ms"] = {**times, **again}
        row["tflops"] = {k: flops / (t * 1e-3) / 1e12 for k, t in row["ms"].items()}
        # full-size cross-check of the best kernel against a baseline's output (both low precision)
        o.fill_(float("nan"))
        fns[best]()
        for base in ("flash", "cudnn", "efficient"):
            if base in fns:
                fns[base]()
                torch.cuda.synchronize()
                ref = fns[base].state["out"].transpose(1, 2).double()
                row["crosscheck"] = {"against": base, **compare(o, ref, tol={"f16": 5e-3, "bf16": 2e-2}[c["dtype"]])}
                break
    del q, k, v, o
    return row


def ratio(row: dict, base: str) -> float | None:
    t = row["ms"]
    if "best" not in row or base not in t:
        return None
    return t[base] / t[row["best"]]


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(x, spec=".0f") -> str:
    return "—" if x is None else format(x, spec)


def table(rows: list[dict], gpu: str) -> tuple[str, dict]:
    head = "| case | best kernel | TFLOP/s | cuDNN | FA2 (flash) | efficient | x cuDNN | x FA2 | x efficient |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tf = r["tflops"]
        best = r.get("best")
        lines.append(f"| {r['label']} | {best or '—'} | {fmt(tf.get(best) if best else None)} | "
                     f"{fmt(tf.get('cudnn'))} | {fmt(tf.get('flash'))} | {fmt(tf.get('efficient'))} | "
                     f"{fmt(ratio(r, 'cudnn'), '.2f')} | {fmt(ratio(r, 'flash'), '.2f')} | "
                     f"{fmt(ratio(r, 'efficient'), '.2f')} |")
    summary = {b: geomean([ratio(r, b) for r in rows]) for b in BASELINES}
    summary["min_vs_cudnn"] = min((x for x in (ratio(r, "cudnn") for r in rows) if x), default=None)
    summary["min_vs_flash"] = min((x for x in (ratio(r, "flash") for r in rows) if x), default=None)
    lines.append("")
    lines.append(f"GPU: {gpu}. Geometric mean of the best emitted kernel's speed over: cuDNN "
                 f"{fmt(summary['cudnn'], '.3f')}x (lowest {fmt(summary['min_vs_cudnn'], '.2f')}x), FA2 "
                 f"{fmt(summary['flash'], '.3f')}x (lowest {fmt(summary['min_vs_flash'], '.2f')}x), efficient "
                 f"{fmt(summary['efficient'], '.3f')}x.")
    return "\n".join(lines), summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "attention")
    ap.add_argument("--spec", action="append", default=None,
                    help="attention spec(s) to emit (repeatable; default: " + ", ".join(DEFAULT_SPECS) + ")")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--doc", type=Path, default=None, help="also write the markdown table here (docs)")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--min-ms", type=float, default=5.0, help="GPU time of one timed batch of calls")
    ap.add_argument("--warmup", type=int, default=5, help="calls of each function before timing")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    ap.add_argument("--seqs", nargs="+", type=int, default=list(SEQS))
    ap.add_argument("--no-build", action="store_true", help="reuse <out>/kernels as built")
    args = ap.parse_args()
    specs = args.spec or [str(ROOT / "configs" / "attention" / name) for name in DEFAULT_SPECS]
    args.out.mkdir(parents=True, exist_ok=True)
    kernels_dir = args.out / "kernels"
    t_start = time.perf_counter()
    timings = {} if args.no_build else emit_and_build(specs, kernels_dir, args.jobs)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    torch.empty(1, device="cuda")
    gpu = torch.cuda.get_device_name()
    log(f"GPU {gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    kernels = load_kernels(kernels_dir)
    t0 = time.perf_counter()
    verified = {}
    for i, (name, (cfg, kern)) in enumerate(sorted(kernels.items())):
        try:
            verified[name] = verify_kernel(torch, cfg, kern, seed=1000 + i)
        except Exception as e:
            verified[name] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
        v = verified[name]
        log(f"  verify {name}: {'PASSED' if v['passed'] else 'FAILED'} "
            f"{v.get('rel_err', '')} {'' if v['passed'] else json.dumps(v)[:300]}")
    timings["verify_s"] = round(time.perf_counter() - t0, 1)
    log(f"verify: {sum(v['passed'] for v in verified.values())}/{len(verified)} passed")

    timer = Timer(torch, args.reps, args.min_ms, args.warmup)
    rows = []
    t0 = time.perf_counter()
    for c in case_list(args):
        row = bench_case(torch, timer, c, kernels, verified)
        rows.append(row)
        tf = row["tflops"]
        log(f"  {row['label']:<22} best {row.get('best', '—')}: {fmt(tf.get(row.get('best')))} TFLOP/s, "
            f"cuDNN {fmt(tf.get('cudnn'))}, flash {fmt(tf.get('flash'))}, efficient {fmt(tf.get('efficient'))}"
            f"{'' if row.get('crosscheck', {}).get('passed', True) else '  CROSS-CHECK FAILED ' + json.dumps(row['crosscheck'])}")
    timings["profile_s"] = round(time.perf_counter() - t0, 1)
    timings["total_s"] = round(time.perf_counter() - t_start, 1)
    md, summary = table(rows, gpu)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"# sm90a attention vs torch SDPA (generated by benchmarks/attention_bench.py, {stamp})\n\n"
              f"Forward, B*S = {TOKENS} tokens, H*D = {HIDDEN}, random normal inputs; TFLOP/s = 4*B*H*S^2*D / t, "
              f"halved for causal; Q, K, V and O of 64 MiB each (past the L2); median of {args.reps} CUDA-event timings of back-to-back batches (>= "
              f"{args.min_ms} ms), the functions in alternation after {args.warmup} warm-up calls each, all on the "
              f"same buffers. Ratios are the baseline's time over the best emitted kernel's. Kernels verified "
              f"against a float64 reference first: {sum(v['passed'] for v in verified.values())}/{len(verified)}.\n"
              f"GPU {gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}. "
              f"Specs: {', '.join(os.path.relpath(s, ROOT) for s in specs)}.\n\n")
    doc = header + md + "\n"
    (args.out / "attention.md").write_text(doc)
    (args.out / "attention.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__,
                                                         "cudnn": torch.backends.cudnn.version(),
                                                         "timings": timings, "summary": summary,
                                                         "verify": verified, "rows": rows,
                                                         "specs": specs, "reps": args.reps,
                                                         "min_ms": args.min_ms, "warmup": args.warmup},
                                                        indent=1, default=str))
    if args.doc:
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text(doc)
    log("")
    log(md)
    log(f"timings: {json.dumps(timings)}; wrote {args.out / 'attention.md'} and attention.json")
    return 0 if all(v["passed"] for v in verified.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
