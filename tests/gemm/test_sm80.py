"""CUTLASS 2.x GEMM path (sm75/sm80/sm86/sm89): resolve() rules, template context, rendering, and
(marked nvcc) real compiles of device cubins + host shims for a spread of instances."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from emitter.dtypes import DType
from emitter.families.gemm import sm80
from emitter.families.gemm.model import (
    AUTO, Activation, Arch, Bias, Epilogue, EpilogueSchedule, GemmInstance, KernelSchedule, Layout, OpClass,
    Promotion, Raster, Reduction, Rejection, Shape3, SplitK, TileScheduler,
)
from emitter.render import banner, render_template

S = Shape3
ROW, COL = Layout.row, Layout.col


def make(**kw) -> GemmInstance:
    """A GemmInstance with every field explicit (f16 TN 128x128x32, warp 64x64x32, 4 stages on sm80)."""
    fields = dict(
        arch=Arch.sm80, a=DType.f16, b=DType.f16, c=DType.f16, d=DType.f16,
        layout_a=ROW, layout_b=COL, layout_c=ROW,
        accumulator=DType.f32, epilogue_compute=DType.f32, op_class=OpClass.tensorop,
        tile=S(128, 128, 32), warp=S(64, 64, 32), cluster=None, instruction=None, stages=4,
        kernel_schedule=KernelSchedule.auto, epilogue_schedule=EpilogueSchedule.auto,
        tile_scheduler=TileScheduler.persistent, swizzle=1,
        alignment_a=AUTO, alignment_b=AUTO, alignment_c=AUTO,
        epilogue=Epilogue(), split_k=SplitK.none, batched=False,
    )
    fields.update(kw)
    return GemmInstance(**fields)


def ok(inst: GemmInstance) -> GemmInstance:
    r = sm80.resolve(inst)
    assert not isinstance(r, Rejection), f"rejected: {r.rule}: {r.reason}"
    return r


def rejected(inst: GemmInstance) -> Rejection:
    r = sm80.resolve(inst)
    assert isinstance(r, Rejection), f"accepted: {r}"
    return r


# ------------------------------------------------------------------------------------------------
# module contract
# ------------------------------------------------------------------------------------------------

def test_module_contract():
    assert sm80.ARCHES == (Arch.sm75, Arch.sm80, Arch.sm86, Arch.sm89)
    assert sm80.LEVELS == ("instruction", "warp", "threadblock", "epilogue", "kernel", "device", "entry")
    r = ok(make())
    assert r.instruction == S(16, 8, 16) and r.stages == 4
    assert (r.alignment_a, r.alignment_b, r.alignment_c) == (8, 8, 8)
    assert sm80.resolve(r) == r, "resolve is idempotent"


# ------------------------------------------------------------------------------------------------
# every GEMM CUTLASS's own generator emits for these arches is accepted
# ------------------------------------------------------------------------------------------------

_DT = {"f16": DType.f16, "bf16": DType.bf16, "tf32": DType.tf32, "f32": DType.f32, "f64": DType.f64,
       "s8": DType.s8, "s32": DType.s32, "e4m3": DType.e4m3, "e5m2": DType.e5m2}


def _generator_instances(function: str, arch: Arch):
    generator = pytest.importorskip("cutlass_library.generator")
    from cutlass_library.library import GemmKind, LayoutType

    class Manifest:
        kernel_filter = "all"   # non-empty: every tile and alignment, not just the first

        def __init__(self):
            self.ops = []

        def append(self, op):
            self.ops.append(op)

    m = Manifest()
    getattr(generator, function)(m, "13.0")
    out = []
    for op in m.ops:
        if type(op).__name__ != "GemmOperation" or op.gemm_kind != GemmKind.Universal:
            continue
        names = [op.A.element.name, op.B.element.name, op.C.element.name, op.accumulator_type().name,
                 op.element_epilogue.name]
        if any(n not in _DT for n in names):
            continue                  # u8, complex: not in our type set
        a, b, c, acc, comp = (_DT[n] for n in names)
        td = op.tile_description
        tile = S(*td.threadblock_shape)
        wc = td.warp_count
        layout = {LayoutType.RowMajor: ROW, LayoutType.ColumnMajor: COL}
        out.append(make(
            arch=arch, a=a, b=b, c=c, d=c, accumulator=acc, epilogue_compute=comp,
            layout_a=layout[op.A.layout], layout_b=layout[op.B.layout], layout_c=layout[op.C.layout],
            op_class=OpClass.simt if td.math_instruction.instruction_shape == [1, 1, 1] else OpClass.tensorop,
            tile=tile, warp=S(tile.m // wc[0], tile.n // wc[1], tile.k // wc[2]),
            instruction=S(*td.math_instruction.instruction_shape), stages=td.stages, swizzle=8,
            alignment_a=op.A.alignment, alignment_b=op.B.alignment, alignment_c=op.C.alignment,
        ))
    return out


@pytest.mark.parametrize("function,arch", [
    ("GenerateSM80_TensorOp_16816", Arch.sm80),
    ("GenerateSM80_TensorOp_1688", Arch.sm80),
    ("GenerateSM80_TensorOp_16832_TN", Arch.sm80),
    ("GenerateSM80_TensorOp_884", Arch.sm80),
    ("GenerateSM80_Simt_f32", Arch.sm80),
    ("GenerateSM80_Simt_f64", Arch.sm80),
    ("GenerateSM75_TensorOp_1688", Arch.sm75),
    ("GenerateSM75_TensorOp_8816_TN", Arch.sm75),
    ("GenerateSM50_Simt", Arch.sm75),
    ("GenerateSM89_TensorOp_16832_fp8_fp32acc", Arch.sm89),
])
def test_cutlass_generator_configs_are_accepted(function, arch):
    instances = _generator_instances(function, arch)
    assert instances, f"{function} produced no GEMMs"
    bad = []
    for inst in instances:
        r = sm80.resolve(inst)
        t = inst.tile
        mainloop = inst.stages * (t.m * t.k * inst.a.bits + t.k * t.n * inst.b.bits) // 8
        if isinstance(r, Rejection) and r.rule == "smem-budget" and mainloop > sm80.SMEM_LIMIT[arch]:
            continue   # CUTLASS emits it for newer GPUs too (max_cc 1024); it cannot launch on this arch
        if isinstance(r, Rejection):
            bad.append(f"{inst.a}/{inst.d} {inst.layout_a}{inst.layout_b}{inst.layout_c} {inst.tile} w{inst.warp} "
                       f"s{inst.stages} al{inst.alignment_a}/{inst.alignment_c}: {r.rule}: {r.reason}")
    assert not bad, f"{len(bad)} of {len(instances)} rejected:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("tile,warp,stages", [
    ((256, 128, 32), (64, 64, 32), 3), ((128, 256, 32), (64, 64, 32), 3), ((256, 64, 32), (64, 64, 32), 4),
    ((64, 256, 32), (64, 64, 32), 4), ((128, 128, 32), (64, 64, 32), 5), ((128, 64, 32), (64, 32, 32), 6),
    ((64, 128, 32), (32, 64, 32), 6), ((64, 64, 32), (32, 32, 32), 10), ((256, 128, 64), (64, 64, 64), 3),
    ((128, 256, 64), (64, 64, 64), 3), ((128, 128, 64), (64, 64, 64), 4), ((64, 64, 64), (32, 32, 64), 5),
])
def test_default_sm80_f16_tiles(tile, warp, stages):
    for la in (ROW, COL):
        for lb in (ROW, COL):
            for lc in (ROW, COL):
                ok(make(tile=S(*tile), warp=S(*warp), stages=stages, layout_a=la, layout_b=lb, layout_c=lc))


# ------------------------------------------------------------------------------------------------
# derived fields
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,a,acc,d,op_class,expected", [
    (Arch.sm80, DType.f16, DType.f32, DType.f16, OpClass.tensorop, S(16, 8, 16)),
    (Arch.sm80, DType.bf16, DType.f32, DType.bf16, OpClass.tensorop, S(16, 8, 16)),
    (Arch.sm80, DType.f32, DType.f32, DType.f32, OpClass.tensorop, S(16, 8, 8)),
    (Arch.sm80, DType.tf32, DType.f32, DType.f32, OpClass.tensorop, S(16, 8, 8)),
    (Arch.sm80, DType.f64, DType.f64, DType.f64, OpClass.tensorop, S(8, 8, 4)),
    (Arch.sm80, DType.s8, DType.s32, DType.s8, OpClass.tensorop, S(16, 8, 32)),
    (Arch.sm86, DType.f16, DType.f32, DType.f16, OpClass.tensorop, S(16, 8, 16)),
    (Arch.sm89, DType.e4m3, DType.f32, DType.f16, OpClass.tensorop, S(16, 8, 32)),
    (Arch.sm75, DType.f16, DType.f32, DType.f16, OpClass.tensorop, S(16, 8, 8)),
    (Arch.sm75, DType.s8, DType.s32, DType.s32, OpClass.tensorop, S(8, 8, 16)),
    (Arch.sm80, DType.f32, DType.f32, DType.f32, OpClass.simt, S(1, 1, 1)),
])
def test_instruction_derivation(arch, a, acc, d, op_class, expected):
    kw = dict(arch=arch, a=a, b=a, c=d, d=d, accumulator=acc,
              epilogue_compute=DType.f32 if acc is DType.s32 else acc, op_class=op_class)
    if a.bits == 8:
        kw.update(tile=S(128, 128, 64), warp=S(64, 64, 64))
    if op_class is OpClass.simt:
        kw.update(tile=S(128, 128, 8), warp=S(32, 64, 8))
    if a is DType.f64:
        kw.update(tile=S(64, 64, 16), warp=S(32, 32, 16))
    if a in (DType.f32, DType.tf32) and op_class is OpClass.tensorop:
        kw.update(tile=S(128, 128, 16), warp=S(64, 64, 16))
    if arch is Arch.sm75:
        kw.update(stages=2)
    assert ok(make(**kw)).instruction == expected


def test_auto_alignments():
    r = ok(make(a=DType.f16, d=DType.f32, c=DType.f32))
    assert (r.alignment_a, r.alignment_b, r.alignment_c) == (8, 8, 4)
    r = ok(make(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32,
                tile=S(128, 128, 64), warp=S(64, 64, 64)))
    assert (r.alignment_a, r.alignment_b, r.alignment_c) == (16, 16, 16)
    r = ok(make(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32,
                tile=S(128, 64, 64), warp=S(64, 32, 64)))
    assert r.alignment_c == 8      # narrow tiles store 8 int8 per access (as CUTLASS's generator)
    r = ok(make(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64,
                epilogue_compute=DType.f64, tile=S(64, 64, 16), warp=S(32, 32, 16)))
    assert (r.alignment_a, r.alignment_b, r.alignment_c) == (1, 1, 1)


def test_auto_stages_fit_the_arch():
    r = ok(make(stages=AUTO))
    assert 3 <= r.stages <= 10 and sm80.smem_bytes(r, r.stages) <= sm80.SMEM_LIMIT[Arch.sm80]
    big = dict(tile=S(256, 128, 64), warp=S(64, 64, 64), stages=AUTO)
    assert ok(make(**big)).stages == 3
    r = rejected(make(arch=Arch.sm86, **big))
    assert r.rule == "smem-budget" and "101376" in r.reason
    assert ok(make(arch=Arch.sm75, stages=AUTO, instruction=S(16, 8, 8))).stages == 2


# ------------------------------------------------------------------------------------------------
# every rule: rejected with its id and a reason that says how to fix it
# ------------------------------------------------------------------------------------------------

REJECTIONS = [
    # (changes, rule, words the reason must contain)
    (dict(arch=Arch.sm90a, cluster=S(1, 1, 1)), "arch-not-cutlass2", ["sm90a"]),
    (dict(kernel_schedule=KernelSchedule.cooperative), "kernel-schedule-3x-only", ["sm90a"]),
    (dict(epilogue_schedule=EpilogueSchedule.tma), "epilogue-schedule-3x-only", ["sm90a"]),
    (dict(tile_scheduler=TileScheduler.stream_k), "tile-scheduler-3x-only", ["sm90a"]),
    (dict(cluster=S(2, 1, 1)), "cluster-3x-only", ["sm90a"]),
    (dict(fp8_fast_accum=True), "fp8-fast-accum", ["sm90a", "remove"]),
    (dict(swap_ab=True), "swap-ab-3x-only", ["sm90a", "remove"]),
    (dict(raster=Raster.along_n), "scheduler-3x-only", ["sm90a", "swizzle"]),
    (dict(reduction=Reduction.nondeterministic), "scheduler-3x-only", ["sm90a", "stream-K"]),
    (dict(promotion_interval=8), "promotion-interval-fp8-only", ["sm90a", "remove"]),
    (dict(promotion=Promotion.overlap), "promotion-overlap-fp8-only", ["sm90a", "remove"]),
    # a K-major operand's tile k beyond one 128-byte shared-memory line (CUTLASS static_assert; seed 700304)
    (dict(tile=S(128, 128, 128), warp=S(64, 64, 128)), "tile-k-crosswise", ["tile k <= 64", "128 bytes"]),
    (dict(arch=Arch.sm89, a=DType.e4m3, b=DType.e4m3, c=DType.bf16, d=DType.bf16, tile=S(128, 128, 64),
          warp=S(64, 64, 64), stages=3, fp8_fast_accum=True), "fp8-fast-accum", ["sm90a", "e4m3"]),
    (dict(warp=None), "warp-shape-required", ["warp"]),
    (dict(a=DType.e4m3, b=DType.e4m3, accumulator=DType.f32, tile=S(128, 128, 64), warp=S(64, 64, 64)),
     "fp8-needs-sm89", ["sm89", "sm90a"]),
    (dict(b=DType.bf16), "dtype-a-b-mismatch", ["b=f16"]),
    (dict(c=DType.f32), "dtype-c-d-mismatch", ["c=f16"]),
    (dict(a=DType.bf16, b=DType.bf16, c=DType.bf16, d=DType.bf16, accumulator=DType.f16,
          epilogue_compute=DType.f16), "dtype-accumulator", ["f32"]),
    (dict(a=DType.s8, b=DType.s8, c=DType.f16, d=DType.f16, accumulator=DType.s32, tile=S(128, 128, 64),
          warp=S(64, 64, 64)), "dtype-output", ["s8", "s32"]),
    (dict(epilogue_compute=DType.f64), "dtype-epilogue-compute", ["f32"]),
    (dict(a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, accumulator=DType.f32, arch=Arch.sm75, stages=2,
          tile=S(128, 128, 16), warp=S(64, 64, 16)), "tf32-needs-sm80", ["simt"]),
    (dict(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64, epilogue_compute=DType.f64,
          arch=Arch.sm75, stages=2, tile=S(64, 64, 16), warp=S(32, 32, 16)), "f64-tensorop-needs-sm80", ["sm80"]),
    (dict(a=DType.bf16, b=DType.bf16, c=DType.bf16, d=DType.bf16, arch=Arch.sm75, stages=2), "bf16-needs-sm80",
     ["sm80"]),
    (dict(op_class=OpClass.simt, tile=S(128, 128, 8), warp=S(32, 64, 8)), "simt-dtype", ["tensorop"]),
    (dict(instruction=S(16, 8, 32)), "instruction-shape", ["16x8x16"]),
    (dict(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64, epilogue_compute=DType.f64,
          tile=S(64, 64, 16), warp=S(32, 32, 16), instruction=S(16, 8, 4)), "instruction-shape", ["sm90", "8x8x4"]),
    (dict(arch=Arch.sm75, stages=2, instruction=S(16, 8, 16)), "instruction-shape", ["16x8x8"]),
    (dict(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32, layout_a=COL,
          tile=S(128, 128, 64), warp=S(64, 64, 64)), "layout-8bit-requires-tn", ["tn"]),
    (dict(tile=S(128, 128, 32), warp=S(48, 64, 32)), "tile-multiple-of-warp", ["warp m"]),
    (dict(tile=S(128, 120, 32), warp=S(64, 60, 32)), "warp-multiple-of-instruction", ["multiple of 8"]),
    (dict(tile=S(128, 128, 48), warp=S(64, 64, 24)), "warp-multiple-of-instruction", ["16"]),
    (dict(a=DType.s8, b=DType.s8, c=DType.s32, d=DType.s32, accumulator=DType.s32, tile=S(128, 128, 48),
          warp=S(64, 64, 48)), "tile-k-multiple-of-instruction-k", ["use 32 or 64"]),
    (dict(tile=S(128, 128, 48), warp=S(64, 64, 48)), "warp-k-iterations", ["even", "32"]),
    (dict(tile=S(128, 128, 96), warp=S(64, 64, 32), stages=3), "tile-k-crosswise", ["k=96"]),
    (dict(tile=S(128, 128, 16), warp=S(64, 64, 16), stages=4), "warp-k-iterations", ["even", "32"]),
    (dict(tile=S(256, 256, 32), warp=S(32, 32, 32)), "warp-count", ["64 warps"]),
    (dict(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64, epilogue_compute=DType.f64,
          tile=S(32, 32, 16), warp=S(32, 32, 16)), "f64-tensorop-min-warps", ["2 warps"]),
    (dict(swizzle=3), "swizzle-width", ["1, 2, 4 or 8"]),
    (dict(split_k=SplitK.parallel), "split-k-parallel-unsupported", ["serial"]),
    (dict(split_k=SplitK.serial, batched=True), "split-k-batched-exclusive", []),
    (dict(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32, split_k=SplitK.serial,
          tile=S(128, 128, 64), warp=S(64, 64, 64)), "split-k-8bit-output", ["s32"]),
    (dict(epilogue=Epilogue(bias=Bias.row)), "bias-unsupported", ["sm90a", "beta=1"]),
    (dict(a=DType.s8, b=DType.s8, c=DType.s32, d=DType.s32, accumulator=DType.s32, epilogue_compute=DType.s32,
          epilogue=Epilogue(activation=Activation.gelu), tile=S(128, 128, 64), warp=S(64, 64, 64)),
     "activation-needs-float-compute", ["f32"]),
    (dict(epilogue=Epilogue(activation=Activation.clamp, clamp_min=6.0, clamp_max=0.0)), "clamp-bounds", ["swap"]),
    (dict(alignment_a=1), "alignment-a", ["32 bits", "8, 4, 2"]),
    (dict(alignment_b=16), "alignment-b", ["8, 4, 2"]),
    (dict(alignment_c=16), "alignment-c", ["8"]),
    (dict(tile=S(32, 32, 32), warp=S(16, 8, 32), stages=3), "operand-thread-map", ["too small"]),
    (dict(a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, op_class=OpClass.simt, tile=S(128, 128, 32),
          warp=S(32, 64, 32)), "simt-warp-tile", ["k=8"]),
    (dict(stages=2), "stages-multistage-min", ["3 or more"]),
    (dict(arch=Arch.sm75, stages=3, instruction=S(16, 8, 8)), "stages-sm75-pipelined", ["stages 2"]),
    (dict(tile=S(256, 128, 64), warp=S(64, 64, 64), stages=5), "smem-budget", ["use stages 3"]),
    (dict(arch=Arch.sm86, tile=S(256, 128, 64), warp=S(64, 64, 64), stages=3), "smem-budget", ["101376"]),
    (dict(arch=Arch.sm75, stages=2, tile=S(256, 128, 64), warp=S(64, 64, 64), instruction=S(16, 8, 8)),
     "smem-budget", ["65536"]),
]


@pytest.mark.parametrize("changes,rule,words", REJECTIONS, ids=[f"{r}-{i}" for i, (_, r, _) in enumerate(REJECTIONS)])
def test_rule_rejects_with_reason(changes, rule, words):
    r = rejected(make(**changes))
    assert r.rule == rule, f"expected {rule}, got {r.rule}: {r.reason}"
    assert len(r.reason) > 20 and (":" in r.reason or "use" in r.reason)
    for w in words:
        assert w in r.reason, f"{w!r} missing from reason: {r.reason}"


def test_tile_k_names_the_fix():
    r = rejected(make(tile=S(128, 128, 40), warp=S(64, 64, 40)))
    assert r.rule == "tile-k-multiple-of-instruction-k"
    assert r.reason == "tile k=40 is not a multiple of instruction k=16: use 32 or 48"


def test_rules_are_stable_kebab_ids():
    for changes, rule, _ in REJECTIONS:
        assert rule == rule.lower() and " " not in rule and "_" not in rule


# ------------------------------------------------------------------------------------------------
# accepted corners (do not over-reject)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes", [
    dict(layout_c=COL),                                                      # transposed problem
    dict(a=DType.f16, c=DType.f16, d=DType.f16, accumulator=DType.f16, epilogue_compute=DType.f16),
    dict(instruction=S(16, 8, 8)),
    dict(alignment_a=2, alignment_b=4, alignment_c=1),
    dict(epilogue=Epilogue(activation=Activation.clamp, clamp_min=-1.5, clamp_max=2.0)),
    dict(epilogue=Epilogue(activation=Activation.silu)),
    dict(epilogue=Epilogue(activation=Activation.sigmoid)),
    dict(split_k=SplitK.serial, d=DType.f32, c=DType.f32),
    dict(batched=True),
    dict(arch=Arch.sm86, stages=4),
    dict(arch=Arch.sm89, stages=4),
    dict(tile=S(64, 128, 64), warp=S(64, 64, 32), stages=3),                # sliced-K (2 K-partitions)
    dict(a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, op_class=OpClass.simt, tile=S(128, 128, 8),
         warp=S(32, 64, 8), stages=4, layout_a=COL, layout_b=COL),
    dict(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64, epilogue_compute=DType.f64,
         op_class=OpClass.simt, tile=S(128, 128, 8), warp=S(32, 64, 8), stages=3),
    dict(arch=Arch.sm75, a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, op_class=OpClass.simt,
         tile=S(128, 128, 8), warp=S(32, 64, 8), stages=2),
    dict(arch=Arch.sm89, a=DType.e4m3, b=DType.e5m2, c=DType.bf16, d=DType.bf16, tile=S(128, 128, 64),
         warp=S(64, 64, 64), stages=3),
])
def test_accepted_corners(changes):
    ok(make(**changes))


# ------------------------------------------------------------------------------------------------
# template context and rendering
# ------------------------------------------------------------------------------------------------

def _render(level: str, inst: GemmInstance, name: str = "t", spec: str = "spec.yaml") -> str:
    return render_template(f"gemm/sm80/{level}.cu.j2", inst=inst, name=name, ctx=sm80.template_context(inst),
                           banner=banner(spec, "f" * 64))


def test_shim_refuses_run_time_scheduler_options():
    text = _render("device", ok(make()))
    assert "if (p->options != 0) return EMITTER_CANNOT_IMPLEMENT;" in text


def test_context_needs_resolved_instance():
    with pytest.raises(ValueError):
        sm80.template_context(make(stages=AUTO))


def test_context_is_cpp_from_enums():
    ctx = sm80.template_context(ok(make(layout_c=COL, layout_a=ROW, layout_b=ROW)))
    assert ctx["transposed"] is True
    # kernel A = user B^T (row-major B -> column-major), kernel B = user A^T
    assert ctx["layout_a"] == "cutlass::layout::ColumnMajor" and ctx["layout_b"] == "cutlass::layout::ColumnMajor"
    assert ctx["layout_c"] == "cutlass::layout::RowMajor"
    assert ctx["arch_tag"] == "cutlass::arch::Sm80" and ctx["gencode"] == "arch=compute_80,code=sm_80"
    assert sm80.template_context(ok(make(arch=Arch.sm86)))["gencode"] == "arch=compute_86,code=sm_86"


def test_every_level_renders_alone_and_in_order():
    inst = ok(make(epilogue=Epilogue(activation=Activation.relu), swizzle=8))
    whole = _render("instance", inst, name="gemm_x")
    positions = []
    for level in sm80.LEVELS:
        body = _render(level, inst, name="gemm_x").strip()
        assert body and body in whole
        positions.append(whole.index(body))
    assert positions == sorted(positions)
    head = whole[:600]
    assert "generated by emitter" in head and "do not edit" in head and "instance: gemm_x" in head
    for needle in ("using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;",
                   "using WarpShape = cutlass::gemm::GemmShape<64, 64, 32>;",
                   "using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 32>;",
                   "cutlass::epilogue::thread::LinearCombinationRelu<",
                   "GemmIdentityThreadblockSwizzle<8>",
                   "cutlass::gemm::kernel::GemmUniversal<ThreadblockMma, Epilogue, ThreadblockSwizzle>",
                   "extern \"C\" __global__ void __launch_bounds__(emitter_gemm_x::GemmKernel::kThreadCount)",
                   "emitter_gemm_x_kernel(typename emitter_gemm_x::GemmKernel::Params params)",
                   "int emitter_gemm_x_query(", "int emitter_gemm_x_initialize(", "const char* emitter_gemm_x_name(void)",
                   "#define EMITTER_ABI_VERSION 3"):
        assert needle in whole, needle


def test_spec_text_cannot_escape_the_banner_comment():
    inst = ok(make())
    evil = "x.yaml\n#include </etc/passwd>\r\nint evil; \\"
    text = _render("instance", inst, spec=evil)
    lines = text.splitlines()
    assert not any(line.startswith("#include </etc") or line.startswith("int evil") for line in lines)
    assert not any(line.startswith("//") and line.endswith("\\") for line in lines)


def test_name_must_be_a_c_identifier():
    inst = ok(make())
    with pytest.raises(Exception):
        _render("instance", inst, name="bad-name; int x")


def test_clamp_bounds_are_float_literals():
    inst = ok(make(epilogue=Epilogue(activation=Activation.clamp, clamp_min=-1.5, clamp_max=2.0)))
    text = _render("epilogue", inst)
    assert "kClampMin = -1.5f;" in text and "kClampMax = 2.0f;" in text
    assert "LinearCombinationGeneric<\n    cutlass::epilogue::thread::Clamp, ElementC" in text


def test_int8_output_saturates():
    inst = ok(make(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32,
                   tile=S(128, 128, 64), warp=S(64, 64, 64), stages=3))
    text = _render("epilogue", inst)
    assert "cutlass::epilogue::thread::LinearCombinationClamp<" in text
    assert "cutlass::arch::OpMultiplyAddSaturate" in _render("instruction", inst)


def test_sm75_renders_pipelined_mainloop():
    inst = ok(make(arch=Arch.sm75, stages=2, instruction=S(16, 8, 8)))
    text = _render("threadblock", inst)
    assert "MmaPipelined" in text and "PredicatedTileIterator<" in text and "MmaMultistage" not in text


# ------------------------------------------------------------------------------------------------
# nvcc: render, compile device cubin + host shim, call the shim (no GPU needed)
# ------------------------------------------------------------------------------------------------

COMPILE_CASES = {
    # name: instance
    "f16_tn_128x128x32_s4": make(tile=S(128, 128, 32), warp=S(64, 64, 32), stages=4, swizzle=8),
    "bf16_nn_256x128x64_s3_relu": make(a=DType.bf16, b=DType.bf16, c=DType.bf16, d=DType.bf16, layout_a=COL,
                                       layout_b=COL, tile=S(256, 128, 64), warp=S(64, 64, 64), stages=3,
                                       epilogue=Epilogue(activation=Activation.relu)),
    "tf32_f32io_128x128x16": make(a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, tile=S(128, 128, 16),
                                  warp=S(64, 64, 16), stages=4, layout_b=ROW),
    "s8_tn_s8out_clamp": make(a=DType.s8, b=DType.s8, c=DType.s8, d=DType.s8, accumulator=DType.s32,
                              epilogue_compute=DType.f32, tile=S(128, 128, 64), warp=S(64, 64, 64), stages=3),
    "f16_splitk_serial_colc_clamp": make(c=DType.f32, d=DType.f32, layout_c=COL, tile=S(128, 64, 32),
                                         warp=S(64, 32, 32), stages=3, split_k=SplitK.serial,
                                         epilogue=Epilogue(activation=Activation.clamp, clamp_min=-2.0,
                                                           clamp_max=2.0)),
    "f16_batched_nt_gelu": make(layout_a=COL, layout_b=ROW, tile=S(64, 64, 32), warp=S(32, 32, 32), stages=AUTO,
                                batched=True, epilogue=Epilogue(activation=Activation.gelu)),
    "f64_tensorop_nn_colc": make(a=DType.f64, b=DType.f64, c=DType.f64, d=DType.f64, accumulator=DType.f64,
                                 epilogue_compute=DType.f64, layout_a=COL, layout_b=COL, layout_c=COL,
                                 tile=S(64, 64, 16), warp=S(32, 32, 16), stages=4),
}
EXTRA_COMPILE_CASES = {   # EMITTER_NVCC_EXTRA=1: the other paths (SIMT, sm75 pipelined, sm86, sm89 fp8)
    "f32_simt_128x128x8": make(a=DType.f32, b=DType.f32, c=DType.f32, d=DType.f32, op_class=OpClass.simt,
                               tile=S(128, 128, 8), warp=S(32, 64, 8), stages=4, layout_a=COL, layout_b=COL),
    "sm75_f16_tn": make(arch=Arch.sm75, tile=S(128, 128, 32), warp=S(64, 64, 32), stages=2),
    "sm86_f16_silu": make(arch=Arch.sm86, stages=3, epilogue=Epilogue(activation=Activation.silu)),
    "sm89_e4m3_bf16out": make(arch=Arch.sm89, a=DType.e4m3, b=DType.e4m3, c=DType.bf16, d=DType.bf16,
                              tile=S(128, 128, 64), warp=S(64, 64, 64), stages=3),
}


def _cutlass_include() -> Path:
    env = os.environ.get("CUTLASS_PATH")
    if env:
        return Path(env)
    import cutlass_library
    return Path(cutlass_library.__file__).parent / "source"


def _nvcc(args: list[str], cwd: Path) -> None:
    from tests._helpers import nvcc_path

    cmd = [nvcc_path() or "nvcc", *args]
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/nvcc.lock", *cmd]     # one nvcc at a time on shared machines
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr[-6000:]}"
    assert "C7510" not in res.stderr


class _Problem(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("m", "n", "k", "batch_count", "split_k_slices", "options")] + \
               [(n, ctypes.c_void_p) for n in ("A", "B", "C", "D", "bias")] + \
               [(n, ctypes.c_longlong) for n in ("lda", "ldb", "ldc", "ldd", "bsA", "bsB", "bsC", "bsD")] + \
               [("alpha", ctypes.c_float), ("beta", ctypes.c_float)]


class _Launch(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_int * 3), ("block", ctypes.c_int * 3), ("cluster", ctypes.c_int * 3),
                ("shared_bytes", ctypes.c_int), ("params_bytes", ctypes.c_int), ("params_align", ctypes.c_int),
                ("workspace_bytes", ctypes.c_longlong)]


def _check_shim(lib_path: Path, name: str, inst: GemmInstance) -> None:
    lib = ctypes.CDLL(str(lib_path))
    query = getattr(lib, f"emitter_{name}_query")
    init = getattr(lib, f"emitter_{name}_initialize")
    get_name = getattr(lib, f"emitter_{name}_name")
    get_name.restype = ctypes.c_char_p
    assert get_name().decode() == name
    query.argtypes = [ctypes.POINTER(_Problem), ctypes.POINTER(_Launch)]
    init.argtypes = [ctypes.POINTER(_Problem), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                     ctypes.POINTER(_Launch)]
    m, n, k = 512, 256, 1024
    p = _Problem(m=m, n=n, k=k, batch_count=3 if inst.batched else 1,
                 split_k_slices=4 if inst.split_k is SplitK.serial else 1, alpha=1.0, beta=0.5)
    launch = _Launch()
    assert query(ctypes.byref(p), ctypes.byref(launch)) == 0
    # run-time scheduler options are 3.x only: any nonzero value is refused (swizzle 4 here)
    opt = _Problem.from_buffer_copy(p)
    opt.options = 3
    assert query(ctypes.byref(opt), ctypes.byref(launch)) == 1
    t = inst.tile
    tm, tn = (m, n) if inst.layout_c is ROW else (n, m)     # kernel frame
    tiles = -(-tm // t.m) * -(-tn // t.n)
    assert launch.grid[0] * launch.grid[1] >= tiles
    assert launch.block[0] == 32 * (t.m // inst.warp.m) * (t.n // inst.warp.n) * (t.k // inst.warp.k)
    assert list(launch.cluster) == [1, 1, 1]
    assert 0 < launch.shared_bytes <= sm80.SMEM_LIMIT[inst.arch]
    assert launch.shared_bytes >= sm80.mainloop_smem_bytes(inst, inst.stages) * 0.9
    assert 0 < launch.params_bytes <= 4096 and launch.params_align in (4, 8, 16)
    if inst.batched:
        assert launch.grid[2] == 3
    if inst.split_k is SplitK.serial:
        assert launch.grid[2] == 4 and launch.workspace_bytes == 4 * tiles
    else:
        assert launch.workspace_bytes == 0
    # misaligned K (row-major A) or M: cannot implement; a bias pointer: cannot implement
    q = _Problem.from_buffer_copy(p)
    q.k = k + 1
    assert query(ctypes.byref(q), ctypes.byref(launch)) in (0, 1)
    if inst.alignment_a > 1 and inst.layout_a is ROW:
        assert query(ctypes.byref(q), ctypes.byref(launch)) == 1
    q = _Problem.from_buffer_copy(p)
    q.bias = 0x1000
    assert query(ctypes.byref(q), ctypes.byref(launch)) == 1
    # initialize writes the Params bytes (no workspace needed without split-K)
    if inst.split_k is SplitK.none:
        r = _Problem.from_buffer_copy(p)
        r.A, r.B, r.C, r.D = 0x100000, 0x200000, 0x300000, 0x400000
        buf = ctypes.create_string_buffer(4096)
        assert init(ctypes.byref(r), None, None, buf, 8, ctypes.byref(launch)) == 3   # buffer too small
        assert init(ctypes.byref(r), None, None, buf, 4096, ctypes.byref(launch)) == 0
        assert buf.raw[:launch.params_bytes] != b"\0" * launch.params_bytes
    else:
        r = _Problem.from_buffer_copy(p)
        r.A, r.B, r.C, r.D = 0x100000, 0x200000, 0x300000, 0x400000
        buf = ctypes.create_string_buffer(4096)
        assert init(ctypes.byref(r), None, None, buf, 4096, ctypes.byref(launch)) == 2   # workspace missing


def _compile_case(tmp_path: Path, label: str, inst: GemmInstance) -> None:
    r = ok(inst)
    name = f"t_{label}"
    src = tmp_path / f"{name}.cu"
    src.write_text(render_template("gemm/sm80/instance.cu.j2", inst=r, name=name, ctx=sm80.template_context(r),
                                   banner=banner("tests/gemm/test_sm80.py", "0" * 64)))
    inc = _cutlass_include()
    common = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", f"-gencode={sm80.gencode(r)}",
              f"-I{inc / 'include'}", f"-I{inc / 'tools' / 'util' / 'include'}"]
    _nvcc([*common, "-DEMITTER_DEVICE", "-cubin", "-o", f"{name}.cubin", src.name], tmp_path)
    assert (tmp_path / f"{name}.cubin").stat().st_size > 1000
    _nvcc([*common, "--shared", "-Xcompiler", "-fPIC", "-o", f"lib{name}.so", src.name], tmp_path)
    _check_shim(tmp_path / f"lib{name}.so", name, r)


@pytest.mark.nvcc
@pytest.mark.parametrize("label", list(COMPILE_CASES))
def test_compiles_with_nvcc(tmp_path, label):
    _compile_case(tmp_path, label, COMPILE_CASES[label])


@pytest.mark.nvcc
@pytest.mark.skipif(os.environ.get("EMITTER_NVCC_EXTRA") != "1", reason="set EMITTER_NVCC_EXTRA=1 for more compiles")
@pytest.mark.parametrize("label", list(EXTRA_COMPILE_CASES))
def test_compiles_with_nvcc_extra(tmp_path, label):
    _compile_case(tmp_path, label, EXTRA_COMPILE_CASES[label])
