"""sm90a attention's `warp_groups` (issue 39): FlashAttention-3's d64 layout, a 192-row query tile on three
consumer warp groups. Rules (accepted / rejected by name), the register and shared-memory estimates, naming and
the manifest config, the rendered option, the library records, the fake backend through `emitter verify`, and
one real nvcc build (`-m nvcc`) of a 192-row d64 instance whose host shim is then asked, without a GPU, for its
launch shape and shared memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.cutlass_path import find_cutlass
from emitter.dtypes import DType
from emitter.errors import SpecError
from emitter.families.attention import sm80, sm90a
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask, Rejection, Schedule
from emitter.families.attention.naming import instance_name
from emitter.render import banner, render_template

ROOT = Path(__file__).resolve().parents[2]


def make(**kw) -> AttentionInstance:
    base = dict(arch=Arch.sm90a, dtype=DType.bf16, head_dim=64, head_dim_v=64, tile_q=192, tile_kv=128,
                schedule=Schedule.cooperative, warp_groups=3)
    base.update(kw)
    if "head_dim" in kw and "head_dim_v" not in kw:
        base["head_dim_v"] = kw["head_dim"]
    return AttentionInstance(**base)


def rejected(inst) -> Rejection:
    r = sm90a.resolve(inst)
    assert isinstance(r, Rejection), f"expected a rejection, got {r}"
    return r


# ------------------------------------------------------------------------------------------------ registers
def test_consumer_registers_follow_upstreams_split():
    """MmaRegisterRequirement of FmhaKernelTmaWarpSpecialized, recomputed from the header's own expression."""
    header = (find_cutlass().root / "examples" / "88_hopper_fmha" / "kernel" / "fmha_kernel_tma_warpspecialized.hpp")
    text = header.read_text()
    assert "LoadRegisterRequirement = 40 - 2 * 8" in text
    assert ("MmaRegisterRequirement = ((TotalRegisterSupply - LoadRegisterRequirement) / NumMmaWarpGroups / 8) * 8"
            in text)
    assert [sm90a.mma_registers(n) for n in (2, 3, 4)] == [240, 160, 112]
    # the producer's 24 and the consumers' share never exceed the SM's 65,536
    for n in (2, 3, 4):
        assert 128 * (sm90a.LOAD_REGISTERS + n * sm90a.mma_registers(n)) <= 65536
    assert [sm90a.max_acc_columns(n) for n in (2, 3, 4)] == [sm90a.MAX_ACC_COLUMNS, 224, 128]
    assert sm90a.MAX_ACC_COLUMNS == 384                                 # the 2-group limit of before


# ------------------------------------------------------------------------------------------------ resolve
@pytest.mark.parametrize("changes", [
    dict(),
    dict(dtype=DType.f16, schedule=Schedule.pingpong, mask=Mask.causal_bottom_right, lse=True, gqa=True),
    dict(persistent=True, mask=Mask.causal_top_left),
    dict(varlen=True, gqa=True, lse=True),
    dict(tile_kv=64),
    dict(head_dim=128, tile_kv=64),                  # 192 accumulator columns: 96 + 48 <= 160
    dict(tile_q=256, tile_kv=64, warp_groups=4),     # 128 columns: 64 + 48 <= 112
])
def test_accepted(changes):
    r = sm90a.resolve(make(**changes))
    assert not isinstance(r, Rejection), r.reason
    assert r.warp_groups == make(**changes).warp_groups and r.tile_q == 64 * r.warp_groups
    assert sm90a.smem_bytes(r, r.stages).total <= sm90a.SMEM_CAPACITY


@pytest.mark.parametrize("changes,rule,words", [
    (dict(tile_kv=256), "sm90a-registers", ["320 accumulator columns", "160 registers", "<= 224", "tile_kv 128"]),
    (dict(head_dim=128), "sm90a-registers", ["256 accumulator columns", "128 f32", "4 x 128 threads", "tile_kv 64"]),
    (dict(head_dim=256, tile_kv=64), "sm90a-registers", ["no tile_kv fits head_dim 256", "warp_groups 2"]),
    (dict(tile_q=256, warp_groups=4), "sm90a-registers", ["112 registers", "<= 128"]),
    (dict(schedule=Schedule.split_kv), "sm90a-warp-groups-split-kv", ["warp_groups 3", "use warp_groups 2"]),
    (dict(tile_q=128), "sm90a-tile-q", ["3 consumer", "use tile_q 192", "warp_groups 2"]),
    (dict(warp_groups=2), "sm90a-tile-q", ["2 consumer", "use tile_q 128, or warp_groups 3"]),
    (dict(tile_q=64, warp_groups=1), "sm90a-warp-groups", ["warp_groups 1", "255"]),
    (dict(tile_q=320, warp_groups=5), "sm90a-warp-groups", ["Consumer0..Consumer3"]),
])
def test_rejected(changes, rule, words):
    r = rejected(make(**changes))
    assert r.rule == rule, (r.rule, r.reason)
    for w in words:
        assert w in r.reason, (w, r.reason)


def test_sm80_refuses_warp_groups():
    r = sm80.resolve(make(arch=Arch.sm80, tile_q=64, tile_kv=64, schedule=Schedule.auto))
    assert isinstance(r, Rejection) and r.rule == "warp-groups-arch" and "sm90a" in r.reason


# ------------------------------------------------------------------------------------------------ shared memory
def test_shared_memory_grows_with_the_warp_groups():
    """Q: 192 rows; the epilogue: one D tile per consumer warp group; a Q and two order barriers per group.
    pingpong's 133,120 bytes is what the real build of the nvcc test below reports (dynamic_shared_bytes)."""
    coop = sm90a.resolve(make())
    two = sm90a.resolve(make(tile_q=128, warp_groups=2))
    s3, s2 = sm90a.smem_bytes(coop, 5), sm90a.smem_bytes(two, 5)
    assert s3.q == 192 * 64 * 2 and s2.q == 128 * 64 * 2
    assert s3.epilogue * 2 == s2.epilogue * 3 and s3.kv == s2.kv
    assert coop.stages == 5 and s3.total == 107008                     # max(Q + K/V, epilogue) + barriers
    ping = sm90a.resolve(make(schedule=Schedule.pingpong))
    assert ping.persistent and sm90a.smem_bytes(ping, ping.stages).total == 133120   # Q + K/V + epilogue


def test_largest_three_group_tiles_fit_at_eight_stages():
    """The register rule keeps 3-group tiles small enough that even 8 persistent stages fit: d128 192x64 is
    Q 49,152 + K/V 8 x 16,384 + epilogue 3 x 8,704 (+ barriers, rounded to 512)."""
    r = sm90a.resolve(make(head_dim=128, tile_kv=64, stages=8, persistent=True))
    assert not isinstance(r, Rejection), r.reason
    s = sm90a.smem_bytes(r, 8)
    assert (s.q, s.kv, s.epilogue) == (49152, 131072, 26112)
    assert s.total == (49152 + 131072 + 26112 + 16 * 8 + 80 + 32 * 3 + 511) // 512 * 512 <= sm90a.SMEM_CAPACITY


# ------------------------------------------------------------------------------------------------ naming, config
def test_name_and_config():
    wg3 = sm90a.resolve(make(schedule=Schedule.pingpong, mask=Mask.causal_bottom_right))
    assert instance_name(wg3) == "attn_sm90a_bf16_d64_192x128_wg3_pingpong_persistent_s5_causalbr_bshd"
    cfg = wg3.config()
    assert cfg["warp_groups"] == 3 and AttentionInstance.from_config(cfg) == wg3
    two = sm90a.resolve(make(tile_q=128, warp_groups=2))
    assert "_wg" not in instance_name(two) and "warp_groups" not in two.config()   # manifests as before
    assert AttentionInstance.from_config(two.config()) == two
    assert instance_name(two) == "attn_sm90a_bf16_d64_128x128_cooperative_s5_nomask_bshd"


def _doc(tmp_path, body: str):
    from emitter.families import attention as fam
    from emitter.spec.loader import parse_text

    doc = parse_text(body, "spec.yaml")
    return [inst for inst, _ in fam.expand_entry(doc, ("kernels", 0), doc.data["kernels"][0], {})]


SPEC_ENTRY = """\
kernels:
  - family: attention
    arch: sm90a
    dtype: bf16
    head_dim: 64
    tile: 192x128
    warp_groups: {wg}
    schedule: [cooperative, pingpong]
"""


def test_spec_key(tmp_path):
    insts = _doc(tmp_path, SPEC_ENTRY.format(wg=3))
    assert [i.warp_groups for i in insts] == [3, 3] and all(i.tile_q == 192 for i in insts)
    with pytest.raises(SpecError) as e:
        _doc(tmp_path, SPEC_ENTRY.format(wg=5))
    assert "warp_groups" in str(e.value) and "5" in str(e.value)


# ------------------------------------------------------------------------------------------------ render
def _render(inst, name="wg_sm90a_attention"):
    r = sm90a.resolve(inst)
    return render_template("attention/sm90a/instance.cu.j2", inst=r, name=name,
                           ctx=sm90a.template_context(r), banner=banner("wg.yaml", "0" * 64))


def test_render_passes_the_warp_groups():
    text = _render(make(schedule=Schedule.pingpong, mask=Mask.causal_bottom_right, gqa=True, lse=True))
    assert "fmha_kernel::Tag::kNumMmaWarpGroups, cute::Int<3>>" in text
    assert "cute::Shape<cute::_192, cute::_128, cute::_64>" in text and "kTileQ = 192;" in text
    assert "3 consumer warp groups" in text
    two = _render(make(tile_q=128, warp_groups=2))
    assert "kNumMmaWarpGroups, cute::Int<2>>" in two and "kTileQ = 128;" in two
    assert sm90a.template_context(sm90a.resolve(make()))["mma_warp_groups"] == 3


# ------------------------------------------------------------------------------------------------ library
def test_library_records_keep_the_warp_groups(tmp_path):
    from emitter.emit import emit
    from emitter.families.attention.library import kernel_records
    from emitter.kit.library import DTYPES, LibraryError

    (tmp_path / "spec.yaml").write_text(SPEC_ENTRY.format(wg=3))
    emit([tmp_path / "spec.yaml"], tmp_path / "gen", jobs=1)
    entries = json.loads((tmp_path / "gen" / "manifest.json").read_text())["instances"]
    ks = kernel_records(entries, DTYPES, LibraryError)
    assert len(ks) == 2 and all(k.inst.warp_groups == 3 and k.inst.tile_q == 192 for k in ks)
    assert all("_192x128_wg3_" in k.name for k in ks)


# ------------------------------------------------------------------------------------------------ fake verify
def test_fake_backend_verifies_a_wg3_instance(tmp_path):
    """`emitter verify --backend fake` on a 192-row instance: odd lengths (sq not a multiple of 192), causal."""
    spec = tmp_path / "wg3.yaml"
    spec.write_text(SPEC_ENTRY.format(wg=3).replace("[cooperative, pingpong]", "pingpong")
                    + "    mask: causal_bottom_right\n    lse: true\n    gqa: true\n")
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(spec), "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--data", "normal",
                              "--problem", "b=2,hq=4,hkv=2,sq=200,sk=333,d=64"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["results"] and all(x["status"] == "PASSED" for x in res["results"]), res["results"]
    assert all("_wg3_" in x["instance"] for x in res["results"])


# ------------------------------------------------------------------------------------------------ nvcc
@pytest.mark.nvcc
def test_one_wg3_instance_builds_and_its_shim_launches_four_warp_groups(tmp_path):
    """The real pipeline on bf16 d64 192x128 ping-pong (about 80 s of nvcc, cubin and shim, on an idle machine):
    no spills, no serialized wgmma; the shim launches 512 threads (3 consumer warp groups and the producer) with
    the shared memory the model says."""
    import ctypes

    from emitter.families.attention.abi import AttentionShim, EmitterAttentionProblem

    spec = tmp_path / "att.yaml"
    spec.write_text(SPEC_ENTRY.format(wg=3).replace("[cooperative, pingpong]", "pingpong")
                    + "    mask: causal_bottom_right\n    lse: true\n    gqa: true\n")
    out = tmp_path / "out"
    env = dict(os.environ)
    emit = subprocess.run([sys.executable, "-m", "emitter", "emit", str(spec), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert emit.returncode == 0, emit.stdout + emit.stderr
    build = subprocess.run([sys.executable, "-m", "emitter", "build", str(out), "-j", "1", "--no-cache",
                            "--no-progress"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    [entry] = json.loads((out / "manifest.json").read_text())["instances"]
    name = entry["name"]
    assert "_192x128_wg3_" in name
    record = json.loads((out / "build" / name / "record.json").read_text())
    assert record["status"] == "ok" and not record.get("serialized_wgmma")
    assert record["resources"]["spill_bytes"] == 0

    shim = AttentionShim(out / record["artifacts"]["host"], name)
    reason_fn = getattr(shim.lib, f"emitter_{name}_reason")
    reason_fn.restype = ctypes.c_char_p
    p = EmitterAttentionProblem(batch=2, heads_q=8, heads_kv=2, seq_q=1000, seq_k=777, head_dim=64, head_dim_v=64)
    status, launch = shim.query(p)
    assert status == 0, reason_fn()
    inst = AttentionInstance.from_config(entry["config"])
    assert inst.warp_groups == 3
    assert tuple(launch.block) == (512, 1, 1)
    assert launch.shared_bytes == sm90a.smem_bytes(inst, inst.stages).total
