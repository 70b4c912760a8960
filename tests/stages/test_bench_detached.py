"""scripts/bench_gpu_detached.sh: a long sweep survives short commands (start detached, wait, pack, resume)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_gpu_detached.sh"


def _call(env: dict[str, str], wait: int) -> str:
    r = subprocess.run(["bash", str(SCRIPT), str(wait)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("setsid") is None, reason="no setsid")
def test_detached_sweep_outlives_the_call_then_resumes(tmp_path):
    run = tmp_path / "bench" / "sm90a"
    out = tmp_path / "out"
    fake = (f"sleep 3; mkdir -p {run}/profile/work; echo '{{}}' > {run}/profile/work/shard0.jsonl; "
            "echo sweep-finished")
    env = {**os.environ, "RUN": str(run), "OUT": str(out), "BENCH_CMD": fake}
    first = _call(env, 0)
    assert "starting:" in first and "still running" in first
    assert (out / "run.tgz").is_file()
    second = _call(env, 20)                       # the sweep kept running between the two calls
    assert "already running" in second and "BENCH_EXIT 0" in second and "sweep-finished" in second
    with tarfile.open(out / "run.tgz") as tar:
        names = tar.getnames()
    assert "sm90a/profile/work/shard0.jsonl" in names and "bench.log" in names
    assert "already finished" in _call(env, 0)
    # a new machine: the previous sitting's logs carried in -> the sweep resumes instead of starting afresh
    carry = tmp_path / "carry"
    shutil.copytree(run / "profile", carry)
    env2 = {**env, "RUN": str(tmp_path / "fresh" / "sm90a"), "BENCH_CARRY": str(carry)}
    third = _call(env2, 20)
    assert "starting (resuming)" in third and "BENCH_EXIT 0" in third
    assert (tmp_path / "fresh" / "sm90a" / "profile" / "work" / "shard0.jsonl").is_file()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="no setsid")
def test_carried_run_folder_brings_confirmation_verify_and_times(tmp_path):
    """BENCH_CARRY may be the run folder of an earlier run.tgz (`sm90a`): the sweep's shards, the confirmation rows
    done so far, verify.json and run.json all reach the new sitting, so neither verify nor confirmed rows repeat."""
    carry = tmp_path / "carried" / "sm90a"
    (carry / "profile" / "work").mkdir(parents=True)
    (carry / "profile" / "work" / "shard0.jsonl").write_text("{}\n")
    (carry / "profile" / "confirm.json").write_text('{"rows": []}')
    (carry / "verify.json").write_text("{}")
    (carry / "run.json").write_text('{"times": {"build": 1}}')
    run = tmp_path / "fresh" / "sm90a"
    env = {**os.environ, "RUN": str(run), "OUT": str(tmp_path / "out"), "BENCH_CARRY": str(carry),
           "BENCH_CMD": "echo resumed"}
    out = _call(env, 20)
    assert "starting (resuming)" in out and "BENCH_EXIT 0" in out
    for rel in ("profile/work/shard0.jsonl", "profile/confirm.json", "verify.json", "run.json"):
        assert (run / rel).is_file(), rel
    assert (run / "run.json").read_text() == '{"times": {"build": 1}}'
