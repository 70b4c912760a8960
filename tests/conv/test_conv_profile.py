"""conv: `emitter profile` through the family's profile hooks (fake backend: checks, split-K variants chosen per
problem, the cuDNN baseline's slot, profile.json / tuning.json), and the serial split-K slice choice."""

from __future__ import annotations

import json

import pytest

from emitter.emit import emit
from emitter.families.conv import runtime as hooks
from emitter.families.conv.problem import ConvProblem
from tests._helpers import CONV_SM80_WGRAD_SPLITK_ENTRY

SPEC = """\
kernels:
  - family: conv
    arch: sm90a
    op: [fprop, wgrad]
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: [128x128x64, 128x64x64]
    stages: 4
""" + CONV_SM80_WGRAD_SPLITK_ENTRY

PROBLEM = "n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1"


@pytest.fixture(scope="module")
def conv_manifest(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv")
    spec = out / "spec.yaml"
    spec.write_text(SPEC)
    emit([spec], out / "k", jobs=1)
    return out / "k"


def _cfg(tile=(128, 128, 32), split="serial", op="wgrad"):
    from emitter.dtypes import DType
    from emitter.families.conv.config import ConvConfig

    return ConvConfig(name="x", arch="sm80", op=op, dims=2, a=DType.f16, c=DType.f16, accumulator=DType.f32,
                      alignment_a=8, alignment_b=8, alignment_c=8, tile=tile, split_k=split)


def _layer(c, hw, k, rs, pad):
    return ConvProblem(n=128, h=hw, w=hw, c=c, k=k, r=rs, s=rs, pad_front=(0, pad, pad), pad_back=(0, pad, pad))


def test_conv_has_every_profile_hook():
    from emitter.families.base import PROFILE_HOOKS, VERIFY_HOOKS
    from emitter.families.registry import runtime_family
    from emitter.profile.runner import _profilable

    mod = runtime_family("conv", need=VERIFY_HOOKS + PROFILE_HOOKS)
    assert mod.BASELINES == ("cudnn",)
    assert _profilable("conv") is None


def test_split_k_choices_fill_a_wave():
    cfg = _cfg()
    # C64 K64 3x3: wgrad GEMM 64 x 576 x 401408 = 5 tiles of 128x128: 27 slices fill 132 SMs, its half and double
    assert hooks.split_k_choices(cfg, _layer(64, 56, 64, 3, 1), 132) == [13, 27, 54]
    assert hooks.choose_split_k(cfg, _layer(64, 56, 64, 3, 1), 132) == 27
    # C512 7^2 K512 3x3: 144 tiles already fill the GPU
    assert hooks.split_k_choices(cfg, _layer(512, 7, 512, 3, 1), 132) == [1, 2]
    # 1x1 C256 -> K64: 2 tiles; capped at SPLIT_K_MAX
    assert max(hooks.split_k_choices(cfg, _layer(256, 56, 64, 1, 0), 132)) == hooks.SPLIT_K_MAX
    # a short reduction keeps MIN_SLICE_K_ITERS iterations a slice
    small = ConvProblem(n=1, h=8, w=8, c=64, k=64, r=1, s=1)          # K-dim 64 = 2 iterations of 32
    assert hooks.split_k_choices(cfg, small, 132) == [1]
    # instances without serial split-K: [1]
    assert hooks.split_k_choices(_cfg(split="none"), _layer(64, 56, 64, 3, 1), 132) == [1]
    # more SMs, more slices
    assert hooks.choose_split_k(cfg, _layer(64, 56, 64, 3, 1), 264) > hooks.choose_split_k(cfg, _layer(64, 56, 64, 3, 1), 132)


def test_profile_problem_parse_key_flops_roundtrip():
    from emitter.errors import SpecError
    from emitter.profile.config import problem_from_json, problems_from_text

    p, s2 = problems_from_text([PROBLEM, "n=8,h=15,w=15,c=16,k=32,r=7,s=7,pad=3,stride=2"], families=["conv"])
    assert p.FAMILY == "conv" and p.key.startswith("n128_h56_w56_c64_k64_r3s3")
    assert "_a1" not in p.key and "_b0" not in p.key
    assert p.flops == 2 * 128 * 64 * 56 * 56 * 64 * 9
    assert s2.stride == (1, 2, 2) and s2.conv.output_extents() == (1, 8, 8)
    for q in (p, s2):
        assert problem_from_json(json.loads(json.dumps(q.as_dict()))) == q
    assert sorted([s2, p]) in ([p, s2], [s2, p])       # orderable
    for bad in (PROBLEM + ",alpha=2", PROBLEM + ",split_k=4", PROBLEM + ",beta=1"):
        with pytest.raises(SpecError):
            problems_from_text([bad], families=["conv"])
    op = hooks.profile_op(_cfg())
    assert hooks.profile_op_from_json(json.loads(json.dumps(op.to_json()))) == op
    assert op.key == "conv2d_wgrad_f16f16_accf32_nhwc"
    # bytes: x, w, y each once (+ the output again as the source when beta != 0)
    el = 128 * 56 * 56 * 64 * 2 + 64 * 9 * 64 * 2 + 128 * 56 * 56 * 64 * 2
    assert hooks.profile_min_bytes(op, p, 0.0) == el
    assert hooks.profile_min_bytes(op, p, 1.0) == el + 64 * 9 * 64 * 2


def test_fake_problem_is_small_and_keeps_the_geometry():
    from types import SimpleNamespace

    from emitter.profile.config import problems_from_text

    (p,) = problems_from_text(["n=128,h=56,w=56,c=256,k=64,r=3,s=3,pad=2,dilation=2,stride=2"], families=["conv"])
    small = hooks.profile_fake_problem(_cfg(), p, SimpleNamespace(alpha=1.0, beta=0.5), 64, split_k=3)
    assert (small.n, small.h, small.w, small.c, small.k) == (2, 12, 12, 64, 64)
    assert (small.stride, small.dilation, small.pad_front, small.beta, small.split_k) == (
        (1, 2, 2), (1, 2, 2), (0, 2, 2), 0.5, 3)


def _profile(manifest, out, *args):
    from click.testing import CliRunner

    from emitter.cli import main

    res = CliRunner().invoke(main, ["profile", str(manifest), "--backend", "fake", "-o", str(out), "--quick",
                                    "--no-plots", "--problem", PROBLEM,
                                    "--problem", "n=32,h=28,w=28,c=128,k=128,r=1,s=1", *args])
    assert res.exit_code == 0, res.output
    return res


def test_fake_profile_split_k_variants_baseline_and_tuning(conv_manifest, tmp_path):
    _profile(conv_manifest, tmp_path / "p")
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    rows = prof["measurements"] if "measurements" in prof else prof["results"]
    kern = [r for r in rows if r["kind"] == "kernel"]
    base = [r for r in rows if r["kind"] == "baseline"]
    assert {r["name"] for r in base} == {"cudnn"}
    assert len(base) == 4                         # 2 ops (fprop, wgrad) x 2 problems
    # the sm80 split-K wgrad kernel ran at the slice counts split_k_choices gives, each checked
    sk = [r for r in kern if "splitkserial" in r["name"]]
    c64 = sorted(r["split_k"] for r in sk if r["problem"]["c"] == 64)
    assert c64 == [13, 27, 54], c64
    assert all(r["status"] == "ok" and r["check"]["passed"] for r in sk)
    assert all(r["status"] == "ok" for r in kern), [(r["name"], r["status"], r["reason"]) for r in kern if r["status"] != "ok"]
    tuning = json.loads((tmp_path / "p" / "tuning.json").read_text())
    ops = {e["op"]["key"] for e in tuning["entries"]}
    assert ops == {"conv2d_fprop_f16f16_accf32_nhwc", "conv2d_wgrad_f16f16_accf32_nhwc"}
    assert len(tuning["entries"]) == 4
    for e in tuning["entries"]:
        assert e["problem"]["family"] == "conv" and e["kernel"].startswith(f"conv2d_{e['op']['op']}_")
        assert e["split_k"] == 1 or "splitkserial" in e["kernel"]


def test_fake_profile_planted_bug_fails_its_check(conv_manifest, tmp_path):
    """A kernel that ignores the stride / padding fails the profile's check (the verify case it runs on the
    shrunk problem); its time does not count; the others still run."""
    from emitter.manifest import manifest_path
    from emitter.profile.config import ProfileConfig, problems_from_text
    from emitter.profile.runner import plan, run

    mpath = manifest_path(conv_manifest)
    probs = tuple(problems_from_text([PROBLEM], families=["conv"]))
    cfg = ProfileConfig(file=str(mpath), manifests=(str(mpath.resolve()),), problems=probs, baselines=("cudnn",))
    pl = plan(cfg)
    bad = next(i["entry"]["name"] for i in pl.instances if "fprop" in i["entry"]["name"] and "128x64x64" in i["entry"]["name"])
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", faults=[{"kind": "conv_wrong_padding", "select": bad}])
    by = {m.name: m for m in outcome.measurements if m.kind == "kernel"}
    assert by[bad].status == "check_failed" and by[bad].stats is None
    assert all(m.status == "ok" for n, m in by.items() if n != bad)


@pytest.mark.gpu
def test_gpu_profile_hooks_on_a_built_instance(tmp_path):
    """On the GPU machine with a built conv manifest in $EMITTER_CONV_MANIFEST: one problem profiled through the
    pycuda engine, every kernel checked against torch, cuDNN timed on the same buffers."""
    import os

    root = os.environ.get("EMITTER_CONV_MANIFEST")
    if not root:
        pytest.skip("set EMITTER_CONV_MANIFEST to a built conv manifest directory")
    pytest.importorskip("pycuda")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from click.testing import CliRunner

    from emitter.cli import main

    res = CliRunner().invoke(main, ["profile", root, "-o", str(tmp_path / "p"), "--quick", "--no-plots",
                                    "--problem", "n=32,h=28,w=28,c=64,k=64,r=3,s=3,pad=1"])
    assert res.exit_code == 0, res.output
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    rows = prof["measurements"] if "measurements" in prof else prof["results"]
    assert any(r["kind"] == "baseline" and r["status"] == "ok" for r in rows)
    ok = [r for r in rows if r["kind"] == "kernel" and r["status"] == "ok"]
    assert ok and all(r["check"]["passed"] for r in ok)
    assert not [r for r in rows if r["kind"] == "kernel" and r["status"] == "check_failed"]


def test_library_tuning_carries_the_benchmarked_split_count(conv_manifest, tmp_path):
    """conv.json rows name the slice count that won (benchmarks/conv_bench.py "split_k"): the library's tuning record
    keeps it for split-K kernels (its dispatch runs that count when the caller passes split_k_slices = 1) and
    refuses it, with a note, for any other kernel."""
    from emitter.families.conv.library import kernel_records, tuning_records

    entries = json.loads((conv_manifest / "manifest.json").read_text())["instances"]
    kernels = kernel_records(entries)
    split = next(k for k in kernels if k.split_k)
    plain = next(k for k in kernels if not k.split_k and k.op == "wgrad")
    geo = {"n": 128, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "stride": 1, "pad": 1}
    rows = [{"layer": "a", "op": "wgrad", "dtype": "f16", "kernel": split.name, "split_k": 27, "check": "ok", "problem": geo},
            {"layer": "b", "op": "wgrad", "dtype": "f16", "kernel": plain.name, "split_k": 5, "check": "ok",
             "problem": dict(geo, c=128)}]
    path = tmp_path / "conv.json"
    path.write_text(json.dumps({"n": 128, "rows": rows}))
    recs, notes = tuning_records(kernels, [path])
    by = {r.kernel: r for r in recs}
    assert by[split.index].split_k == 27
    assert by[plain.index].split_k == 1 and any("split_k 5" in n for n in notes)


def test_export_takes_a_conv_bench_table_through_tuning(tmp_path):
    """`emitter library --tuning conv.json`: the conv bench's table goes to the conv library hook (not GEMM's tuning
    loader, which would refuse it), and its split count reaches the generated tuning records."""
    from emitter.library.export import export_library

    spec = tmp_path / "spec.yaml"
    spec.write_text("""\
kernels:
  - arch: sm80
    dtype: {a: f16, b: f16, c: f16, d: f16, accumulator: f32}
    layout: tn
    tile: 64x64x64
    warp: 32x32x64
    stages: 3
  - family: conv
    arch: sm80
    op: wgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    split_k: serial
""")
    emit([spec], tmp_path / "gen", jobs=1)
    name = next(e["name"] for e in json.loads((tmp_path / "gen" / "manifest.json").read_text())["instances"]
                if e.get("family") == "conv")
    table = tmp_path / "bench" / "conv.json"          # not beside the manifest: only --tuning names it
    table.parent.mkdir()
    table.write_text(json.dumps({"n": 128, "rows": [
        {"layer": "C64 56² K64 3x3", "op": "wgrad", "dtype": "f16", "kernel": name, "split_k": 27, "check": "ok",
         "problem": {"n": 128, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "stride": 1, "pad": 1}}]}))
    export_library([tmp_path / "gen"], "cvt", tmp_path / "lib", tuning=[table])
    src = "\n".join(p.read_text() for p in (tmp_path / "lib" / "src").rglob("*table*.cpp"))
    assert "{0, 128, 56, 56, 64, 64, 3, 3, 1, 56, 56, 27}," in src        # kernel 0, the layer, 27 slices
