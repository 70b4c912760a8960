"""emitter profile as a stage, without a GPU (GEMM kernels as the example): configs and their errors, timing
statistics and warm-up, stable selection on recorded timings (ties within noise), reports (CSV, JSON, tuning
table, plots, replay), the runner through the fake backend (sharding, fault isolation, hangs, resume, pruning,
CLI options), and the worker's engine with stand-ins. GPU-only parts carry the `gpu` marker. GEMM's own profile
behaviour (problem sets, op keys, scheduler sweeps, host check, split-K) is in tests/gemm/test_gemm_profile.py."""

from __future__ import annotations

import csv
import io
import json
import random
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

from emitter.errors import SpecError
from emitter.families.gemm.profile import Op, Problem
from emitter.profile import report as rep
from emitter.profile.config import ProfileConfig, load_config, parse_config_text
from emitter.profile.records import CHECK_FAILED, FAULT, OK, Measurement, min_bytes
from emitter.profile.runner import RunOutcome, plan, run, shard, shard_balance
from emitter.profile.selection import TIE_CAP, choose, choose_all, noise_ms
from emitter.profile.stats import TimingStats
from emitter.profile.timing import MAX_WARMUP_CHUNK, iterations_for, rotation_sets, warm_up

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_helpers import BASE, OP, P, _fake_config, cfg_text, manifest_dir, meas  # noqa: E402,F401  (fixture)


# ------------------------------------------------------------------------------------------ config
def test_defaults_and_timing_modes():
    c = cfg_text(BASE)
    assert c.baselines == ("cublas",) and c.check and c.beta == 0.0 and c.gpus == "all"
    assert c.timing.iterations == 100 and c.timing.rotate == "auto" and c.timing.blocking_kernel
    c2 = cfg_text(BASE + "timing: {min_duration_ms: 20, repeats: 3, rotate: 268435456, warmup_ms: 5}\n"
                         "baselines: none\ngpus: [0, 1]\nselect: ['a=bf16', '*128x256*']\n")
    assert c2.timing.iterations is None and c2.timing.min_duration_ms == 20 and c2.timing.rotate == 1 << 28
    assert c2.baselines == () and c2.gpus == (0, 1) and c2.select == ("a=bf16", "*128x256*")
    assert iterations_for(c2.timing, 0.05) == 400 and iterations_for(c2.timing, 100.0) == 10
    assert iterations_for(c.timing, 1.0) == 100


class _Queue:
    """A GPU stand-in: launches enqueue instantly (as cuLaunchKernel does), synchronize runs the queue, and
    the clock is the GPU's busy time plus `host_us` per launch of enqueue cost."""

    def __init__(self, kernel_ms: float, host_us: float = 20.0) -> None:
        self.kernel_ms, self.host_us = kernel_ms, host_us
        self.now_ms = self.gpu_free_ms = 0.0
        self.launched = self.pending = self.max_pending = 0

    def launch(self, i: int) -> None:
        self.now_ms += self.host_us / 1e3
        self.gpu_free_ms = max(self.gpu_free_ms, self.now_ms) + self.kernel_ms
        self.launched += 1
        self.pending += 1
        self.max_pending = max(self.max_pending, self.pending)

    def synchronize(self) -> None:
        self.now_ms = max(self.now_ms, self.gpu_free_ms)
        self.pending = 0

    def clock(self) -> float:
        return self.now_ms / 1e3


@pytest.mark.parametrize("kernel_ms", [0.005, 0.03, 1.6, 13.0, 34.0])
def test_warm_up_lasts_what_was_asked_of_the_gpu(kernel_ms):
    """warmup 10 and warmup_ms 100 (benchmarks/profile_sm90a.py): about 100 ms of GPU work whatever the kernel,
    never more than a chunk in the queue. The loop it replaces watched the host's clock only, so it queued
    about a thousand 13 ms launches (13 s) per measurement in a 2026-11-23 H200 sweep."""
    q = _Queue(kernel_ms)
    n = warm_up(q.launch, q.synchronize, 10, 100.0, sets=3, clock=q.clock)
    assert n == q.launched and n >= 10
    assert q.pending == 0 and q.max_pending <= max(10, MAX_WARMUP_CHUNK)
    assert q.now_ms >= 100.0
    # at most one launch past 100 ms of GPU time, or the 10 launches asked for, plus the host's enqueue time
    assert q.now_ms <= max(100.0 + kernel_ms, 10 * kernel_ms) * 1.05 + n * q.host_us / 1e3 + 1.0


def test_warm_up_by_count_only():
    q = _Queue(13.0)
    assert warm_up(q.launch, q.synchronize, 10, None, clock=q.clock) == 10
    assert warm_up(q.launch, q.synchronize, 0, None, clock=q.clock) == 1    # at least one: module load



def test_interleave_alternates_launch_by_launch_and_shares_the_clock():
    """EventTimer.interleave on a simulated GPU whose clock slows 0.2% with every launch: a kernel of 1.0 and a
    baseline of 1.1 time units come out 1.1x apart, as they are; timed one after the other (measure, twice) the
    drift adds itself to the second. Launches alternate with the lead swapped each pair, every launch between
    its own events, and consecutive launches never share an input set."""
    from types import SimpleNamespace

    from emitter.profile.config import Timing
    from emitter.profile.timing import EventTimer

    gpu = {"t": 0.0, "n": 0}
    log: list[tuple[str, int]] = []

    class Event:
        t = 0.0

        def record(self, stream):
            self.t = gpu["t"]
            log.append(("event", -1))

        def synchronize(self):
            pass

        def time_since(self, other):
            return self.t - other.t

    def fn(name, units):
        def launch(i):
            gpu["n"] += 1
            gpu["t"] += units * (1 + 0.002 * gpu["n"])
            log.append((name, i))
        return launch

    timer = EventTimer.__new__(EventTimer)
    timer.drv, timer.stream, timer._events, timer._spin = SimpleNamespace(Event=Event), SimpleNamespace(
        synchronize=lambda: None), [], None
    timer.timing = Timing(warmup=4, iterations=30, repeats=2)
    k, b = timer.interleave([fn("k", 1.0), fn("b", 1.1)], sets=3)
    assert k.samples == b.samples == 60 and k.repeats == b.repeats == 2
    assert b.median_ms / k.median_ms == pytest.approx(1.1, rel=0.01)
    launches = [x for x in log if x[0] != "event"]
    timed = launches[-120:]
    assert [x[0] for x in timed[:8]] == ["k", "b", "b", "k", "k", "b", "b", "k"]
    assert all(a[1] != c[1] for a, c in zip(timed, timed[1:]))          # never the set its predecessor read
    # each timed launch sits between its own event pair
    tail = log[-360:]
    assert all(tail[i][0] == "event" and tail[i + 2][0] == "event" and tail[i + 1][0] in "kb"
               for i in range(0, 360, 3))
    seq_k = timer.measure(fn("k", 1.0), 3).stats.median_ms
    seq_b = timer.measure(fn("b", 1.1), 3).stats.median_ms
    assert seq_b / seq_k > 1.1 * 1.05         # what the alternation removes

def test_config_json_round_trip():
    c = cfg_text(BASE + "gpus: [0, 2]\nselect: a=bf16\npeaks: {tflops: {bf16: 900}}\n")
    assert ProfileConfig.from_json(json.loads(json.dumps(c.to_json()))) == c


BAD = [
    # (text, line, key path, fragment of the message)
    ("manifests: [x]\nproblem: [{set: llm}]\n", 2, "problem", "did you mean 'problems'"),
    ("manifests: [x]\nproblems:\n  - {set: huge}\n", 3, "problems[0].set", "unknown problem set"),
    ("manifests: [x]\nproblems:\n  - {m: 1, n: 2}\n", 3, "problems[0]", "lacks 'k'"),
    ("manifests: [x]\nproblems:\n  - {m: 0, n: 2, k: 3}\n", 3, "problems[0].m", "out of range"),
    ("manifests: [x]\nproblems:\n  - {m: 1, n: 2, k: {from: 8, to: 4, mul: 2}}\n", 3, "problems[0].k.to", "below"),
    ("manifests: [x]\nproblems:\n  - {m: 1, n: 2, k: {from: 1, to: 4}}\n", 3, "problems[0].k", "exactly one of"),
    ("manifests: [x]\nproblems: [{square: 64}]\ntiming:\n  iterations: 10\n  min_duration_ms: 5\n", 5,
     "timing.min_duration_ms", "not both"),
    ("manifests: [x]\nproblems: [{square: 64}]\ntiming: {rotate: sometimes}\n", 3, "timing.rotate", "rotate takes"),
    ("manifests: [x]\nproblems: [{square: 64}]\ntiming: {repeat: 3}\n", 3, "timing.repeat", "did you mean 'repeats'"),
    ("manifests: [x]\nproblems: [{square: 64}]\nbaselines: [mkl]\n", 3, "baselines[0]", "unknown baseline"),
    ("manifests: [x]\nproblems: [{square: 64}]\nselect: ['a=']\n", 3, "select[0]", "key=value"),
    ("manifests: [x]\nproblems: [{square: 64}]\noutput: {csv: a/b.csv}\n", 3, "output.csv", "file name"),
    ("manifests: [x]\nproblems: [{square: 64}]\ngpus: [0, 0]\n", 3, "gpus", "twice"),
    ("problems: [{square: 64}]\n", None, "manifests", "names no manifest"),
    ("manifests: [x]\n", None, "problems", "needs a 'problems' list"),
    ("manifests: [x]\nproblems: [{square: 64}]\ncheck: yes please\n", 3, "check", "true or false"),
    ("manifests: [x]\nproblems: [{square: 64}\n", 3, None, "invalid YAML"),
]


@pytest.mark.parametrize("text,line,key,fragment", BAD)
def test_bad_configs_name_file_line_and_key(text, line, key, fragment):
    with pytest.raises(SpecError) as ei:
        parse_config_text(text, "bad.yaml")
    e = ei.value
    assert e.file == "bad.yaml"
    if line is not None:
        assert e.line == line, e.render()
    if key is not None:
        assert e.key_path == key, e.render()
    assert fragment in e.render(), e.render()
    assert e.exit_code == 2


def test_cli_reports_config_error_without_traceback(tmp_path):
    from emitter.cli import main

    p = tmp_path / "bad.yaml"
    p.write_text("manifests: [x]\nproblems: [{set: sqare}]\n")
    res = CliRunner().invoke(main, ["profile", str(p)])
    assert res.exit_code == 2
    assert f"{p}:2: error: unknown problem set" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------------------------------ stats, timing
def test_stats_median_iqr_and_repeat_spread():
    s = TimingStats.from_samples([[1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0]])
    assert s.median_ms == 3.0 and s.q25_ms == 2.0 and s.q75_ms == 4.0 and s.iqr_ms == 2.0
    assert s.repeat_medians_ms == (2.5, 3.5) and s.run_spread_ms == 1.0
    assert s.samples == 8 and s.repeats == 2 and s.iterations == 4
    assert TimingStats.from_json(json.loads(json.dumps(s.to_json()))) == s
    with pytest.raises(ValueError):
        TimingStats.from_samples([[1.0, float("nan")]])


def test_rotation_sets_cover_twice_l2():
    l2 = 50 * 2 ** 20
    assert rotation_sets(10 * 2 ** 20, l2, "auto") == 11           # 100 MB / 10 MB + 1
    assert rotation_sets(4 * 2 ** 30, l2, "auto") == 2             # huge: still two sets
    assert rotation_sets(4 * 2 ** 30, l2, "auto", free_bytes=8 * 2 ** 30) == 1   # not two in 40% of 8 GB
    assert rotation_sets(1024, l2, "auto") == 64                   # capped
    assert rotation_sets(10 * 2 ** 20, l2, False) == 1
    assert rotation_sets(10 * 2 ** 20, l2, 30 * 2 ** 20) == 4


# ------------------------------------------------------------------------------------------ selection
def test_clear_winner_is_the_fastest():
    ch = choose([meas("k_b", 1.00, seed=1), meas("k_a", 1.10, seed=2), meas("k_c", 1.30, seed=3)])
    assert ch.winner.name == "k_b" and ch.ties == ("k_b",) and ch.candidates == 3
    assert ch.margin_ms == pytest.approx(0.10, abs=0.01)


def test_ties_within_noise_are_reported_and_the_fastest_wins():
    # k_z is 0.3% faster than k_a: within the 1% floor, so a tie (reported), and the smaller median wins
    ch = choose([meas("k_z", 1.000, seed=1), meas("k_a", 1.003, seed=2), meas("k_m", 1.2, seed=3)], 0.01)
    assert ch.fastest.name == "k_z" and ch.winner.name == "k_z" and ch.ties == ("k_a", "k_z")
    # equal medians: name order, whatever order the rows come in
    same = [meas("k_y", 1.0, 0.0, seed=1), meas("k_b", 1.0, 0.0, seed=2)]
    assert choose(same).winner.name == choose(same[::-1]).winner.name == "k_b"
    # with no tolerance floor and tiny spread they are told apart
    ch0 = choose([meas("k_z", 1.000, 0.0001, seed=1), meas("k_a", 1.003, 0.0001, seed=2)], 0.0)
    assert ch0.winner.name == "k_z" and ch0.ties == ("k_z",)


def test_noisy_measurements_widen_the_tie():
    quiet = meas("k_a", 1.04, 0.001, seed=1)
    noisy = meas("k_b", 1.00, 0.06, seed=2)       # IQR ~ 8% of the median
    assert noise_ms(noisy.stats, quiet.stats, 0.01) > 0.04
    assert choose([noisy, quiet]).ties == ("k_a", "k_b")


def test_a_noisy_slow_kernel_does_not_tie_a_steady_fast_one():
    """The tie window is capped (TIE_CAP): figures shaped on an H200 run at 16384^3, where a ping-pong kernel's
    repeats drifted 13.2-17.7 ms and, uncapped, tied the steady 12.8 ms kernel and won by name."""
    steady = Measurement("kernel", "k_z_128x256", "emitter", OP, P)
    steady.stats = TimingStats.from_samples([[12.74] * 10, [12.76] * 10, [12.82] * 10])
    noisy = Measurement("kernel", "k_a_128x128", "emitter", OP, P)
    noisy.stats = TimingStats.from_samples([[17.2] * 10, [13.25] * 10, [17.73] * 10])
    assert noisy.stats.run_spread_ms > noisy.stats.median_ms - steady.stats.median_ms   # uncapped: a tie
    ch = choose([steady, noisy])
    assert ch.winner.name == "k_z_128x256" and ch.ties == ("k_z_128x256",)
    assert noise_ms(steady.stats, noisy.stats, 0.01) == pytest.approx(TIE_CAP * steady.stats.median_ms)


def test_repeat_drift_counts_as_noise():
    a = meas("k_a", 1.00, 0.001, seed=1)
    drift = Measurement("kernel", "k_b", "emitter", OP, P)
    drift.stats = TimingStats.from_samples([[1.02] * 20, [0.97] * 20, [1.03] * 20])  # run-to-run 6%
    assert drift.stats.iqr_ms > 0 and drift.stats.run_spread_ms == pytest.approx(0.06)
    assert choose([a, drift]).ties == ("k_a", "k_b")


def test_selection_is_stable_across_reruns_and_input_order():
    """Reruns of the same profile (fresh noise each) pick the same winner, whatever order rows come in."""
    true = {"k_coop_128x256": 1.000, "k_pingpong_64x128": 1.004, "k_streamk_128x128": 1.08, "k_small": 1.5}
    winners = set()
    for run_no in range(20):
        ms = [meas(n, t, 0.004, seed=run_no * 100 + i) for i, (n, t) in enumerate(true.items())]
        random.Random(run_no).shuffle(ms)
        ch = choose(ms, 0.01)
        winners.add(ch.winner.name)
        assert set(ch.ties) == {"k_coop_128x256", "k_pingpong_64x128"}
    assert winners == {"k_coop_128x256"}


def test_failed_and_check_failed_kernels_never_win():
    ms = [meas("k_a", 0.5, status=CHECK_FAILED), meas("k_b", 1.0), meas("k_c", 0.1, status=FAULT)]
    assert choose(ms).winner.name == "k_b"
    assert choose([meas("k_a", 0.5, status=CHECK_FAILED)]) is None


def test_choose_all_groups_by_op_and_problem():
    f16 = Op("f16", "f16", "f16", "f16", "row", "col", "row")
    q = Problem(16, 4096, 4096)
    ms = [meas("a", 1.0), meas("b", 0.5), meas("a", 0.2, problem=q), meas("b", 0.3, problem=q),
          meas("c", 9.0, op=f16), meas("cublas", 0.1, kind="baseline")]
    got = {k: c.winner.name for k, c in choose_all(ms).items()}
    assert got == {(OP.key, (4096, 4096, 4096, 1)): "b", (OP.key, (16, 4096, 4096, 1)): "a",
                   (f16.key, (4096, 4096, 4096, 1)): "c"}


# ------------------------------------------------------------------------------------------ reports
def recorded() -> tuple[list[Measurement], dict[int, dict], ProfileConfig]:
    """A recorded H100 run: two problems, three kernels and cuBLAS, one kernel tied, one wrong, one fault."""
    q = Problem(16, 4096, 4096)
    ms = [
        meas("cublas", 0.1800, kind="baseline", seed=1), meas("cublas", 0.0140, kind="baseline", problem=q, seed=2),
        meas("gemm_k_coop", 0.1750, seed=3), meas("gemm_k_pingpong", 0.1755, seed=4),
        meas("gemm_k_streamk", 0.2100, seed=5), meas("gemm_k_coop", 0.0150, problem=q, seed=6),
        meas("gemm_k_streamk", 0.0120, problem=q, seed=7), meas("gemm_k_pingpong", 0.0, problem=q, status=FAULT),
        meas("gemm_k_wrong", 0.0, status=CHECK_FAILED),
    ]
    ms[7].reason = "the worker process died"
    ms[8].reason = "rel err 0.3 > tol 0.01"
    for m in ms:
        m.gpu = 0
    env = {0: {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc": "9.0", "l2_bytes": 52428800,
               "driver": "580.65", "nvcc": "13.0", "cutlass": "4.2.0", "emitter_version": "0.1.0"}}
    cfg = cfg_text("manifests: [generated/demo]\nproblems: [{square: 4096}, {m: 16, n: 4096, k: 4096}]\n")
    return ms, env, cfg


def test_report_figures_ratio_and_peak():
    ms, env, cfg = recorded()
    r = rep.build(ms, env, cfg)
    coop = next(m for m in ms if m.name == "gemm_k_coop" and m.problem == P)
    f = r.figures[("kernel", "gemm_k_coop", OP.key, (4096, 4096, 4096, 1))]
    tflops = P.flops / (coop.stats.median_ms * 1e-3) / 1e12
    assert f["tflops"] == pytest.approx(tflops)
    assert f["pct_peak"] == pytest.approx(100 * tflops / 989)
    assert f["gbs"] == pytest.approx(min_bytes(OP, P, 0.0) / (coop.stats.median_ms * 1e-3) / 1e9)
    assert f["pct_peak_bw"] == pytest.approx(100 * f["gbs"] / 3350)
    base = next(m for m in ms if m.kind == "baseline" and m.problem == P)
    assert f["ratio"] == pytest.approx(base.stats.median_ms / coop.stats.median_ms)
    ch = r.choices[(OP.key, (4096, 4096, 4096, 1))]
    assert ch.winner.name == "gemm_k_coop" and ch.ties == ("gemm_k_coop", "gemm_k_pingpong")
    assert r.choices[(OP.key, (16, 4096, 4096, 1))].winner.name == "gemm_k_streamk"
    g = rep.geomeans(r)[OP.key]
    assert g["problems"] == 2 and g["min_ratio"] < g["geomean_ratio"]


def test_csv_json_tuning_and_replay(tmp_path):
    ms, env, cfg = recorded()
    r = rep.build(ms, env, cfg)
    paths = rep.write_all(r, tmp_path, plots=False)
    rows = list(csv.DictReader(io.StringIO(Path(paths["csv"]).read_text())))
    assert list(rows[0]) == rep.CSV_COLUMNS and len(rows) == len(ms)
    best = [x for x in rows if x["best"] == "True"]
    assert {(x["m"], x["name"]) for x in best} == {("4096", "gemm_k_coop"), ("16", "gemm_k_streamk")}
    assert {x["name"] for x in rows if x["tied"] == "True"} == {"gemm_k_coop", "gemm_k_pingpong"}
    wrong = next(x for x in rows if x["name"] == "gemm_k_wrong")
    assert wrong["status"] == CHECK_FAILED and wrong["tflops"] == "" and "tol" in wrong["reason"]

    data = json.loads(Path(paths["json"]).read_text())
    assert data["schema_version"] == 1 and data["kind"] == "emitter.profile"
    e = data["environment"]
    assert (e["name"], e["sm_count"], e["driver"], e["nvcc"], e["cutlass"]) == (
        "NVIDIA H100 80GB HBM3", 132, "580.65", "13.0", "4.2.0")
    assert e["emitter_version"] and data["peaks"]["hbm_tbs"] == 3.35 and data["peaks"]["tflops"]["bf16"] == 989
    assert data["baselines"] == ["torch.matmul (cuBLAS)"]

    tuning = json.loads(Path(paths["tuning"]).read_text())
    assert tuning["schema_version"] == 1 and tuning["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
    by_m = {t["problem"]["m"]: t for t in tuning["entries"]}
    assert by_m[4096]["kernel"] == "gemm_k_coop" and by_m[4096]["ties"] == ["gemm_k_coop", "gemm_k_pingpong"]
    assert by_m[4096]["ratio_to_baseline"] > 1 and by_m[16]["op"]["layout"] == "tnt"

    # replay: the recorded results give the same choices and the same files, with no GPU
    ms2, env2, cfg2 = rep.from_json(data)
    r2 = rep.build(ms2, env2, cfg2)
    assert {k: c.winner.name for k, c in r2.choices.items()} == {k: c.winner.name for k, c in r.choices.items()}
    assert rep.to_csv(r2) == rep.to_csv(r)


def test_terminal_table_shows_best_ratio_and_failures():
    from rich.console import Console

    ms, env, cfg = recorded()
    r = rep.build(ms, env, cfg)
    con = Console(record=True, width=240)
    rep.print_table(r, con, all_kernels=True)
    text = con.export_text()
    assert "NVIDIA H100 80GB HBM3" in text and "torch.matmul (cuBLAS)" in text
    assert "* k_coop" in text and "check_failed" in text and "fault" in text
    assert "geometric mean of best/cuBLAS" in text
    con2 = Console(record=True, width=240)
    rep.print_table(r, con2)
    assert "k_wrong" not in con2.export_text()


def test_plots_written(tmp_path):
    pytest.importorskip("matplotlib")
    ms, env, cfg = recorded()
    out = rep.write_plots(rep.build(ms, env, cfg), tmp_path / "plots")
    assert sorted(Path(p).name for p in out) == [f"{OP.key}_ratio.png", f"{OP.key}_tflops.png"]
    for p in out:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_say_so(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    ms, env, cfg = recorded()
    assert "matplotlib is not installed" in rep.write_plots(rep.build(ms, env, cfg), tmp_path)


def test_peaks_per_gpu():
    from emitter.profile.device import peaks_for

    assert peaks_for("NVIDIA H200")["hbm_tbs"] == 4.8
    assert peaks_for("NVIDIA H100 80GB HBM3")["tflops"]["e4m3"] == 1979
    assert peaks_for("NVIDIA H100 80GB HBM3")["tflops"]["tf32"] == 494
    other = peaks_for("Some GPU", {"memory_clock_khz": 1_000_000, "memory_bus_bits": 4096})
    assert other["tflops"] == {} and other["hbm_tbs"] == pytest.approx(1.024)
    assert peaks_for("x", None, {"tflops": {"bf16": 100.0}, "hbm_tbs": 1.0})["tflops"]["bf16"] == 100.0


# ------------------------------------------------------------------------------------------ runner + fake backend
def test_shard_balances_flops_deterministically():
    ps = [Problem(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)] + [Problem(16, 4096, 4096)]
    one, two = shard(ps, 2)
    assert Problem(16384, 16384, 16384) in one and Problem(8192, 8192, 8192) in two
    assert sorted(one + two) == sorted(ps) and shard(ps, 2) == [one, two]
    assert shard(ps, 1) == [ps]


def test_shard_balance_names_the_problem_that_bounds_the_speed_up():
    # the 2-H100 run's set: 16384^3 is most of the work, so 2 GPUs cannot finish in half the time
    ps = [Problem(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)] + [
        Problem(128, 8192, 8192), Problem(512, 8192, 8192), Problem(2048, 16384, 4096), Problem(16384, 4096, 16384)]
    line = shard_balance(ps, 2)
    assert line.startswith("estimated work 15 s (modelled: FLOPs x measurements); queue, largest first, over 2 "
                           "GPUs: 64%, 36% -> 1.56x of one GPU"), line
    assert "16384x16384x16384 alone is 64%" in line and "at most 1.56x sooner" in line
    even = [Problem(8192, 8192, 8192 + 64 * i) for i in range(8)]
    assert shard_balance(even, 2) == ("estimated work 11 s (modelled: FLOPs x measurements); queue, largest first, "
                                      "over 2 GPUs: 50%, 50% -> 2.00x of one GPU")
    assert shard_balance(ps, 1) is None


def test_plan_selects_and_resolves_manifests_beside_the_config(manifest_dir, tmp_path):
    cfg_path = manifest_dir.parent / "p.yaml"
    cfg_path.write_text(f"manifests: [{manifest_dir.name}]\nselect: a=e4m3 fp8_fast_accum=false swap_ab=false swizzle=1\n"
                        "problems: [{square: 1024}]\n")
    pl = plan(load_config(cfg_path), cwd=tmp_path)      # not under cwd: found beside the config
    # the fp8 full-accumulation kernels that are not decode kernels: cooperative 1x2 / 2x1, split-K, ping-pong
    # 64x128 1x1, and the M = 128 ping-pong pair 64x64 / 64x128 2x1
    assert {i["entry"]["config"]["a"] for i in pl.instances} == {"e4m3"} and len(pl.instances) == 6
    assert not any(i["entry"]["config"]["fp8_fast_accum"] for i in pl.instances)
    pl2 = plan(load_config(cfg_path), exclude=("pingpong",), cwd=tmp_path)
    assert len(pl2.instances) == 3
    from emitter.profile.runner import ProfileError

    with pytest.raises(ProfileError, match="keeps none"):
        plan(load_config(cfg_path), select=("tile=1x1x1",), cwd=tmp_path)


def test_fake_run_in_process(manifest_dir, tmp_path):
    cfg = _fake_config(manifest_dir)
    pl = plan(cfg)
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", isolate=False)
    kernels = [m for m in outcome.measurements if m.kind == "kernel"]
    # each kernel on both problems; split-K kernels at more slice counts too where the tiles leave SMs idle
    assert len([m for m in kernels if m.split_k == 1]) == len(pl.instances) * 2 and all(m.ok for m in kernels)
    assert all(m.check["passed"] and "emitter.verify" in m.check["reference"] for m in kernels)
    # bf16, fp8 and fp8 fast-accumulation ops (its own op: its own baseline and winner)
    assert len([m for m in outcome.measurements if m.kind == "baseline"]) == 3 * 2
    assert {m.op.key for m in kernels if m.op.fast_accum} == {"e4m3e4m3_bf16bf16_accf32_tnt_fastacc"}
    r = rep.build(outcome.measurements, outcome.envs, cfg)
    assert len(r.choices) == 6


def test_scheduler_top_resumes_mid_second_pass(manifest_dir, tmp_path):
    """A `top` sweep cut short in its second pass finishes with --resume: the ranking is rebuilt from the
    first pass on record, nothing is measured twice and nothing is lost."""
    cfg = _fake_config(manifest_dir, "scheduler: {swizzle: [null, 2, 4], top: 3}\n")

    def in_second_pass(lines: list[str]) -> int:     # after the first variant of a second pass with more to come
        results = [(i, json.loads(line)["measurement"]) for i, line in enumerate(lines)
                   if '"type": "result"' in line]
        return next(i for (i, m), (_j, nxt) in zip(results, results[1:])
                    if m.get("options") and nxt.get("options") and (m["op"], m["problem"]) == (nxt["op"], nxt["problem"]))

    full, again, log = _cut_and_resume(cfg, tmp_path, in_second_pass)
    key = lambda m: (m.kind, m.label, m.op.key, m.problem.key)          # noqa: E731
    assert sorted(map(key, again.measurements)) == sorted(map(key, full.measurements))
    recorded = [l for l in log.read_text().splitlines() if '"type": "result"' in l]
    assert len(recorded) == len(full.measurements)


def test_scheduler_config_errors_name_the_key():
    with pytest.raises(SpecError, match="swizzle=3"):
        cfg_text(BASE + "scheduler: {swizzle: [1, 3]}\n")
    with pytest.raises(SpecError, match="tiles"):
        cfg_text(BASE + "scheduler: {tiles: 4}\n")
    for bad in ("-1", "two", "true", "1.5"):
        with pytest.raises(SpecError, match="top") as e:
            cfg_text(BASE + f"scheduler: {{swizzle: [null, 4], top: {bad}}}\n")
        assert "whole number" in str(e.value)
    assert cfg_text(BASE + "scheduler: {swizzle: [null, 4], top: 3}\n").scheduler_top == 3
    assert cfg_text(BASE + "scheduler: {swizzle: [null, 4]}\n").scheduler_top == 0


def test_fake_run_isolates_faults_and_wrong_kernels(manifest_dir, tmp_path):
    """A CUDA fault kills its worker; the runner records it, restarts, and the rest is still measured.
    A kernel computing a wrong result fails its check and its time does not count."""
    cfg = _fake_config(manifest_dir)
    pl = plan(cfg)
    names = sorted(i["entry"]["name"] for i in pl.instances)
    pingpong = next(n for n in names if "bf16" in n and "pingpong" in n and "c1x1x1" in n)
    streamk = next(n for n in names if "streamk" in n)
    faults = [{"kind": "illegal_address", "select": pingpong, "problem": "1024x1024x1024"},
              {"kind": "wrong", "select": streamk}]
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", faults=faults)
    by = {(m.name, m.problem.key): m for m in outcome.measurements if m.kind == "kernel"}
    assert by[(pingpong, "1024x1024x1024")].status == FAULT
    assert by[(pingpong, "128x256x512")].status == OK
    assert by[(streamk, "1024x1024x1024")].status == CHECK_FAILED and by[(streamk, "1024x1024x1024")].stats is None
    assert outcome.restarts == 1
    assert len(by) == len(pl.instances) * 2                  # nothing measured twice, nothing lost
    assert sum(m.kind == "baseline" for m in outcome.measurements) == 6     # 3 ops x 2 problems


def test_fake_run_on_two_gpus_shards_problems(manifest_dir, tmp_path):
    cfg = _fake_config(manifest_dir, "gpus: 2\n")
    pl = plan(cfg)
    outcome = run(cfg, pl, tmp_path, [0, 1], backend="fake")
    gpus = {m.problem.key: m.gpu for m in outcome.measurements}
    assert gpus == {"1024x1024x1024": 0, "128x256x512": 1}
    assert set(outcome.envs) == {0, 1}


def test_cli_fake_end_to_end_and_replay(manifest_dir, tmp_path):
    from emitter.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"manifests: [{manifest_dir}]\nproblems: [{{square: [1024, 2048]}}]\n"
                   f"timing: {{iterations: 10, repeats: 2}}\noutput: {{dir: {tmp_path / 'res'}, plots: false}}\n")
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake", "--select", "a=bf16"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "res"
    for f in ("profile.csv", "profile.json", "tuning.json"):
        assert (out / f).is_file()
    assert "fake cuBLAS" in res.output and "geometric mean" in res.output
    tuning = json.loads((out / "tuning.json").read_text())
    assert len(tuning["entries"]) == 2
    res2 = CliRunner().invoke(main, ["profile", "--replay", str(out / "profile.json"), "--no-plots"])
    assert res2.exit_code == 0, res2.output
    assert json.loads((out / "replay" / "tuning.json").read_text())["entries"] == tuning["entries"]


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_event_timer_times_the_gpu_not_python():
    """The blocking kernel spins 0.2 ms per launch: the median must be 0.2 ms, launch overhead excluded."""
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv

    from emitter.profile.config import Timing
    from emitter.profile.timing import EventTimer

    stream = drv.Stream()
    timer = EventTimer(stream, Timing(warmup=3, iterations=50, repeats=3))
    spin = timer._spin

    def launch(i: int) -> None:
        spin.prepared_async_call((1, 1, 1), (1, 1, 1), stream, np.uint64(200_000))

    got = timer.measure(launch, 1)
    assert got.stats.median_ms == pytest.approx(0.2, rel=0.1)
    assert got.stats.samples == 150



@pytest.mark.gpu
def test_event_timer_interleave_on_the_gpu():
    """Two spin kernels of 0.1 and 0.3 ms, interleaved launch by launch: each side's median is its own."""
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv

    from emitter.profile.config import Timing
    from emitter.profile.timing import EventTimer

    stream = drv.Stream()
    timer = EventTimer(stream, Timing(warmup=3, iterations=40, repeats=2))
    spin = timer._spin

    def launcher(ns):
        return lambda i: spin.prepared_async_call((1, 1, 1), (1, 1, 1), stream, np.uint64(ns))

    a, b = timer.interleave([launcher(100_000), launcher(300_000)], 2)
    assert a.median_ms == pytest.approx(0.1, rel=0.1) and b.median_ms == pytest.approx(0.3, rel=0.1)
    assert a.samples == b.samples == 80

def test_fake_run_kills_a_hanging_kernel(manifest_dir, tmp_path):
    cfg = _fake_config(manifest_dir)
    pl = plan(cfg, select=("a=e4m3",))
    victim = sorted(i["entry"]["name"] for i in pl.instances)[0]
    faults = [{"kind": "hang", "select": victim, "problem": "1024x1024x1024", "seconds": 120}]
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", faults=faults, stall_timeout_s=3)
    by = {(m.name, m.problem.key): m for m in outcome.measurements if m.kind == "kernel"}
    assert by[(victim, "1024x1024x1024")].status == FAULT and "no progress" in by[(victim, "1024x1024x1024")].reason
    assert all(m.ok for k, m in by.items() if k != (victim, "1024x1024x1024"))


def test_gpu_engine_kernel_flow_without_a_gpu(monkeypatch):
    """GpuEngine.kernel's order (poison, launch, check, time, check again) and its record, with the device
    pieces replaced by stand-ins: a check that fails only after the timed launches must fail the kernel."""
    import emitter.families.gemm.profile_check as chk
    import emitter.families.gemm.workload as wl
    from emitter.profile.timing import Measured
    from emitter.profile.worker import GpuEngine

    calls: list[str] = []

    class Launch:
        info = {"grid": [1, 1, 1]}
        resets = [(1, 256), None]

        def __init__(self, kernel, data, stream, split_k=1, options=0, workspace_reset="library"):
            calls.append("prepare")

        def __call__(self, i):
            calls.append(f"launch{i}")

        def free(self):
            calls.append("free")

    results = iter([{"passed": True, "reason": None, "rel_err": 1e-3, "tolerance": 1e-2, "unwritten": 0,
                     "nonfinite": 0, "mismatches": 0, "reference": "x"},
                    {"passed": False, "reason": "rel err 0.5 > tol 0.01", "rel_err": 0.5, "tolerance": 1e-2,
                     "unwritten": 0, "nonfinite": 0, "mismatches": 9, "reference": "x"}])
    monkeypatch.setattr(wl, "KernelLaunch", Launch)
    monkeypatch.setattr(chk, "poison_d", lambda data, i=0: calls.append("poison"))
    monkeypatch.setattr(chk, "check", lambda data, cfg, use_torch, split_k=1: (calls.append("check"), next(results))[1])

    class Timer:
        def measure(self, launch, sets):
            calls.append("time")
            return Measured(TimingStats.from_samples([[1.0, 1.1]]), 2, 10, 9.0, 0.0)

    class Stream:
        def synchronize(self):
            pass

    eng = GpuEngine.__new__(GpuEngine)
    eng.config, eng.timer, eng.stream, eng.use_torch = cfg_text(BASE), Timer(), Stream(), True
    eng.extra = lambda data: {"rotation_sets": 2}
    from emitter.families.registry import runtime_family
    kernel = type("K", (), {"config": None, "name": "k", "hooks": runtime_family("gemm")})()
    data = type("D", (), {"sets": [0, 1]})()
    m = eng.kernel(kernel, data, Measurement("kernel", "k", "emitter", OP, P))
    assert calls == ["prepare", "poison", "launch0", "check", "time", "poison", "launch0", "check", "free"]
    assert m.status == CHECK_FAILED and "after the timed launches" in m.reason
    assert m.check["after_timing"]["mismatches"] == 9 and m.extra["workspace_reset_bytes"] == 256


def test_gpu_engine_head_to_head_without_a_gpu(monkeypatch):
    """GpuEngine.head_to_head interleaves the winner's launch (its split-K count and options) with cuBLAS's on
    one stream and frees the kernel's launch state even when timing fails."""
    import emitter.families.gemm.baselines as bl
    import emitter.families.gemm.workload as wl
    from emitter.profile.worker import GpuEngine

    seen: dict = {}

    class Launch:
        def __init__(self, kernel, data, stream, split_k=1, options=0, workspace_reset="library"):
            seen["launch"] = (stream, split_k, options)

        def __call__(self, i):
            pass

        def free(self):
            seen["freed"] = True

    monkeypatch.setattr(wl, "KernelLaunch", Launch)
    monkeypatch.setattr(bl, "cublas", lambda data, stream: (seen.update(cublas=stream),
                                                            bl.BaselineLaunch("cublas", "x", lambda i: None))[1])
    stats = TimingStats.from_samples([[1.0, 1.2]])

    class Timer:
        fail = False

        def interleave(self, launches, sets):
            seen["interleave"] = (len(launches), sets)
            if self.fail:
                raise RuntimeError("boom")
            return stats, stats

    eng = GpuEngine.__new__(GpuEngine)
    eng.config, eng.timer, eng.stream = cfg_text(BASE), Timer(), "S"
    data = type("D", (), {"sets": [0, 1, 2]})()
    from emitter.families.registry import runtime_family
    gemm_kernel = type("K", (), {"hooks": runtime_family("gemm")})()
    got = eng.head_to_head(gemm_kernel, data, Measurement("kernel", "k", "emitter", OP, P, split_k=3, options=5), "cublas")
    assert got == (stats, stats) and seen == {"launch": ("S", 3, 5), "cublas": "S", "interleave": (2, 3), "freed": True}
    seen.clear()
    eng.timer.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        eng.head_to_head(gemm_kernel, data, Measurement("kernel", "k", "emitter", OP, P), "cublas")
    assert seen["freed"]


def test_replay_from_worker_logs_of_a_run_cut_short(manifest_dir, tmp_path):
    """A run killed before it wrote profile.json (machine lost, timeout) is reported from its workers' logs:
    what they finished is there, a line cut mid-write is skipped, and `emitter profile --replay work/`
    writes the usual outputs."""
    from emitter.cli import main as main_cli
    from emitter.profile.runner import outcome_from_logs

    cfg = _fake_config(manifest_dir)
    pl = plan(cfg)
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", isolate=False)
    work = tmp_path / "work"
    log = next(work.glob("shard*.jsonl"))
    lines = log.read_text().splitlines()
    results = [i for i, line in enumerate(lines) if '"type": "result"' in line]
    cut = results[len(results) // 2]
    log.write_text("\n".join(lines[:cut]) + "\n" + lines[cut][: len(lines[cut]) // 2])   # killed mid-line
    back, cfg2 = outcome_from_logs(work)
    assert 0 < len(back.measurements) == sum(1 for i in results if i < cut) < len(outcome.measurements)
    assert cfg2.problems == cfg.problems and back.envs
    res = CliRunner().invoke(main_cli, ["profile", "--replay", str(work), "-o", str(tmp_path / "again"), "--no-plots"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "again" / "profile.json").is_file() and "replaying" in res.output
    with pytest.raises(Exception, match="no shard"):
        outcome_from_logs(tmp_path)


def _cut_and_resume(cfg: ProfileConfig, tmp_path: Path,
                    cut_at: Callable[[list[str]], int]) -> tuple[RunOutcome, RunOutcome, Path]:
    """An uncut fake run, and one cut after log line cut_at(lines) then finished with --resume (real worker
    processes): (uncut outcome, resumed outcome, the resumed run's log)."""
    pl = plan(cfg)
    full = run(cfg, pl, tmp_path / "full", [0], backend="fake", isolate=False)
    out = tmp_path / "cut"
    run(cfg, pl, out, [0], backend="fake", isolate=False)
    log = next((out / "work").glob("shard*.jsonl"))
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[: cut_at(lines) + 1]) + "\n")
    return full, run(cfg, pl, out, [0], backend="fake", resume=True), log


def test_resume_keeps_what_was_measured_and_takes_the_rest(manifest_dir, tmp_path):
    """`emitter profile --resume`: a sweep cut short is finished in a second sitting; nothing measured twice,
    nothing lost, and a work directory of another plan is refused."""
    from emitter.profile.runner import ProfileError

    cfg = _fake_config(manifest_dir)

    def a_third_in(lines: list[str]) -> int:        # the last of the first third of the results
        results = [i for i, line in enumerate(lines) if '"type": "result"' in line]
        return results[: len(results) // 3][-1]

    full, again, log = _cut_and_resume(cfg, tmp_path, a_third_in)
    out = tmp_path / "cut"
    key = lambda m: (m.kind, m.label, m.op.key, m.problem.key)          # noqa: E731
    assert sorted(map(key, again.measurements)) == sorted(map(key, full.measurements))
    recorded = [l for l in log.read_text().splitlines() if '"type": "result"' in l]
    assert len(recorded) == len(full.measurements)                        # the kept ones were not re-measured
    other = cfg.replace(problems=cfg.problems[:1])
    with pytest.raises(ProfileError, match="other problems"):
        run(other, plan(other), out, [0], backend="fake", resume=True)


def test_prune_skips_timing_a_kernel_that_cannot_win(manifest_dir, tmp_path):
    """timing.prune: a kernel whose probe launch takes more than prune x the best so far (cuBLAS's
    included) is checked, recorded as pruned with its probe time, and not timed; 0 times every kernel."""
    from emitter.profile.records import PRUNED

    cfg = _fake_config(manifest_dir)
    pl = plan(cfg)
    slow = next(i["entry"]["name"] for i in pl.instances if not i["entry"]["config"]["fp8_fast_accum"]
                and i["entry"]["config"]["a"] == "bf16")
    model = {"slow": {slow: 0.002}}         # 500x slower than the other kernels of its op
    outcome = run(cfg, pl, tmp_path / "p", [0], backend="fake", isolate=False, model=model)
    mine = [m for m in outcome.measurements if m.name == slow]
    assert mine and all(m.status == PRUNED for m in mine)
    assert all(m.check["passed"] and m.stats is None for m in mine)      # correct, just not timed
    assert all(m.extra["probe_ms"] > m.extra["prune_ms"] > 0 and "4x the best" in m.reason for m in mine)
    others = [m for m in outcome.measurements if m.kind == "kernel" and m.name != slow]
    assert others and all(m.ok for m in others)                          # the rest is timed as before
    r = rep.build(outcome.measurements, outcome.envs, cfg)
    assert all(ch.winner.name != slow for ch in r.choices.values())
    off = parse_config_text(f"manifests: [{manifest_dir}]\nproblems: [{{square: 1024}}]\n"
                            "timing: {iterations: 20, repeats: 3, prune: 0}\n", "p.yaml")
    timed = run(off, plan(off), tmp_path / "off", [0], backend="fake", isolate=False, model=model)
    assert all(m.ok for m in timed.measurements if m.name == slow)


@pytest.mark.parametrize("value,ok", [(0, True), (False, True), (4, True), (1.5, True), (1.2, False), (-1, False)])
def test_prune_config_is_checked(value, ok):
    text = f"manifests: [x]\nproblems: [{{square: 1024}}]\ntiming: {{prune: {str(value).lower()}}}\n"
    if ok:
        assert parse_config_text(text, "p.yaml").timing.prune == float(value or 0)
    else:
        with pytest.raises(SpecError) as e:
            parse_config_text(text, "p.yaml")
        assert "prune" in str(e.value)


def test_cli_options_replace_the_scheduler_sweep(manifest_dir, tmp_path):
    """`emitter profile --options swizzle=4` times every kernel with that one option set and nothing else (the
    launch ncu_compare profiles is then the one the tuning table chose); a bad value is a clear error."""
    from emitter.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"manifests: [{manifest_dir}]\nproblems: [{{square: 1024}}]\n"
                   "scheduler: {swizzle: [null, 2, 4]}\n"
                   f"timing: {{iterations: 10, repeats: 2}}\noutput: {{dir: {tmp_path / 'res'}, plots: false}}\n")
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake", "--select", "a=bf16 split_k=none",
                                    "--no-baseline", "--options", "swizzle=4"])
    assert res.exit_code == 0, res.output
    kernels = [m for m in json.loads((tmp_path / "res" / "profile.json").read_text())["measurements"]
               if m["kind"] == "kernel"]
    from emitter.kit.scheduler import SchedulerOptions

    assert len(kernels) == 4 and {m["options"] for m in kernels} == {SchedulerOptions(swizzle=4).encode()}
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake", "--options", "swizzle=3"])
    assert res.exit_code != 0 and "swizzle=3" in res.output and "Traceback" not in res.output
