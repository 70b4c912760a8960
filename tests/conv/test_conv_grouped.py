"""Grouped convolution (sm80 `group_mode: single | multiple`, CUTLASS 2.x DefaultConv2dGroupFprop), on the CPU:
the spec's keys and rejections, the problem's `groups=`, what each instance refuses at run time (ungrouped ones
every groups > 1), the default verify problems, the float64 reference against torch's grouped convolution, the
fake backend (block-diagonal filter, not the reference's group slices) passing them, and the planted faults --
the new group_offset among them -- caught for their own reason."""

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emitter.emit import spec_entries
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.conv import check, fake, instance_name, reference, render_instance, resolve
from emitter.families.conv import runtime as hooks
from emitter.families.conv.abi import c_problem_from
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.flops import conv_flops
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons, parse_problem
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

ROOT = Path(__file__).resolve().parents[2]
SINGLE = "family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x64x64\nwarp: 64x32x64\ngroup_mode: single\n"
MULTIPLE = ("family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 64x64x32\nwarp: 32x32x32\nstages: 2\n"
            "iterator: analytic\nalignment: {a: 1, b: 1, c: 8}\ngroup_mode: multiple\n")
PLAIN = "family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\n"


def one(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(expand_entry(doc, path, entry, kp))
    return resolve(cand)


def config(text: str) -> ConvConfig:
    inst = one(text)
    assert not isinstance(inst, Rejection), inst
    return ConvConfig.from_entry({"name": instance_name(inst), "config": inst.config()})


# ------------------------------------------------------------------------------------------------ spec
def test_group_modes_resolve_name_and_render_the_group_kernel():
    for text, mode, cpp in ((SINGLE, "single", "kSingleGroup"), (MULTIPLE, "multiple", "kMultipleGroup")):
        inst = one(text)
        assert not isinstance(inst, Rejection), inst
        name = instance_name(inst)
        assert name.endswith(f"_group{mode}")
        assert inst.config()["group_mode"] == mode
        src = render_instance(inst, name, banner("t.yaml", "0" * 64))
        assert "cutlass/conv/kernel/default_conv2d_group_fprop.h" in src
        assert f"cutlass::conv::GroupMode::{cpp}" in src and "DefaultConv2dGroupFprop<" in src
        assert "p->split_k_slices, p->groups)" in src and "filter_c" in src
    plain = one(PLAIN)
    assert "group" not in instance_name(plain) and "group_mode" not in plain.config()     # old names, old manifests


@pytest.mark.parametrize("extra,rule", [
    ("op: dgrad\n", "group-fprop-2d"),
    ("op: wgrad\n", "group-fprop-2d"),
    ("dims: 3\n", "group-fprop-2d"),
    ("iterator: few_channels\n", "group-iterator"),
    ("group_mode: multiple\n", "group-optimized-single"),      # SINGLE's default iterator is optimized
    ("split_k: serial\n", "group-split-k"),
    ("stride_support: unity\n", "group-stride"),
    ("arch: sm90a\ncluster: 1x1x1\nwarp: null\n", "group-sm80-only"),
])
def test_group_rejections_name_the_rule_and_a_fix(extra, rule):
    base = {k: v for k, v in (line.split(": ", 1) for line in SINGLE.strip().splitlines())}
    for k, v in (line.split(": ", 1) for line in extra.strip().splitlines()):
        if v == "null":
            base.pop(k, None)
        else:
            base[k] = v
    got = one("".join(f"{k}: {v}\n" for k, v in base.items()))
    assert isinstance(got, Rejection) and got.rule == rule, got
    assert "use " in got.reason


def test_unknown_group_mode_is_a_spec_error():
    with pytest.raises(SpecError) as e:
        one(SINGLE.replace("group_mode: single", "group_mode: triple"))
    assert "group_mode" in str(e.value) and "multiple" in str(e.value)


# ------------------------------------------------------------------------------------------------ problems
def test_problem_syntax_shapes_flops_and_abi():
    (d,) = parse_problem("n=2,h=9,w=9,c=12,k=8,r=3,s=3,groups=4")
    p = hooks.problem_from_mapping(d, "<t>", None, "")
    assert p.groups == 4 and p.shape("w") == (8, 1, 3, 3, 3) and p.gemm("fprop")[2] == 27
    assert conv_flops(p) == conv_flops(replace(p, groups=1)) // 4
    assert p.label("normal").endswith("_g4_normal") and "_g" not in replace(p, groups=1).label("normal")
    assert ConvProblem.from_dict(p.as_dict()) == p and "groups" not in replace(p, groups=1).as_dict()
    assert c_problem_from(p, {}).groups == 4
    for bad in ("groups=5", "groups=0"):
        with pytest.raises(SpecError):
            parse_problem(f"n=2,h=9,w=9,c=12,k=8,r=3,s=3,{bad}")


def test_every_ungrouped_instance_refuses_groups_and_grouped_ones_their_rules():
    p = ConvProblem(n=2, h=9, w=9, c=64, k=128, r=3, s=3, groups=2)
    plain = config(PLAIN).cfg
    assert any("ungrouped convolutions only" in r for r in not_supported_reasons(plain, p))
    assert not_supported_reasons(plain, replace(p, groups=1)) == []
    single = config(SINGLE).cfg
    assert not_supported_reasons(single, p) == []                                    # K/g = 64 = tile n
    assert any("groups=1" in r for r in not_supported_reasons(single, replace(p, groups=1)))
    assert any("not a multiple of tile n 64" in r for r in not_supported_reasons(single, replace(p, k=64)))
    assert any("C/groups=12" in r for r in not_supported_reasons(single, replace(p, c=24)))
    multiple = config(MULTIPLE).cfg
    assert not_supported_reasons(multiple, replace(p, c=40, k=40, groups=40)) == []   # depthwise
    assert any("tile n 64 is not a multiple of K/groups=24" in r
               for r in not_supported_reasons(multiple, replace(p, k=48)))


@pytest.mark.parametrize("text", [SINGLE, MULTIPLE])
def test_default_problems_cover_group_counts_and_geometry(text):
    cfg = config(text)
    probs = default_problems(cfg.cfg)
    normal = [p for p, d in probs if d == "normal"]
    assert len(normal) >= 5 and all(not not_supported_reasons(cfg.cfg, p) for p in normal)
    groups = {p.groups for p in normal}
    assert {2, 3, 4} <= groups and min(groups) > 1
    assert any(p.stride[1] == 2 for p in normal) and any(p.dilation[1] == 2 for p in normal)
    assert any(p.r == 1 for p in normal) and any(p.r == 7 for p in normal) and any(p.beta != 0 for p in normal)
    assert any(p.pad_front != p.pad_back for p in normal)
    assert any((p.c // p.groups) % (2 * cfg.alignment_a) for p in normal)           # odd C/g multiples
    if cfg.alignment_a == 1:
        assert any(p.groups == p.c == p.k for p in normal)                          # depthwise


# ------------------------------------------------------------------------------------------------ reference, fake
GROUPED = [
    ConvProblem(n=2, h=9, w=11, c=6, k=4, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), groups=2),
    ConvProblem(n=2, h=10, w=9, c=12, k=8, r=3, s=3, pad_front=(0, 1, 2), pad_back=(0, 0, 1), stride=(1, 2, 2),
                groups=4),
    ConvProblem(n=1, h=12, w=12, c=9, k=9, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2), dilation=(1, 2, 2),
                groups=9),                                                       # depthwise
    ConvProblem(n=2, h=7, w=8, c=6, k=12, r=1, s=1, groups=3),                     # channel multiplier 4
]


def _values(p, seed):
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(p.shape(t)) for t in ("x", "w", "y")}


@pytest.mark.parametrize("i", range(len(GROUPED)))
def test_reference_matches_torch_cpu_grouped_convolution(i):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    p = GROUPED[i]
    v = _values(p, i)
    x = torch.tensor(v["x"][:, 0]).permute(0, 3, 1, 2).requires_grad_(True)        # N C H W
    w = torch.tensor(v["w"][:, 0]).permute(0, 3, 1, 2).requires_grad_(True)        # K C/g R S
    dy = torch.tensor(v["y"][:, 0]).permute(0, 3, 1, 2)
    (pt, pl), (pb, pr) = p.pad_front[1:], p.pad_back[1:]
    y = F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, stride=p.stride[1:], dilation=p.dilation[1:], groups=p.groups)
    dx, dw = torch.autograd.grad(y, (x, w), grad_outputs=dy)
    want = {"fprop": y.detach().permute(0, 2, 3, 1), "dgrad": dx.permute(0, 2, 3, 1), "wgrad": dw.permute(0, 2, 3, 1)}
    for op in ("fprop", "dgrad", "wgrad"):
        got = reference.conv_numpy(op, p, v["x"], v["w"], v["y"])[:, 0] if op != "wgrad" else \
            reference.conv_numpy(op, p, v["x"], v["w"], v["y"])[:, 0]
        np.testing.assert_allclose(got, want[op].numpy(), rtol=1e-10, atol=1e-10, err_msg=op)
        if op != "wgrad":
            np.testing.assert_allclose(reference.conv_torch(op, p, *(torch.tensor(v[t]) for t in "xwy"))[:, 0].numpy(),
                                       want[op].numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_fake_grouped_convolution_equals_the_reference(op):
    for i, p in enumerate(GROUPED):
        v = _values(p, 10 + i)
        np.testing.assert_allclose(fake.fake_conv(op, p, v["x"], v["w"], v["y"]),
                                   reference.conv_numpy(op, p, v["x"], v["w"], v["y"]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("text", [SINGLE, MULTIPLE])
def test_fake_backend_passes_the_default_problems(text):
    cfg = config(text)
    for k, (p, data) in enumerate(default_problems(cfg.cfg, quick=True)):
        inputs = hooks.make_inputs(cfg, p, data, k)
        out = hooks.fake_run(cfg, p, inputs.buffers, {})
        v = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
        assert v["status"] == "PASSED", (p.label(data), v["reason"])


def _planted(cfg, p, fault, seed=3):
    inputs = hooks.make_inputs(cfg, p, "normal", seed)
    out = hooks.fake_run(cfg, p, inputs.buffers, {f"conv_{fault}": {}})
    verdict = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
    model = None
    if fault != "row_short":
        model = hooks.compare(cfg, p, inputs, out, check.fault_model_reference(fault, cfg.cfg, p, inputs.values))
    return verdict, model


@pytest.mark.parametrize("fault", [*check.FAULTS, *check.GROUP_FAULTS])
def test_planted_faults_on_grouped_problems_are_caught_for_their_reason(fault):
    cfg = config(SINGLE)
    p = ConvProblem(n=2, h=15, w=13, c=4 * 24, k=4 * 64, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                    stride=(1, 2, 2), groups=4)
    assert not not_supported_reasons(cfg.cfg, p)
    verdict, model = _planted(cfg, p, fault)
    assert verdict["status"] == "FAILED", verdict["reason"]
    assert check.signature_misses(fault, "fprop", p, verdict, model) == [], (verdict["reason"], verdict.get("bad_channels"))
    if model is not None:
        assert model["status"] == "PASSED", model["reason"]


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_group_offset_fault_model_is_the_fakes_and_marks_groups_past_the_first(op):
    p = GROUPED[1]
    v = _values(p, 4)
    got = fake.fake_conv(op, p, v["x"], v["w"], v["y"], {"conv_group_offset": {}})
    cfg = {"op": op, "epilogue": {"activation": "identity"}}
    np.testing.assert_allclose(got, check.fault_model_reference("group_offset", cfg, replace(p, alpha=1.0), v),
                               rtol=1e-10, atol=1e-10)
    right = reference.conv_numpy(op, p, v["x"], v["w"], v["y"])
    kg = p.k // p.groups
    if op != "dgrad":
        first = got[..., :kg] if op == "fprop" else got[:kg]
        want = right[..., :kg] if op == "fprop" else right[:kg]
        np.testing.assert_allclose(first, want, rtol=1e-10, atol=1e-10)          # group 0 has offset 0 anyway
    assert not np.allclose(got, right)


def test_group_offset_needs_a_grouped_problem():
    p = replace(GROUPED[0], groups=1, k=4)
    v = _values(p, 1)
    with pytest.raises(ValueError, match="grouped problem"):
        fake.fake_conv("fprop", p, v["x"], v["w"], v["y"], {"conv_group_offset": {}})


# ------------------------------------------------------------------------------------------------ profile
def test_profile_problem_keeps_groups_and_the_baseline_gets_them():
    from emitter.families.conv import profile as prof

    p = ConvProblem(n=8, h=28, w=28, c=256, k=256, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), groups=32)
    pp = prof.profile_problem(p)
    assert pp.groups == 32 and pp.conv == p and "_g32" in pp.key
    assert prof.ConvProfileProblem.from_dict(pp.as_dict()) == pp
    assert prof._geometry(p, 2)["groups"] == 32 and prof._geometry_any(p, 2)["groups"] == 32
    cfg = config(SINGLE.replace("tile: 128x64x64", "tile: 128x64x64"))
    small = prof.profile_fake_problem(cfg, pp, None, limit=64)
    assert small.groups >= 2 and small.c // small.groups == 8 and small.k // small.groups == 8


# ------------------------------------------------------------------------------------------------ configs, verify CLI
def test_verify_set_holds_grouped_instances_that_verify_on_the_fake_backend(tmp_path):
    from emitter.emit import resolve_specs

    spec = ROOT / "configs" / "conv" / "verify_set.yaml"
    resolved, rejected, _s, _d = resolve_specs([spec])
    grouped = [r.name for r in resolved if "_group" in r.name]
    assert rejected == [] and {n.rsplit("_", 1)[1] for n in grouped} == {"groupsingle", "groupmultiple"}
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(spec), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick", "--select", "*_group*"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["cases"]["FAILED"] == 0 and res["summary"]["cases"]["PASSED"] >= 6 * len(grouped)
    assert any("_g" in x["problem"] for x in res["results"])
    faults = json.dumps([{"kind": "conv_group_offset"}])
    r = subprocess.run(cmd + ["verify", str(out), "--backend", "fake", "--quick", "--select", "*_group*",
                              "--fake-faults", faults],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stdout[-2000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["cases"]["PASSED"] == 0


# ------------------------------------------------------------------------------------------------ the GPU runner's launches
@pytest.mark.parametrize("text", [SINGLE, MULTIPLE])
def test_runner_planted_launches_on_grouped_instances(text):
    """The GPU runner's default cases and planted launches (group_offset among them: x handed over with every
    group's channels replaced by group 0's) run by the CPU stand-in kernel of test_conv_runner_cpu.py."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_conv_runner_cpu import StandIn

    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    k = StandIn(config(text))
    p = planted_problem(k.cfg)
    assert p.groups == 4 and not not_supported_reasons(k.cfg.cfg, p)
    assert "group_offset" in planted_bugs(k.cfg)
    assert run_case(k, p, "normal", 3)["status"] == "PASSED"
    for bug in planted_bugs(k.cfg):
        v = run_case(k, p, "normal", 3, planted=bug)
        assert expected_reason(bug, v), (bug, v.get("status"), v.get("reason"), v.get("signature_misses"))
    for i, (q, data) in enumerate(default_problems(k.cfg.cfg, quick=True)):
        assert run_case(k, q, data, i)["status"] == "PASSED", q.label(data)


def test_library_tuning_records_leave_grouped_problems_out():
    from emitter.families.conv.library import _entry_shape

    p = ConvProblem(n=8, h=28, w=28, c=256, k=256, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), groups=4)
    shape, why = _entry_shape(p.as_dict())
    assert shape is None and "groups=4" in why
    assert _entry_shape(replace(p, groups=1).as_dict())[0] == (8, 28, 28, 256, 256, 3, 3, 1, 28, 28)
