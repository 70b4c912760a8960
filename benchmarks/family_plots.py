"""Plots of the attention and convolution benchmark records (no GPU): speed ratio of the best emitted
kernel against each same-run baseline, one bar group per case. Reads the JSON that
benchmarks/attention_bench.py and benchmarks/conv_bench.py write.

    python benchmarks/family_plots.py --attention docs/perf/families/attention-2026-11-25-h100.json \
        --conv docs/perf/families/conv-2026-11-27-h200.json --out docs/perf/families
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _best(row: dict) -> tuple[str | None, float | None]:
    kernels = {k: v for k, v in row["ms"].items() if k.startswith("attn_") and v}
    if not kernels:
        return None, None
    name = min(kernels, key=kernels.get)
    return name, kernels[name]


def attention_plot(path: Path, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    rows = data["rows"]
    labels, series = [], {"cudnn": [], "flash": [], "efficient": []}
    for r in rows:
        _, ms = _best(r)
        if ms is None:
            continue
        labels.append(r["label"])
        for b in series:
            series[b].append(r["ms"][b] / ms if r["ms"].get(b) else float("nan"))
    fig, ax = plt.subplots(figsize=(max(10, len(labels) * 0.42), 4.8))
    width = 0.27
    for i, (b, vals) in enumerate(series.items()):
        ax.bar([x + (i - 1) * width for x in range(len(labels))], vals, width, label=f"vs {b}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("baseline time / emitter time")
    ax.set_title(f"sm90a attention vs torch SDPA backends ({data.get('gpu', '?')})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    dest = out / (path.stem + "_ratio.png")
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def conv_plot(path: Path, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if r.get("ratio")]
    labels = [f"{r['op']} {r['dtype']} {r['layer']}" for r in rows]
    ratios = [r["ratio"] for r in rows]
    colors = ["tab:green" if x >= 1.0 else ("tab:orange" if x >= 0.9 else "tab:red") for x in ratios]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.3), 4.8))
    ax.bar(range(len(rows)), ratios, color=colors)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), labels, rotation=75, ha="right", fontsize=6)
    ax.set_ylabel("cuDNN time / emitter time (log)")
    ax.set_title(f"convolution vs cuDNN, ResNet-50 layers, N = 128 ({data.get('gpu', '?')})")
    fig.tight_layout()
    dest = out / (path.stem + "_ratio.png")
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", type=Path)
    ap.add_argument("--conv", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.attention:
        print(attention_plot(a.attention, a.out))
    if a.conv:
        print(conv_plot(a.conv, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
