"""GEMM library dispatch between profiled shapes (emitter/families/gemm/library_dispatch.py step 4 and options_fit):
every kernel's time per profiled shape, from the profile.json beside the tuning table, ranks the candidates by
predicted time; a record's run-time scheduler options run only where they cost no tile padding. The C++ twin is
checked against these in tests/gemm/test_gemm_library.py (test_cpp_dispatch_matches_python, the fake-CUDA API test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from emitter.families.gemm.library_dispatch import (Candidate, Query, candidate_order, effective_options,
                                                    effective_split_k, kernel_records, measured_records, options_fit,
                                                    predicted_cost, tuning_records, wave_log)
from emitter.library.export import export_library

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_helpers import _cfg, _write_manifest  # noqa: E402

SWZ8 = 4   # options: max swizzle 8 (emitter.kit.scheduler)


def _sm90(tile, cluster=(1, 1, 1), sched="persistent", **kw) -> dict:
    c = _cfg(tile=tile, **kw)
    c.update(cluster=list(cluster), tile_scheduler=sched)
    return c


CFGS = {"k128x256": _sm90((128, 256, 64), (2, 1, 1)), "k256x160": _sm90((256, 160, 64), (1, 2, 1)),
        "k64x128": _sm90((64, 128, 64), (2, 1, 1)), "k64x64": _sm90((64, 64, 64), (2, 1, 1)),
        "ksplit": _sm90((128, 16, 128), sched="stream_k", split_k="serial")}


def _records():
    ks = kernel_records([{"name": n, "arch": "sm90a", "family": "gemm", "config": c} for n, c in CFGS.items()])
    return ks, {k.name: k.index for k in ks}


def test_options_fit_is_the_scheduler_padding():
    ks, idx = _records()
    big = ks[idx["k128x256"]]
    # 3000^3: 24 x 12 tiles; swizzle 8 rounds them to 32 x 16 (512 launched for 288)
    assert not options_fit(big, SWZ8, 3000, 3000)
    # 6144 x 4096: 48 x 16 tiles are multiples of 8 x cluster already; 4096^3 its own shape
    assert options_fit(big, SWZ8, 6144, 4096) and options_fit(big, SWZ8, 4096, 4096)
    # raster only (bits 4-5): never pads; no options: nothing to check
    assert options_fit(big, 3 << 4, 3000, 3000) and options_fit(big, 0, 3000, 3000)
    # effective_options: the record's options at its own shape and where they fit, none where they pad
    ts = tuning_records([(big.index, 4096, 4096, 4096, 1, 90, 1, SWZ8)])
    c = Candidate(big.index, 0)
    q = lambda m, n: Query(op=big.op, m=m, n=n, k=3000)   # noqa: E731
    assert effective_options(ks, ts, c, q(4096, 4096)) == SWZ8
    assert effective_options(ks, ts, c, q(6144, 4096)) == SWZ8
    assert effective_options(ks, ts, c, q(3000, 3000)) == 0
    assert effective_options(ks, ts, Candidate(big.index, -1), q(4096, 4096)) == 0


def test_wave_model():
    ks, idx = _records()
    big, wide = ks[idx["k128x256"]], ks[idx["k256x160"]]
    # 3000^3 on 132 SMs: 288 tiles -> 3 waves (396 slots), 240 tiles (12 x 19 -> 20 for the 1x2 cluster) -> 2 waves
    assert wave_log(big, 3000, 3000, 1, 1, 132) > wave_log(wide, 3000, 3000, 1, 1, 132) > 0
    # a full last wave wastes nothing; an unknown SM count models no waves
    assert wave_log(big, 128 * 132, 256, 1, 1, 132) == 0 and wave_log(big, 3000, 3000, 1, 1, 0) == 0


def _measured(ks, idx, rows):
    return measured_records((idx[n], m, nn, k, 1, 90, s, o, int(ms * 1e9), 132) for n, m, nn, k, s, o, ms in rows)


def test_predicted_order_between_shapes_exact_record_wins():
    ks, idx = _records()
    # 4096^3: 128x256 (swizzle 8) won narrowly; 256x160 close behind
    rows = [("k128x256", 4096, 4096, 4096, 1, SWZ8, 0.200), ("k256x160", 4096, 4096, 4096, 1, 0, 0.205),
            ("k64x128", 4096, 4096, 4096, 1, 0, 0.300), ("ksplit", 4096, 4096, 4096, 2, 0, 1.5)]
    ms = _measured(ks, idx, rows)
    ts = tuning_records([(idx["k128x256"], 4096, 4096, 4096, 1, 90, 1, SWZ8)])
    q = Query(op=ks[0].op, m=3000, n=3000, k=3000)
    order = candidate_order(ks, ts, q, ms)
    # 256x160 first (2 waves against 3), anchored at the 4096^3 record; 64x64 never measured: last, fallback order
    assert [ks[c.kernel].name for c in order][:2] == ["k256x160", "k128x256"] and order[-1].kernel == idx["k64x64"]
    assert order[0].tuning == 0 and ms[order[0].measured].kernel == idx["k256x160"]
    assert predicted_cost(ks[idx["k256x160"]], ms[order[0].measured], q) < predicted_cost(ks[idx["k128x256"]], ms[order[1].measured], q)
    # the 128x256 candidate keeps no swizzle here (it would pad), the split-K one its 2 slices
    assert effective_options(ks, ts, order[1], q, ms) == 0
    split = next(c for c in order if c.kernel == idx["ksplit"])
    assert effective_split_k(ks, ts, split, q, ms) == 2
    # without measurements: today's rule (the nearest winner first)
    assert ks[candidate_order(ks, ts, q)[0].kernel].name == "k128x256"
    # at the profiled shape itself the winner wins outright, with its options
    q0 = Query(op=ks[0].op, m=4096, n=4096, k=4096)
    first = candidate_order(ks, ts, q0, ms)[0]
    assert (ks[first.kernel].name, first.measured, effective_options(ks, ts, first, q0, ms)) == ("k128x256", -1, SWZ8)
    # an explicit split-K request: today's rule too
    assert all(c.measured < 0 for c in candidate_order(ks, ts, Query(op=ks[0].op, m=3000, n=3000, k=3000, split_k=2), ms))
    # measurements of another GPU generation are not used
    ms80 = measured_records((r.kernel, r.m, r.n, r.k, 1, 80, r.split_k, r.options, r.time_ps, 108) for r in ms)
    assert all(c.measured < 0 for c in candidate_order(ks, ts, q, ms80))


def _profile(path: Path, rows: list[tuple]) -> None:
    path.write_text(json.dumps({"schema_version": 1, "kind": "emitter.profile",
                                "environment": {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132},
                                "measurements": [{"kind": "kernel", "name": n, "status": st, "split_k": s, "options": o,
                                                  "problem": {"m": m, "n": nn, "k": k, "batch": 1},
                                                  "stats": {"median_ms": t}} for n, m, nn, k, s, o, t, st in rows]}))


def test_export_reads_the_profile_beside_the_tuning_table(tmp_path):
    gen = _write_manifest(tmp_path / "gen", CFGS)
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "tuning.json").write_text(json.dumps({"schema_version": 1, "gpu": {"cc": "9.0", "sm_count": 132}, "entries": [
        {"problem": {"m": 4096, "n": 4096, "k": 4096, "batch": 1}, "kernel": "k128x256", "options": SWZ8, "median_ms": 0.2}]}))
    rows = [("k128x256", 4096, 4096, 4096, 1, SWZ8, 0.200, "ok"), ("k256x160", 4096, 4096, 4096, 1, 0, 0.205, "ok"),
            ("k64x64", 4096, 4096, 4096, 1, 0, 0.1, "check_failed"), ("elsewhere", 4096, 4096, 4096, 1, 0, 0.1, "ok")]
    _profile(prof / "profile.json", rows)
    r = export_library([gen], "predlib", tmp_path / "lib", tuning=[prof / "tuning.json"])
    got = [(m["kernel"], m["time_ps"], m["sms"]) for m in r.manifest["measured"]]
    assert got == [("k128x256", 200_000_000, 132), ("k256x160", 205_000_000, 132)]   # failed and foreign ones left out
    assert any("3 kernel timings on 1 shapes" in n for n in r.notes), r.notes   # read; one is not in the library
    assert any("1 profile timings left out" in n for n in r.notes), r.notes
    table = (tmp_path / "lib" / "src" / "predlib_table.cpp").read_text()
    assert "const int kMeasuredCount = 2;" in table
    # a profile.json of another run (it lacks the table's winner) is not used, and the export says so
    _profile(prof / "profile.json", rows[1:])
    r = export_library([gen], "predlib", tmp_path / "lib2", tuning=[prof / "tuning.json"])
    assert r.manifest["measured"] == [] and any("does not hold the tuning table's winner k128x256" in n for n in r.notes)
    # not JSON: a note, no traceback
    (prof / "profile.json").write_text("{")
    r = export_library([gen], "predlib", tmp_path / "lib3", tuning=[prof / "tuning.json"])
    assert r.manifest["measured"] == [] and any("not read" in n for n in r.notes)
