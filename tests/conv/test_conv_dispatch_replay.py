"""The conv library's dispatch replayed on the 2026-11-27 H200 library benchmark record (every exported kernel's time
on each of its 24 evaluation cases, split-K kernels at the counts the profiler tries) without a GPU:
emitter/families/conv/library_replay.py.

The record holds no tuning-problem times (the profile's profile.json and tuning.json stayed on the GPU machine: the
record keeps their counts only, 15 kernels and 30 tuning entries), so the tuning run is a synthetic profile.json
(tests/fixtures/conv_profile_h200_synthetic.json, written by `synthetic_profile` below): each kernel's time on the
10 tuning problems any of them runs, from a wave model calibrated on the record's own times (per kernel and filter
class, a rate per tile slot, a launch floor, an HBM floor, the split-K reduction's traffic). Its picks are judged
against the record's measured eval times -- real numbers -- but the tuning inputs are modelled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from emitter.families.conv.library_dispatch import reduction_iters, tile_grid
from emitter.families.conv.library_replay import case_geometry, kernel_from_name, main, replay

FIX = Path(__file__).resolve().parents[1] / "fixtures"
RECORD = Path(__file__).resolve().parents[2] / "docs" / "perf" / "library" / "conv-2026-11-27-h200.json"
PROFILE = FIX / "conv_profile_h200_synthetic.json"

SMS, HBM, FLOOR_MS = 132, 3.0e12, 0.004      # H200: SMs, effective bytes/s, launch floor


def _geo(g: dict) -> tuple[int, ...]:
    return (g["n"], g["h"], g["w"], g["c"], g["k"], g["r"], g["s"], g["p"], g["q"])


def _work(k, g: dict, split: int) -> tuple[float, float]:
    """(tile-slot waves x FLOPs per unit, bytes) of kernel k on geometry g at `split` slices."""
    dims = _geo(g)
    bm, bn = tile_grid(k, k.op, *dims)
    iters = reduction_iters(k, k.op, *dims)
    cs = k.cluster[0] * k.cluster[1]
    slots = SMS // cs * cs * k.tiles_per_sm
    unit = 2 * k.tile[0] * k.tile[1] * k.tile[2]
    if k.split_k and k.arch_specific and split <= 1:         # stream-K over every SM
        work = bm * bn * iters * unit / slots
    else:
        work = -(-bm * bn * split // slots) * -(-iters // split) * unit
    n, c, kk = g["n"], g["c"], g["k"]
    bytes_ = 2 * (n * g["h"] * g["w"] * c + kk * g["r"] * g["s"] * c + n * g["p"] * g["q"] * kk)
    if split > 1:
        bytes_ += 8 * split * kk * c * g["r"] * g["s"]       # wgrad's f32 partials, written and read back
    return work, bytes_


def _klass(g: dict) -> str:
    return "1x1" if g["r"] == g["s"] == 1 else "rxs"


def calibrate(record: dict) -> dict[tuple[str, str], float]:
    """Per (kernel, filter class): the median over the record's cases of the rate (FLOP/s per tile slot) that
    explains its time."""
    rates: dict[tuple[str, str], list[float]] = {}
    for row in record["rows"]:
        g = case_geometry(row["case"])
        if g["stride"] != 1:
            continue
        for key, t in row["search_ms"].items():
            if not key.startswith("k:"):
                continue
            name, _, sp = key[2:].partition("@splitk")
            k = kernel_from_name(0, name)
            work, _ = _work(k, g, int(sp or 1))
            _, bytes_ = _work(k, g, int(sp or 1))
            rates.setdefault((name, _klass(g)), []).append(work / max(t * 1e-3 - FLOOR_MS * 1e-3 - bytes_ / HBM, 2e-6))
    return {key: sorted(v)[len(v) // 2] for key, v in rates.items()}


def model_ms(rates: dict, k, g: dict, split: int) -> float | None:
    rate = rates.get((k.name, _klass(g)))
    if rate is None:
        return None
    work, bytes_ = _work(k, g, split)
    return (work / rate + bytes_ / HBM + FLOOR_MS * 1e-3) * 1e3


def runs(k, g: dict) -> bool:
    """What the kernels' shims accept (the record's cases agree): gemm_1x1 kernels 1x1, stride 1, no padding; unity
    kernels stride 1; C and K multiples of the kernel's alignment (8 here: no kernel runs the C = 3 stem, which the
    record's 30 tuning entries, 10 problems x 3 ops, agree with)."""
    if "gemm1x1" in k.name and (g["r"], g["s"], g["stride"], g["pad"]) != (1, 1, 1, 0):
        return False
    if k.unity_stride and g["stride"] != 1:
        return False
    return g["c"] % k.alignment_a == 0 and g["k"] % k.alignment_a == 0


def split_choices(k, g: dict) -> list[int]:
    """emitter.families.conv.runtime.split_k_choices for a parallel split-K kernel (the profile's sweep)."""
    if not k.split_k:
        return [1]
    bm, bn = tile_grid(k, k.op, *_geo(g))
    most = max(1, min(64, reduction_iters(k, k.op, *_geo(g)) // 8))
    wave = max(1, SMS // (bm * bn))
    return sorted({1} | {max(1, min(most, s)) for s in (wave // 2, wave, 2 * wave)})


def _distance(a: dict, b: dict) -> int:
    from emitter.kit.library import log2_fixed as lg

    return (abs(lg(a["n"] * a["p"] * a["q"]) - lg(b["n"] * b["p"] * b["q"])) + abs(lg(a["k"]) - lg(b["k"]))
            + abs(lg(a["c"]) - lg(b["c"])))


def _key(text: str) -> str:
    from emitter.families.conv.problem import parse_problem, problem_from_mapping

    return problem_from_mapping(parse_problem(text)[0]).label("x")


def inferred_winners(record: dict) -> dict[tuple[str, str], tuple[str, int | None]]:
    """(op, tuning problem) -> (kernel, split-K count or None): what the record's `tuned` picks say the real tuning
    table held. Without profile.json the library launches the winner of the nearest tuning record of the case's
    filter class, so each tuned pick was the winner at the nearest tuning problem (where several
    tie, the first in the tuning table's order: the problem's key); its split-K count is known where the bench timed the pick's kernel at one count within 1% of the library's
    C-API time."""
    out: dict[tuple[str, str], tuple[str, int | None]] = {}
    for row in record["rows"]:
        if row.get("why") != "tuned":
            continue
        g = case_geometry(row["case"])
        same = [t for t in record["tune"] if (case_geometry(t)["r"], case_geometry(t)["s"], case_geometry(t)["stride"])
                == (g["r"], g["s"], g["stride"])]
        best = min(_distance(case_geometry(t), g) for t in same)
        lib = row["search_ms"]["library_c"]
        splits = [int(key.partition("@splitk")[2] or 1) for key, t in row["search_ms"].items()
                  if key.startswith("k:" + row["kernel"]) and abs(t / lib - 1) < 0.01]
        nearest = min((t for t in same if _distance(case_geometry(t), g) == best), key=_key)
        out[(row["op"], nearest)] = (row["kernel"], splits[0] if len(splits) == 1 else None)
    return out


def synthetic_profile(record: dict) -> dict:
    rates = calibrate(record)
    pins = inferred_winners(record)
    names = sorted({key[2:].split("@")[0] for r in record["rows"] for key in r["search_ms"] if key.startswith("k:")})
    ms = []
    layer = lambda g: tuple(g[f] for f in ("h", "w", "c", "k", "r", "s", "stride", "pad"))  # noqa: E731
    for shape in record["tune"]:
        g = case_geometry(shape)
        # an eval case of the same layer at another batch: its measured time, scaled by the model's batch ratio
        found: dict[str, list[tuple[str, int, float]]] = {}
        sibling = {row["op"]: row for row in record["rows"] if layer(case_geometry(row["case"])) == layer(g)}
        for name in names:
            k = kernel_from_name(0, name)
            if not runs(k, g):
                continue
            for split in split_choices(k, g):
                t = model_ms(rates, k, g, split)
                if t is None:
                    continue
                row = sibling.get(k.op)
                key = "k:" + name + (f"@splitk{split}" if split > 1 else "")
                if row is not None and key in row["search_ms"]:
                    t = row["search_ms"][key] * t / model_ms(rates, k, case_geometry(row["case"]), split)
                found.setdefault(k.op, []).append((name, split, t))
        pad = [0, g["pad"], g["pad"]]
        for op, timed in found.items():
            pinned, pin_split = pins.get((op, shape), (None, None))
            if pinned is not None:     # the record's inferred winner: 1% ahead of the model's best where it is not
                best = min(t for _, _, t in timed)
                own = [t for n, sp, t in timed if n == pinned and pin_split in (None, sp)]
                scale = min(1.0, 0.99 * best / min(own)) if own else 1.0
                timed = [(n, sp, t * scale if n == pinned and pin_split in (None, sp) else t) for n, sp, t in timed]
            for name, split, t in timed:
                k = kernel_from_name(0, name)
                ms.append({"kind": "kernel", "name": name, "status": "ok", "split_k": split, "options": 0,
                           "op": {"family": "conv", "op": k.op, "dims": 2, "a": k.a, "c": k.c},
                           "problem": {"family": "conv", "n": g["n"], "d": 1, "h": g["h"], "w": g["w"], "c": g["c"],
                                       "k": g["k"], "t": 1, "r": g["r"], "s": g["s"], "pad_front": pad, "pad_back": pad,
                                       "stride": [1, g["stride"], g["stride"]], "dilation": [1, 1, 1]},
                           "stats": {"median_ms": round(t, 6)}})
    return {"schema_version": 1, "kind": "emitter.profile", "synthetic": "tests/conv/test_conv_dispatch_replay.py",
            "environment": {"name": "NVIDIA H200 (modelled)", "cc": "9.0", "sm_count": SMS}, "measurements": ms}


def test_fixture_is_its_generator():
    """The fixture is what synthetic_profile writes (regenerate: .venv/bin/python tests/conv/test_conv_dispatch_replay.py)."""
    assert json.loads(PROFILE.read_text()) == synthetic_profile(json.loads(RECORD.read_text()))


def test_model_matches_measured_times_it_was_not_fitted_on():
    """The synthetic times are calibrated, not invented: against the conv bench's H200 times of the same kernels on
    ResNet-50's layers at N = 128 (docs/perf/families/conv-2026-11-27b-h200.json, fprop and dgrad; none of them is
    in the fit) the model's median error is under 20% (the worst, 1x1 layers at 56^2 that the record has no case
    of, about 2.4x)."""
    rates = calibrate(json.loads(RECORD.read_text()))
    bench = json.loads((RECORD.parents[1] / "families" / "conv-2026-11-27b-h200.json").read_text())
    errs = []
    for row in bench["rows"]:
        if row["dtype"] != "f16" or not row.get("candidates"):
            continue
        g = dict(row["problem"])
        g["p"] = g["q"] = (g["h"] + 2 * g["pad"] - g["r"]) // g["stride"] + 1
        flops = 2 * g["n"] * g["p"] * g["q"] * g["k"] * g["c"] * g["r"] * g["s"]
        for name, tflops in row["candidates"].items():
            try:
                k = kernel_from_name(0, name)
            except ValueError:
                continue
            t = model_ms(rates, k, g, 1)
            if t is not None:
                errs.append(abs(math.log(t / (flops / tflops / 1e9))))
    errs.sort()
    assert len(errs) >= 50
    assert errs[len(errs) // 2] < math.log(1.2) and errs[-1] < math.log(2.5), errs[-5:]


def test_inferred_winners():
    """What the record's tuned picks say about the real tuning table (the 1x1 layers have no eval case of their own)."""
    pins = inferred_winners(json.loads(RECORD.read_text()))
    assert pins[("dgrad", "n=32,h=14,w=14,c=1024,k=256,r=1,s=1")][0].endswith("_gemm1x1_pingpong_persistent")
    assert pins[("wgrad", "n=32,h=14,w=14,c=1024,k=256,r=1,s=1")] == (
        "conv2d_wgrad_sm90a_f16_f16_accf32_nhwc_64x64x64_c1x2x1_s8_strided_al8x8x8_identity_splitkparallel", 2)
    # the n=64 28^2 1x1 cases tie between two tuning layers at distance 5: the first in tuning.json's order ranked
    assert ("fprop", "n=128,h=14,w=14,c=1024,k=256,r=1,s=1") in pins
    assert ("fprop", "n=128,h=56,w=56,c=64,k=256,r=1,s=1") not in pins


def test_replay_reproduces_the_record_with_todays_rule():
    """Fed today's rule (tuning records, then the static priority), the replay picks the kernel the bench's library
    picked on every case, and its lib / oracle figures are the record's within noise: the min is the same case
    (wgrad 7^2 C2048, 0.624); the geomean differs by one case whose tuned split-K count the record does not name
    (wgrad 28^2 K512: judged at 1 slice, 0.739, where the library got 0.882) and by the record's own retiming noise
    (its figures above 1.0)."""
    record = json.loads(RECORD.read_text())
    res = replay(record, json.loads(PROFILE.read_text()))
    assert [c["winners"]["kernel"].split("@")[0] for c in res["cases"]] == [r["kernel"] for r in record["rows"]]
    s = res["summary"]["winners"]["all"]
    assert s["judged"] == 24
    assert abs(s["min_vs_oracle"] - record["summary"]["lib_vs_oracle_min"]) < 0.005
    assert abs(s["geomean_vs_oracle"] - record["summary"]["lib_vs_oracle_geomean"]) < 0.015
    assert res["tuning_records"] == record["tuning_entries"] == 30


def test_replay_predicted_rule():
    """The predicted-time rule against today's on the same record (all 24 cases judged by measured times)."""
    res = replay(json.loads(RECORD.read_text()), json.loads(PROFILE.read_text()))
    cases = {(c["op"], c["case"]): c for c in res["cases"]}
    # fprop 7^2 C2048 1x1: the nearest winner (an implicit kernel at 14^2) was 0.90 of the best; the prediction
    # finds the 128x256 GEMM kernel, whose 74 tiles fill one wave of 132 SMs
    c = cases[("fprop", "n=96,h=7,w=7,c=2048,k=512,r=1,s=1")]
    assert c["predicted"]["vs_oracle"] > 0.99 > 0.91 > c["winners"]["vs_oracle"]
    # wgrad 7^2 C2048 1x1: 0.62 -> 0.88
    c = cases[("wgrad", "n=96,h=7,w=7,c=2048,k=512,r=1,s=1")]
    assert c["predicted"]["vs_oracle"] > 0.85 > 0.63 > c["winners"]["vs_oracle"]
    # exact layers aside, where both rules agree the prediction loses nothing measured here ...
    worse = [(key, c["predicted"]["vs_oracle"], c["winners"]["vs_oracle"]) for key, c in cases.items()
             if c["predicted"]["vs_oracle"] < c["winners"]["vs_oracle"] - 0.01]
    assert worse == [], worse
    p, w = res["summary"]["predicted"], res["summary"]["winners"]
    assert p["all"]["geomean_vs_oracle"] > w["all"]["geomean_vs_oracle"] + 0.02
    assert p["all"]["min_vs_oracle"] > w["all"]["min_vs_oracle"] + 0.1
    for op in ("fprop", "dgrad", "wgrad"):
        assert p[op]["geomean_vs_oracle"] >= w[op]["geomean_vs_oracle"], op


def test_replay_cli(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([str(RECORD), str(PROFILE), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "n=96,h=7,w=7,c=2048,k=512,r=1,s=1" in text and "predicted: all geomean" in text
    assert json.loads(out.read_text())["summary"]["predicted"]["all"]["judged"] == 24
    assert main([str(tmp_path / "missing.json"), str(PROFILE)]) == 2


if __name__ == "__main__":
    PROFILE.write_text(json.dumps(synthetic_profile(json.loads(RECORD.read_text())), indent=0))
    print(f"wrote {PROFILE}")
