"""Replay of a library benchmark record (benchmarks/library_bench.py --family gemm: every exported kernel's time on
each evaluation shape, `rows[*].search_ms`) through the exported library's dispatch, given the tuning run's
profile.json (every kernel's time on each tuning shape): which kernel the dispatch would pick on each evaluation
shape, and how close its recorded time is to the best recorded one (the oracle) -- without a GPU.

    python -m emitter.families.gemm.library_replay RECORD.json PROFILE.json [--json OUT]

The kernels are read from their instance names (emitter/families/gemm/naming.py's fields: dtypes, layouts, tile,
cluster, schedule, scheduler, swap_ab, split-K); the tuning table is the profile's winner per shape (as `emitter
profile` writes it). Both rules are replayed: the winners only (the nearest profiled shape's winner first, as a
table without profile.json dispatches) and the predicted times (library_dispatch.predicted_cost). A pick whose
recorded time is missing (not timed on that shape) is reported as such; one that keeps run-time options is judged
by its recorded options-0 time and flagged (options_time_approx).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from emitter.families.gemm.library_dispatch import (Candidate, KernelRecord, MeasuredRecord, Query, dispatch_order,
                                                    effective_options, effective_split_k, kernel_records,
                                                    measured_records, transpose, tuning_records)

_NAME = re.compile(r"^gemm_(?P<arch>sm\d+a?)_(?P<a>[a-z0-9]+?)(?P=a)_(?P<c>[a-z0-9]+?)(?P=c)_acc(?P<acc>[a-z0-9]+)_"
                   r"(?P<lay>[tn]{3})_(?P<tile>\d+x\d+x\d+)_c(?P<cl>\d+x\d+x\d+)_.*?_(?P<sched>persistent|streamk)"
                   r"(?P<swap>_swapab)?_al(?P<al>\d+)x\d+x\d+_(?P<act>[a-z]+)")


def config_from_name(name: str) -> dict[str, Any]:
    """The dispatch-relevant config of an sm90a instance name (a bench record names kernels, not configs)."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"{name}: not an sm90a GEMM instance name this replay reads")
    lay = {"t": "row", "n": "col"}
    la, lb, lc = (lay[ch] for ch in m["lay"])
    # the name's layout letters are A, B, C as in GemmConfig.layout_letters ("t" = row-major)
    return {"arch": m["arch"], "a": m["a"], "b": m["a"], "c": m["c"], "d": m["c"], "accumulator": m["acc"],
            "layout_a": la, "layout_b": lb, "layout_c": lc, "tile": [int(x) for x in m["tile"].split("x")],
            "cluster": [int(x) for x in m["cl"].split("x")], "alignment_a": int(m["al"]), "alignment_b": int(m["al"]),
            "alignment_c": int(m["al"]), "epilogue": {"activation": m["act"], "bias": "none"},
            "split_k": "serial" if name.endswith("_splitkserial") else "none", "batched": False,
            "swap_ab": bool(m["swap"]), "tile_scheduler": "stream_k" if m["sched"] == "streamk" else "persistent"}


def _shape(text: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in text.split("x"))
    return m, n, k


def replay(record: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    names = sorted({k[2:].split("@")[0] for r in record["rows"] for k in r["search_ms"] if k.startswith("k:")})
    kernels = kernel_records([{"name": n, "arch": "sm90a", "family": "gemm", "config": config_from_name(n)} for n in names])
    idx = {k.name: k.index for k in kernels}
    env = profile.get("environment") or {}
    cc = int(str(env.get("cc", "9.0")).replace(".", "")) if env.get("cc") else 90
    sms = int(env.get("sm_count") or 0)
    ok = [m for m in profile["measurements"] if m.get("kind") == "kernel" and m.get("status") == "ok"
          and m.get("name") in idx and (m.get("stats") or {}).get("median_ms")]
    rows = [(idx[m["name"]], m["problem"]["m"], m["problem"]["n"], m["problem"]["k"], m["problem"].get("batch", 1), cc,
             int(m.get("split_k") or 1), int(m.get("options") or 0), max(int(round(m["stats"]["median_ms"] * 1e9)), 1), sms)
            for m in ok]
    measured = measured_records(rows)
    winners: dict[tuple, tuple] = {}
    for r in rows:    # the tuning table: each shape's fastest
        key = r[1:5]
        if key not in winners or r[8] < winners[key][8]:
            winners[key] = r
    tuning = tuning_records(w[:8] for w in winners.values())
    op = kernels[0].op
    out = []
    for row in record["rows"]:
        m, n, k = _shape(row["case"])
        q = Query(op=op, m=m, n=n, k=k, cc=cc)
        times = {key[2:]: v for key, v in row["search_ms"].items() if key.startswith("k:")}
        oracle = min(times, key=times.get)
        case: dict[str, Any] = {"case": row["case"], "oracle": oracle, "oracle_ms": times[oracle],
                                "bench_pick": row["kernel"], "bench_lib_vs_oracle": row["ratios"].get("lib_vs_oracle")}
        for rule, ms in (("winners", ()), ("predicted", measured)):
            c: Candidate = dispatch_order(kernels, tuning, q, measured=ms)[0]
            qq = transpose(q) if c.transposed else q
            split = effective_split_k(kernels, tuning, c, q, ms)
            options = effective_options(kernels, tuning, c, qq, ms)
            label = kernels[c.kernel].name + (f"@splitk{split}" if split > 1 else "")
            # the bench's oracle timed each kernel with options 0: a pick that keeps its record's options (they
            # cost no padding here, options_fit) is judged by that time, and flagged
            t = times.get(label)
            case[rule] = {"kernel": label, "options": options, "ms": t, "options_time_approx": bool(options),
                          "vs_oracle": times[oracle] / t if t else None,
                          "why": (f"predicted from {measured[c.measured].m}x{measured[c.measured].n}x{measured[c.measured].k}"
                                  if c.measured >= 0 else "nearest winner" if c.tuning >= 0 else "fallback order")}
        out.append(case)

    def geo(rule: str) -> float | None:
        v = [c[rule]["vs_oracle"] for c in out if c[rule]["vs_oracle"]]
        return math.exp(sum(map(math.log, v)) / len(v)) if v else None

    return {"cases": out, "summary": {r: {"geomean_vs_oracle": geo(r),
                                          "min_vs_oracle": min((c[r]["vs_oracle"] for c in out if c[r]["vs_oracle"]), default=None),
                                          "judged": sum(1 for c in out if c[r]["vs_oracle"])}
                                      for r in ("winners", "predicted")}}


def _short(name: str) -> str:
    m = re.search(r"_(\d+x\d+x\d+_c\d+x\d+x\d+)_.*?_(pingpong|coop)_.*?_(persistent|streamk)(_swapab)?.*?(_nosrc)?(_splitkserial)?(@.*)?$", name)
    return "".join(x for x in m.groups() if x) if m else name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    try:
        res = replay(json.loads(a.record.read_text()), json.loads(a.profile.read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for c in res["cases"]:
        p, w = c["predicted"], c["winners"]
        fmt = lambda x: f"{x:.3f}" if x else "  -  "   # noqa: E731
        print(f"{c['case']:>16}  predicted {_short(p['kernel']):<34} {fmt(p['vs_oracle'])}  winners {_short(w['kernel']):<34} "
              f"{fmt(w['vs_oracle'])}  oracle {_short(c['oracle'])}  (bench {fmt(c['bench_lib_vs_oracle'])})")
    for r, s in res["summary"].items():
        print(f"{r}: geomean {s['geomean_vs_oracle']:.3f} min {s['min_vs_oracle']:.3f} of the oracle ({s['judged']} cases)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
