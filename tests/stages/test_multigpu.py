"""The profiler on several GPUs of one host (issues 30 and 41, the part CI can run): fake GPUs, one worker process
each, fed from one queue, the largest estimated cost first. Every GPU gets work, the workers' logs say which
problem ran where, the merged results equal a one-GPU run's (the fake engine's times depend on kernel and
problem, not on the GPU), a set whose costs are skewed (and unrelated to FLOPs) finishes within one problem of
the ideal once an earlier run's measured seconds order the queue, and a worker that crashes, hangs or is
killed from outside loses only its measurement in flight: the rest of its problem goes to another GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from emitter.profile import report as rep
from emitter.profile.config import parse_config_text
from emitter.profile.cost import Estimate, balance_line, estimate, lpt, queue_order
from emitter.profile.records import FAULT
from emitter.profile.runner import plan, run

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ["256x256x256", "512x512x512", "1024x1024x1024", "2048x2048x2048", "4096x4096x4096",
            "128x4096x4096", "16x8192x8192"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    from emitter.emit import emit

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], out)
    return out


def _config(manifest: Path, gpus: int, problems: list[str] = PROBLEMS):
    probs = "\n".join(f"  - {{m: {m}, n: {n}, k: {k}}}" for m, n, k in (p.split("x") for p in problems))
    return parse_config_text(f"manifests: [{manifest}]\nproblems:\n{probs}\ngpus: {gpus}\n"
                             "timing: {iterations: 10, repeats: 2}\n", "p.yaml")


def _key(m) -> tuple:
    return (m.kind, m.label, m.op.key, m.problem.key)


def _med(outcome) -> dict:
    return {_key(m): (m.status, m.stats.median_ms if m.stats else None) for m in outcome.measurements}


def _tuning(outcome, cfg, out: Path) -> list:
    rep.write_all(rep.build(outcome.measurements, outcome.envs, cfg, run=outcome.run), out, plots=False)
    return json.loads((out / "tuning.json").read_text())["entries"]


@pytest.fixture(scope="module")
def one_gpu(manifest, tmp_path_factory):
    cfg = _config(manifest, 1)
    out = tmp_path_factory.mktemp("one")
    outcome = run(cfg, plan(cfg), out, [0], backend="fake")
    assert not outcome.fatal and outcome.restarts == 0
    return outcome, _tuning(outcome, cfg, out)


def test_three_gpus_share_the_work_and_agree_with_one(manifest, one_gpu, tmp_path, capfd):
    one, one_table = one_gpu
    cfg = _config(manifest, 3)
    pl = plan(cfg)
    three = run(cfg, pl, tmp_path, [0, 1, 2], backend="fake")
    assert not three.fatal and three.restarts == 0 and set(three.envs) == {0, 1, 2}
    # each problem ran on exactly one GPU, every GPU took some, and the run says which took what
    ran: dict[str, set] = {}
    for m in three.measurements:
        ran.setdefault(m.problem.key, set()).add(m.gpu)
    assert set(ran) == set(PROBLEMS) and all(len(g) == 1 for g in ran.values())
    split = {g: sorted(k for k, gs in ran.items() if g in gs) for g in (0, 1, 2)}
    assert all(split.values())
    per_gpu = three.run["per_gpu"]
    assert {g: sorted(per_gpu[str(g)]["taken"]) for g in (0, 1, 2)} == split
    assert sum(per_gpu[str(g)]["problems"] for g in (0, 1, 2)) == len(PROBLEMS)
    # the queue hands out the largest estimate first: the first problem each GPU took is the next of that order
    order = [p.key for p in queue_order(pl.problems, estimate(pl, cfg))]
    assert [per_gpu[str(g)]["taken"][0] for g in (0, 1, 2)] == order[:3]
    assert all(p["wall_s"] and p["wall_s"] > 0 and len(p["gpus"]) == 1 for p in three.run["problems"])
    # the logs say which problem ran where: each worker names its GPU on every line
    err = capfd.readouterr().err
    for g, keys in split.items():
        lines = [line for line in err.splitlines() if line.startswith(f"[gpu{g}]")]
        assert re.search(rf"\[gpu{g}\] fake GPU .*: {len(PROBLEMS)} problems, taken from the queue x 4 kernels", err)
        for k in keys:
            assert any(k in line for line in lines), (g, k)
        others = [k for h, ks in split.items() if h != g for k in ks]
        assert not any(re.search(rf"\s{re.escape(k)}\s", line) for line in lines for k in others)
    # and profile.json records it per measurement, with the run's per-problem wall seconds
    rep.write_all(rep.build(three.measurements, three.envs, cfg, run=three.run), tmp_path / "r", plots=False)
    saved = json.loads((tmp_path / "r" / "profile.json").read_text())
    assert {m["gpu"] for m in saved["measurements"]} == {0, 1, 2}
    assert sorted(p["problem"] for p in saved["run"]["problems"]) == sorted(PROBLEMS)
    # merged: the same measurements and medians as one GPU, so the same winners
    assert _med(three) == _med(one)
    assert _tuning(three, cfg, tmp_path / "t") == one_table and len(one_table) == len(PROBLEMS)


def test_lpt_follows_the_estimate_and_names_what_bounds_it():
    """The queue's order is the estimate's, not the FLOPs': a schedule of skewed costs is within one problem of the
    ideal, and the balance line names a problem that is more than a GPU's share."""
    from emitter.families.gemm.profile import Problem

    ps = [Problem(64 * (i + 1), 64, 64) for i in range(8)]
    secs = {p.key: s for p, s in zip(ps, [0.4, 0.4, 2.4, 0.4, 1.2, 0.4, 0.4, 0.4])}
    est = Estimate(secs, {k: "measured" for k in secs}, prior="x/profile.json")
    assert queue_order(ps, est)[0].key == "192x64x64"          # not the most FLOPs: the most seconds
    shards, load = lpt(ps, 2, est)
    assert max(load) - sum(secs.values()) / 2 <= 0.4 + 1e-9   # within one (small) problem of ideal
    assert sorted(p.key for s in shards for p in s) == sorted(p.key for p in ps)
    line = balance_line(ps, 2, est)
    assert line.startswith("estimated work 6 s (8 measured in x/profile.json); queue, largest first, over 2 GPUs: ")
    assert "-> 1.88x of one GPU" in line and "alone" not in line
    big = Estimate({**secs, "192x64x64": 9.0}, est.source, prior=est.prior)
    assert "192x64x64 alone is 71% of it" in balance_line(ps, 2, big)
    assert balance_line(ps, 1, est) is None


def test_a_skewed_set_finishes_within_one_problem_of_ideal(manifest, tmp_path):
    """Problems whose cost has nothing to do with their FLOPs (fake operand sets that take 0.4 to 2.4 s): one
    GPU's run records each problem's wall seconds in profile.json; a two-GPU run ordered by them keeps the GPUs
    busy to within one problem of half the work, and measures exactly what the one-GPU run measured."""
    keys = [f"{64 * (i + 1)}x256x256" for i in range(8)]
    sleeps = dict(zip(keys, [0.4, 0.4, 2.4, 0.4, 1.2, 0.4, 0.4, 0.4]))
    model = {"prepare_s": sleeps}
    cfg = _config(manifest, 1, keys)
    pl = plan(cfg)
    one = run(cfg, pl, tmp_path / "one", [0], backend="fake", model=model)
    rep.write_all(rep.build(one.measurements, one.envs, cfg, run=one.run), tmp_path / "one", plots=False)
    walls = {p["problem"]: p["wall_s"] for p in one.run["problems"]}
    assert all(walls[k] >= sleeps[k] for k in keys)
    est = estimate(pl, cfg, tmp_path / "one" / "profile.json")
    assert all(est.source[k] == "measured" for k in keys) and est.of(pl.problems[2]) == walls["192x256x256"]
    two = run(cfg, pl, tmp_path / "two", [0, 1], backend="fake", model=model, cost=est)
    assert not two.fatal and two.restarts == 0
    assert two.run["estimate"]["from"] == str(tmp_path / "one" / "profile.json")
    per = two.run["per_gpu"]
    assert per["0"]["taken"][0] == "192x256x256" and per["1"]["taken"][0] == "320x256x256"   # 2.4 s, then 1.2 s
    busy = [per[g]["busy_s"] for g in ("0", "1")]
    small = max(p["wall_s"] for p in two.run["problems"] if p["problem"] not in ("192x256x256", "320x256x256"))
    assert max(busy) <= sum(busy) / 2 + small, (busy, small)
    assert _med(two) == _med(one)


def _op(got: dict, pkey: str) -> str:
    return next(k[2] for k in got if k[3] == pkey)


def _worker_pid(job: Path) -> int | None:
    """The pid of the worker process running job (its command line names the job file)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"emitter.profile.worker" in cmd and str(job).encode() in cmd:
            return int(d)
    return None


def test_a_gpu_that_crashes_or_hangs_loses_nothing_of_the_others(manifest, one_gpu, tmp_path):
    """One worker dies mid-run (a crashing kernel), another hangs (killed after the stall timeout): each is
    restarted, its culprit gets a fault record, the rest of its problem goes back to the queue for another GPU,
    and every other measurement of the run is there and equals the one-GPU run's."""
    one, _table = one_gpu
    cfg = _config(manifest, 3)
    pl = plan(cfg)
    names = [i["entry"]["name"] for i in pl.instances]
    crash_at, hang_at = "2048x2048x2048", "128x4096x4096"
    faults = [{"kind": "crash", "select": names[0], "problem": crash_at},
              {"kind": "hang", "select": names[2], "problem": hang_at, "seconds": 120}]
    out = run(cfg, pl, tmp_path, [0, 1, 2], backend="fake", faults=faults, stall_timeout_s=4)
    assert out.restarts == 2 and not out.fatal
    got = {_key(m): m for m in out.measurements}
    assert len(got) == len(out.measurements)                          # nothing measured twice
    faulted = {k for k, m in got.items() if m.status == FAULT}
    assert {(k[1], k[3]) for k in faulted} == {(names[0], crash_at), (names[2], hang_at)}
    assert "no progress" in next(m.reason for k, m in got.items() if k[1] == names[2] and k[3] == hang_at)
    ref = {_key(m): m for m in one.measurements}
    assert set(got) == set(ref)                                       # nothing lost
    for k, m in got.items():
        if k not in faulted:
            assert (m.status, m.stats.median_ms if m.stats else None) == \
                   (ref[k].status, ref[k].stats.median_ms if ref[k].stats else None), k
    for culprit, pkey in ((names[0], crash_at), (names[2], hang_at)):   # the rest of the problem: another GPU
        row = next(p for p in out.run["problems"] if p["problem"] == pkey)
        assert len(row["gpus"]) == 2 and row["gpus"][0] != row["gpus"][1], row
        assert got[("kernel", culprit, _op(got, pkey), pkey)].gpu == row["gpus"][0]
        later = names[names.index(culprit) + 1:]
        assert {m.gpu for m in out.measurements if m.problem.key == pkey and m.name in later} == {row["gpus"][1]}
    assert sum("went back to the queue for another GPU" in e for e in out.events) == 2
    assert any("no progress" not in e and crash_at in e and "died (exit code" in e for e in out.events)


def test_a_worker_killed_from_outside_loses_only_its_measurement(manifest, one_gpu, tmp_path):
    """The FAULT=1 run of scripts/multigpu_check.sh, here: a worker is SIGKILLed while it measures a kernel (held by
    a hang). That one measurement is a fault record naming the death, the problem's other kernels are measured on
    another GPU, the killed GPU's new worker takes further problems, the run completes and says what happened."""
    one, _table = one_gpu
    cfg = _config(manifest, 2)
    pl = plan(cfg)
    names = [i["entry"]["name"] for i in pl.instances]
    victim, where = names[1], "1024x1024x1024"
    faults = [{"kind": "hang", "select": victim, "problem": where, "seconds": 120}]
    work = tmp_path / "work"
    killed: list[tuple[int, int]] = []

    def kill_when_held() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and not killed:
            for i in (0, 1):
                log = work / f"shard{i}.jsonl"
                text = log.read_text() if log.exists() else ""
                if f'"name": "{victim}"' in text and f'"problem": "{where}"' in text and '"type": "start"' in text:
                    time.sleep(0.3)
                    pid = _worker_pid(work / f"shard{i}.job.json")
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        killed.append((i, pid))
                        return
            time.sleep(0.05)

    t = threading.Thread(target=kill_when_held)
    t.start()
    out = run(cfg, pl, tmp_path, [0, 1], backend="fake", faults=faults, stall_timeout_s=60)
    t.join()
    assert killed and out.restarts == 1 and not out.fatal
    gpu = killed[0][0]
    got = {_key(m): m for m in out.measurements}
    assert set(got) == {_key(m) for m in one.measurements}            # nothing lost
    lost = [m for m in out.measurements if m.status == FAULT]
    assert [(m.name, m.problem.key, m.gpu) for m in lost] == [(victim, where, gpu)]
    assert "died (exit code -9)" in lost[0].reason
    row = next(p for p in out.run["problems"] if p["problem"] == where)
    assert row["gpus"] == [gpu, 1 - gpu] and row["wall_s"] > 0
    after = [m for m in out.measurements if m.problem.key == where and m.kind == "kernel"
             and names.index(m.name) > names.index(victim)]
    assert after and {m.gpu for m in after} == {1 - gpu}
    assert out.run["per_gpu"][str(gpu)]["problems"] >= 2               # its restarted worker took more work
    assert out.events == [f"gpu{gpu}: the worker died (exit code -9) measuring {victim} on {where}: recorded as a "
                          f"fault; the rest of {where} went back to the queue for another GPU"]
