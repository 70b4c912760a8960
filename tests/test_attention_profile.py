"""Attention: every configured instance has a runnable default problem; `emitter profile` of attention
instances through the family's profile hooks (fake backend: tuning table, winners per problem, baselines)."""

from __future__ import annotations

import json

import pytest

from emitter.emit import emit
from emitter.families.attention import runtime as hooks
from emitter.resources import configs_root

ATTENTION_CONFIGS = sorted((configs_root() / "attention").glob("*.yaml"))


@pytest.mark.parametrize("spec", ATTENTION_CONFIGS, ids=lambda p: p.name)
def test_every_instance_has_a_runnable_default_problem(spec, tmp_path):
    emit([spec], tmp_path, jobs=1)
    entries = json.loads((tmp_path / "manifest.json").read_text())["instances"]
    assert entries, f"{spec.name}: no instances"
    for e in entries:
        cfg = hooks.config_from_entry(e)
        for quick in (True, False):
            probs = hooks.default_problems(cfg, quick=quick)
            runnable = [p for p, _ in probs if not hooks.not_supported_reasons(cfg, p)]
            assert runnable, (f"{spec.name}: {e['name']} (quick={quick}) has no runnable default problem: "
                              + "; ".join(hooks.not_supported_reasons(cfg, p)[0] for p, _ in probs))
        if not cfg.varlen:     # the tile-multiple cases run on every fixed-length instance, and odd ones stay
            full = hooks.default_problems(cfg)
            assert any(p.seq_k % cfg.tile_kv for p, _ in full)
            assert any(p.seq_k % cfg.tile_kv == 0 and not hooks.not_supported_reasons(cfg, p) for p, _ in full)
