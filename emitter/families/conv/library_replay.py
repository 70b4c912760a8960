"""Replay of a conv library benchmark record (benchmarks/library_bench.py --family conv: every exported kernel's time
on each evaluation case, `rows[*].search_ms`, split-K kernels at the counts the profiler tries) through the exported
library's conv dispatch, given the tuning run's profile.json (every kernel's time on each tuning problem): which kernel
the dispatch would pick on each case, and how close its recorded time is to the best recorded one (the oracle) --
without a GPU.

    python -m emitter.families.conv.library_replay RECORD.json PROFILE.json [--json OUT]

The kernels are read from their instance names (emitter/families/conv/naming.py); the tuning table is the profile's
winner per (op, problem), as `emitter profile` writes it. A kernel runs a case when the bench could force it there (it
is in the case's search_ms). Both rules are replayed: `winners` (tuning records, then the static priority: the
library without profile.json) and `predicted` (library_dispatch step 4). A pick is judged by its recorded time at its
split-K count; where the bench did not time that count, the pick is the bench's own kernel and the bench's C-API
library time stands for it (flagged `library_time`), else it is reported unjudged.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from emitter.families.conv.library import ConvKernelRecord, ConvTuningRecord
from emitter.families.conv.problem import ConvProblem
from emitter.families.conv.library_dispatch import ConvQuery, candidate_order, launch_split_k, measured_records

_NAME = re.compile(r"^conv2d_(?P<op>fprop|dgrad|wgrad)_(?P<arch>sm\d+a?)_(?P<a>[a-z0-9]+)_(?P<c>[a-z0-9]+)_acc(?P<acc>[a-z0-9]+)"
                   r"_nhwc_(?P<tile>\d+x\d+x\d+)_(?:c(?P<cl>\d+x\d+x\d+)|w\d+x\d+x\d+)(?:_i\d+x\d+x\d+)?_s(?:\d+|auto)"
                   r"(?:_(?P<it>analytic|opt|fewch|fixch))?_(?P<stride>unity|strided)(?:_swz\d+)?"
                   r"_al(?P<al>\d+)x(?P<alb>\d+)x(?P<alc>\d+)_(?P<act>[a-z]+)(?P<bias>_bias)?(?:_splitk(?P<split>serial|parallel))?")
_ITER = {"analytic": "analytic", "opt": "optimized", "fewch": "few_channels", "fixch": "fixed_channels", None: "optimized"}
_CC = {"sm80": (80, False), "sm90a": (90, True)}


def kernel_from_name(index: int, name: str) -> ConvKernelRecord:
    """The dispatch-relevant record of a 2-D conv instance name (a bench record names kernels, not configs)."""
    m = _NAME.match(name)
    if not m or m["arch"] not in _CC:
        raise ValueError(f"{name}: not a 2-D sm80/sm90a conv instance name this replay reads")
    cc, specific = _CC[m["arch"]]
    return ConvKernelRecord(
        index=index, name=name, arch=m["arch"], cc=cc, arch_specific=specific, op=m["op"], dims=2, a=m["a"], c=m["c"],
        accumulator=m["acc"], alignment_a=int(m["al"]), alignment_b=int(m["alb"]), alignment_c=int(m["alc"]),
        tile=tuple(int(x) for x in m["tile"].split("x")),  # type: ignore[arg-type]
        cluster=tuple(int(x) for x in (m["cl"] or "1x1x1").split("x")),  # type: ignore[arg-type]
        iterator=_ITER[m["it"]], unity_stride=m["stride"] == "unity", split_k=bool(m["split"]),
        activation=m["act"], bias=bool(m["bias"]), clamp_min=0.0, clamp_max=0.0,
        cutlass_major=3 if specific else 2, tiles_per_sm=2 if "_gemm1x1_pingpong" in name else 1)


def case_geometry(text: str) -> dict[str, int]:
    """n, h, w, c, k, r, s, stride, pad, p, q of a bench case ('n=64,h=56,w=56,c=64,k=64,r=3,s=3,pad=1[,stride=2]')."""
    kv = dict(item.split("=") for item in text.split(","))
    g = {key: int(kv.get(key, default)) for key, default in
         (("n", 1), ("h", 1), ("w", 1), ("c", 1), ("k", 1), ("r", 1), ("s", 1), ("stride", 1), ("pad", 0))}
    g["p"] = (g["h"] + 2 * g["pad"] - g["r"]) // g["stride"] + 1
    g["q"] = (g["w"] + 2 * g["pad"] - g["s"]) // g["stride"] + 1
    return g


def profile_geometry(prob: dict[str, Any]) -> tuple[int, ...] | None:
    """(n, h, w, c, k, r, s, stride, p, q) of a 2-D profile problem with equal strides, else None."""
    st, pf, pb = list(prob.get("stride", [1, 1, 1])), list(prob.get("pad_front", [0, 0, 0])), list(prob.get("pad_back", [0, 0, 0]))
    if int(prob.get("d", 1)) != 1 or int(prob.get("t", 1)) != 1 or st[1] != st[2]:
        return None
    n, h, w, c, k, r, s = (int(prob[f]) for f in "nhwckrs")
    p = (h + pf[1] + pb[1] - r) // st[1] + 1
    q = (w + pf[2] + pb[2] - s) // st[1] + 1
    return (n, h, w, c, k, r, s, int(st[1]), p, q)


def replay(record: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    names = sorted({key[2:].split("@")[0] for r in record["rows"] for key in r["search_ms"] if key.startswith("k:")}
                   | {m["name"] for m in profile["measurements"] if m.get("kind") == "kernel" and m.get("status") == "ok"})
    kernels = [kernel_from_name(i, n) for i, n in enumerate(names)]
    idx = {k.name: k.index for k in kernels}
    env = profile.get("environment") or {}
    cc = int(str(env.get("cc", "9.0")).replace(".", "")) if env.get("cc") else 90
    sms = int(env.get("sm_count") or 0)
    rows = []
    for m in profile["measurements"]:
        if m.get("kind") != "kernel" or m.get("status") != "ok" or not (m.get("stats") or {}).get("median_ms"):
            continue
        g = profile_geometry(m["problem"])
        if g is None:
            continue
        rows.append((idx[m["name"]], *g, int(m.get("split_k") or 1),
                     max(int(round(m["stats"]["median_ms"] * 1e9)), 1), sms, cc))
    measured = measured_records(rows)
    winners: dict[tuple, tuple] = {}
    for r in rows:         # the tuning table: each (op, problem)'s fastest kernel and split
        key = (kernels[r[0]].op, kernels[r[0]].a, r[1:11])
        if key not in winners or r[12] < winners[key][12]:
            winners[key] = r
    # in tuning.json's order (emitter.profile.selection: sorted by op, then the problem's key): ties of the distance
    # keep record order in the dispatch
    label = {tuple(g): ConvProblem.from_dict(m["problem"]).label("x") for m in profile["measurements"]
             if m.get("kind") == "kernel" and (g := profile_geometry(m["problem"])) is not None}
    order = sorted(winners, key=lambda key: (key[0], key[1], label[key[2]]))
    tuning = [ConvTuningRecord(winners[key][0], *winners[key][1:11], split_k=winners[key][11]) for key in order]
    out = []
    for row in record["rows"]:
        g = case_geometry(row["case"])
        q = ConvQuery(op=row["op"], a=row["dtype"], c=row["dtype"], n=g["n"], h=g["h"], w=g["w"], ci=g["c"], k=g["k"],
                      r=g["r"], s=g["s"], p=g["p"], q=g["q"], stride=(g["stride"], g["stride"]), cc=cc)
        times = {key[2:]: v for key, v in row["search_ms"].items() if key.startswith("k:")}
        runs = {key.split("@")[0] for key in times}
        oracle = min(times, key=times.get)
        case: dict[str, Any] = {"case": row["case"], "op": row["op"], "oracle": oracle, "oracle_ms": times[oracle],
                                "bench_pick": row["kernel"], "bench_why": row.get("why"),
                                "bench_lib_vs_oracle": row["ratios"].get("lib_vs_oracle")}
        for rule, ms in (("winners", ()), ("predicted", measured)):
            order = candidate_order(kernels, tuning, q, ms, available=lambda i: kernels[i].name in runs)
            if not order:
                case[rule] = {"kernel": None, "ms": None, "vs_oracle": None, "why": "no candidate"}
                continue
            c = order[0]
            split = launch_split_k(kernels, tuning, ms, c, q, sms)
            name = kernels[c.kernel].name
            label = name + (f"@splitk{split}" if split > 1 else "")
            t, source = times.get(label), "search"
            if t is None and name == row["kernel"]:
                t, source = row["search_ms"].get("library_c"), "library_time"
            why = ("predicted from {}".format(
                "x".join(map(str, (ms[c.measured].n, ms[c.measured].h, ms[c.measured].c, ms[c.measured].k))))
                if c.measured >= 0 else "nearest winner" if c.tuning >= 0 else "static priority")
            case[rule] = {"kernel": label, "ms": t, "judged_by": source if t else None,
                          "vs_oracle": times[oracle] / t if t else None, "why": why}
        out.append(case)

    def summary(rule: str, op: str | None = None) -> dict[str, Any]:
        v = [c[rule]["vs_oracle"] for c in out if c[rule]["vs_oracle"] and (op is None or c["op"] == op)]
        n = sum(1 for c in out if op is None or c["op"] == op)
        return {"geomean_vs_oracle": math.exp(sum(map(math.log, v)) / len(v)) if v else None,
                "min_vs_oracle": min(v) if v else None, "judged": len(v), "cases": n}

    ops = sorted({c["op"] for c in out}, key=["fprop", "dgrad", "wgrad"].index)
    return {"cases": out, "tuning_records": len(tuning), "measured_records": len(measured),
            "summary": {r: {"all": summary(r), **{op: summary(r, op) for op in ops}} for r in ("winners", "predicted")}}


def _short(name: str | None) -> str:
    if not name:
        return "-"
    m = re.search(r"_(\d+x\d+x\d+)_(?:c(\d+x\d+x\d+)|w[\dx]+)_.*?_(unity|strided).*?(_gemm1x1_\w+?_persistent|_gemm1x1_\w+)?(@splitk\d+)?$", name)
    if not m:
        return name
    return f"{m[1]}{'_c' + m[2] if m[2] else '_sm80'}{(m[4] or '').replace('_persistent', '')}{m[5] or ''}"


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
    fmt = lambda x: f"{x:.3f}" if x else "  -  "   # noqa: E731
    for c in res["cases"]:
        p, w = c["predicted"], c["winners"]
        print(f"{c['op']:5} {c['case']:<46} predicted {_short(p['kernel']):<34} {fmt(p['vs_oracle'])}  winners "
              f"{_short(w['kernel']):<34} {fmt(w['vs_oracle'])}  oracle {_short(c['oracle'])}  (bench {fmt(c['bench_lib_vs_oracle'])})")
    for r, by in res["summary"].items():
        print(f"{r}: " + "; ".join(f"{op} geomean {fmt(s['geomean_vs_oracle'])} min {fmt(s['min_vs_oracle'])} "
                                   f"({s['judged']}/{s['cases']} judged)" for op, s in by.items()))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
