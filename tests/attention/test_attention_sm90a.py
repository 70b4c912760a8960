"""sm90a attention (emitter/families/attention/sm90a.py, templates/attention/sm90a/): resolve rules with their
reasons, the rendered levels (golden file), and one real nvcc build (`-m nvcc`) whose host shim is then
asked, without a GPU, which problems it takes and how much shared memory the kernel has.

After an intended template change: EMITTER_UPDATE_GOLDEN=1 pytest tests/attention/test_attention_sm90a.py, review the diff.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.dtypes import DType
from emitter.families.attention import sm90a
from emitter.families.attention.model import (AUTO, Arch, AttentionInstance, Layout, Mask, Rejection,
                                              Schedule)
from emitter.render import banner, render_template

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "attention" / "sm90a" / "instance.cu"
UPDATE = os.environ.get("EMITTER_UPDATE_GOLDEN") == "1"
ROOT = Path(__file__).resolve().parents[2]


def make(**kw) -> AttentionInstance:
    base = dict(arch=Arch.sm90a, dtype=DType.f16, head_dim=128, head_dim_v=128, tile_q=128, tile_kv=128,
                schedule=Schedule.cooperative)
    base.update(kw)
    if "head_dim" in kw and "head_dim_v" not in kw:
        base["head_dim_v"] = kw["head_dim"]
    return AttentionInstance(**base)


def rejected(inst) -> Rejection:
    r = sm90a.resolve(inst)
    assert isinstance(r, Rejection), f"expected a rejection, got {r}"
    return r


# ------------------------------------------------------------------------------------------------ resolve
def test_d256_kv128_five_stages_needs_393728_bytes():
    r = rejected(make(head_dim=256, tile_kv=128, stages=5))
    assert r.rule == "sm90a-shared-memory"
    assert "393,728 bytes" in r.reason and "232,448" in r.reason


def test_auto_stages_fit_and_match_upstream_default():
    assert sm90a.resolve(make()).stages == 5                            # d128 128x128: 197,120 bytes
    assert sm90a.smem_bytes(make(), 5).total == 197120                  # measured: the shim's shared_bytes
    d256 = sm90a.resolve(make(head_dim=256, tile_kv=128))
    assert d256.stages == 2 and sm90a.smem_bytes(d256, 2).total <= sm90a.SMEM_CAPACITY
    persistent = sm90a.resolve(make(head_dim=256, tile_kv=64, persistent=True))
    non_persistent = sm90a.resolve(make(head_dim=256, tile_kv=64))
    assert persistent.stages < non_persistent.stages                   # epilogue storage no longer overlaps


# sizeof(Kernel::SharedStorage) as the built shims report it (emitter_<name>_query's shared_bytes, nvcc 13.0)
MEASURED_SMEM = [
    (dict(head_dim=32, tile_kv=64, key_tail=False, layout=Layout.bhsd), 5, 29184),
    (dict(head_dim=64, schedule=Schedule.pingpong, persistent=True, mask=Mask.causal_bottom_right, gqa=True), 5, 116224),
    (dict(mask=Mask.causal_bottom_right, lse=True, gqa=True), 5, 197120),
    (dict(dtype=DType.bf16, head_dim=128, varlen=True, gqa=True, lse=True), 5, 197120),
    (dict(dtype=DType.bf16, head_dim=256, tile_kv=64, persistent=True, mask=Mask.causal_bottom_right), 4, 214528),
]


@pytest.mark.parametrize("changes,stages,measured", MEASURED_SMEM)
def test_shared_memory_model_matches_measured(changes, stages, measured):
    inst = sm90a.resolve(make(**changes))
    assert inst.stages == stages and sm90a.smem_bytes(inst, stages).total == measured


@pytest.mark.parametrize("changes,rule,words", [
    (dict(dtype=DType.e4m3), "sm90a-e4m3-v-layout", "transposed"),
    (dict(head_dim=96), "sm90a-head-dim", "96"),
    (dict(head_dim_v=64), "sm90a-head-dim-v", "head_dim_v 64"),
    (dict(varlen=True, schedule=Schedule.pingpong), "sm90a-varlen-persistent", "one-CTA-per-tile"),
    (dict(varlen=True, key_tail=False), "sm90a-varlen-key-tail", "key_tail: true"),
    (dict(varlen=True, layout=Layout.bhsd), "sm90a-varlen-layout", "[total, heads, dim]"),
    (dict(schedule=Schedule.tma), "sm90a-schedule-tma", "cooperative or pingpong"),
    (dict(schedule=Schedule.multistage), "sm90a-schedule", "multistage"),
    (dict(tile_q=64), "sm90a-tile-q", "tile_q 128"),
    (dict(tile_kv=96), "sm90a-tile-kv", "96"),
    (dict(head_dim=256, tile_kv=256), "sm90a-registers", "512"),
    (dict(stages=1), "sm90a-stages", "2 to"),
])
def test_rejections_name_rule_and_fix(changes, rule, words):
    r = rejected(make(**changes))
    assert r.rule == rule and words in r.reason, r.reason


def test_pingpong_is_persistent_and_auto_is_cooperative():
    assert sm90a.resolve(make(schedule=Schedule.pingpong)).persistent is True
    auto = sm90a.resolve(make(schedule=Schedule.auto))
    assert auto.schedule is Schedule.cooperative and auto.persistent is False


def test_resolve_is_idempotent():
    for inst in (make(), make(schedule=Schedule.pingpong, mask=Mask.causal_top_left, gqa=True),
                 make(head_dim=256, tile_kv=64, persistent=True, lse=True)):
        once = sm90a.resolve(inst)
        assert sm90a.resolve(once) == once


# ------------------------------------------------------------------------------------------------ render
GOLDEN_INSTANCE = dict(dtype=DType.bf16, head_dim=128, tile_kv=128, schedule=Schedule.pingpong,
                       mask=Mask.causal_bottom_right, key_tail=True, lse=True, gqa=True, layout=Layout.bhsd)


def _render(inst, name="golden_sm90a_attention"):
    r = sm90a.resolve(inst)
    return render_template("attention/sm90a/instance.cu.j2", inst=r, name=name,
                           ctx=sm90a.template_context(r), banner=banner("golden.yaml", "0" * 64))


def test_instance_matches_golden():
    text = _render(make(**GOLDEN_INSTANCE))
    if UPDATE:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.is_file(), "no golden file: EMITTER_UPDATE_GOLDEN=1 pytest tests/attention/test_attention_sm90a.py"
    assert text == GOLDEN.read_text(), "rendered sm90a attention instance differs from tests/golden (review, then update)"


def test_render_levels_and_features():
    text = _render(make(**GOLDEN_INSTANCE))
    for level in ("level 1: types", "level 2: fusion (mask)", "level 3: collective mainloop", "level 4: epilogue",
                  "level 5: tile scheduler and kernel", "level 6: device", "level 7: entry"):
        assert level in text
    assert '#include "../examples/88_hopper_fmha/collective/fmha_collective_tma_warpspecialized.hpp"' in text
    assert "kBottomRight = true" in text and "kKeyTail = true" in text
    assert "load_kv_maybe_q" in text                         # GQA head mapping
    assert "kLoadsQSeparately, cute::true_type" in text
    assert "__grid_constant__" in text and "alignof(emitter_golden_sm90a_attention::Params) <= 128" in text
    plain = _render(make(mask=Mask.none, key_tail=False, lse=False, gqa=False))
    assert "load_kv_maybe_q" not in plain and "kCausal = false" in plain and "kKeyTail = false" in plain
    assert "ptr_LSE = nullptr" in plain and "heads_kv != heads_q needs an instance with gqa: true" in plain


def test_render_varlen():
    text = _render(make(varlen=True, gqa=True, lse=True, mask=Mask.causal_bottom_right))
    assert "struct VarlenLoad" in text and "domain_offset(make_coord(pad" in text
    assert "predicated stores" in text and "desc_batch_q = p->total_q + 1" in text
    assert "kLoadsQSeparately, cute::true_type" in text
    plain = _render(make())
    assert "VarlenLoad" not in plain and "need an instance with varlen: true" in plain


def test_template_context_needs_resolved_instance():
    with pytest.raises(ValueError):
        sm90a.template_context(make(stages=AUTO))


# ------------------------------------------------------------------------------------------------ nvcc
NVCC_SPEC = """\
kernels:
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 128x128
    schedule: pingpong
    mask: causal_bottom_right
    lse: true
    gqa: true
"""


@pytest.mark.nvcc
def test_one_sm90a_instance_builds_and_its_shim_checks_problems(tmp_path):
    """emit + build through the real pipeline (-DNDEBUG; ptxas C7510 'wgmma serialized' fails the build),
    then the host shim's query, which needs no GPU: shared memory equals the model, refusals carry reasons."""
    spec = tmp_path / "att.yaml"
    spec.write_text(NVCC_SPEC)
    out = tmp_path / "out"
    env = dict(os.environ)
    emit = subprocess.run([sys.executable, "-m", "emitter", "emit", str(spec), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert emit.returncode == 0, emit.stdout + emit.stderr
    build = subprocess.run([sys.executable, "-m", "emitter", "build", str(out), "-j", "1", "--no-cache",
                            "--no-progress"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    [entry] = manifest["instances"]
    name = entry["name"]
    record = json.loads((out / "build" / name / "record.json").read_text())
    assert record["status"] == "ok" and not record.get("serialized_wgmma")
    assert "-DNDEBUG" in " ".join(record["commands"][0])

    from emitter.families.attention.abi import AttentionShim, EmitterAttentionProblem
    shim = AttentionShim(out / record["artifacts"]["host"], name)
    reason_fn = getattr(shim.lib, f"emitter_{name}_reason")
    reason_fn.restype = ctypes.c_char_p
    assert shim.kernel_name() == name

    def problem(**kw):
        p = EmitterAttentionProblem(batch=2, heads_q=8, heads_kv=2, seq_q=1024, seq_k=1000, head_dim=64,
                                    head_dim_v=64)
        for k, v in kw.items():
            setattr(p, k, v)
        return p

    status, launch = shim.query(problem())
    assert status == 0, reason_fn()
    # any length: odd query and key lengths, one row, rows without keys (seq_q > seq_k, bottom-right)
    for sq, sk in ((1001, 1000), (1, 1), (1, 4097), (7, 3), (4097, 1), (255, 257)):
        status, odd = shim.query(problem(seq_q=sq, seq_k=sk))
        assert status == 0 and odd.shared_bytes == launch.shared_bytes, (sq, sk, reason_fn())
    inst = AttentionInstance.from_config(entry["config"])
    assert launch.shared_bytes == sm90a.smem_bytes(inst, inst.stages).total
    assert launch.params_align == 128 and tuple(launch.block) == (384, 1, 1)
    for kw, status_want, words in [
        (dict(heads_kv=3), 2, b"divide"),
        (dict(seq_q=0), 2, b">= 1"),
        (dict(scale=-0.5), 1, b"scale"),
        (dict(head_dim=128, head_dim_v=128), 1, b"head_dim"),
        (dict(cu_seqlens_q=64, cu_seqlens_k=64), 1, b"variable sequence lengths"),
        (dict(stride_q=(ctypes.c_int64 * 3)(0, 100, 0)), 1, b"16 bytes"),
        (dict(seq_k=1 << 20, heads_kv=8, batch=64), 1, b"2^31"),
    ]:
        got, _ = shim.query(problem(**kw))
        assert got == status_want and words in reason_fn(), (kw, got, reason_fn())


# ------------------------------------------------------------------------------------------------ benchmark
def test_bench_cases_and_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location("attention_bench", ROOT / "benchmarks" / "attention_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class A:
        dtypes, head_dims, seqs = list(bench.DTYPES), list(bench.HEAD_DIMS), list(bench.SEQS)
    cases = bench.case_list(A)
    assert len(cases) == 36                                      # 2 dtypes x 3 head dims x 3 lengths x 2 masks
    assert all(c["batch"] * c["seq"] == 16384 and c["heads"] * c["head_dim"] == 2048 for c in cases)
    rows = [{"label": "a", "best": "k", "ms": {"k": 1.0, "cudnn": 1.2, "flash": 2.0, "efficient": 4.0},
             "tflops": {"k": 600.0, "cudnn": 500.0, "flash": 300.0, "efficient": 150.0}},
            {"label": "b", "best": "k", "ms": {"k": 2.0, "cudnn": 1.8, "flash": 4.0},
             "tflops": {"k": 300.0, "cudnn": 333.0, "flash": 150.0}}]
    md, summary = bench.table(rows, "test GPU")
    assert abs(summary["cudnn"] - (1.2 * 0.9) ** 0.5) < 1e-9 and abs(summary["flash"] - 2.0) < 1e-9
    assert summary["min_vs_cudnn"] == 0.9 and "| a | k | 600 | 500 | 300 | 150 | 1.20 | 2.00 | 4.00 |" in md
    assert "| b | k | 300 | 333 | 150 | — |" in md
