"""Profile outputs: figures per measurement, CSV, JSON (schema-versioned), tuning table, terminal table, plots.

Every row gives time (median, IQR), TFLOP/s, GB/s (the fewest bytes the GEMM must move over the time),
percent of the GPU's compute and memory peaks, and the ratio to the baseline measured in the same run
(baseline time / kernel time: above 1 is faster than cuBLAS).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from emitter.families.registry import FAMILIES
from emitter.fsutil import atomic_write_json, atomic_write_text
from emitter.profile.config import ProfileConfig, problem_ident
from emitter.profile.device import peaks_for
from emitter.profile.records import Measurement, min_bytes
from emitter.profile.selection import RULE, Choice, choose_all, group_key, measurement_key, tuning_table
from emitter.version import __version__

SCHEMA_VERSION = 1

CSV_COLUMNS = [
    "gpu", "op", "layout", "a", "b", "c", "d", "m", "n", "k", "batch", "kind", "name", "split_k", "scheduler",
    "options", "provider", "status",
    "median_ms", "iqr_ms", "q25_ms", "q75_ms", "min_ms", "run_spread_ms", "repeats", "iterations", "tflops", "gbs",
    "pct_peak_compute", "pct_peak_bw", "baseline", "baseline_ms", "ratio_to_baseline", "check_rel_err", "best",
    "tied", "rotation_sets", "working_set_mb", "reason",
]


@dataclass
class Report:
    measurements: list[Measurement]
    envs: dict[int, dict[str, Any]]
    config: ProfileConfig
    choices: dict[tuple, Choice]
    figures: dict[tuple, dict[str, Any]]
    # how the run went (runner.RunOutcome.run: per GPU busy seconds, per problem wall seconds and estimate,
    # fault events); empty for a report rebuilt from measurements alone
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, Any]:
        return self.envs[min(self.envs)] if self.envs else {}

    def baseline_providers(self) -> list[str]:
        return sorted({m.provider for m in self.measurements if m.kind == "baseline" and m.ok})


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def build(measurements: list[Measurement], envs: dict[int, dict[str, Any]], config: ProfileConfig,
          run: dict[str, Any] | None = None) -> Report:
    """Figures for every measurement, the baseline of each (op, problem), and the stable best kernels. `run`:
    how the run went (RunOutcome.run), kept in profile.json's `run`."""
    baselines: dict[tuple, Measurement] = {}
    for m in measurements:
        if m.kind == "baseline" and m.ok:
            baselines.setdefault(group_key(m), m)
    figures: dict[tuple, dict[str, Any]] = {}
    for m in measurements:
        env = envs.get(m.gpu) or (envs[min(envs)] if envs else {})
        peaks = peaks_for(env.get("name", ""), env, config.peaks)
        f: dict[str, Any] = {}
        b = baselines.get(group_key(m))
        if b is not None:
            f["baseline"] = b.name
            f["baseline_provider"] = b.provider
            f["baseline_ms"] = b.stats.median_ms if b.stats else None
        if m.ok and m.stats is not None:
            t = m.stats.median_ms * 1e-3
            f["tflops"] = m.problem.flops / t / 1e12
            nbytes = min_bytes(m.op, m.problem, config.beta)
            f["gbs"] = nbytes / t / 1e9 if nbytes is not None else None
            peak = peaks["tflops"].get(getattr(m.op, "a", None))
            f["pct_peak"] = 100 * f["tflops"] / peak if peak else None
            f["pct_peak_bw"] = 100 * f["gbs"] / (peaks["hbm_tbs"] * 1e3) if peaks["hbm_tbs"] else None
            if b is not None and b.stats is not None:
                f["ratio"] = b.stats.median_ms / m.stats.median_ms
        figures[measurement_key(m)] = f
    choices = choose_all(measurements, config.tie_tolerance)
    return Report(measurements, envs, config, choices, figures, dict(run or {}))


# ------------------------------------------------------------------------------------------ CSV / JSON
def _sort_key(m: Measurement) -> tuple:
    p = m.problem
    return (m.op.key, p.flops, *problem_ident(p), 0 if m.kind == "baseline" else 1, m.name, m.split_k, m.options)


def rows(report: Report) -> list[dict[str, Any]]:
    out = []
    for m in sorted(report.measurements, key=_sort_key):
        f = report.figures.get(measurement_key(m), {})
        ch = report.choices.get(group_key(m))
        s = m.stats
        out.append({
            "gpu": m.gpu, "op": m.op.key, "layout": getattr(m.op, "layout", None), "a": getattr(m.op, "a", None),
            "b": getattr(m.op, "b", None), "c": getattr(m.op, "c", None), "d": getattr(m.op, "d", None),
            "m": getattr(m.problem, "m", None), "n": getattr(m.problem, "n", None),
            "k": getattr(m.problem, "k", None), "batch": getattr(m.problem, "batch", None),
            "kind": m.kind, "name": m.name, "split_k": m.split_k, "options": m.options, "scheduler": m.options_label,
            "provider": m.provider, "status": m.status,
            "median_ms": _r(s.median_ms, 6) if s else None, "iqr_ms": _r(s.iqr_ms, 6) if s else None,
            "q25_ms": _r(s.q25_ms, 6) if s else None, "q75_ms": _r(s.q75_ms, 6) if s else None,
            "min_ms": _r(s.min_ms, 6) if s else None, "run_spread_ms": _r(s.run_spread_ms, 6) if s else None,
            "repeats": s.repeats if s else None, "iterations": s.iterations if s else None,
            "tflops": _r(f.get("tflops"), 2), "gbs": _r(f.get("gbs"), 1),
            "pct_peak_compute": _r(f.get("pct_peak"), 2), "pct_peak_bw": _r(f.get("pct_peak_bw"), 2),
            "baseline": f.get("baseline_provider"), "baseline_ms": _r(f.get("baseline_ms"), 6),
            "ratio_to_baseline": _r(f.get("ratio"), 4),
            "check_rel_err": (m.check or {}).get("rel_err"),
            "best": bool(ch and m.kind == "kernel" and ch.winner.label == m.label),
            "tied": bool(ch and m.kind == "kernel" and m.label in ch.ties and len(ch.ties) > 1),
            "rotation_sets": m.extra.get("rotation_sets"),
            "working_set_mb": _r(m.extra["working_set_bytes"] / 2 ** 20, 1) if m.extra.get("working_set_bytes") else None,
            "reason": m.reason,
        })
    return out


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows(report):
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def geomeans(report: Report) -> dict[str, dict[str, Any]]:
    """Per op: geometric mean of best-kernel / baseline ratios, the worst ratio, and counts."""
    per: dict[str, list[float]] = defaultdict(list)
    for key, ch in report.choices.items():
        f = report.figures.get(measurement_key(ch.winner), {})
        if f.get("ratio"):
            per[key[0]].append(f["ratio"])
    out = {}
    for op, rs in sorted(per.items()):
        out[op] = {"geomean_ratio": math.exp(sum(math.log(r) for r in rs) / len(rs)), "min_ratio": min(rs),
                   "problems": len(rs)}
    return out


def environment(report: Report) -> dict[str, Any]:
    env = report.env
    keys = ("name", "cc", "sm_count", "sm_clock_khz", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz",
            "memory_clock_khz", "memory_bus_bits", "l2_bytes", "memory_bytes", "driver", "cuda_driver_api",
            "pycuda_cuda", "nvcc", "cutlass", "torch", "emitter_version", "temperature_c", "power_w")
    return {"gpu_count": len(report.envs), **{k: env.get(k) for k in keys},
            "emitter_version": env.get("emitter_version") or __version__,
            "per_gpu": {str(k): v for k, v in sorted(report.envs.items())}}


def to_json(report: Report) -> dict[str, Any]:
    env = report.env
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "emitter.profile",
        "emitter_version": __version__,
        "config_file": report.config.file,
        "config": report.config.to_json(),
        "environment": environment(report),
        "peaks": peaks_for(env.get("name", ""), env, report.config.peaks),
        "baselines": report.baseline_providers(),
        "selection": {"rule": RULE, "tie_tolerance": report.config.tie_tolerance},
        "summary": {"geomean": geomeans(report), "counts": _counts(report)},
        "rows": rows(report),
        "measurements": [m.to_json() for m in sorted(report.measurements, key=_sort_key)],
        **({"run": report.run} if report.run else {}),
    }


def _counts(report: Report) -> dict[str, int]:
    c: dict[str, int] = defaultdict(int)
    for m in report.measurements:
        c[f"{m.kind}:{m.status}"] += 1
    return dict(sorted(c.items()))


def from_json(data: dict[str, Any]) -> tuple[list[Measurement], dict[int, dict[str, Any]], ProfileConfig]:
    """Recorded results back into measurements (for --replay: reselect and report without a GPU)."""
    from emitter.errors import ManifestError

    if data.get("kind") != "emitter.profile" or data.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(f"not an emitter profile result of schema_version {SCHEMA_VERSION} "
                            f"(kind={data.get('kind')!r}, schema_version={data.get('schema_version')!r})")
    ms = [Measurement.from_json(d) for d in data["measurements"]]
    envs = {int(k): v for k, v in (data.get("environment", {}).get("per_gpu") or {}).items()}
    return ms, envs, ProfileConfig.from_json(data["config"])


def write_all(report: Report, out_dir: Path, plots: bool = True) -> dict[str, Any]:
    """Writes CSV, JSON, the tuning table and plots; returns {"csv": path, ..., "plots": [paths] | reason}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    o = report.config.output
    paths: dict[str, Any] = {"csv": out_dir / o.csv, "json": out_dir / o.json, "tuning": out_dir / o.tuning}
    atomic_write_text(paths["csv"], to_csv(report))
    atomic_write_json(paths["json"], to_json(report))
    atomic_write_json(paths["tuning"], tuning_table(report.choices, report.figures, {**report.env,
                                                    "emitter_version": __version__}, report.config.tie_tolerance))
    if plots:
        paths["plots"] = write_plots(report, out_dir / "plots")
    return paths


# ------------------------------------------------------------------------------------------ terminal
def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def make_console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:      # logs, pipes and CI: wide enough for one row per line
        console = Console(width=max(console.width, 200))
    return console


def print_table(report: Report, console: Any = None, all_kernels: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or make_console()
    env = report.env
    title = (f"{env.get('name', '?')} ({env.get('sm_count', '?')} SMs) | baseline: "
             f"{'; '.join(report.baseline_providers()) or 'none'}")
    table = Table(title=title, title_justify="left")
    # the baseline's own name where it is not cuBLAS (attention: sdpa_*, conv: cudnn)
    bases = sorted({m.name for m in report.measurements if m.kind == "baseline"} - {"cublas"})
    base_label = "cuBLAS" if not bases else "/".join(bases)
    for col, just in (("problem", "right"), ("op", "left"), ("kernel", "left"), ("time", "right"),
                      ("±IQR", "right"), ("TFLOP/s", "right"), ("GB/s", "right"), ("%peak", "right"),
                      (f"{base_label} TFLOP/s", "right"), ("ratio", "right"), ("ties", "right")):
        table.add_column(col, justify=just, overflow="fold")
    groups: dict[tuple, list[Measurement]] = defaultdict(list)
    for m in report.measurements:
        groups[group_key(m)].append(m)
    for key in sorted(groups, key=lambda k: (k[0], k[1][0] * k[1][1] * k[1][2] * k[1][3] if len(k[1]) == 4 else 0,
                                             k[1])):   # other families' problems: (key,)
        ms = groups[key]
        ch = report.choices.get(key)
        base = next((m for m in ms if m.kind == "baseline" and m.ok), None)
        bf = report.figures.get(measurement_key(base), {}) if base else {}
        show = [m for m in ms if m.kind == "kernel"] if all_kernels else ([ch.winner] if ch else [])
        if not show:
            bad = [m for m in ms if m.kind == "kernel"]
            why = "; ".join(sorted({f"{m.status}" for m in bad})) or "no kernel"
            table.add_row(_pkey(key), key[0], f"[red]none ran correctly ({why})[/red]", "-", "-", "-", "-", "-",
                          _fmt(bf.get("tflops"), ".1f"), "-", "-")
            continue
        for m in sorted(show, key=lambda m: (m.stats.median_ms if m.ok else math.inf, m.label)):
            f = report.figures.get(measurement_key(m), {})
            ratio = f.get("ratio")
            color = "green" if ratio and ratio >= 1.0 else ("yellow" if ratio and ratio >= 0.97 else "red")
            ratio_txt = f"[{color}]{ratio:.2f}x[/{color}]" if ratio else "-"
            win = ch is not None and ch.winner.label == m.label
            name = ("* " if win and all_kernels else "") + compact_name(m.name) + \
                (f" split-K {m.split_k}" if m.split_k > 1 else "") + (f" [{m.options_label}]" if m.options else "")
            if not m.ok:
                table.add_row(_pkey(key), key[0], name, f"[red]{m.status}[/red]", "-", "-", "-", "-",
                              _fmt(bf.get("tflops"), ".1f"), "-", "-")
                continue
            ties = str(len(ch.ties) - 1) if (ch and win and len(ch.ties) > 1) else ""
            table.add_row(_pkey(key), key[0], name, _time(m.stats.median_ms), _time(m.stats.iqr_ms),
                          _fmt(f.get("tflops"), ".1f"), _fmt(f.get("gbs"), ".0f"), _fmt(f.get("pct_peak"), ".1f"),
                          _fmt(bf.get("tflops"), ".1f"), ratio_txt, ties)
    console.print(table)
    for op, g in geomeans(report).items():
        console.print(f"{op}: geometric mean of best/{base_label} {g['geomean_ratio']:.3f}x over {g['problems']} problems "
                      f"(worst {g['min_ratio']:.3f}x)")
    c = _counts(report)
    bad = {k: v for k, v in c.items() if not k.endswith(":ok")}
    if bad:
        console.print("not timed: " + ", ".join(f"{v} {k}" for k, v in bad.items()))


def _pkey(key: tuple) -> str:
    if len(key[1]) != 4:         # another family's problem ident: (key,)
        return str(key[1][0])
    m, n, k, b = key[1]
    return f"{m}x{n}x{k}" + (f"x{b}" if b != 1 else "")


# ------------------------------------------------------------------------------------------ plots
def write_plots(report: Report, plot_dir: Path) -> list[str] | str:
    """PNG per op: TFLOP/s per problem for each kernel and the baseline; best-kernel ratio to baseline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plots (pip install matplotlib)"
    plot_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for m in report.measurements:
        if m.ok:
            by_op[m.op.key].append(m)
    env = report.env
    for op, ms in sorted(by_op.items()):
        problems = sorted({m.problem for m in ms}, key=lambda p: (p.flops, p.key))
        xi = {p: i for i, p in enumerate(problems)}
        labels = [p.key for p in problems]
        width = max(6.0, 0.45 * len(problems) + 3)

        fig, ax = plt.subplots(figsize=(width, 5.0))
        series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        for m in ms:
            f = report.figures.get(measurement_key(m), {})
            if f.get("tflops") is not None:
                series[(m.kind, m.label)].append((xi[m.problem], f["tflops"]))
        for (kind, name), pts in sorted(series.items(), key=lambda kv: (kv[0][0] != "baseline", kv[0][1])):
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            if kind == "baseline":
                ax.plot(xs, ys, "k--", marker="s", linewidth=2, label=f"{name} (baseline)")
            else:
                ax.plot(xs, ys, marker="o", linewidth=1, markersize=3, label=_short_name(name))
        peak = peaks_for(env.get("name", ""), env, report.config.peaks)["tflops"].get(getattr(ms[0].op, "a", None))
        if peak:
            ax.axhline(peak, color="grey", linewidth=0.8, linestyle=":")
            ax.text(0, peak, f" peak {peak:.0f}", va="bottom", fontsize=7, color="grey")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{op} on {env.get('name', '?')}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        path = plot_dir / f"{op}_tflops.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

        fig, ax = plt.subplots(figsize=(width, 4.0))
        best_x, best_y, all_x, all_y = [], [], [], []
        for m in ms:
            f = report.figures.get(measurement_key(m), {})
            if m.kind != "kernel" or not f.get("ratio"):
                continue
            ch = report.choices.get(group_key(m))
            if ch and ch.winner.label == m.label:
                best_x.append(xi[m.problem])
                best_y.append(f["ratio"])
            else:
                all_x.append(xi[m.problem])
                all_y.append(f["ratio"])
        if best_x or all_x:
            ax.scatter(all_x, all_y, s=8, color="tab:gray", alpha=0.5, label="other kernels", zorder=3)
            # bars grow from 1.0 (parity with the baseline) so small differences stay visible
            ax.bar(best_x, [y - 1.0 for y in best_y], bottom=1.0, alpha=0.8, label="best kernel",
                   color=["tab:green" if y >= 1 else "tab:red" for y in best_y])
            ax.axhline(1.0, color="black", linewidth=1)
            lo, hi = min(best_y + all_y), max(best_y + all_y)
            ax.set_ylim(min(0.9, lo - 0.03), max(1.1, hi + 0.03))
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("ratio to baseline (baseline time / kernel time)")
            providers = sorted({m.provider for m in ms if m.kind == "baseline" and m.ok})
            ax.set_title(f"{op}: speed relative to {', '.join(providers) or 'baseline'}", fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = plot_dir / f"{op}_ratio.png"
            fig.savefig(path, dpi=110)
            written.append(str(path))
        plt.close(fig)
    return written


_OP_TOKEN = re.compile("^(" + "|".join(FAMILIES) + r"|sm\d+a?|acc\w+|al\d+x\d+x\d+|[tn]{3}|identity|relu|gelu|silu|"
                       r"sigmoid|clamp.*|bias\w+|(f16|bf16|f32|tf32|f64|s8|s32|e4m3|e5m2){2})$")


def compact_name(name: str) -> str:
    """An instance name without what the op already says (arch, dtypes, layout, alignment, epilogue)."""
    kept = [t for t in name.split("_") if not _OP_TOKEN.match(t)]
    return "_".join(kept) or name


def _short_name(name: str) -> str:
    """The distinguishing part of an instance name (tile, cluster, schedule) for legends."""
    parts = name.split("_")
    keep = [p for p in parts if any(ch.isdigit() for ch in p) and "x" in p] + \
           [p for p in parts if p in ("coop", "pingpong", "streamk", "persistent")]
    return " ".join(keep) or name


def summary_lines(report: Report, paths: dict[str, Any]) -> Iterable[str]:
    for key in ("csv", "json", "tuning"):
        yield f"{key:>7}: {paths[key]}"
    plots = paths.get("plots")
    if isinstance(plots, list):
        yield f"  plots: {len(plots)} PNG in {Path(plots[0]).parent if plots else '-'}"
    elif plots:
        yield f"  plots: {plots}"
