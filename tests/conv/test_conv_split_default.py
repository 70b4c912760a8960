"""The library's split-K count for a split-K kernel no record ranked is the profiler's one-wave count: the Python
twin of the exported conv_split_k (library_dispatch.default_split_k, held equal to the C++ by the C API parity test
of test_conv_library_predicted.py) against conv.runtime.choose_split_k, on the split-K instances of the shipped
specs (sm80 serial, sm90a parallel with clusters) and random 2D problems. No GPU, no nvcc."""

from __future__ import annotations

import json
import random

import pytest

from emitter.families.conv.config import ConvConfig
from emitter.families.conv.library import kernel_records
from emitter.families.conv.library_dispatch import ConvQuery, default_split_k
from emitter.families.conv.problem import ConvProblem
from emitter.families.conv.runtime import choose_split_k

SPECS = ["configs/conv/sm90a_bench.yaml", "configs/conv/sm90a_splitk.yaml", "configs/conv/sm80_resnet50.yaml"]


@pytest.fixture(scope="module")
def split_entries(tmp_path_factory):
    from click.testing import CliRunner

    from emitter.cli import main

    out = tmp_path_factory.mktemp("split") / "emit"
    res = CliRunner().invoke(main, ["emit", *SPECS, "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    entries = [e for e in json.loads((out / "manifest.json").read_text())["instances"] if e.get("family") == "conv"]
    return [e for e in entries if ConvConfig.from_entry(e).split_k != "none"]


def test_default_split_is_the_profilers_one_wave_count(split_entries):
    kinds = {ConvConfig.from_entry(e).split_k for e in split_entries}
    assert kinds == {"serial", "parallel"}, kinds           # both rules are exercised
    records = {r.name: r for r in kernel_records(split_entries)}
    rng = random.Random(7)
    checked = 0
    for e in split_entries:
        cfg = ConvConfig.from_entry(e)
        k = records[cfg.name]
        assert k.split_k and (k.arch_specific == (cfg.split_k == "parallel"))
        for _ in range(40):
            r = rng.choice([1, 3, 5])
            n, h, c, kk = rng.choice([1, 2, 8, 32, 128]), rng.choice([7, 14, 28, 56, 57]), rng.choice([64, 128, 256, 512]), rng.choice([64, 128, 256, 2048])
            stride, pad = rng.choice([1, 2]), r // 2
            pq = (h + 2 * pad - r) // stride + 1
            prob = ConvProblem(n=n, h=h, w=h, c=c, k=kk, r=r, s=r, pad_front=(0, pad, pad), pad_back=(0, pad, pad),
                               stride=(1, stride, stride))
            q = ConvQuery(op=cfg.op, a=k.a, c=k.c, n=n, h=h, w=h, ci=c, k=kk, r=r, s=r, p=pq, q=pq, stride=(stride, stride))
            for sms in (132, 114, 78):
                assert default_split_k(k, q, sms) == choose_split_k(cfg, prob, sms), (cfg.name, prob, sms)
                checked += 1
    assert checked >= 3 * 40 * len(split_entries)


def test_a_parallel_split_fills_one_wave_not_two():
    """C64 K64 3x3 wgrad on 132 SMs, an sm90a 128x128 parallel split-K kernel: 1 x 9 = 9 output tiles along C,
    14 slices (126 units, one wave) -- not ceil(132 / 9) = 15 (135 units: a second wave of 3)."""
    from emitter.families.conv.library import ConvKernelRecord

    k = ConvKernelRecord(index=0, name="k", arch="sm90a", cc=90, arch_specific=True, op="wgrad", dims=2, a="f16",
                         c="f16", accumulator="f32", alignment_a=8, alignment_b=8, alignment_c=8, tile=(128, 128, 64),
                         cluster=(1, 1, 1), iterator="optimized", unity_stride=False, split_k=True,
                         activation="identity", bias=False, clamp_min=0.0, clamp_max=0.0, cutlass_major=3)
    q = ConvQuery(op="wgrad", a="f16", c="f16", n=32, h=56, w=56, ci=64, k=64, r=3, s=3, p=56, q=56)
    assert default_split_k(k, q, 132) == 14
    serial = ConvKernelRecord(**{**k.__dict__, "arch": "sm80", "cc": 80, "arch_specific": False, "cutlass_major": 2})
    # sm80 tiles N = C*R*S = 576 unsplit: 1 x 5 tiles, a CTA per tile x slice, the fewest covering the SMs: 27
    assert default_split_k(serial, q, 132) == 27
