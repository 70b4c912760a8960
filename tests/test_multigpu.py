"""The profiler on several GPUs of one host (issue 30, the part CI can run): three fake GPUs, one worker process
each, problems sharded by FLOPs. Every GPU gets work, the workers' logs say which problem ran where, the
merged results equal a one-GPU run's (the fake engine's times depend on kernel and problem, not on the GPU),
and a GPU whose worker crashes or hangs in the middle loses nothing of the other GPUs' results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from emitter.profile import report as rep
from emitter.profile.config import parse_config_text
from emitter.profile.records import FAULT
from emitter.profile.runner import plan, run, shard

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ["256x256x256", "512x512x512", "1024x1024x1024", "2048x2048x2048", "4096x4096x4096",
            "128x4096x4096", "16x8192x8192"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    from emitter.emit import emit

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], out)
    return out


def _config(manifest: Path, gpus: int):
    probs = "\n".join(f"  - {{m: {m}, n: {n}, k: {k}}}" for m, n, k in (p.split("x") for p in PROBLEMS))
    return parse_config_text(f"manifests: [{manifest}]\nproblems:\n{probs}\ngpus: {gpus}\n"
                             "timing: {iterations: 10, repeats: 2}\n", "p.yaml")


def _key(m) -> tuple:
    return (m.kind, m.label, m.op.key, m.problem.key)


def _tuning(outcome, cfg, out: Path) -> list:
    rep.write_all(rep.build(outcome.measurements, outcome.envs, cfg), out, plots=False)
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
    # every GPU got work, exactly the FLOP-balanced shards
    split = {g: sorted(p.key for p in ps) for g, ps in zip([0, 1, 2], shard(pl.problems, 3))}
    assert all(split.values())
    ran = {}
    for m in three.measurements:
        ran.setdefault(m.gpu, set()).add(m.problem.key)
    assert {g: sorted(ps) for g, ps in ran.items()} == split
    # the logs say which problem ran where: each worker names its GPU on every line
    err = capfd.readouterr().err
    for g, keys in split.items():
        lines = [l for l in err.splitlines() if l.startswith(f"[gpu{g}]")]
        assert re.search(rf"\[gpu{g}\] fake GPU .*: {len(keys)} problems x 4 kernels", err)
        for k in keys:
            assert any(k in l for l in lines), (g, k)
        others = [k for h, ks in split.items() if h != g for k in ks]
        assert not any(re.search(rf"\s{re.escape(k)}\s", l) for l in lines for k in others)
    # and profile.json records it per measurement
    rep.write_all(rep.build(three.measurements, three.envs, cfg), tmp_path / "r", plots=False)
    saved = json.loads((tmp_path / "r" / "profile.json").read_text())
    assert {m["gpu"] for m in saved["measurements"]} == {0, 1, 2}
    # merged: the same measurements and medians as one GPU, so the same winners
    med = lambda o: {_key(m): (m.status, m.stats.median_ms if m.stats else None) for m in o.measurements}  # noqa: E731
    assert med(three) == med(one)
    assert _tuning(three, cfg, tmp_path / "t") == one_table and len(one_table) == len(PROBLEMS)


def test_a_gpu_that_crashes_or_hangs_loses_nothing_of_the_others(manifest, one_gpu, tmp_path):
    """GPU 1's worker dies mid-run (a crashing kernel), GPU 2's hangs (killed after the stall timeout): each is
    restarted without its culprit, which gets a fault record; every other measurement of the run is there and
    equals the one-GPU run's."""
    one, _table = one_gpu
    cfg = _config(manifest, 3)
    pl = plan(cfg)
    shards = shard(pl.problems, 3)
    names = [i["entry"]["name"] for i in pl.instances]
    crash_at, hang_at = shards[1][-1].key, shards[2][-1].key
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
    assert {m.gpu for m in out.measurements if m.problem.key in {p.key for p in shards[0]}} == {0}
