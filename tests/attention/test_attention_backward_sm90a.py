"""sm90a attention backward (CUTLASS examples/88's Hopper FMHA backward as one launch) without a GPU: the spec's
rules (each rejection names its rule, before nvcc), configs/attention/sm90a_backward.yaml emitted and rendered
level by level with upstream's headers included from the CUTLASS tree, the fake backend on every instance's
default problems, and (nvcc marker) one real sm90a backward instance compiled through the project's build with
its host shim's can-implement, launch shape and workspace answered through ctypes."""

import json
import textwrap

import pytest

from emitter.dtypes import DType
from emitter.emit import emit, spec_entries
from emitter.families import attention as fam
from emitter.families.attention import backward_sm90a, runtime as rt
from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.model import Arch, Layout, Mask, Rejection
from emitter.families.attention.problem import make_problem
from emitter.resources import configs_root
from emitter.spec.loader import parse_text

CONFIG = configs_root() / "attention" / "sm90a_backward.yaml"
OK = AttentionBackwardInstance(Arch.sm90a, DType.f16, 128, 128, 64, 128, deterministic=False)


def expand(text: str):
    doc = parse_text(textwrap.dedent(text), "spec.yaml")
    out = []
    for path, entry, kp in spec_entries(doc):
        out += [c for c, _ in fam.expand_entry(doc, path, entry, kp)]
    return out


def test_accepted_instance_and_name():
    (c,) = expand("""\
        kernels:
          - family: attention
            op: backward
            arch: sm90a
            dtype: f16
            head_dim: 128
            tile: 64x128
            mask: causal_bottom_right
            deterministic: false
        """)
    r = fam.resolve(c)
    assert r == OK.replace(mask=Mask.causal_bottom_right)
    assert fam.instance_name(r) == "attn_bwd_sm90a_f16_d128_64x128_causalbr_bshd"


def test_bf16_is_accepted():
    """bf16 resolves like f16 (its TU gives bfloat16_t register fragments elements that take the f32 dS)."""
    r = fam.resolve(OK.replace(dtype=DType.bf16))
    assert r == OK.replace(dtype=DType.bf16)
    assert fam.instance_name(r) == "attn_bwd_sm90a_bf16_d128_64x128_nomask_bshd"


@pytest.mark.parametrize("change, rule, words", [
    (dict(deterministic=True), "sm90a-backward-deterministic", "deterministic: false"),
    (dict(dtype=DType.f32), "sm90a-backward-dtype", "f16 or bf16"),
    (dict(head_dim=256, head_dim_v=256), "sm90a-backward-head-dim", "32, 64, 128"),
    (dict(head_dim_v=64), "backward-head-dim-v", "head_dim_v=64"),
    (dict(tile_kv=64), "sm90a-backward-tile-kv", "64x128"),
    (dict(tile_q=128), "sm90a-backward-tile-q", "shared memory"),          # d128 at BlockQ 128
    (dict(head_dim=64, head_dim_v=64, tile_q=256), "sm90a-backward-tile-q", "64 or 128"),
    (dict(varlen=True), "sm90a-backward-varlen", "arch sm80"),
    # the split dQ: query rows at BlockQ 128, whole 64-column halves of the head dim at BlockQ 64
    (dict(head_dim=64, head_dim_v=64, dq_split=True), "sm90a-backward-dq-split", "128x128 at head_dim 64"),
    (dict(head_dim=32, head_dim_v=32, dq_split=True), "sm90a-backward-dq-split", "head_dim 128"),
    (dict(head_dim=32, head_dim_v=32, tile_q=128, dq_split=True), "sm90a-backward-dq-split", "head_dim 64"),
])
def test_rejections_name_the_rule_and_the_fix(change, rule, words):
    r = fam.resolve(OK.replace(**change))
    assert isinstance(r, Rejection) and r.rule == rule and words in r.reason, r


def test_dq_split_is_a_spec_key_a_name_and_its_own_mainloop_level():
    """`dq_split: true` resolves at d128 / BlockQ 64 (head-dim halves) and d64 / BlockQ 128 (query-row halves),
    names the instance `_dqsplit`, renders emitter's compute() over upstream's collective (with the two named
    barriers), round-trips through the manifest config; sm80 refuses it with its rule."""
    from emitter.families.attention import backward_sm80
    from emitter.render import banner

    (c,) = expand("""\
        kernels:
          - family: attention
            op: backward
            arch: sm90a
            dtype: bf16
            head_dim: 128
            tile: 64x128
            gqa: true
            deterministic: false
            dq_split: true
        """)
    r = fam.resolve(c)
    assert r == OK.replace(dtype=DType.bf16, gqa=True, dq_split=True)
    name = fam.instance_name(r)
    assert name == "attn_bwd_sm90a_bf16_d128_64x128_nomask_bshd_gqa_dqsplit"
    assert AttentionBackwardInstance.from_config(r.config()) == r
    assert AttentionBackwardInstance.from_config({**OK.config()} | {"dq_split": None}).dq_split is False
    for inst, split in ((r, True), (OK.replace(head_dim=64, head_dim_v=64, tile_q=128, dq_split=True), True), (OK, False)):
        assert fam.resolve(inst) == inst
        text = fam.render_instance(inst, fam.instance_name(inst), banner("spec.yaml", "0" * 64))
        assert ": mainloop --" in text
        assert ("struct Mainloop : UpstreamMainloop {" in text) == split
        assert ("using Mainloop = UpstreamMainloop;" in text) == (not split)
        assert ("groups_sync(kBarrierDsFree);" in text) == split
        # upstream's collective is the base either way, included from the CUTLASS tree
        assert "using UpstreamMainloop = cutlass::fmha::collective::FmhaBwdMainloopTmaWarpSpecialized<" in text
    s80 = backward_sm80.resolve(OK.replace(arch=Arch.sm80, tile_q=64, tile_kv=64, dq_split=True))
    assert isinstance(s80, Rejection) and s80.rule == "backward-dq-split", s80


def test_default_deterministic_is_rejected_in_the_emit_report(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(textwrap.dedent("""\
        kernels:
          - family: attention
            op: backward
            arch: sm90a
            dtype: f16
            head_dim: 64
            tile: 64x128
        """))
    emit([str(spec)], tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert not manifest["instances"]
    (rej,) = manifest["rejected"]
    assert "sm90a-backward-deterministic" in json.dumps(rej)


def test_every_accepted_combination_renders():
    import itertools

    from emitter.render import banner

    n = 0
    for dtype, d in itertools.product(backward_sm90a.DTYPES, backward_sm90a.HEAD_DIMS):
        for tq, mask, layout, gqa in itertools.product(backward_sm90a.TILE_Q[d], Mask, Layout, (False, True)):
            inst = AttentionBackwardInstance(Arch.sm90a, dtype, d, d, tq, 128, mask, layout, gqa, deterministic=False)
            r = fam.resolve(inst)
            assert r == inst
            name = fam.instance_name(r)
            text = fam.render_instance(r, name, banner("spec.yaml", "0" * 64))
            assert f"emitter_{name}_kernel" in text
            assert f"static constexpr bool kGqa = {'true' if gqa else 'false'};" in text
            # the bf16 fragment engine only in bf16 instances, ahead of upstream's collective
            bf16 = dtype is DType.bf16
            assert ("struct ArrayEngine<cutlass::bfloat16_t, N>" in text) == bf16
            assert f"using Element = {'cutlass::bfloat16_t' if bf16 else 'cutlass::half_t'};" in text
            if bf16:
                assert text.index("struct ArrayEngine<cutlass::bfloat16_t, N>") < \
                    text.index("#include \"../examples/88_hopper_fmha/collective/fmha_collective_bwd")
            n += 1
    assert n == 2 * 5 * 3 * 2 * 2


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd90")
    emit([str(CONFIG)], out)
    return out, json.loads((out / "manifest.json").read_text())


def test_config_emits_and_renders_each_level(emitted):
    out, manifest = emitted
    backward = [e for e in manifest["instances"] if e["config"].get("op") == "backward"]
    names = [e["name"] for e in backward]
    assert len(names) == 15 and not manifest["rejected"]
    assert sum(n.startswith("attn_bwd_sm90a_f16_") for n in names) == 8
    assert sum(n.startswith("attn_bwd_sm90a_bf16_") for n in names) == 7
    # bf16: d64 and d128, full and causal
    assert {(e["config"]["head_dim"], e["config"]["mask"]) for e in backward if e["config"]["dtype"] == "bf16"} >= \
        {(d, m) for d in (64, 128) for m in ("none", "causal_top_left")}
    assert {e["config"]["mask"] for e in backward} == {"none", "causal_top_left", "causal_bottom_right"}
    # the forward the GPU test's training step pairs with the d64 causal backward
    assert [e["name"] for e in manifest["instances"] if e["config"].get("op") != "backward"] == \
        ["attn_sm90a_f16_d64_128x128_cooperative_s5_causaltl_bshd_lse",
         "attn_sm90a_bf16_d64_128x128_cooperative_s5_causaltl_bshd_lse"]
    for name in names:
        text = (out / f"{name}.cu").read_text()
        for level in backward_sm90a.LEVELS:
            assert f": {level} --" in text, (name, level)
        # upstream's collective, epilogue and kernel, included from the CUTLASS tree (never copied)
        for header in ("collective/fmha_collective_bwd_tma_warpspecialized.hpp", "collective/fmha_epilogue_bwd.hpp",
                       "kernel/fmha_kernel_tma_warpspecialized.hpp"):
            assert f'#include "../examples/88_hopper_fmha/{header}"' in text
        assert "FmhaBwdMainloopTmaWarpSpecialized<Element, ElementAccumulator, TileShape, Fusion>" in text
        assert "struct FmhaBwdMainloopTmaWarpSpecialized" not in text
        cfg = rt.config_from_entry(next(e for e in manifest["instances"] if e["name"] == name))
        fusion = "CausalBwdFusion" if cfg.causal else "FusionBwdAdapter<cutlass::fmha::collective::ResidualFusion>"
        assert f"using Fusion = {fusion if cfg.causal else 'cutlass::fmha::collective::' + fusion};" in text
        assert f"static constexpr bool kBottomRight = {'true' if cfg.mask is Mask.causal_bottom_right else 'false'};" in text
        assert f"static constexpr int kBlockQ = {cfg.tile_q};" in text
        # the run-time scale replaces upstream's fixed 1/sqrt(d); the phases' waits and the ticket
        assert "P.main.mainloop.scale_softmax = s.scale;" in text
        assert "atomicAdd(params.counters, 1)" in text and "cp.async.bulk.wait_group 0;" in text


def _case(root, entry, p, data="normal", faults=(), seed=3):
    from emitter.runtime.fake_backend import FakeBackend

    be = FakeBackend(faults=list(faults))
    k = be.load(root, entry)
    inp = rt.make_inputs(k.config, p, data, seed)
    res = be.run(k, p, inp)
    return rt.compare(k.config, p, inp, res.outputs, rt.reference(k.config, p, inp))


def test_fake_backend_on_default_problems_and_planted_faults(emitted):
    out, manifest = emitted
    seen = set()
    for entry in manifest["instances"]:
        if entry["config"].get("op") != "backward":
            continue
        cfg = rt.config_from_entry(entry)
        for i, (p, data) in enumerate(rt.default_problems(cfg, quick=True)):
            assert not rt.not_supported_reasons(cfg, p)
            v = _case(out, entry, p, data, seed=i)
            assert v["status"] == "PASSED", (entry["name"], p.label(), data, v["reason"])
            seen.add((cfg.mask.value, p.seq_q % 8 != 0, p.seq_q > p.seq_k, p.seq_q < p.seq_k, p.heads_kv < p.heads_q))
    for mask in ("causal_top_left", "causal_bottom_right"):
        assert any(s[0] == mask and s[2] for s in seen)
        assert any(s[0] == mask and s[3] for s in seen)
    assert any(s[1] for s in seen)                   # a seq_q upstream's can_implement (seq_q % 8) refuses
    assert any(s[4] and s[0] != "none" for s in seen)     # GQA with a causal mask
    entry = next(e for e in manifest["instances"] if e["name"] == "attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd")
    p = make_problem(batch=1, heads_q=4, heads_kv=4, seq_q=77, seq_k=78, head_dim=64, scale=0.3)
    assert _case(out, entry, p)["status"] == "PASSED"
    v = _case(out, entry, p, faults=[{"kind": "bwd_no_scale_ds"}])
    assert v["failed_tensors"] == ["dq", "dk"], v["reason"]
    v = _case(out, entry, p, faults=[{"kind": "bwd_mask_off_by_one"}])
    assert v["status"] == "FAILED" and v["failed_full_rows"] == 0 and v["unseen_key_rows"] > 0, v["reason"]
    long = make_problem(batch=1, heads_q=4, heads_kv=4, seq_q=200, seq_k=201, head_dim=64)
    v = _case(out, entry, long, faults=[{"kind": "bwd_drop_dq_partial"}])
    assert v["failed_tensors"] == ["dq"], v["reason"]
    gqa = next(e for e in manifest["instances"] if e["name"] == "attn_bwd_sm90a_f16_d128_64x128_causalbr_bshd_gqa_dqsplit")
    p = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=77, seq_k=90, head_dim=128)
    assert _case(out, gqa, p)["status"] == "PASSED"
    v = _case(out, gqa, p, faults=[{"kind": "bwd_wrong_kv_head"}])
    assert v["failed_tensors"] == ["dk"] and v["failed_heads"]["dk"] == [0, 1], v["reason"]


@pytest.mark.nvcc
def test_one_sm90a_backward_instance_compiles(emitted):
    """A real sm90a backward instance through the project's build (cubin and host shim; about 1.5 min on 2
    cores): bf16, so upstream's collective compiles with the instance's bf16 fragment engine (an f16 instance is
    the same TU without it); the shared-memory budget and thread count are static_asserts in it, and its host
    shim answers."""
    import dataclasses

    from emitter.build import BuildOptions, build
    from emitter.kit.shim import HostShim
    from emitter.manifest import load, write

    out, _ = emitted
    data = load(out)
    name = "attn_bwd_sm90a_bf16_d64_64x128_causalbr_bhsd"
    data["instances"] = [e for e in data["instances"] if e["name"] == name]
    write(out, data)
    summary = build(out, options=BuildOptions())
    (r,) = summary.results
    assert r.status in ("ok", "cached"), r.error

    entry = data["instances"][0]
    cfg = rt.config_from_entry(entry)
    shim = HostShim(out / "build" / name / f"lib{name}.so", name)
    ok = make_problem(batch=2, heads_q=8, heads_kv=8, seq_q=130, seq_k=300, head_dim=64, layout="bhsd")
    status, launch = shim.query(rt.c_problem(cfg, ok, {}))
    assert status == 0
    # one grid of tickets: preprocessing (128 rows of seq_q rounded to 8), key blocks of 128, conversion (64 rows)
    bh = 2 * 8
    assert tuple(launch.grid) == (bh * (-(-136 // 128) + -(-300 // 128) + -(-130 // 64)), 1, 1)
    assert tuple(launch.block) == (backward_sm90a.THREADS, 1, 1) and tuple(launch.cluster) == (1, 1, 1)
    assert 100_000 < launch.shared_bytes <= backward_sm90a.SMEM_CAPACITY
    assert launch.params_align in (64, 128)
    # counters, the LSE and rowsum rows (seq_q rounded to 8), the f32 dQ accumulator
    assert launch.workspace_bytes >= bh * 136 * 4 * 2 + bh * 136 * 64 * 4

    def status_of(p, **fields):
        c = rt.c_problem(cfg, p, {})
        for k, v in fields.items():
            if isinstance(v, tuple):
                arr = getattr(c, k)
                for i, x in enumerate(v):
                    arr[i] = x
            else:
                setattr(c, k, v)
        return shim.query(c)[0]

    assert status_of(ok, head_dim=128) == 1                       # compiled for d64
    assert status_of(dataclasses.replace(ok, heads_kv=2)) == 1    # GQA: upstream has none
    assert status_of(ok, heads_kv=3) == 2                         # 3 does not divide 8: invalid
    assert status_of(ok, stride_q=(0, 68, 0)) == 1                # a stride off TMA's 16 bytes
    assert status_of(ok, stride_q=(0, 0, 2 ** 31)) == 1           # upstream's strides are int
    assert status_of(ok, flags=1) == 1
    assert status_of(ok, scale=-1.0) == 2
    assert status_of(dataclasses.replace(ok, seq_q=77)) == 0      # any seq_q (upstream's can_implement wants % 8)
    varlen = make_problem(heads_q=8, heads_kv=8, seqlens_q=(5, 70), seqlens_k=(9, 1), head_dim=64, layout="bhsd")
    assert status_of(varlen) == 1                                 # no variable lengths


FRAGMENT_PROBE = r"""
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include <type_traits>
#include <cstdio>
@FRAGMENT@
int main() {
  using namespace cute;
  auto layout = make_layout(make_shape(Int<2>{}, Int<4>{}));
  // upstream's dS: acc_DS = make_fragment_like<Element>(acc_DP); acc_DS(i) = <float expression>
  auto ds = make_fragment_like<cutlass::bfloat16_t>(layout);
  static_assert(std::is_same<typename decltype(ds)::value_type, cutlass::bfloat16_t>::value, "value_type");
  static_assert(sizeof(ds) == 8 * sizeof(cutlass::bfloat16_t), "storage");
  const float x[8] = {1.00390625f, 1.01171875f, -3.14159265f, 65504.f, 1e-30f, 0.f, -0.f, 3.3895314e38f};
  for (int i = 0; i < 8; ++i) ds(i) = x[i] * 1.0f;
  int bad = 0;
  for (int i = 0; i < 8; ++i) bad += ds(i).raw() != cutlass::bfloat16_t(x[i]).raw();
  printf("ties %04x %04x\n", ds(0).raw(), ds(1).raw());
  // recast_bits (upstream's store of dS to shared memory) sees the same 16-bit values
  auto u = recast<uint32_t>(ds);
  for (int i = 0; i < 4; ++i) bad += u(i) != (uint32_t(ds(2 * i).raw()) | uint32_t(ds(2 * i + 1).raw()) << 16);
  // make_acc_into_op: cute::copy of the f32 accumulator into a fragment of the element type
  auto acc = make_tensor<float>(layout);
  for (int i = 0; i < 8; ++i) acc(i) = x[7 - i];
  auto op = make_fragment_like<cutlass::bfloat16_t>(acc);
  copy(acc, op);
  for (int i = 0; i < 8; ++i) bad += op(i).raw() != cutlass::bfloat16_t(x[7 - i]).raw();
  // other element types keep CuTe's own engine
  auto h = make_fragment_like<cutlass::half_t>(layout);
  static_assert(std::is_same<decltype(h.data()), cutlass::half_t*>::value, "half_t fragments untouched");
  printf("mismatches %d\n", bad);
  return 0;
}
"""


@pytest.mark.nvcc
@pytest.mark.nvcc
def test_one_dq_split_instance_compiles(tmp_path):
    """emitter's split-dQ mainloop level through nvcc (about 1 min on 2 cores): bf16 d128 with GQA, dQ split by
    head-dim columns; ptxas keeps its wgmma asynchronous (a serialized wgmma fails the build) and the host shim
    answers with upstream's launch shape."""
    from emitter.build import BuildOptions, build
    from emitter.kit.shim import HostShim

    spec = tmp_path / "s.yaml"
    spec.write_text(textwrap.dedent("""\
        kernels:
          - family: attention
            op: backward
            arch: sm90a
            dtype: bf16
            head_dim: 128
            tile: 64x128
            gqa: true
            deterministic: false
            dq_split: true
        """))
    out = tmp_path / "out"
    emit([str(spec)], out)
    summary = build(out, options=BuildOptions())
    (r,) = summary.results
    name = "attn_bwd_sm90a_bf16_d128_64x128_nomask_bshd_gqa_dqsplit"
    assert r.name == name and r.status in ("ok", "cached"), r.error
    entry = json.loads((out / "manifest.json").read_text())["instances"][0]
    cfg = rt.config_from_entry(entry)
    shim = HostShim(out / "build" / name / f"lib{name}.so", name)
    p = make_problem(batch=2, heads_q=8, heads_kv=2, seq_q=77, seq_k=200, head_dim=128)
    status, launch = shim.query(rt.c_problem(cfg, p, {}))
    assert status == 0
    assert tuple(launch.block) == (backward_sm90a.THREADS, 1, 1)
    assert 100_000 < launch.shared_bytes <= backward_sm90a.SMEM_CAPACITY


def test_bf16_fragments_take_a_float_rounded_to_nearest_even(tmp_path):
    """The bf16 fragment engine (templates/attention/sm90a/bwd/bf16_fragment.cu.j2) on the host (nvcc, about 15 s):
    a fragment of cutlass::bfloat16_t takes a float rounded as cutlass::bfloat16_t(float) rounds (ties to even),
    its bits read back through recast<uint32_t> as upstream's dS store reads them, cute::copy from f32 converts
    the same way, and half_t fragments keep CuTe's engine."""
    import subprocess

    from emitter.build.nvcc import find_nvcc
    from emitter.cutlass_path import find_cutlass
    from emitter.render import render_template

    src = tmp_path / "probe.cu"
    src.write_text(FRAGMENT_PROBE.replace("@FRAGMENT@", render_template("attention/sm90a/bwd/bf16_fragment.cu.j2")))
    exe = tmp_path / "probe"
    r = subprocess.run([str(find_nvcc()), "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90a",
                        *find_cutlass().include_flags(), "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.splitlines()
    # 1 + 2^-8 and 1 + 3 * 2^-8 are ties: to even, 1.0 and 1 + 2^-6
    assert out == ["ties 3f80 3f82", "mismatches 0"], out
