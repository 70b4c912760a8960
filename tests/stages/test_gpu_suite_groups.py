"""scripts/gpu_suite.sh's grouping without a GPU (GROUPS_ONLY=1): every test file holding a GPU test lands in exactly
one group, and SHARD=i/n splits each group's files into n disjoint parts that together are the group."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def groups(shard: str | None = None) -> dict[str, list[str]]:
    env = {**os.environ, "GROUPS_ONLY": "1"}
    if shard:
        env["SHARD"] = shard
    out = subprocess.run(["bash", "scripts/gpu_suite.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        m = re.match(r"== (\w+): \d+ files", line)
        if m:
            current = m.group(1)
            got[current] = []
        elif line.startswith("   tests/") and current:
            got[current].append(line.strip())
    return got


def test_every_gpu_test_file_is_in_one_group():
    whole = groups()
    files = [f for fs in whole.values() for f in fs]
    assert len(files) == len(set(files))
    needle = "mark." + "gpu"       # spelled apart, so this CPU test file is not one the suite's grep finds
    marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                    if needle in p.read_text(encoding="utf-8"))
    assert sorted(files) == marked


def test_shards_partition_each_group():
    whole = groups()
    parts = [groups(f"{i}/3") for i in (1, 2, 3)]
    for g, files in whole.items():
        split = [f for p in parts for f in p[g]]
        assert sorted(split) == sorted(files) and len(split) == len(set(split)), g


def test_a_bad_shard_is_refused():
    env = {**os.environ, "GROUPS_ONLY": "1", "SHARD": "3/2"}
    out = subprocess.run(["bash", "scripts/gpu_suite.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "i must not exceed n" in out.stderr
