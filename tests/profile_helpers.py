"""Profile-stage pieces that tests/stages/test_profile.py and tests/gemm/test_gemm_profile.py share: config text
parsing, GEMM's bf16 op and 4096^3 problem as the example, recorded measurements with chosen noise, an emitted
manifest of the sm90a bf16 and fp8 GEMM configs (a module fixture: each importing test module gets its own), and
a small fake-backend profile config over it.

Imported by its bare name (`from profile_helpers import ...`, with tests/ on sys.path)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from emitter.families.gemm.profile import Op, Problem
from emitter.profile.config import ProfileConfig, parse_config_text
from emitter.profile.records import OK, Measurement
from emitter.profile.stats import TimingStats

ROOT = Path(__file__).resolve().parents[1]


def cfg_text(text: str, file: str = "p.yaml") -> ProfileConfig:
    return parse_config_text(textwrap.dedent(text), file)


BASE = """
manifests: [generated/demo]
problems:
  - {m: 128, n: 256, k: 512}
"""


OP = Op("bf16", "bf16", "bf16", "bf16", "row", "col", "row")
P = Problem(4096, 4096, 4096)


def meas(name: str, median: float, spread: float = 0.002, *, seed: int = 0, status: str = OK, op: Op = OP,
         problem: Problem = P, kind: str = "kernel", repeats: int = 5, n: int = 50) -> Measurement:
    """A recorded measurement: repeats x n launches around `median` with relative spread `spread`."""
    rng = np.random.default_rng(seed)
    groups = [list(median * (1 + spread * rng.standard_normal(n))) for _ in range(repeats)]
    m = Measurement(kind, name, "emitter" if kind == "kernel" else "torch.matmul (cuBLAS)", op, problem, status)
    if status == OK:
        m.stats = TimingStats.from_samples(groups)
    return m


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory):
    from emitter.emit import emit

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml", ROOT / "configs/gemm/sm90a_fp8.yaml"], out)
    return out


def _fake_config(manifest_dir: Path, extra: str = "") -> ProfileConfig:
    return parse_config_text(f"manifests: [{manifest_dir}]\nproblems:\n  - {{m: 128, n: 256, k: 512}}\n"
                             f"  - square: 1024\ntiming: {{iterations: 20, repeats: 3}}\n{extra}", "p.yaml")
