"""Runs GEMMs through an exported library's Python loader and compares them with torch (needs a GPU).

    PYTHONPATH=<prefix>/lib/mykernels/python python examples/library_consumer/python_check.py [--module mykernels]
        [--json results.json]

For every operation the library computes on this GPU with dtypes torch has (f16, bf16, f32), checks
dispatched GEMMs on several shapes (tile multiples and not), with beta = 0 and beta != 0 (C given), a
column-major output (the library runs D^T = B^T A^T), every kernel forced by name, and a problem no
kernel can implement (Error with status "not supported"); times the largest shape against torch.matmul
(cuBLAS) with CUDA events. With PyCUDA installed, also runs an f16 GEMM on PyCUDA GPUArrays
(__cuda_array_interface__). Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import torch

TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
ACT = {"identity": lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
       "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid}


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    if torch.isnan(got).any():
        return float("inf")
    return float(torch.linalg.norm(got - ref) / max(float(torch.linalg.norm(ref)), 1e-30))


def operand(rows: int, cols: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """Random small multiples of 1/4 (exact in every dtype), stored row- or column-major."""
    t = (torch.randint(-4, 5, (rows, cols) if layout == "row" else (cols, rows), device="cuda") / 4).to(dtype)
    return t if layout == "row" else t.t()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default="mykernels")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lib = importlib.import_module(args.module)
    torch.manual_seed(0)
    cc = torch.cuda.get_device_capability()
    cc = cc[0] * 10 + cc[1]
    print(lib.version(), "|", torch.cuda.get_device_name(), f"sm_{cc}")
    results, failures = [], 0

    def record(kind: str, op: dict, shape: tuple, ok: bool, **extra) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        row = {"check": kind, "op": op, "shape": list(shape), "ok": ok, **extra}
        results.append(row)
        tail = " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
        print(f"{'PASS' if ok else 'FAIL'} {kind:9s} {op['a']}/{op['la']}{op['lb']}{op['lc']}/{op['act']} "
              f"{'x'.join(map(str, shape))} {tail}")

    kernels = [k for k in lib.kernels() if k["available"] and (cc == k["arch"] if k["arch_specific"] else cc >= k["arch"])]
    names = {v: k for k, v in lib.ACTIVATIONS.items()}
    ops = []
    for k in kernels:
        op = {"a": k["a_type"], "d": k["d_type"], "la": "row" if k["a_layout"] == 1 else "col",
              "lb": "row" if k["b_layout"] == 1 else "col", "lc": "row" if k["c_layout"] == 1 else "col",
              "act": names[k["activation"]]}
        if (op["a"] in TORCH and op["d"] in TORCH and k["b_type"] == op["a"] and k["c_type"] == op["d"]
                and op["act"] in ACT and not k["bias_kind"] and not k["batched"] and op not in ops):
            ops.append(op)

    def run(op: dict, m: int, n: int, kk: int, beta: float, force=None, timing=False):
        a = operand(m, kk, TORCH[op["a"]], op["la"])
        b = operand(kk, n, TORCH[op["a"]], op["lb"])
        lc = op["lc"]
        out = torch.full((m, n) if lc == "row" else (n, m), float("nan"), device="cuda", dtype=TORCH[op["d"]])
        out = out if lc == "row" else out.t()
        c = operand(m, n, TORCH[op["d"]], lc) if beta else None
        sel = lib.select(a, b, out, c, beta=beta, activation=op["act"], kernel=force)
        lib.gemm(a, b, out, c, beta=beta, activation=op["act"], kernel=force)
        ref = a.float() @ b.float()
        if c is not None:
            ref = ref + beta * c.float()
        ref = ACT[op["act"]](ref)
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        extra = {"rel_err": err, "kernel": sel["kernel"], "why": sel["reason"] + (", transposed" if sel["transposed"] else "")}
        if sel.get("tuned_shape"):
            extra["tuned_shape"] = "x".join(map(str, sel["tuned_shape"][:3]))
        if timing:
            def median_ms(fn, batch: int = 10) -> float:
                """Median over 7 event pairs, each around `batch` back-to-back calls (so the Python/ctypes
                overhead of one call overlaps the previous kernel instead of being timed)."""
                for _ in range(3):
                    fn()
                ts = []
                for _ in range(7):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(batch):
                        fn()
                    e1.record()
                    e1.synchronize()
                    ts.append(e0.elapsed_time(e1) / batch)
                return sorted(ts)[len(ts) // 2]
            ms = median_ms(lambda: lib.gemm(a, b, out, activation=op["act"]))
            ref_ms = median_ms(lambda: torch.matmul(a, b))
            extra.update(ms=round(ms, 4), tflops=round(2 * m * n * kk / ms / 1e9, 1), torch_ms=round(ref_ms, 4),
                         ratio_vs_torch=round(ref_ms / ms, 3))
        tol = 5e-3 if op["a"] == "f32" else 1e-2
        return err <= tol, extra

    # not tile multiples, but every leading dimension a multiple of 8 (each layout: 16-byte aligned rows)
    shapes = [(128, 128, 64), (264, 520, 392), (1000, 1000, 1000), (64, 4096, 4096), (4096, 4096, 4096)]
    for op in ops:
        for (m, n, kk) in shapes:
            for beta in (0.0, 0.5):
                ok, extra = run(op, m, n, kk, beta, timing=(m * n * kk >= 4096 ** 3 and beta == 0.0))
                record("dispatch", op, (m, n, kk), ok, beta=beta, **extra)
        # the same operation stored the other way (D^T = B^T A^T): A, B, D layouts flip and A/B swap roles
        flip = {"row": "col", "col": "row"}
        t = {**op, "la": flip[op["lb"]], "lb": flip[op["la"]], "lc": flip[op["lc"]]}
        if t not in ops:
            ok, extra = run(t, 320, 192, 256, 0.5)
            record("transpose", t, (320, 192, 256), ok and "transposed" in extra["why"], **extra)
        try:
            run(op, 128, 128, 1001, 0.0)
            record("misalign", op, (128, 128, 1001), False, note="expected NOT_SUPPORTED")
        except lib.Error as e:
            record("misalign", op, (128, 128, 1001), e.status == 1, status=e.status_name, message=e.message[:90])
    for k in kernels:
        op = next((o for o in ops if o["a"] == k["a_type"] and o["act"] == names[k["activation"]]
                   and o["la"] == ("row" if k["a_layout"] == 1 else "col") and o["lb"] == ("row" if k["b_layout"] == 1 else "col")
                   and o["lc"] == ("row" if k["c_layout"] == 1 else "col")), None)
        if op is None:
            continue
        ok, extra = run(op, 384, 256, 512, 0.5, force=k["name"])
        record("forced", op, (384, 256, 512), ok and extra["kernel"] == k["name"], **extra)

    # PyCUDA arrays through __cuda_array_interface__ (f16 row-major A, column-major B via a transposed view)
    f16 = next((o for o in ops if o["a"] == "f16" and o["act"] == "identity"), None)
    try:
        import numpy as np
        import pycuda.autoprimaryctx  # noqa: F401  (the primary context torch uses too)
        import pycuda.gpuarray as ga
    except Exception as e:   # noqa: BLE001
        print(f"skip pycuda: {e}")
    else:
        if f16 is not None and f16["la"] == "row" and f16["lb"] == "col" and f16["lc"] == "row":
            m, n, kk = 256, 192, 320
            rng = np.random.default_rng(0)
            A = (rng.integers(-4, 5, (m, kk)) / 4).astype(np.float16)
            Bt = (rng.integers(-4, 5, (n, kk)) / 4).astype(np.float16)     # B = Bt.T: column-major k x n
            dA, dBt = ga.to_gpu(A), ga.to_gpu(Bt)
            dD = ga.to_gpu(np.full((m, n), np.nan, np.float16))     # poisoned: every element must be written

            class ColMajor:   # a k x n column-major view of dBt
                __cuda_array_interface__ = {"shape": (kk, n), "strides": (2, 2 * kk), "typestr": "<f2",
                                            "data": (int(dBt.gpudata), False), "version": 3}
            lib.gemm(dA, ColMajor(), dD, stream=0)
            torch.cuda.synchronize()
            ref = A.astype(np.float64) @ Bt.T.astype(np.float64)
            got = dD.get().astype(np.float64)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            record("pycuda", f16, (m, n, kk), err <= 1e-2, rel_err=err)

    print(f"{sum(r['ok'] for r in results)} passed, {failures} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"version": lib.version(), "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
