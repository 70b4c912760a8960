#!/usr/bin/env python3
"""Grouped and depthwise convolution through the exported library against cuDNN: layers of ResNeXt, MobileNetV2,
EfficientNet, ConvNeXt and a two-group layer, f16 channels_last, fprop / dgrad / wgrad.

On the GPU machine, from the repository root (about 2 minutes to build on 16 cores, 1-2 to time):

    python3 benchmarks/conv_grouped_bench.py --out $OUT/grouped -j 16 [--doc docs/conv_grouped_performance.md]

1. emit configs/conv/grouped.yaml (CUTLASS 2.x's grouped fprop, `single` and `multiple` group modes, the ungrouped
   sm80 and sm90a kernels the library runs a group at a time or on the block-diagonal weight, sm90a's split-K wgrad)
   and configs/conv/depthwise.yaml (the depthwise direct kernels), configs/conv/depthwise_simt.yaml (emitter's SIMT
   depthwise wgrad and fprop) and export them as one library (`emitter library`,
   CMake: sm80 kernels for sm_80, sm90a ones for sm_90a on a Hopper GPU); --library DIR reuses a built tree;
2. per layer and op: the library's torch call (conv2d / conv2d_input_grad / conv2d_weight_grad with groups=, the
   route conv_select reports -- grouped kernel, a launch a group, block-diagonal dense, depthwise fprop of dy -- and
   its kernel) and cuDNN (torch.backends.cudnn.benchmark = True; F.conv2d, and
   aten.convolution_backward on the real tensors for dgrad / wgrad: emitter/families/conv/baseline.py) on the same
   input sets, rotated past the L2, the same warm-up, batches of back-to-back calls between CUDA events in
   alternation, medians (benchmarks/conv_bench.py's Timer); the library's output checked against cuDNN's;
3. print the table (layer, op, route, kernel, TFLOP/s, cuDNN TFLOP/s, ratio vs cuDNN, check, GPU) and write
   grouped.json / grouped.md under --out (and --doc).

TFLOP/s = 2 * N * K * P * Q * (C / groups) * R * S / t. A case the library cannot run is a row with its reason,
not a failure of the run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SPEC = ROOT / "configs" / "conv" / "grouped.yaml"
SPECS = [SPEC, ROOT / "configs" / "conv" / "depthwise.yaml", ROOT / "configs" / "conv" / "depthwise_simt.yaml"]
NAME = "convgrouped"
OPS = ("fprop", "dgrad", "wgrad")
TOLERANCE = 1e-2      # relative max error of the library's output against cuDNN's (f16)

# (name, N, C, H, W, K, groups, R, stride, padding)
LAYERS = [
    ("ResNeXt-50 32x4d conv2 3x3", 32, 128, 56, 56, 128, 32, 3, 1, 1),
    ("ResNeXt-50 32x4d conv3 3x3 s2", 32, 256, 56, 56, 256, 32, 3, 2, 1),
    ("two groups 3x3 (AlexNet-style)", 32, 256, 27, 27, 256, 2, 3, 1, 1),
    ("MobileNetV2 dw 3x3 C144", 32, 144, 56, 56, 144, 144, 3, 1, 1),
    ("MobileNetV2 dw 3x3 C144 s2", 32, 144, 56, 56, 144, 144, 3, 2, 1),
    ("MobileNetV2 dw 3x3 C384 14^2", 32, 384, 14, 14, 384, 384, 3, 1, 1),
    ("EfficientNet-B0 dw 5x5 C240", 32, 240, 28, 28, 240, 240, 5, 1, 2),
    ("ConvNeXt-T dw 7x7 C96", 32, 96, 56, 56, 96, 96, 7, 1, 3),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def flops(layer) -> int:
    _, n, c, h, w, k, g, r, st, pad = layer
    p, q = (h + 2 * pad - r) // st + 1, (w + 2 * pad - r) // st + 1
    return 2 * n * k * p * q * (c // g) * r * r


def build(out: Path, jobs: int, archs: str) -> Path:
    """emit + export + CMake; the tree holding lib<NAME>.so and python/<NAME>.py."""
    py = sys.executable
    gen, tree = out / "gen", out / NAME
    specs = [str(p) for p in SPECS if p.exists()]
    for cmd in ([py, "-m", "emitter", "emit", *specs, "-o", str(gen), "-q"],
                [py, "-m", "emitter", "library", str(gen), "--name", NAME, "-o", str(tree), "--exclude", "*bf16*"],
                ["cmake", "-S", str(tree), "-B", str(tree / "build"), f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
                 "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(tree / "build"), "-j", str(jobs)]):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return tree


def load(tree: Path):
    import importlib.util

    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    spec = importlib.util.spec_from_file_location(NAME, tree / "python" / f"{NAME}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    spec.loader.exec_module(mod)
    mod.load(str(so))
    return mod


def bench_case(torch, timer, lib, layer, op: str, sets_wanted: int) -> dict[str, Any]:
    from emitter.families.conv.baseline import torch_conv

    name, n, c, h, w, k, g, r, st, pad = layer
    row: dict[str, Any] = {"layer": name, "op": op, "groups": g, "flops": flops(layer)}
    cl = torch.channels_last
    p, q = (h + 2 * pad - r) // st + 1, (w + 2 * pad - r) // st + 1
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{name} {op}".encode()))
    sets = []
    for _ in range(sets_wanted):
        sets.append({"x": torch.randn(n, c, h, w, device="cuda", generator=gen).half().to(memory_format=cl),
                     "w": (torch.randn(k, c // g, r, r, device="cuda", generator=gen) / math.sqrt(c // g * r * r)
                           ).half().to(memory_format=cl),
                     "y": torch.randn(n, k, p, q, device="cuda", generator=gen).half().to(memory_format=cl)})
    geo = {"stride": st, "padding": pad, "groups": g}

    def lib_call(i):
        s = sets[i % len(sets)]
        if op == "fprop":
            return lib.conv2d(s["x"], s["w"], **geo)
        if op == "dgrad":
            return lib.conv2d_input_grad(s["y"], s["w"], tuple(s["x"].shape), **geo)
        return lib.conv2d_weight_grad(s["x"], s["y"], tuple(s["w"].shape), **geo)

    def vendor(i):
        s = sets[i % len(sets)]
        return torch_conv(torch, op, s["x"], s["w"], s["y"], stride=st, padding=pad, groups=g)

    s0 = sets[0]
    sel: dict[str, Any] = {}
    try:
        args = {"fprop": (s0["x"], s0["w"], None), "dgrad": (None, s0["w"], s0["y"]),
                "wgrad": (s0["x"], None, s0["y"])}[op]
        shape = {"fprop": None, "dgrad": tuple(s0["x"].shape), "wgrad": tuple(s0["w"].shape)}[op]
        sel = lib.conv_select(op, *args, stride=st, padding=pad, groups=g, shape=shape)
        row["kernel"], row["why"] = sel.get("kernel"), sel.get("reason")
    except Exception as e:  # noqa: BLE001 -- a selection the library refuses is the row's reason
        row["kernel"], row["why"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    # the route as conv_select reports it (its cost model's choice; the estimates are in its reason)
    row["route"] = sel.get("route") if row["kernel"] else None
    row["route"] = row["route"] or "-"
    row["costs_us"] = sel.get("costs_us")      # the model's estimate of every route it priced (grouped.json)
    try:
        got = lib_call(0)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        row["reason"] = f"library refused: {type(e).__name__}: {str(e)[:200]}"
        row["cudnn_ms"] = timer.time({"cudnn": vendor})["cudnn"]
        row["cudnn_tflops"] = row["flops"] / (row["cudnn_ms"] * 1e-3) / 1e12
        return row
    want = vendor(0).double()
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    row["rel_err"] = err
    row["check"] = "ok" if err < TOLERANCE else "MISMATCH"
    ms = timer.time({"library": lib_call, "cudnn": vendor})
    again = timer.time({"library": lib_call, "cudnn": vendor})      # a fresh alternation: the reported figures
    row["search_ms"] = ms
    row["library_ms"], row["cudnn_ms"] = again["library"], again["cudnn"]
    row["tflops"] = row["flops"] / (row["library_ms"] * 1e-3) / 1e12
    row["cudnn_tflops"] = row["flops"] / (row["cudnn_ms"] * 1e-3) / 1e12
    row["ratio"] = row["cudnn_ms"] / row["library_ms"]
    return row


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def table(rows: list[dict], gpu: str) -> str:
    f = (lambda v: f"{v:.1f}" if v else "-")  # noqa: E731
    lines = ["| layer | op | route | kernel | library TFLOP/s | cuDNN TFLOP/s | x cuDNN | check | GPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kern = (r.get("kernel") or "-").replace("_accf32", "").replace("_identity", "")
        lines.append(f"| {r['layer']} | {r['op']} | {r.get('route', '-')} | `{kern}` | {f(r.get('tflops'))} | "
                     f"{f(r.get('cudnn_tflops'))} | "
                     f"{r['ratio']:.2f} | {r.get('check', r.get('reason', ''))} | {gpu} |" if r.get("ratio") else
                     f"| {r['layer']} | {r['op']} | {r.get('route', '-')} | `{kern}` | - | {f(r.get('cudnn_tflops'))} | - | "
                     f"{r.get('reason', '')} | {gpu} |")
    lines += ["", "| op | geomean x cuDNN (matched rows) | lowest | rows |", "|---|---|---|---|"]
    for op in OPS:
        rs = [r["ratio"] for r in rows if r["op"] == op and r.get("check") == "ok"]
        if rs:
            lines.append(f"| {op} | {geomean(rs):.3f} | {min(rs):.2f} | {len(rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "generated" / "conv_grouped")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--library", type=Path, help="a built tree of this spec to reuse")
    ap.add_argument("--layers", help="comma-separated indices into LAYERS (default: all)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--min-ms", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--doc", type=Path)
    a = ap.parse_args(argv)
    try:
        layers = [LAYERS[int(i)] for i in a.layers.split(",")] if a.layers else LAYERS
    except (ValueError, IndexError):
        ap.error(f"--layers {a.layers!r}: comma-separated indices 0..{len(LAYERS) - 1}")
    import torch

    if not torch.cuda.is_available():
        print("conv_grouped_bench: needs a CUDA GPU visible to torch", file=sys.stderr)
        return 2
    from conv_bench import Timer

    torch.backends.cudnn.benchmark = True
    a.out.mkdir(parents=True, exist_ok=True)
    archs = "80;90a" if torch.cuda.get_device_capability(0) == (9, 0) else "80"
    tree = a.library or build(a.out, a.jobs, archs)
    lib = load(tree)
    gpu = torch.cuda.get_device_name(0)
    timer = Timer(torch, a.reps, a.min_ms, a.warmup)
    rows = []
    for layer in layers:
        _, n, c, h, w, k, g, r, st, pad = layer
        per_set = 2 * (n * c * h * w + k * (c // g) * r * r + n * k * h * w)      # bytes, an upper bound
        sets = max(1, min(8, math.ceil(2 * 64 * 2**20 / per_set)))                  # past a 50-60 MB L2
        for op in OPS:
            row = bench_case(torch, timer, lib, layer, op, sets)
            log(f"{row['layer']:34} {op:5} {row.get('route', ''):40} "
                + (f"{row['tflops']:7.1f} vs cuDNN {row['cudnn_tflops']:7.1f} TFLOP/s  x{row['ratio']:.2f} "
                   f"{row['check']}" if row.get("ratio") else row.get("reason", "")))
            rows.append(row)
    rec = {"gpu": gpu, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "spec": " + ".join(str(p.relative_to(ROOT)) for p in SPECS if p.exists()),
           "rows": rows}
    text = (f"# Grouped and depthwise convolution through the exported library (generated by "
            f"benchmarks/conv_grouped_bench.py: do not edit)\n\n{gpu}, {rec['date']}, torch {rec['torch']}, cuDNN "
            f"{rec['cudnn']}; f16 channels_last; kernels of {rec['spec']}; route: conv_select's (a cost model "
            f"over the routes the library can run).\n\n" + table(rows, gpu) + "\n")
    (a.out / "grouped.json").write_text(json.dumps(rec, indent=1, default=str))
    (a.out / "grouped.md").write_text(text)
    if a.doc:
        a.doc.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
