"""GEMM's exported library: the dispatch data, the Python mirror of the C++ selection (and that the two agree),
tuning records (split-K, scheduler options, fast accumulation), the generated C API on a stand-in CUDA runtime,
the C struct layout the Python loader relies on, and the loader module itself. The export stage's own behaviour
(tree, determinism, errors, CLI, CMake) is in tests/stages/test_library.py."""

from __future__ import annotations

import ctypes
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.cli import main as cli
from emitter.kit.library import ACTIVATIONS, DTYPES
from emitter.families.gemm import library_abi as abi
from emitter.families.gemm.library_dispatch import (LAYOUTS, Candidate, KernelRecord, Op, Query,
                                                    candidate_order, dispatch_order, effective_options,
                                                    effective_split_k, forced, kernel_records, log2_fixed, select,
                                                    measured_records, transpose, tuning_records)
from emitter.families.gemm.library_tuning import TuningError, load as load_tuning
from emitter.library.export import LibraryError, export_library

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_helpers import (SM80, SM90A, _FAKE_CUDA, _FAKE_KERNELS, _cfg, _compile, _tuning,  # noqa: E402,F401
                             _write_manifest, manifest_dir)


# ---- fixed-point log2 -----------------------------------------------------------------------------

def test_log2_fixed_exact_on_powers_of_two_and_close_elsewhere():
    for e in range(0, 40):
        assert log2_fixed(1 << e) == e << 16
    rnd = random.Random(1)
    prev = -1
    for x in sorted(rnd.randrange(1, 1 << 33) for _ in range(2000)) + [3, 5, 7, 1000, 4095, 65537]:
        v = log2_fixed(x)
        assert abs(v / 65536 - math.log2(x)) < 2 ** -15
    for x in range(1, 5000):
        v = log2_fixed(x)
        assert v >= prev
        prev = v
    with pytest.raises(ValueError):
        log2_fixed(0)


# ---- the Python selection rule --------------------------------------------------------------------

def _fp8(**kw) -> dict:
    """An sm90a e4m3 x e4m3 -> bf16 kernel config (fast=True: fp8 fast accumulation)."""
    return _cfg(a="e4m3", cd="bf16", tile=kw.pop("tile", (128, 128, 128)), align=kw.pop("align", 16), **kw)


def _records(cfgs: dict[str, dict]) -> list[KernelRecord]:
    return kernel_records([{"name": n, "arch": c["arch"], "family": "gemm", "config": c} for n, c in cfgs.items()])


def _query(k: KernelRecord, m, n, kk, cc=90, batch=1, acc=None) -> Query:
    op = k.op if acc is None else Op(**{**k.op.__dict__, "acc": acc})
    return Query(op=op, m=m, n=n, k=kk, batch=batch, cc=cc)


def test_nearest_tuned_shape_first_then_fallback_rank():
    ks = _records({"big": _cfg(tile=(128, 256, 64)), "small": _cfg(tile=(64, 128, 64)),
                   "mid": _cfg(tile=(128, 128, 64)), "old": _cfg(arch="sm80", tile=(128, 128, 32)),
                   "other_dtype": _cfg(a="f16")})
    idx = {k.name: k.index for k in ks}
    ts = tuning_records([(idx["big"], 4096, 4096, 4096, 1), (idx["small"], 128, 4096, 4096, 1)])
    big = ks[idx["big"]]
    names = lambda q: [ks[c.kernel].name for c in candidate_order(ks, ts, q)]
    # near 4096^3: big first, then the winner of the next-nearest shape, then untuned by rank (sm90a before sm80)
    assert names(_query(big, 3000, 5000, 4096)) == ["big", "small", "mid", "old"]
    assert names(_query(big, 100, 4096, 4096)) == ["small", "big", "mid", "old"]
    # on an sm80 GPU the sm90a kernels drop out entirely
    assert names(_query(big, 100, 4096, 4096, cc=80)) == ["old"]
    # on sm89: 2.x kernels run on newer archs, sm90a only on exactly 90
    assert names(_query(big, 100, 4096, 4096, cc=89)) == ["old"]
    # exact operation match: the f16 kernel never serves bf16; accumulator "any" (0) or exact
    assert "other_dtype" not in names(_query(big, 64, 64, 64))
    assert names(_query(big, 64, 64, 64, acc=DTYPES["f16"])) == []
    # batched problems need batched kernels
    assert names(_query(big, 64, 64, 64, batch=4)) == []
    # record order breaks distance ties: (m, n, k) sorted, so the smaller shape wins a tie
    mid_q = _query(big, 724, 4096, 4096)   # log-equidistant-ish between 128 and 4096 in m
    order = candidate_order(ks, ts, mid_q)
    assert {ks[order[0].kernel].name, ks[order[1].kernel].name} == {"big", "small"}


def test_records_from_this_gpu_generation_come_first():
    ks = _records({"h100_pick": _cfg(tile=(128, 256, 64)), "a100_pick": _cfg(arch="sm80", tile=(128, 128, 32))})
    idx = {k.name: k.index for k in ks}
    # the A100 table's winner sits exactly at the problem's shape, the H100 table's far away
    ts = tuning_records([(idx["a100_pick"], 1000, 1000, 1000, 1, 80), (idx["h100_pick"], 8192, 8192, 8192, 1, 90)])
    order = lambda cc: [ks[c.kernel].name for c in candidate_order(ks, ts, _query(ks[0], 1000, 1000, 1000, cc=cc))]
    assert order(90) == ["h100_pick", "a100_pick"]
    assert order(80) == ["a100_pick"]
    # a record of unknown GPU counts as this generation's
    ts = tuning_records([(idx["a100_pick"], 1000, 1000, 1000, 1, 0), (idx["h100_pick"], 8192, 8192, 8192, 1, 90)])
    assert order(90) == ["a100_pick", "h100_pick"]


def test_fallback_rank_prefers_new_arch_wide_alignment_big_tile():
    ks = _records({"a_sm80": _cfg(arch="sm80"), "b_narrow": _cfg(align=2), "c_small": _cfg(tile=(64, 64, 64)),
                   "d_big": _cfg(tile=(256, 128, 64))})
    ranked = [k.name for k in sorted(ks, key=lambda k: k.fallback_rank)]
    assert ranked == ["d_big", "c_small", "b_narrow", "a_sm80"]
    assert [ks[c.kernel].name for c in candidate_order(ks, [], _query(ks[0], 64, 64, 64))] == ranked


def test_transposed_problem_and_can_implement_fallback():
    ks = _records({"tn": _cfg(), "tn_narrow": _cfg(align=2, tile=(64, 64, 64))})
    tn = ks[0]
    # D column-major with A row / B col: no direct kernel; D^T = B^T A^T is (row, col, row)
    q = Query(op=Op(**{**tn.op.__dict__, "lc": LAYOUTS["col"]}), m=300, n=200, k=64, cc=90)
    order = dispatch_order(ks, [], q)
    assert order and all(c.transposed for c in order)
    assert transpose(q).m == 200 and transpose(q).n == 300 and transpose(q).op.lc == LAYOUTS["row"]
    assert transpose(transpose(q)) == q
    # k = 1002: alignment 8 fails, alignment 2 works; k = 1001: none
    from emitter.families.gemm.library_dispatch import packed_can_implement
    q2 = _query(tn, 256, 256, 1002)
    assert ks[select(ks, [], q2, packed_can_implement).kernel].name == "tn_narrow"
    assert select(ks, [], _query(tn, 256, 256, 1001), packed_can_implement) is None


def test_bias_flips_under_transpose():
    per_row = Op(a=2, b=2, c=2, d=2, acc=3, la=1, lb=2, lc=1, act=0, bias=1)
    assert transpose(Query(op=per_row, m=10, n=20, k=30)).op.bias == 2


def test_effective_split_k_tuned_clamped_explicit_forced():
    ks = _records({"split": _cfg(tile=(128, 128, 64), split_k="serial"), "plain": _cfg(tile=(256, 128, 64))})
    idx = {k.name: k.index for k in ks}
    ts = tuning_records([(idx["split"], 128, 128, 8192, 1, 90, 8), (idx["plain"], 4096, 4096, 4096, 1, 90, 1)])
    split = ks[idx["split"]]

    def first(m, n, k, split_k=1):
        q = Query(op=split.op, m=m, n=n, k=k, split_k=split_k, cc=90)
        c = candidate_order(ks, ts, q)[0]
        return ks[c.kernel].name, effective_split_k(ks, ts, c, q)

    # near its tuned shape the split-K kernel runs with its tuned count
    assert first(128, 128, 8192) == ("split", 8)
    assert first(100, 200, 6000) == ("split", 8)
    # clamped so every slice keeps a whole k-block of tile k 64: k=300 has 4 blocks, k=100 one, k=10 none
    assert first(128, 128, 300) == ("split", 4)
    assert first(128, 128, 512) == ("split", 8)
    assert first(128, 128, 100) == ("split", 1)
    assert first(128, 128, 10) == ("split", 1)
    # the caller's split_k_slices > 1 wins (and only split-K kernels are candidates then)
    assert first(128, 128, 8192, split_k=3) == ("split", 3)
    assert first(128, 128, 64, split_k=16) == ("split", 16)
    # near the other shape the plain kernel (tuned 1) comes first; the split-K kernel behind it keeps its count
    q = Query(op=split.op, m=4096, n=4096, k=4096, cc=90)
    order = candidate_order(ks, ts, q)
    assert [(ks[c.kernel].name, effective_split_k(ks, ts, c, q)) for c in order] == [("plain", 1), ("split", 8)]
    # fallback order (no record) and forced (-2): the caller's count
    assert effective_split_k(ks, [], Candidate(idx["split"], -1), q) == 1
    assert effective_split_k(ks, ts, Candidate(idx["split"], -2), q) == 1
    assert effective_split_k(ks, ts, Candidate(idx["split"], -2), Query(op=split.op, m=1, n=1, k=8192, split_k=2)) == 2
    # a record with split_k > 1 on a kernel that is not split-K (export refuses it) never splits
    ts2 = tuning_records([(idx["plain"], 128, 128, 8192, 1, 90, 8)])
    assert effective_split_k(ks, ts2, Candidate(idx["plain"], 0), q) == 1
    # transposition keeps k, so the count does not change
    assert [effective_split_k(ks, ts, c, q) for c in dispatch_order(ks, ts, q) if c.transposed] == []


def _allow(q: Query, fast: bool = True) -> Query:
    return Query(**{**q.__dict__, "op": Op(**{**q.op.__dict__, "fast_accum": fast})})


def test_fast_accum_kernels_only_for_callers_who_opt_in():
    ks = _records({"full": _fp8(), "fast": _fp8(fast=True), "full_small": _fp8(tile=(64, 128, 128)),
                   "fast_small": _fp8(tile=(64, 128, 128), fast=True), "fast_only_relu": _fp8(act="relu", fast=True),
                   "fast_split": _fp8(fast=True, split_k="serial")})
    idx = {k.name: k.index for k in ks}
    assert [k.name for k in ks if k.fast_accum] == ["fast", "fast_only_relu", "fast_small", "fast_split"]
    # fast accumulation is part of the op: two kernels that differ only in it compute different ops
    assert ks[idx["full"]].op != ks[idx["fast"]].op and ks[idx["full"]].op.fast_accum is False
    # the fast op's winner at 4096^3, the normal op's at 128x4096x4096 (profile: two ops, no conflict)
    ts = tuning_records([(idx["fast"], 4096, 4096, 4096, 1, 90), (idx["full_small"], 128, 4096, 4096, 1, 90)])
    full = ks[idx["full"]]
    names = lambda q: [ks[c.kernel].name for c in dispatch_order(ks, ts, q)]
    rnd = random.Random(5)
    for _ in range(300):   # without the opt-in no order ever holds a fast-accum kernel (direct or transposed)
        q = Query(op=Op(**{**full.op.__dict__, "lc": rnd.choice([1, 2]), "act": rnd.choice([0, 1])}),
                  m=rnd.randrange(1, 9000), n=rnd.randrange(1, 9000), k=rnd.randrange(1, 9000),
                  split_k=rnd.choice([1, 1, 2]), cc=90)
        assert not any(ks[c.kernel].fast_accum for c in dispatch_order(ks, ts, q)), q
    q = _query(full, 4096, 4096, 4096)
    # default: the fast op's tuning record does not apply; the normal winner, then the fallback order
    assert names(q) == ["full_small", "full"]
    assert names(_query(full, 128, 4096, 4096)) == ["full_small", "full"]
    # opted in: the fast op's winner at its own shape ...
    # (split-K kernels serve split_k_slices = 1 problems too)
    assert names(_allow(q)) == ["fast", "full_small", "fast_split", "full", "fast_small"]
    # ... a normal kernel is still acceptable: the nearest profiled shape wins whichever op it was
    assert names(_allow(_query(full, 128, 4096, 4096))) == ["full_small", "fast", "fast_split", "full", "fast_small"]
    # at equal distance (and in the fallback order, between otherwise equal kernels) fast-accum comes first
    ts_tie = tuning_records([(idx["full"], 1024, 1024, 1024, 1, 90), (idx["fast_small"], 1024, 1024, 1024, 1, 90)])
    tie = lambda q: [ks[c.kernel].name for c in candidate_order(ks, ts_tie, q)]
    assert tie(_allow(_query(full, 1024, 1024, 1024)))[:2] == ["fast_small", "full"]
    assert tie(_allow(_query(full, 2048, 2048, 2048)))[:2] == ["fast_small", "full"]
    assert tie(_query(full, 1024, 1024, 1024)) == ["full", "full_small"]
    assert [ks[c.kernel].name for c in candidate_order(ks, [], _allow(_query(full, 64, 64, 64)))] == \
        ["fast", "fast_split", "full", "fast_small", "full_small"]
    # an op only fast-accum kernels compute: nothing without the opt-in
    relu = Query(op=Op(**{**full.op.__dict__, "act": ACTIVATIONS["relu"]}), m=256, n=256, k=256, cc=90)
    assert names(relu) == [] and names(_allow(relu)) == ["fast_only_relu"]
    # split_k_slices > 1: only the fast split-K kernel could run it
    split = Query(**{**q.__dict__, "split_k": 2})
    assert names(split) == [] and names(_allow(split)) == ["fast_split"]
    # transposition keeps the opt-in (and its absence)
    qt = Query(op=Op(**{**full.op.__dict__, "lc": LAYOUTS["col"]}), m=4096, n=4096, k=4096, cc=90)
    assert transpose(_allow(qt)).op.fast_accum and not transpose(qt).op.fast_accum
    assert names(qt) == ["full_small", "full"] and names(_allow(qt))[0] == "fast"
    assert all(c.transposed for c in dispatch_order(ks, ts, _allow(qt)))
    # forcing by name is the opt-in: a fast-accum kernel runs when named, whatever the flag says
    assert forced(ks, idx["fast"], q) == Candidate(idx["fast"], -2, False)
    assert forced(ks, idx["fast"], qt) == Candidate(idx["fast"], -2, True)
    assert forced(ks, idx["fast"], qt, allow_transpose=False) is None
    assert forced(ks, idx["full"], _allow(q)) == Candidate(idx["full"], -2, False)
    assert forced(ks, idx["fast_only_relu"], q) is None   # another operation
    # a fast-accum tuned split-K kernel keeps its slices only for an opted-in caller (it is no candidate otherwise)
    ts_split = tuning_records([(idx["fast_split"], 128, 128, 8192, 1, 90, 4)])
    qs = _allow(_query(full, 128, 128, 8192))
    first = candidate_order(ks, ts_split, qs)[0]
    assert ks[first.kernel].name == "fast_split" and effective_split_k(ks, ts_split, first, qs) == 4
    assert "fast_split" not in [ks[c.kernel].name for c in candidate_order(ks, ts_split, _allow(qs, False))]


def test_fast_accum_on_a_kernel_without_it_is_an_export_error():
    from emitter.families.gemm.library_dispatch import ExportError
    with pytest.raises(ExportError, match="fast accumulation is a mode of the sm90a fp8 wgmma"):
        _records({"bf16_fast": _cfg(fast=True)})
    with pytest.raises(ExportError, match="on a sm80 kernel"):
        _records({"sm80_fast": {**_fp8(fast=True), "arch": "sm80"}})
    with pytest.raises(ExportError, match="must be true or false"):
        _records({"odd": {**_fp8(), "fp8_fast_accum": "yes"}})
    # absent = false (manifests from before fp8_fast_accum)
    cfg = _fp8()
    del cfg["fp8_fast_accum"]
    assert not _records({"old": cfg})[0].fast_accum


# ---- export: tuning records and fast-accum kernels ------------------------------------------------

def test_tuning_split_k_parsing(tmp_path):
    t = tmp_path / "t.json"

    def table(*splits):
        entries = []
        for s_ in splits:
            e = {"problem": {"m": 64, "n": 64, "k": 4096}, "kernel": SM80}
            if s_ is not ...:
                e["split_k"] = s_
            entries.append(e)
        t.write_text(json.dumps({"schema_version": 1, "entries": entries}))
        return t

    assert [e.split_k for e in load_tuning(table(..., 1, 4, None, 16))] == [1, 1, 4, 1, 16]
    for bad in (0, -2, 2.0, "4", True, [2], 2 ** 31):
        with pytest.raises(TuningError) as ei:
            load_tuning(table(1, bad))
        msg = str(ei.value)
        assert str(t) in msg and "entries[1]" in msg and "split_k must be a positive integer" in msg, msg
        assert repr(bad) in msg


def test_tuning_split_k_needs_a_split_k_kernel(manifest_dir, tmp_path):
    # neither exported kernel is a split-K instance: a tuned count > 1 on one is an error, 1 is fine
    t = _tuning([(SM80, 256, 256, 8192, 1), (SM90A, 64, 64, 8192, 4)], tmp_path / "t.json")
    with pytest.raises(TuningError) as ei:
        export_library([manifest_dir], "mykernels", tmp_path / "o", tuning=[t])
    msg = str(ei.value)
    assert "entries[1]" in msg and str(t) in msg and SM90A in msg and "not a split-K instance" in msg, msg
    # the same entry for a kernel left out of the library is only dropped (as any entry for a missing kernel)
    r = export_library([manifest_dir], "mykernels", tmp_path / "o", tuning=[t], archs=["sm80"])
    assert [t_.split_k for t_ in r.tuning] == [1] and r.dropped_tuning[0]["kernel"] == SM90A
    # the CLI: a clear message, exit 2, no traceback
    res = CliRunner().invoke(cli, ["library", str(manifest_dir), "--tuning", str(t), "--name", "mykernels",
                                   "-o", str(tmp_path / "cli")])
    assert res.exit_code == 2 and "not a split-K instance" in res.output and "Traceback" not in res.output


def test_tuned_split_k_reaches_table_and_manifest(tmp_path):
    rnd = random.Random(3)
    entries = _synthetic_manifest(tmp_path / "gen", rnd, 6)
    for e in entries:
        e["config"]["split_k"], e["config"]["batched"] = "serial", False
    (tmp_path / "gen/manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0", "generated_at": None,
                                                          "specs": [], "instances": entries, "rejected": []}))
    name = entries[0]["name"]
    t = _tuning([(name, 128, 128, 8192, 6), (name, 4096, 4096, 4096, 1), (name, 128, 128, 8192, 2)], tmp_path / "t.json")
    r = export_library([tmp_path / "gen"], "splitlib", tmp_path / "o", tuning=[t])
    # two counts timed at one shape are a conflict: one is kept (equal medians: the smaller count), noted
    assert sorted((x.m, x.split_k) for x in r.tuning) == [(128, 2), (4096, 1)]
    assert any("@splitk6" in n for n in r.notes) and r.dropped_tuning[0]["split_k"] == 6
    m = json.loads((tmp_path / "o/manifest.json").read_text())
    assert sorted((x["problem"]["m"], x["split_k"]) for x in m["tuning"]) == [(128, 2), (4096, 1)]
    table = (tmp_path / "o/src/splitlib_table.cpp").read_text()
    rows = [line for line in table.splitlines() if line.endswith("// " + name)]
    assert len(rows) == 2 and rows[0].endswith(", 0, 2, 0},  // " + name)
    assert rows[1].endswith(", 0, 1, 0},  // " + name)
    res = CliRunner().invoke(cli, ["library", str(tmp_path / "gen"), "--tuning", str(t), "--name", "splitlib",
                                   "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "2 tuned shapes (1 run split-K)" in res.output and f"{name} split-K 6 @ 128x128x8192x1: conflict" in res.output


def test_tuned_scheduler_options_checked_and_kept(tmp_path):
    """A tuning entry's run-time scheduler options reach the table when its kernel has them; options a kernel
    lacks (any on 2.x, a nondeterministic reduction without stream-K) or undefined bits are export errors."""
    entries = _synthetic_manifest(tmp_path / "gen", random.Random(5), 12)
    sm80 = next(e["name"] for e in entries if e["arch"] != "sm90a")
    persistent = next(e["name"] for e in entries if e["arch"] == "sm90a" and e["config"]["split_k"] == "none")

    def table(name, options):
        t = tmp_path / f"t{options}.json"
        t.write_text(json.dumps({"schema_version": 1, "entries": [
            {"problem": {"m": 512, "n": 4096, "k": 4096}, "kernel": name, "options": options, "median_ms": 0.1}]}))
        return t

    r = export_library([tmp_path / "gen"], "optlib", tmp_path / "o", tuning=[table(persistent, 3 | 3 << 4)])
    assert [t.options for t in r.tuning] == [3 | 3 << 4]
    m = json.loads((tmp_path / "o/manifest.json").read_text())
    assert m["tuning"][0]["options"] == 3 | 3 << 4
    assert (tmp_path / "o/src/optlib_table.cpp").read_text().count(f", 0, 1, {3 | 3 << 4}}},  // {persistent}") == 1
    for name, options, words in ((sm80, 3, "sm90a"), (persistent, 2 << 6, "stream-K"), (persistent, 1 << 17, "bits")):
        with pytest.raises(TuningError, match=words):
            export_library([tmp_path / "gen"], "optlib", tmp_path / "bad", tuning=[table(name, options)])


def test_tuning_conflicts_and_op_mismatch(manifest_dir, tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"schema_version": 1, "entries": [
        {"problem": {"m": 256, "n": 256, "k": 256}, "kernel": SM90A,
         "op": {"a": "f16", "b": "f16", "c": "f16", "d": "f16", "layout_a": "row", "layout_b": "col", "layout_c": "row"}},
    ]}))
    r = export_library([manifest_dir], "mykernels", tmp_path / "o", tuning=[t])
    assert r.tuning == [] and "does not fit the kernel" in r.dropped_tuning[0]["reason"]


# fp8 kernels with and without fast accumulation (names as emitter gives them: a `fastacc` token), a fast-only
# operation, a fast split-K kernel and a bf16 kernel
FA_FULL = "gemm_sm90a_e4m3e4m3_bf16bf16_accf32_tnt_128x128x128_full"
FA_FAST = "gemm_sm90a_e4m3e4m3_bf16bf16_accf32_tnt_128x128x128_fastacc"
FA_RELU = "gemm_sm90a_e4m3e4m3_bf16bf16_accf32_tnt_128x128x128_fastacc_relu"
FA_SPLIT = "gemm_sm90a_e4m3e4m3_bf16bf16_accf32_tnt_128x128x128_fastacc_splitk"
FA_BF16 = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x128x64"
FA_CFGS = {FA_FULL: _fp8(), FA_FAST: _fp8(fast=True), FA_RELU: _fp8(fast=True, act="relu"),
           FA_SPLIT: _fp8(fast=True, split_k="serial"), FA_BF16: _cfg()}


def _op_json(cfg: dict) -> dict:
    from emitter.families.gemm.profile import Op as ProfileOp
    return ProfileOp.from_config(cfg).to_json()


def _fast_accum_library(tmp_path: Path, name: str = "falib"):
    """FA_CFGS exported with a tuning table as `emitter profile` writes it: the fast op's winner and the normal
    op's winner at one shape (two ops, no conflict), each op's `key` and `fast_accum`."""
    gen = _write_manifest(tmp_path / "gen", FA_CFGS)
    t = tmp_path / "tuning.json"
    entry = lambda kname, m, n, k, **kw: {"op": _op_json(FA_CFGS[kname]), "problem": {"m": m, "n": n, "k": k, "batch": 1},
                                          "kernel": kname, "median_ms": 0.1, **kw}
    t.write_text(json.dumps({"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {"cc": "9.0"}, "entries": [
        entry(FA_FAST, 4096, 4096, 4096), entry(FA_FULL, 4096, 4096, 4096), entry(FA_FULL, 128, 4096, 4096),
        entry(FA_SPLIT, 128, 128, 8192, split_k=4)]}))
    return export_library([gen], name, tmp_path / "lib", tuning=[t]), tmp_path / "lib", t


def test_export_fast_accum_kernels_and_tuning(tmp_path):
    r, out, t = _fast_accum_library(tmp_path)
    by = {k.name: k for k in r.kernels}
    assert by[FA_FAST].fast_accum and by[FA_SPLIT].fast_accum and not by[FA_FULL].fast_accum
    assert _op_json(FA_CFGS[FA_FAST])["key"].endswith("_fastacc") and _op_json(FA_CFGS[FA_FAST])["fast_accum"] is True
    # the fast and the normal winner of one shape are two operations: both kept, no conflict
    assert sorted((r.kernels[x.kernel].name, x.m) for x in r.tuning) == sorted(
        [(FA_FAST, 4096), (FA_FULL, 4096), (FA_FULL, 128), (FA_SPLIT, 128)])
    assert r.dropped_tuning == [] and not any("claim" in n for n in r.notes)
    m = json.loads((out / "manifest.json").read_text())
    assert {k["name"]: k["fast_accum"] for k in m["kernels"]} == {n: bool(c["fp8_fast_accum"]) for n, c in FA_CFGS.items()}
    assert "problem.fast_accum = 1" in m["dispatch"]["rule"]
    # fast and normal kernels of one dtype/layout/epilogue compute two operations: two groups
    assert sorted(m["dispatch"]["fallback_order"]) == sorted([[FA_BF16], [FA_FAST, FA_SPLIT], [FA_FULL], [FA_RELU]])
    # the table row carries the flag (op {..., activation, bias, fast_accum, clamp min, max})
    table = (out / "src/falib_table.cpp").read_text()
    row = lambda name: next(l for l in table.splitlines() if f'"{name}"' in l)
    assert ", 0, 0, 1, 0.0f, 0.0f}" in row(FA_FAST) and ", 0, 0, 0, 0.0f, 0.0f}" in row(FA_FULL)
    assert "fast_accum" in (out / "README.md").read_text()
    # CLI: the summary says how many kernels are opt-in only
    res = CliRunner().invoke(cli, ["library", str(tmp_path / "gen"), "--tuning", str(t), "--name", "falib", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 fp8 fast-accum, dispatched only to callers that set fast_accum" in res.output


def test_tuning_fast_accum_entries_checked(tmp_path):
    gen = _write_manifest(tmp_path / "gen", FA_CFGS)
    t = tmp_path / "t.json"

    def table(*ops, kernel=FA_FULL):
        t.write_text(json.dumps({"schema_version": 1, "entries": [
            {"problem": {"m": 64 * (i + 1), "n": 64, "k": 4096}, "kernel": kernel, **({"op": op} if op is not None else {})}
            for i, op in enumerate(ops)]}))
        return t

    full_op, fast_op = _op_json(FA_CFGS[FA_FULL]), _op_json(FA_CFGS[FA_FAST])
    # a fast-accum op for a full-precision kernel (and the reverse) does not fit: dropped, with the reason
    r = export_library([gen], "falib", tmp_path / "o", tuning=[table(fast_op, full_op)])
    assert [(r.kernels[x.kernel].name, x.m) for x in r.tuning] == [(FA_FULL, 128)]
    assert "fast_accum=True (kernel: False)" in r.dropped_tuning[0]["reason"]
    r = export_library([gen], "falib", tmp_path / "o", tuning=[table(fast_op, full_op, kernel=FA_FAST)])
    assert [x.m for x in r.tuning] == [64] and "fast_accum=False (kernel: True)" in r.dropped_tuning[0]["reason"]
    # a table without `fast_accum` whose key ends in _fastacc: the key says it
    legacy = {k: v for k, v in fast_op.items() if k != "fast_accum"}
    assert [e.op["fast_accum"] for e in load_tuning(table(legacy))] == [True]
    r = export_library([gen], "falib", tmp_path / "o", tuning=[table(legacy)])
    assert r.tuning == [] and "fast_accum" in r.dropped_tuning[0]["reason"]
    # no op at all: the kernel's own flag decides (nothing to check)
    assert len(export_library([gen], "falib", tmp_path / "o", tuning=[table(None, kernel=FA_FAST)]).tuning) == 1
    # bad combinations are errors naming the entry
    for bad, msg in (({**fast_op, "fast_accum": "yes"}, "op.fast_accum must be true or false, got 'yes'"),
                     ({**fast_op, "fast_accum": 1}, "op.fast_accum must be true or false, got 1"),
                     ({**fast_op, "fast_accum": False}, "op.fast_accum is false but op.key"),
                     ({**full_op, "fast_accum": True}, "op.fast_accum is true but op.key")):
        with pytest.raises(TuningError) as ei:
            export_library([gen], "falib", tmp_path / "o", tuning=[table(full_op, bad)])
        assert msg in str(ei.value) and "entries[1]" in str(ei.value) and str(t) in str(ei.value), str(ei.value)
    res = CliRunner().invoke(cli, ["library", str(gen), "--tuning", str(t), "--name", "falib", "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "op.fast_accum is true but op.key" in res.output and "Traceback" not in res.output
    # a manifest that claims fast accumulation where CUTLASS has none
    bad_gen = _write_manifest(tmp_path / "bad", {"gemm_sm90a_bf16_fastacc": _cfg(fast=True)})
    with pytest.raises(LibraryError, match="fast accumulation is a mode of the sm90a fp8 wgmma"):
        export_library([bad_gen], "falib", tmp_path / "o2")


# ---- C++ agrees with Python (g++, host only) ------------------------------------------------------

def _synthetic_manifest(d: Path, rnd: random.Random, count: int, fp8: int = 0) -> list[dict]:
    """A manifest of `count` random (never compiled) kernels: enough variety to exercise every rule; plus `fp8`
    random sm90a fp8 configurations, each as a full-precision and a fast-accumulation kernel, or only one of them."""
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(count):
        arch = rnd.choice(["sm80", "sm80", "sm86", "sm90a", "sm90a"])
        split = rnd.random() < 0.3
        cfg = _cfg(a=rnd.choice(["bf16", "f16"]), la=rnd.choice(["row", "col"]), lb=rnd.choice(["row", "col"]),
                   lc=rnd.choice(["row", "col"]), arch=arch,
                   tile=(rnd.choice([64, 128, 256]), rnd.choice([64, 128, 256]), rnd.choice([32, 64])),
                   align=rnd.choice([2, 4, 8]), act=rnd.choice(["identity", "identity", "relu"]),
                   bias=rnd.choice(["none", "none", "row", "column"]), batched=not split and rnd.random() < 0.2,
                   split_k="serial" if split else "none")
        name = f"gemm_{arch}_k{i:03d}"
        (d / f"{name}.cu").write_text("// not compiled\n")
        entries.append({"name": name, "family": "gemm", "arch": arch, "source": f"{name}.cu", "spec": "x.yaml",
                        "spec_hash": "0", "config": cfg})
    for i in range(fp8):
        split = rnd.random() < 0.3
        base = dict(la=rnd.choice(["row", "col"]), lb=rnd.choice(["row", "col"]), lc=rnd.choice(["row", "col"]),
                    tile=(rnd.choice([64, 128, 256]), rnd.choice([64, 128, 256]), rnd.choice([64, 128])),
                    align=rnd.choice([16, 16, 32]), act=rnd.choice(["identity", "identity", "relu"]),
                    bias=rnd.choice(["none", "none", "row"]), batched=not split and rnd.random() < 0.2,
                    split_k="serial" if split else "none")
        for fast in {0: (False, True), 1: (False, True), 2: (True,), 3: (False,)}[rnd.randrange(4)]:
            name = f"gemm_sm90a_f{i:03d}" + ("_fastacc" if fast else "")
            (d / f"{name}.cu").write_text("// not compiled\n")
            entries.append({"name": name, "family": "gemm", "arch": "sm90a", "source": f"{name}.cu", "spec": "x.yaml",
                            "spec_hash": "0", "config": _fp8(fast=fast, **base)})
    (d / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0", "generated_at": None,
                                                 "specs": [], "instances": entries, "rejected": []}))
    return entries


def _synthetic_library(tmp_path: Path, rnd: random.Random, name: str, kernels: int = 60, records: int = 120, fp8: int = 25):
    """A random kernel table (30% split-K; fp8 ones with and without fast accumulation) with three tuning tables
    (H100, A100, unknown GPU) whose split-K winners were timed with random slice counts."""
    entries = _synthetic_manifest(tmp_path / "gen", rnd, kernels, fp8)
    split_ok = {e["name"]: e["config"]["split_k"] != "none" for e in entries}
    sm90a = {e["name"] for e in entries if e["arch"] == "sm90a"}
    orng = random.Random(len(entries))   # its own stream: the draws of `rnd` (and the coverage they give) stay as they were
    grng = random.Random(len(entries) + 1)
    for e in entries:   # sm90a tile grids: clusters, swap_ab, compiled swizzle, scheduler (the time model reads them)
        if e["arch"] == "sm90a":
            e["config"].update(cluster=[grng.choice([1, 2]), grng.choice([1, 1, 2]), 1], swap_ab=grng.random() < 0.2,
                               swizzle=grng.choice([1, 1, 2, 8]),
                               tile_scheduler="stream_k" if split_ok[e["name"]] or grng.random() < 0.2 else "persistent")
    (tmp_path / "gen" / "manifest.json").write_text(json.dumps({
        "schema_version": 1, "emitter_version": "0", "generated_at": None, "specs": [], "instances": entries,
        "rejected": []}))
    names = sorted(split_ok)
    tuning = []
    for _ in range(records):
        kname = rnd.choice(names)
        tuning.append((kname, rnd.choice([1, 16, 128, 1000, 4096]), rnd.choice([64, 1024, 4096, 12288]),
                       rnd.choice([64, 512, 4096]), rnd.choice([1, 1, 8]),
                       rnd.choice([1, 2, 3, 4, 8, 16]) if split_ok[kname] else 1,
                       # run-time scheduler options (swizzle 4; swizzle 2 along N) the sm90a winners were timed with
                       orng.choice([0, 0, 3, 2 | 3 << 4]) if kname in sm90a else 0))
    tables = []
    for i, gpu in enumerate([{"cc": "9.0"}, {"cc": "8.0"}, None]):   # an H100 table, an A100 table, one of unknown GPU
        t = tmp_path / f"tuning{i}.json"
        rows = [{"problem": {"m": m, "n": n, "k": k, "batch": b}, "kernel": kname, "split_k": sk, "options": opt,
                 "median_ms": rnd.random()} for kname, m, n, k, b, sk, opt in tuning[i::3]]
        if i == 0:   # the H100 table's run also left its profile.json: every kernel's time per shape
            t = tmp_path / "h100" / "tuning.json"
            t.parent.mkdir()
            _synthetic_profile(t.parent / "profile.json", rows, names, split_ok, sm90a, random.Random(len(entries) + 2))
        t.write_text(json.dumps({"schema_version": 1, **({"gpu": gpu} if gpu else {}), "entries": rows}))
        tables.append(t)
    out = tmp_path / "lib"
    r = export_library([tmp_path / "gen"], name, out, tuning=tables)
    r.measured = measured_records(
        (names_idx[m_["kernel"]], m_["problem"]["m"], m_["problem"]["n"], m_["problem"]["k"], m_["problem"]["batch"],
         m_["gpu_cc"] or 0, m_["split_k"], m_["options"], m_["time_ps"], m_["sms"])
        for names_idx in [{k.name: k.index for k in r.kernels}] for m_ in r.manifest["measured"])
    assert len(r.measured) > 100 and {m_.sms for m_ in r.measured} == {132}
    assert {t.gpu_cc for t in r.tuning} == {0, 80, 90}
    assert any(t.split_k > 1 for t in r.tuning) and {t.options for t in r.tuning} == {0, 3, 2 | 3 << 4}
    assert any(k.fast_accum for k in r.kernels) and any(r.kernels[t.kernel].fast_accum for t in r.tuning)
    return r, out


def _synthetic_profile(path: Path, rows: list[dict], names: list[str], split_ok: dict, sm90a: set, rng: random.Random):
    """A profile.json of the form `emitter profile` writes: the table's winners plus 2-8 other kernels per shape,
    with random medians (the winner's the smallest) and split-K counts / options they may run with."""
    ms = []
    for row in rows:
        ms.append({"kind": "kernel", "name": row["kernel"], "problem": row["problem"], "status": "ok",
                   "split_k": row["split_k"], "options": row["options"], "stats": {"median_ms": row["median_ms"]}})
        for kname in rng.sample(names, rng.randrange(2, 9)):
            ms.append({"kind": "kernel", "name": kname, "problem": row["problem"], "status": rng.choice(["ok"] * 5 + ["pruned"]),
                       "split_k": rng.choice([1, 2, 4]) if split_ok[kname] else 1,
                       "options": rng.choice([0, 3, 4, 2 | 3 << 4]) if kname in sm90a else 0,
                       "stats": {"median_ms": row["median_ms"] * (1 + rng.random() * 3)}})
    path.write_text(json.dumps({"schema_version": 1, "kind": "emitter.profile",
                                "environment": {"name": "H100", "cc": "9.0", "sm_count": 132}, "measurements": ms}))


def _random_queries(r, rnd: random.Random, count: int, ccs=(80, 86, 89, 90, 90, 100)) -> list[Query]:
    queries = []
    for _ in range(count):
        k = rnd.choice(r.kernels)
        op = k.op if rnd.random() < 0.85 else Op(**{**k.op.__dict__, "lc": 3 - k.op.lc})   # some need the transpose
        if rnd.random() < 0.1:
            op = Op(**{**op.__dict__, "acc": 0})
        op = Op(**{**op.__dict__, "fast_accum": rnd.random() < 0.5})   # the caller's opt-in, either way
        queries.append(Query(op=op, m=rnd.choice([1, 7, 64, 100, 777, 4096, 20000]), n=rnd.randrange(1, 20000),
                             k=rnd.choice([rnd.randrange(1, 9000), rnd.randrange(1, 600)]),   # small k: clamped splits
                             batch=rnd.choice([1, 1, 1, 3, 8]), split_k=rnd.choice([1] * 8 + [2, 5]),
                             cc=rnd.choice(ccs)))
    return queries


def _query_line(q: Query) -> str:
    o = q.op
    return " ".join(map(str, [o.a, o.b, o.c, o.d, o.acc, o.la, o.lb, o.lc, o.act, o.bias, q.m, q.n, q.k, q.batch,
                              q.split_k, q.cc, int(o.fast_accum)]))


def _opts(r, c: Candidate, q: Query) -> int:
    """effective_options in the candidate's own terms (transposed for a transposed candidate)."""
    return effective_options(r.kernels, r.tuning, c, transpose(q) if c.transposed else q, r.measured)


def _src_options(r, c: Candidate) -> int:
    return (r.measured[c.measured] if c.measured >= 0 else r.tuning[c.tuning]).options


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_cpp_dispatch_matches_python(tmp_path):
    rnd = random.Random(7)
    r, out = _synthetic_library(tmp_path, rnd, "probelib")
    exe = tmp_path / "probe"
    _compile([f"-I{out / 'src'}", str(out / "tools/probelib_dispatch_probe.cpp"), str(out / "src/probelib_table.cpp"),
              "-o", str(exe)])
    queries = _random_queries(r, rnd, 1500)
    res = subprocess.run([str(exe)], input="\n".join(map(_query_line, queries)) + "\n", capture_output=True, text=True,
                         check=True)
    got = res.stdout.splitlines()
    assert len(got) == len(queries)
    nonempty = tuned_split = clamped = explicit = predicted = padded = 0
    fast = {"opted_in": 0, "fast_first": 0, "fast_tuned": 0, "fast_hidden": 0}
    for q, line in zip(queries, got):
        want = dispatch_order(r.kernels, r.tuning, q, measured=r.measured)
        splits = [effective_split_k(r.kernels, r.tuning, c, q, r.measured) for c in want]
        text = " ".join(f"{c.kernel}:{c.tuning}:{int(c.transposed)}:{s_}:{_opts(r, c, q)}:{c.measured}"
                        for c, s_ in zip(want, splits)) or "-"
        assert line == text, (q, line, text)
        predicted += bool(want) and want[0].measured >= 0
        padded += any(c.tuning >= 0 and _src_options(r, c) and not _opts(r, c, q) for c in want)
        nonempty += bool(want)
        is_fast = [r.kernels[c.kernel].fast_accum for c in want]
        if not q.op.fast_accum:   # without the opt-in, never a fast-accum kernel (but the opt-in would find some)
            assert not any(is_fast), (q, line)
            fast["fast_hidden"] += bool(dispatch_order(r.kernels, r.tuning, measured=r.measured, q=Query(**{**q.__dict__, "op": Op(
                **{**q.op.__dict__, "fast_accum": True})})) != want)
        else:
            fast["opted_in"] += any(is_fast)
            fast["fast_first"] += bool(is_fast) and is_fast[0]
            fast["fast_tuned"] += any(f and c.tuning >= 0 for f, c in zip(is_fast, want))
        for c, s_ in zip(want, splits):
            if q.split_k > 1:
                explicit += 1
                assert s_ == q.split_k and r.kernels[c.kernel].split_k
            elif c.measured >= 0 or (c.tuning >= 0 and r.tuning[c.tuning].split_k > 1):
                src = r.measured[c.measured] if c.measured >= 0 else r.tuning[c.tuning]
                tuned_split += s_ > 1
                clamped += s_ < src.split_k
                assert s_ * r.kernels[c.kernel].tile[2] <= max(q.k, r.kernels[c.kernel].tile[2])
            else:
                assert s_ == 1
    assert nonempty > 300   # the queries hit real candidates, tuned and fallback, direct and transposed
    assert predicted > 50 and padded > 20, (predicted, padded)   # ... ranked by predicted time; options dropped
    assert tuned_split > 50 and clamped > 20 and explicit > 20   # ... and tuned, clamped and explicit splits
    assert min(fast.values()) > 20, fast   # ... and fast-accum kernels: hidden without the opt-in, tuned and first with it
    # the library's per-thread dispatch cache (64 entries, round-robin) answers the same: every query twice, the
    # second pass in reverse, so that hits, misses and replaced entries all occur
    twice = queries + queries[::-1]
    res = subprocess.run([str(exe), "--cached"], input="\n".join(map(_query_line, twice)) + "\n", capture_output=True,
                         text=True, check=True)
    assert res.stdout.splitlines() == got + got[::-1]
    # the probe lists the same table (names sorted, ranks)
    listing = subprocess.run([str(exe), "--kernels"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert [l.split()[1] for l in listing] == [k.name for k in r.kernels]
    assert [int(l.split()[2].split("=")[1]) for l in listing] == [k.fallback_rank for k in r.kernels]

# One stdin line (the probe's 17 integers, then a kernel name or "-") into `p` and `kernel`: shared by the two
# harnesses below. A .format() template for {lib} only (no other braces).
_READ_PROBLEM = """\
    std::istringstream in(line);
    long long v[17];
    std::string kernel;
    for (long long& x : v) in >> x;
    in >> kernel;
    {lib}_gemm_problem p;
    {lib}_gemm_problem_init(&p);
    p.a_type = int(v[0]); p.b_type = int(v[1]); p.c_type = int(v[2]); p.d_type = int(v[3]); p.accumulator_type = int(v[4]);
    p.a_layout = int(v[5]); p.b_layout = int(v[6]); p.c_layout = int(v[7]); p.activation = int(v[8]); p.bias_kind = int(v[9]);
    p.m = int(v[10]); p.n = int(v[11]); p.k = int(v[12]); p.batch_count = int(v[13]); p.split_k_slices = int(v[14]);
    p.fast_accum = int(v[16]);
    p.A = reinterpret_cast<void*>(0x100000); p.B = p.A; p.D = reinterpret_cast<void*>(0x200000);
    if (p.bias_kind) p.bias = p.A;
    if (kernel != "-") p.kernel = kernel.c_str();
"""

# For each problem on stdin (the probe's 17 integers, then a kernel name or "-"): workspace size, selection,
# a launch with exactly that workspace, a launch with one byte less than the selected kernel needs.
_API_MAIN = """\
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include "{lib}/{lib}.h"
extern int g_run_kernel, g_run_split, g_run_options;
int main() {{
  std::string line;
  while (std::getline(std::cin, line)) {{
{read_problem}    size_t ws = 0;
    const int ws_status = {lib}_gemm_workspace_size(&p, &ws);
    {lib}_selection sel;
    sel.struct_size = sizeof(sel);
    const int sel_status = {lib}_gemm_select(&p, &sel);
    void* const buffer = reinterpret_cast<void*>(0x400000);
    g_run_kernel = -1; g_run_split = 0;
    const int run_status = {lib}_gemm(&p, ws ? buffer : nullptr, ws, nullptr);
    const int run_kernel = g_run_kernel, run_split = g_run_split, run_options = g_run_options;
    int small_status = -1;
    if (sel_status == 0 && sel.workspace_bytes > 0) small_status = {lib}_gemm(&p, buffer, size_t(sel.workspace_bytes) - 1, nullptr);
    std::printf("%d %zu %d %d %d %d %d %lld %d %d %d %d %d\\n", ws_status, ws, sel_status, sel.kernel, sel.transposed,
                sel.tuned, sel.split_k_slices, (long long)sel.workspace_bytes, run_status, run_kernel, run_split, small_status,
                run_options);
  }}
  return 0;
}}
"""


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_cpp_api_queries_and_launches_with_the_effective_split(tmp_path):
    """The generated C API (api.cpp, host-compiled against a fake CUDA runtime and fake shims): the kernel it
    selects and launches, the split-K slices it launches with, and the workspace it asks for all follow the
    Python twin; the workspace size is the largest need at each candidate's own effective split."""
    rnd = random.Random(11)
    r, out = _synthetic_library(tmp_path, rnd, "apilib", kernels=40, records=90)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib="apilib", rows=rows))
    (fake / "main.cpp").write_text(_API_MAIN.format(lib="apilib", read_problem=_READ_PROBLEM.format(lib="apilib")))
    exe = tmp_path / "api"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / "src/apilib_api.cpp"), str(out / "src/apilib_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "main.cpp"), "-o", str(exe)])
    queries = _random_queries(r, rnd, 800, ccs=(90,))
    named: list[tuple[int, Candidate | None] | None] = []   # (forced kernel, its candidate or None: not its op)
    lines = []
    fast_kernels = [k.index for k in r.kernels if k.fast_accum]
    for q in queries:
        order = dispatch_order(r.kernels, r.tuning, q, measured=r.measured)
        f = None
        if order and rnd.random() < 0.2:
            pick = rnd.choice(order)
            f = (pick.kernel, Candidate(pick.kernel, -2, pick.transposed))
        elif rnd.random() < 0.12:   # a fast-accum kernel by name, opted in or not (naming it is the opt-in)
            fitting = [i for i in fast_kernels if forced(r.kernels, i, q)]
            kernel = rnd.choice(fitting if fitting and rnd.random() < 0.8 else fast_kernels)   # or another op's
            f = (kernel, forced(r.kernels, kernel, q))
        named.append(f)
        lines.append(_query_line(q) + " " + (r.kernels[f[0]].name if f else "-"))
    res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    got = res.stdout.splitlines()
    assert len(got) == len(queries)
    need = lambda kernel, split: 4096 * split + kernel if split > 1 else 0
    seen = {"tuned_split": 0, "forced_tuned": 0, "workspace": 0, "max_other": 0, "fast_forced": 0, "fast_dispatched": 0,
            "fast_refused": 0, "options": 0}
    for q, nf, line in zip(queries, named, got):
        (ws_status, ws, sel_status, kernel, transposed, tuned, split, sel_ws, run_status, run_kernel, run_split, small,
         run_options) = map(int, line.split())
        f = nf[1] if nf else None
        order = ([f] if f else []) if nf else dispatch_order(r.kernels, r.tuning, q, measured=r.measured)
        if not order:
            assert (ws_status, sel_status, run_status) == (1, 1, 1), (q, line)
            continue
        # a fast-accum kernel runs only for a caller who opted in, or named it
        if r.kernels[kernel].fast_accum:
            assert q.op.fast_accum or f, (q, line)
            seen["fast_forced" if f and not q.op.fast_accum else "fast_dispatched"] += 1
        elif not nf and not q.op.fast_accum and dispatch_order(r.kernels, r.tuning, _allow(q), measured=r.measured)[0] != order[0]:
            seen["fast_refused"] += 1   # the opt-in would have run another (fast-accum) kernel first
        splits = [effective_split_k(r.kernels, r.tuning, c, q, r.measured) for c in order]
        first = order[0]
        # select and launch: the dispatch's first candidate, at its effective split (forced: the caller's)
        assert (sel_status, kernel, transposed, split) == (0, first.kernel, int(first.transposed), splits[0]), (q, f, line)
        assert tuned == (2 if f else 3 if first.measured >= 0 else 1 if first.tuning >= 0 else 0)
        seen["predicted"] = seen.get("predicted", 0) + (tuned == 3)
        assert (run_status, run_kernel, run_split) == (0, first.kernel, splits[0]), (q, f, line)
        # ... with its tuning record's run-time scheduler options (none when forced or in fallback order)
        assert run_options == _opts(r, first, q), (q, f, line)
        seen["options"] += run_options != 0
        assert sel_ws == need(first.kernel, splits[0])
        # the workspace query: the largest need among the candidates, each at the split it would launch with
        most = max(need(c.kernel, s_) for c, s_ in zip(order, splits))
        assert (ws_status, ws) == (0, most + 256 if most else 0), (q, f, line)
        # one byte less than the launched kernel needs at its split is refused
        assert small == (3 if sel_ws > 0 else -1), (q, line)
        if f and f.kernel in {t.kernel for t in r.tuning if t.split_k > 1} and q.split_k == 1:
            seen["forced_tuned"] += 1
            assert split == 1
        seen["tuned_split"] += q.split_k == 1 and splits[0] > 1
        seen["workspace"] += ws > 0
        seen["max_other"] += most > sel_ws
    assert seen["tuned_split"] > 20 and seen["forced_tuned"] > 3 and seen["workspace"] > 50 and seen["max_other"] > 10, seen
    assert seen["fast_forced"] > 3 and seen["fast_dispatched"] > 10 and seen["fast_refused"] > 3, seen
    assert seen["options"] > 10 and seen.get("predicted", 0) > 20, seen


# For each problem on stdin (the probe's 17 integers, then a kernel name or "-"): what select says (status, kernel,
# tuned, transposed), what gemm launched, and the select's error message; `--info`: each kernel's fast_accum.
_FA_MAIN = """\
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include "{lib}/{lib}.h"
extern int g_run_kernel, g_run_split;
int main(int argc, char** argv) {{
  if (argc > 1 && std::strcmp(argv[1], "--info") == 0) {{
    for (int i = 0; i < {lib}_kernel_count(); ++i) {{
      {lib}_kernel_info info;
      info.struct_size = sizeof(info);
      if ({lib}_get_kernel_info(i, &info) != 0) return 1;
      std::printf("%s %d\\n", info.name, info.fast_accum);
    }}
    return 0;
  }}
  std::string line;
  while (std::getline(std::cin, line)) {{
{read_problem}    {lib}_selection sel;
    sel.struct_size = sizeof(sel);
    const int sel_status = {lib}_gemm_select(&p, &sel);
    const std::string message = {lib}_last_error();
    g_run_kernel = -1;
    const int run_status = {lib}_gemm(&p, nullptr, 0, nullptr);
    std::printf("%d %s %d %d %d %s | %s\\n", sel_status, sel_status == 0 ? {lib}_kernel_name(sel.kernel) : "-", sel.tuned,
                sel.transposed, run_status, g_run_kernel >= 0 ? {lib}_kernel_name(g_run_kernel) : "-", message.c_str());
  }}
  return 0;
}}
"""


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_cpp_api_fast_accum_is_opt_in(tmp_path):
    """The generated C API on a library holding fp8 kernels with and without fast accumulation: without the opt-in
    it never selects or launches a fast-accum kernel (not even one tuned for the exact shape), with it it may (tuned
    or fallback) and still takes a normal one where that is nearer; naming a kernel works either way; bad values and
    fast-only problems are clear errors; get_kernel_info says which kernels are fast-accum. The Python twin agrees."""
    r, out, _ = _fast_accum_library(tmp_path)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib="falib", rows=rows))
    (fake / "main.cpp").write_text(_FA_MAIN.format(lib="falib", read_problem=_READ_PROBLEM.format(lib="falib")))
    exe = tmp_path / "fa"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / "src/falib_api.cpp"), str(out / "src/falib_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "main.cpp"), "-o", str(exe)])
    info = dict(l.split() for l in subprocess.run([str(exe), "--info"], capture_output=True, text=True,
                                                   check=True).stdout.splitlines())
    assert info == {n: str(int(c["fp8_fast_accum"])) for n, c in FA_CFGS.items()}

    by = {k.name: k for k in r.kernels}
    fp8 = by[FA_FULL].op

    def problem(m, n, k, fast, split_k=1, kernel=None, **op):
        return Query(op=Op(**{**fp8.__dict__, **op, "fast_accum": fast}), m=m, n=n, k=k, split_k=split_k, cc=90), kernel

    col = {"lc": LAYOUTS["col"]}
    cases = [   # (problem, kernel or None: dispatch), expected: (kernel selected and launched, tuned, transposed)
        (problem(4096, 4096, 4096, 0), (FA_FULL, 1, 0)),     # the fast op's winner at this very shape: not without the opt-in
        (problem(4096, 4096, 4096, 1), (FA_FAST, 1, 0)),     # opted in: the fast op's winner
        (problem(128, 4096, 4096, 1), (FA_FULL, 1, 0)),      # opted in, but the normal winner's shape is nearer
        (problem(1000, 1000, 1000, 1), (FA_FAST, 1, 0)),     # both ops' 4096^3 winners equally near: fast-accum first
        (problem(1000, 1000, 1000, 0), (FA_FULL, 1, 0)),
        (problem(128, 128, 8192, 1), (FA_SPLIT, 1, 0)),      # the fast split-K kernel's tuned shape
        (problem(128, 128, 8192, 0), (FA_FULL, 1, 0)),
        (problem(4096, 4096, 4096, 1, split_k=2), (FA_SPLIT, 1, 0)),   # split_k_slices 2: only the fast split-K kernel
        (problem(4096, 4096, 4096, 1, **col), (FA_FAST, 1, 1)),        # transposed, opted in
        (problem(4096, 4096, 4096, 0, **col), (FA_FULL, 1, 1)),        # transposed, not
        (problem(256, 256, 256, 1, act=ACTIVATIONS["relu"]), (FA_RELU, 0, 0)),
        (problem(256, 256, 256, 0, kernel=FA_FAST), (FA_FAST, 2, 0)),  # named: runs without the opt-in
        (problem(256, 256, 256, 0, kernel=FA_FAST, **col), (FA_FAST, 2, 1)),
        (problem(256, 256, 256, 1, kernel=FA_FULL), (FA_FULL, 2, 0)),
        (problem(256, 256, 256, 1, a=DTYPES["bf16"], b=DTYPES["bf16"], acc=3), (FA_BF16, 0, 0)),  # no effect on bf16
    ]
    errors = [   # (problem, status, words in the message)
        (problem(256, 256, 256, 0, act=ACTIVATIONS["relu"]), 1,
         ["only fp8 fast-accumulation kernels (1) can run", "problem.fast_accum = 1", "fast_accum=True"]),
        (problem(4096, 4096, 4096, 0, split_k=2), 1, ["only fp8 fast-accumulation kernels (1) can run", "split_k_slices=2"]),
        (problem(256, 256, 256, 2), 2, ["fast_accum=2: must be 0", "or 1"]),
        (problem(256, 256, 256, -1), 2, ["fast_accum=-1"]),
        (problem(256, 256, 256, 0, kernel=FA_FAST, act=ACTIVATIONS["relu"]), 1,
         [f"kernel {FA_FAST} computes e4m3 x e4m3", "fp8 fast accumulation; the problem asks for"]),
        (problem(256, 256, 256, 1, kernel=FA_RELU), 1, ["activation relu, bias none, fp8 fast accumulation",
                                                       "activation identity, bias none, fast accumulation allowed"]),
    ]
    lines = [_query_line(q) + " " + (kernel or "-") for (q, kernel), _ in cases] + \
            [_query_line(q) + " " + (kernel or "-") for (q, kernel), _, _ in errors]
    got = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    got = got.splitlines()
    assert len(got) == len(lines)
    for ((q, kernel), (want, tuned, transposed)), line in zip(cases, got):
        head, _, message = line.partition(" | ")
        assert head.split() == ["0", want, str(tuned), str(transposed), "0", want], (q, kernel, line)
        # the Python twin: the same first candidate
        c = forced(r.kernels, by[kernel].index, q) if kernel else dispatch_order(r.kernels, r.tuning, q)[0]
        assert (r.kernels[c.kernel].name, int(c.transposed)) == (want, transposed)
        assert c.tuning == {1: c.tuning if c.tuning >= 0 else -99, 0: -1, 2: -2}[tuned]
    for ((q, kernel), status, words), line in zip(errors, got[len(cases):]):
        head, _, message = line.partition(" | ")
        assert head.split()[:2] == [str(status), "-"] and head.split()[4:] == [str(status), "-"], line
        for w in words:
            assert w in message, (w, message)
        if status == 1 and not kernel:
            assert dispatch_order(r.kernels, r.tuning, q) == [] and dispatch_order(r.kernels, r.tuning, _allow(q))


# ---- the C header's structs and the Python loader -------------------------------------------------

@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="needs a C compiler")
def test_header_struct_layout_matches_loader(manifest_dir, tmp_path):
    """The public header is C (compiles with a C compiler) and its structs match the ctypes mirror."""
    out = tmp_path / "lib"
    export_library([manifest_dir], "mykernels", out)
    checks = []
    for struct, fields in (("mykernels_gemm_problem", abi.PROBLEM_FIELDS), ("mykernels_selection", abi.SELECTION_FIELDS),
                           ("mykernels_kernel_info", abi.KERNEL_INFO_FIELDS)):
        checks.append(f'printf("{struct} %zu\\n", sizeof({struct}));')
        for f, _ in fields:
            checks.append(f'printf("{struct}.{f} %zu\\n", offsetof({struct}, {f}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <mykernels/mykernels.h>\nint main(void) {\n"
                   + "\n".join(checks) + "\nreturn 0;\n}\n")
    cc = shutil.which("gcc") or shutil.which("cc")
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", f"-I{out / 'include'}", str(src), "-o", str(tmp_path / "layout")],
                   check=True)
    got = dict(l.rsplit(" ", 1) for l in subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                                                          check=True).stdout.splitlines())
    for struct, fields in (("mykernels_gemm_problem", abi.PROBLEM_FIELDS), ("mykernels_selection", abi.SELECTION_FIELDS),
                           ("mykernels_kernel_info", abi.KERNEL_INFO_FIELDS)):
        s = abi.structure("S", fields)
        assert int(got[struct]) == ctypes.sizeof(s), struct
        for f, _ in fields:
            assert int(got[f"{struct}.{f}"]) == getattr(s, f).offset, f"{struct}.{f}"


def test_loader_module_imports_without_gpu(manifest_dir, tmp_path):
    out = tmp_path / "lib"
    export_library([manifest_dir], "mykernels", out)
    sys.path.insert(0, str(out / "python"))
    try:
        import importlib
        mod = importlib.import_module("mykernels")
        assert mod.DTYPES["bf16"] == DTYPES["bf16"] and mod.ACTIVATIONS == ACTIVATIONS
        assert ctypes.sizeof(mod.Problem) == abi.sizes()["problem"]
        # layout from strides: row-major (m, k), and a transposed view (column-major)
        op = mod.Operand(0, (64, 32), (32, 1), "bf16")
        assert op.layout() == (LAYOUTS["row"], 32)
        assert mod.Operand(0, (32, 64), (1, 32), "bf16").layout() == (LAYOUTS["col"], 32)
        with pytest.raises(ValueError, match="neither row- nor column-major"):
            mod.Operand(0, (32, 64), (2, 64), "bf16").layout()
        # the fast-accumulation opt-in: a keyword of gemm / select / workspace_size, off by default, a bool
        import inspect
        assert inspect.signature(mod.gemm).parameters["fast_accum"].default is False
        assert "fast_accum" in mod.select.__doc__ and "fast_accum=True" in mod.gemm.__doc__
        for call in (mod.gemm, mod.select, mod.workspace_size):
            with pytest.raises(ValueError, match="fast_accum must be True or False"):
                call(op, op, fast_accum=1)
        assert [f for f, _ in mod.Problem._fields_].count("fast_accum") == 1 and "reserved" not in dict(mod.Problem._fields_)
        assert mod.KernelInfo._fields_[-1][0] == "fast_accum"
        os.environ["MYKERNELS_LIBRARY"] = str(tmp_path / "nowhere.so")
        with pytest.raises(OSError, match="libmykernels.so not found"):
            mod.load()
    finally:
        os.environ.pop("MYKERNELS_LIBRARY", None)
        sys.path.remove(str(out / "python"))
        sys.modules.pop("mykernels", None)
