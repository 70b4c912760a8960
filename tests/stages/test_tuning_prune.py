"""timing.prune never leaves a problem without a timed kernel: when every candidate's probe is over prune x the
best so far (a baseline far ahead of them all, as `emitter profile` on a conv manifest once reported for ResNet-50
wgrad: "none ran correctly (pruned)"), the best-probed candidate is timed anyway and wins the tuning entry."""

from __future__ import annotations

import pytest

from emitter.emit import emit
from emitter.profile.records import PRUNED
from tests._helpers import CONV_SM80_WGRAD_SPLITK_ENTRY

SPEC = """\
kernels:
  - family: conv
    arch: sm90a
    op: wgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: [128x128x64, 128x64x64]
    stages: 4
""" + CONV_SM80_WGRAD_SPLITK_ENTRY
PROBLEM = "n=32,h=56,w=56,c=64,k=64,r=3,s=3,pad=1"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    out = tmp_path_factory.mktemp("prune")
    (out / "spec.yaml").write_text(SPEC)
    emit([out / "spec.yaml"], out / "k", jobs=1)
    return out / "k"


def _run(manifest, out, model, prune=4.0):
    from emitter.manifest import manifest_path
    from emitter.profile.config import ProfileConfig, Timing, problems_from_text
    from emitter.profile.runner import plan, run

    mpath = manifest_path(manifest)
    probs = tuple(problems_from_text([PROBLEM], families=["conv"]))
    cfg = ProfileConfig(file=str(mpath), manifests=(str(mpath.resolve()),), problems=probs, baselines=("cudnn",),
                        timing=Timing(iterations=20, repeats=3, prune=prune))
    return cfg, run(cfg, plan(cfg), out, [0], backend="fake", isolate=False, model=model)


def test_every_candidate_pruned_the_best_probed_is_timed_anyway(manifest, tmp_path):
    from emitter.profile import report as rep

    # the baseline 2000x faster than any kernel: every probe is over 4x the best so far
    cfg, outcome = _run(manifest, tmp_path / "p", {"baseline_tflops": 700.0 * 2000, "launch_us": 0.0, "hbm_tbs": 1e6})
    kern = [m for m in outcome.measurements if m.kind == "kernel"]
    ok = [m for m in kern if m.ok]
    pruned = [m for m in kern if m.status == PRUNED]
    assert len(ok) == 1, [(m.label, m.status, m.reason) for m in kern]
    assert len(pruned) == len(kern) - 1 >= 3          # the others (split-K variants included) stay pruned
    winner = ok[0]
    assert "timed anyway as the best-probed one" in winner.extra["pruning_waived"]
    assert all(winner.stats.median_ms * 0.999 <= m.extra["probe_ms"] for m in pruned)   # the best-probed one
    r = rep.build(outcome.measurements, outcome.envs, cfg)
    assert [ch.winner.label for ch in r.choices.values()] == [winner.label]
    # one record per launch in the log (the rescued launch's timed record, never its pruned one)
    labels = [m.label for m in kern]
    assert len(labels) == len(set(labels))


def test_pruning_still_prunes_when_some_candidate_is_timed(manifest, tmp_path):
    # a baseline as fast as the kernels: nothing pruned, nothing waived
    _, outcome = _run(manifest, tmp_path / "p", {})
    kern = [m for m in outcome.measurements if m.kind == "kernel"]
    assert kern and all(m.ok and "pruning_waived" not in (m.extra or {}) for m in kern)
    # one kernel hopeless: pruned as before, the rest timed, no waiver
    slow = sorted({m.name for m in kern})[0]
    _, outcome = _run(manifest, tmp_path / "q", {"slow": {slow: 0.002}})
    kern = [m for m in outcome.measurements if m.kind == "kernel"]
    assert {m.status for m in kern if m.name == slow} == {PRUNED}
    assert all(m.ok and "pruning_waived" not in (m.extra or {}) for m in kern if m.name != slow)
