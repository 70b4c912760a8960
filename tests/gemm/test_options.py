"""Run-time scheduler options (emitter/kit/scheduler.py, emitter/families/gemm/options.py): the ABI encoding, the
text form, and which instances can take them (the host shims' refusals, mirrored without a GPU); `emitter verify --scheduler`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.families.gemm.config import GemmConfig
from emitter.families.gemm.options import distinct, launch_key, unsupported
from emitter.kit.scheduler import OptionsError, SchedulerOptions

ROOT = Path(__file__).resolve().parents[2]


def test_encoding_is_the_abi_bit_layout_and_round_trips():
    assert SchedulerOptions().encode() == 0 and SchedulerOptions().empty
    assert SchedulerOptions(swizzle=1).encode() == 1 and SchedulerOptions(swizzle=8).encode() == 4
    assert SchedulerOptions(raster="along_n").encode() == 3 << 4
    assert SchedulerOptions(reduction="nondeterministic").encode() == 2 << 6
    assert SchedulerOptions(promotion_interval=8).encode() == 8 << 8
    every = [SchedulerOptions(s, r, d, p) for s in (None, 1, 2, 4, 8) for r in (None, "heuristic", "along_m", "along_n")
             for d in (None, "deterministic", "nondeterministic") for p in (None, 4, 16, 255)]
    codes = {o.encode() for o in every}
    assert len(codes) == len(every) and max(codes) <= 0xFFFF
    assert all(SchedulerOptions.decode(o.encode()) == o for o in every)
    for bad in (1 << 16, 5, 3 << 6, -1):
        with pytest.raises(OptionsError):
            SchedulerOptions.decode(bad)


def test_text_form_and_labels():
    o = SchedulerOptions.parse("swizzle=4, raster=n,reduction=nondet promotion=8")
    assert o == SchedulerOptions(4, "along_n", "nondeterministic", 8)
    assert o.label() == "swz4 rastern nondet promo8"
    assert SchedulerOptions.parse("") == SchedulerOptions()
    for bad, words in (("swizzle=3", "swizzle=3"), ("raster=diagonal", "allowed"), ("swizzle", "key=value"),
                       ("promotion_interval=0", "1..255"), ("tiles=4", "allowed")):
        with pytest.raises(OptionsError, match=words):
            SchedulerOptions.parse(bad)


def _cfg(**kw):
    c = {"arch": "sm90a", "a": "bf16", "b": "bf16", "c": "bf16", "d": "bf16", "layout_a": "row", "layout_b": "col",
         "layout_c": "row", "accumulator": "f32", "tile": [128, 128, 64], "tile_scheduler": "persistent",
         "split_k": "none", "promotion_interval": 0, "epilogue": {"activation": "identity", "bias": "none"}}
    c.update(kw)
    return GemmConfig.from_entry({"name": "k", "family": "gemm", "arch": c["arch"], "config": c})


def test_launch_key_is_what_the_persistent_scheduler_resolves():
    """CUTLASS's persistent scheduler caps the swizzle by the smaller side of the tile grid (8 needs >= 6 tiles,
    4 needs >= 3, 2 needs 2) and resolves `heuristic` to along M when the grid has more columns than rows;
    options that resolve alike are the same launch. The stream-K scheduler and 2.x kernels are not modelled."""
    S = lambda **kw: SchedulerOptions(**kw).encode()  # noqa: E731
    k = _cfg(tile=[128, 256, 64], cluster=[2, 1, 1])
    # 512 x 4096: a 4 x 16 grid of 128x256 tiles (4 rows, already a multiple of the 2x1 cluster)
    assert launch_key(k, 512, 4096, S(swizzle=8)) == launch_key(k, 512, 4096, S(swizzle=4)) == (2, "along_m", 0)
    assert launch_key(k, 512, 4096, 0) == launch_key(k, 512, 4096, S(raster="along_m")) == (0, "along_m", 0)
    assert launch_key(k, 512, 4096, S(raster="along_n")) == (0, "along_n", 0)
    # 8192 x 8192: 64 x 32, so swizzle 8 is its own launch and the heuristic walks along N
    assert launch_key(k, 8192, 8192, S(swizzle=8)) == (3, "along_n", 0)
    assert launch_key(k, 8192, 8192, S(swizzle=2)) == (1, "along_n", 0)
    # 128 x 4096: 1 x 16 tiles, rounded up to the cluster's 2 rows: no swizzle fits above 2
    assert launch_key(k, 128, 4096, S(swizzle=8)) == launch_key(k, 128, 4096, S(swizzle=2)) == (1, "along_m", 0)
    # swap_ab: the kernel's M is the caller's N, and the raster option is in the caller's terms
    swap = _cfg(tile=[64, 16, 128], cluster=[1, 1, 1], swap_ab=True)
    assert launch_key(swap, 16, 4096, S(raster="along_m")) == launch_key(swap, 16, 4096, 0) == (0, "along_n", 0)
    assert launch_key(swap, 16, 4096, S(raster="along_n"))[1] == "along_m"
    assert launch_key(swap, 16, 4096, S(swizzle=8))[0] == 0          # one tile column: nothing to swizzle
    # a compiled-in swizzle / raster is what `null` resolves to
    assert launch_key(_cfg(tile=[128, 256, 64], cluster=[2, 1, 1], swizzle=4, raster="along_n"), 8192, 8192, 0) == \
        (2, "along_n", 0)
    # not modelled: every variant is its own launch
    assert launch_key(_cfg(tile_scheduler="stream_k", cluster=[1, 1, 1]), 512, 4096, 0) is None
    assert launch_key(_cfg(split_k="serial", cluster=[1, 1, 1]), 512, 4096, 0) is None
    assert launch_key(_cfg(arch="sm80"), 512, 4096, 0) is None
    sweep = [0] + [S(swizzle=s, raster=r) for s in (None, 4, 8) for r in (None, "along_m", "along_n")][1:]
    assert distinct(k, 512, 4096, sweep) == [0, S(raster="along_n"), S(swizzle=4), S(swizzle=4, raster="along_n")]
    assert len(distinct(k, 8192, 8192, sweep)) == 6 and distinct(k, 8192, 8192, sweep)[0] == 0
    assert distinct(_cfg(tile_scheduler="stream_k", cluster=[1, 1, 1]), 512, 4096, sweep) == sweep
    fp8 = _cfg(a="e4m3", b="e4m3", tile=[128, 128, 128], cluster=[1, 1, 1], promotion_interval=4)
    assert distinct(fp8, 8192, 8192, [0, S(promotion_interval=4), S(promotion_interval=8)]) == \
        [0, S(promotion_interval=8)]


def test_which_instances_take_which_options():
    plain, streamk = _cfg(), _cfg(tile_scheduler="stream_k")
    splitk = _cfg(split_k="serial")
    fp8 = _cfg(a="e4m3", b="e4m3", tile=[128, 128, 128], promotion_interval=4)
    enc = lambda **kw: SchedulerOptions(**kw).encode()  # noqa: E731
    assert unsupported(plain, 0) is None
    assert unsupported(plain, enc(swizzle=4, raster="along_m")) is None
    assert "stream-K" in unsupported(plain, enc(reduction="nondeterministic"))
    assert unsupported(plain, enc(reduction="deterministic")) is None
    assert unsupported(streamk, enc(reduction="nondeterministic")) is None
    assert unsupported(splitk, enc(reduction="nondeterministic")) is None
    assert "fp8" in unsupported(plain, enc(promotion_interval=8))
    assert unsupported(fp8, enc(promotion_interval=8)) is None
    assert "multiple of the 4" in unsupported(fp8, enc(promotion_interval=6))
    overlap = _cfg(a="e4m3", b="e4m3", tile=[128, 128, 128], promotion_interval=4, promotion="overlap")
    assert overlap.promotion_overlap and not fp8.promotion_overlap
    assert unsupported(overlap, enc(promotion_interval=4)) is None      # its own interval
    assert "compiled interval" in unsupported(overlap, enc(promotion_interval=8))
    assert unsupported(overlap, enc(swizzle=4)) is None
    assert "sm90a" in unsupported(_cfg(arch="sm80"), enc(swizzle=2))
    assert "bits 0-15" in unsupported(plain, 1 << 20)


def _manifest(tmp_path: Path) -> Path:
    def entry(name, **kw):
        c = {"arch": "sm90a", "a": "f16", "b": "f16", "c": "f16", "d": "f16", "layout_a": "row", "layout_b": "col",
             "layout_c": "row", "accumulator": "f32", "epilogue_compute": "f32", "op_class": "tensorop",
             "tile": [128, 128, 64], "cluster": [1, 1, 1], "alignment_a": 8, "alignment_b": 8, "alignment_c": 8,
             "tile_scheduler": "persistent", "split_k": "none", "batched": False,
             "epilogue": {"activation": "identity", "bias": "none"}}
        c.update(kw)
        return {"name": name, "family": "gemm", "arch": c["arch"], "source": f"{name}.cu", "spec": "t.yaml",
                "spec_hash": "0" * 64, "config": c}
    root = tmp_path / "m"
    root.mkdir()
    entries = [entry("persistent"), entry("streamk", tile_scheduler="stream_k"),
               entry("old", arch="sm80", tile=[128, 128, 32], warp=[64, 64, 32])]
    (root / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0.1.0",
                                                    "generated_at": None, "specs": [], "instances": entries,
                                                    "rejected": []}))
    return root


def test_cli_verify_scheduler_runs_what_can_take_it_and_skips_the_rest(tmp_path):
    root = _manifest(tmp_path)
    cmd = [sys.executable, "-m", "emitter", "verify", str(root), "--backend", "fake", "--seed", "5", "--no-isolation",
           "--m", "136", "--n", "72", "--k", "64", "-q", "--scheduler", "swizzle=4,reduction=nondeterministic"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    res = {r["instance"]: r for r in json.loads((root / "verify" / "results.json").read_text())["results"]}
    assert res["streamk"]["status"] == "PASSED" and "swz4_nondet" in res["streamk"]["problem"]
    assert res["persistent"]["status"] == "SKIPPED" and "stream-K" in res["persistent"]["reason"]
    assert res["old"]["status"] == "SKIPPED" and "sm90a" in res["old"]["reason"]
    bad = subprocess.run(cmd[:-1] + ["swizzle=3"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--scheduler" in bad.stderr and "Traceback" not in bad.stderr
