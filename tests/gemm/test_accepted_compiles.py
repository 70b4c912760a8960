"""Accepted means it compiles.

Fast property (hypothesis, no nvcc): every random spec point either resolves to an instance that
renders and names cleanly, or is rejected with a rule and a reason — never an exception.
Slow property (nvcc, CI): a random sample of accepted instances, 4 for sm80 and 4 for sm90a per run,
all compile (device cubin and host shim). The seed is printed; EMITTER_TEST_SEED=<seed> replays it.
By default the seed comes from the content of the rules and templates (emitter/families/gemm,
templates/gemm, the spec space): a given tree always draws the same sample, so CI's verdict on a commit
is the one a developer saw locally, and every change to the rules draws a new sample.
EMITTER_TEST_SEED=random draws from the clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emitter.emit import Resolved, render_instance, resolve_specs
from emitter.families.gemm.model import Rejection
from tests.spec_space import draw_spec


def _resolve_one(tmp_path, spec: dict, idx: int = 0):
    p = tmp_path / f"draw{idx}.yaml"
    p.write_text(yaml.safe_dump(spec))
    resolved, rejected, _, _ = resolve_specs([p])
    assert len(resolved) + len(rejected) == 1
    return (resolved or rejected)[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(use_true_random=False), arch=st.sampled_from(["sm80", "sm90a"]))
def test_every_point_resolves_or_is_rejected_with_a_reason(tmp_path, rng, arch):
    out = _resolve_one(tmp_path, draw_spec(rng, arch))
    if isinstance(out, Rejection):
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", out.rule), out.rule
        assert len(out.reason) > 15
        return
    assert isinstance(out, Resolved)
    assert re.fullmatch(r"[a-z][a-z0-9_]*", out.name)
    text = render_instance(out)
    assert f"emitter_{out.name}_kernel" in text and f"emitter_{out.name}_query" in text


def _sample(seed: int, arch: str, count: int, tmp_path) -> list[dict]:
    rng = random.Random(f"{seed}-{arch}")
    picked, names = [], set()
    for i in range(5000):
        spec = draw_spec(rng, arch)
        out = _resolve_one(tmp_path, spec, i)
        if isinstance(out, Resolved) and out.name not in names:
            names.add(out.name)
            picked.append(spec)
            if len(picked) == count:
                return picked
    raise AssertionError(f"fewer than {count} accepted {arch} instances in 5000 draws")


def _seed() -> int:
    given = os.environ.get("EMITTER_TEST_SEED", "")
    if given == "random":
        return time.time_ns() % 1_000_000
    if given:
        return int(given)
    root = Path(__file__).resolve().parents[2]
    files = sorted([*(root / "emitter" / "families" / "gemm").glob("*.py"), *(root / "templates" / "gemm").rglob("*.j2"),
                    root / "tests" / "spec_space.py"])
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return int.from_bytes(h.digest()[:8], "little") % 1_000_000


@pytest.mark.nvcc
def test_random_accepted_instances_compile(tmp_path):
    from click.testing import CliRunner

    from emitter.cli import main

    seed = _seed()
    print(f"EMITTER_TEST_SEED={seed}")
    specs = _sample(seed, "sm80", 4, tmp_path) + _sample(seed, "sm90a", 4, tmp_path)
    spec_file = tmp_path / "sample.yaml"
    spec_file.write_text(yaml.safe_dump(specs))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["emit", str(spec_file), "-o", str(out)])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["instances"]) == 8, manifest["rejected"]
    r = CliRunner().invoke(main, ["build", str(out), "--cache-dir", str(tmp_path / "cache")])
    failed = []
    for inst in manifest["instances"]:
        rec = json.loads((out / "build" / inst["name"] / "record.json").read_text())
        if rec["status"] not in ("ok", "cached"):
            failed.append((inst["name"], rec.get("error")))
    assert not failed, f"seed {seed}: accepted instances failed to compile: {failed}\n{r.output[-3000:]}"
    assert r.exit_code == 0, r.output
    # accepted means it also runs something: the host shim's can_implement (which needs no GPU) takes an
    # ordinary aligned problem (an fp8 k-block longer than the promotion interval once built and refused all)
    refused = [f"{inst['name']}: {why}" for inst in manifest["instances"]
               if (why := _refuses_a_plain_problem(out / "build" / inst["name"], inst))]
    assert not refused, f"seed {seed}: accepted instances refuse a plain 1024^3 problem: {refused}"


def _refuses_a_plain_problem(build: Path, inst: dict) -> str | None:
    """Why the instance's host shim refuses m = n = k = 1024 (EMITTER_CANNOT_IMPLEMENT), or None."""
    from emitter.families.gemm.abi import EmitterGemmProblem
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, HostShim

    cfg = inst["config"]
    fake = 1 << 20                  # 1 MiB: aligned for every operand, never dereferenced by query()
    shim = HostShim(build / f"lib{inst['name']}.so", inst["name"])
    status, _ = shim.query(EmitterGemmProblem(
        m=1024, n=1024, k=1024, batch_count=2 if cfg.get("batched") else 1,
        split_k_slices=2 if cfg.get("split_k") == "serial" else 1, A=fake, B=fake, C=fake, D=fake,
        bias=fake if (cfg.get("epilogue") or {}).get("bias", "none") != "none" else None, alpha=1.0, beta=1.0))
    return "EMITTER_CANNOT_IMPLEMENT" if status == EMITTER_CANNOT_IMPLEMENT else None
