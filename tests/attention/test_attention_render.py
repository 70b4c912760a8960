"""Attention sm80 rendering (issue 27): levels against golden files (tests/golden/attention/sm80/<level>.cu;
after an intended template change: EMITTER_UPDATE_GOLDEN=1 pytest tests/attention/test_attention_render.py, review the
diff), the levels in order, only validated values reaching C++, the C ABI struct against its ctypes mirror,
and (marked nvcc) one real sm80 instance compiled through `emitter build` whose host shim is then queried on
the CPU, plus the shared-memory model re-measured against CUTLASS."""

import ctypes
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from emitter.emit import spec_entries
from emitter.families import attention as fam
from emitter.families.attention import abi, sm80
from emitter.families.attention.model import Arch, AttentionInstance
from emitter.dtypes import DType
from emitter.render import banner, render_template, templates_root
from emitter.spec.loader import parse_text

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "attention" / "sm80"
UPDATE = os.environ.get("EMITTER_UPDATE_GOLDEN") == "1"
SPEC = """\
family: attention
arch: sm80
dtype: f16
head_dim: 128
tile: 32x128
mask: causal_bottom_right
lse: true
gqa: true
varlen: true
"""


def resolved(text: str = SPEC) -> AttentionInstance:
    doc = parse_text(textwrap.dedent(text), "golden.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(fam.expand_entry(doc, path, entry, kp))
    inst = fam.resolve(cand)
    assert isinstance(inst, AttentionInstance), inst
    return inst


@pytest.mark.parametrize("level", sm80.LEVELS)
def test_level_matches_golden(level):
    inst = resolved()
    text = render_template(f"attention/sm80/{level}.cu.j2", inst=inst, name=fam.instance_name(inst),
                           ctx=sm80.template_context(inst), banner=banner("golden.yaml", "0" * 64))
    path = GOLDEN / f"{level}.cu"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: EMITTER_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{level} level differs from {path}"


def test_instance_has_every_level_in_order():
    inst = resolved()
    text = fam.render_instance(inst, fam.instance_name(inst), banner("golden.yaml", "0" * 64))
    pos = [text.index(f"level {i + 1}: {lvl} --") for i, lvl in enumerate(sm80.LEVELS)]
    assert pos == sorted(pos)
    assert '#include "../examples/41_fused_multi_head_attention/kernel_forward.h"' in text
    assert f'extern "C" __global__' in text and f"emitter_{fam.instance_name(inst)}_kernel" in text
    # upstream's Params are never used by value: a local copy is what attention_kernel mutates
    assert "AttentionParams p;" in text and "Attention::attention_kernel(p);" in text


def test_context_holds_only_ints_bools_and_known_spellings():
    for d, tile in ((64, (64, 64)), (96, (64, 128)), (256, (128, 128))):
        inst = fam.resolve(AttentionInstance(Arch.sm80, DType.bf16, d, d, *tile))
        ctx = sm80.template_context(inst)
        for k, v in ctx.items():
            assert isinstance(v, (int, bool)) or v in (
                "sm80", "cutlass::arch::Sm80", "cutlass::half_t", "cutlass::bfloat16_t", sm80.gencode(inst)), (k, v)
    assert sm80.template_context(fam.resolve(AttentionInstance(Arch.sm80, DType.f16, 96, 96, 64, 128)))["max_k"] == 128


def test_spec_path_cannot_reach_cpp():
    inst = resolved()
    evil = "x.yaml\n#error injected \\\n"
    text = fam.render_instance(inst, fam.instance_name(inst), banner(evil, "0" * 64))
    assert "\n#error injected" not in text


def test_abi_struct_matches_ctypes(tmp_path):
    """sizeof/offsetof of emitter_attention_problem from a C compiler equal the ctypes mirror's."""
    fields = [f for f, _ in abi.EmitterAttentionProblem._fields_]
    src = tmp_path / "abi.c"
    common = (templates_root() / "common" / "emitter_abi.h").read_text()
    att = (templates_root() / "attention" / "common" / "attention_abi.h").read_text()
    body = "".join(f'  printf("{f} %zu\\n", offsetof(emitter_attention_problem, {f}));\n' for f in fields)
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n" + common + "\n" + att +
                   "\nint main(void) {\n  printf(\"size %zu\\n\", sizeof(emitter_attention_problem));\n" + body + "}\n")
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=c11", "-o", str(exe), str(src)], check=True)
    out = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines())
    assert int(out["size"]) == ctypes.sizeof(abi.EmitterAttentionProblem)
    for f in fields:
        assert int(out[f]) == getattr(abi.EmitterAttentionProblem, f).offset, f


# ---------------------------------------------------------------------------------------------- nvcc
@pytest.mark.nvcc
def test_sm80_instance_compiles_and_its_shim_answers(tmp_path):
    """ONE real sm80 attention instance (varlen, GQA, causal bottom-right, LSE), built by `emitter build`
    (cubin/fatbin + host shim); the host shim's query runs here without a GPU."""
    from emitter.build import BuildOptions, build
    from emitter.emit import emit
    from emitter.families.attention import runtime
    from emitter.families.attention.problem import make_problem
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_INVALID_ARGUMENT, EMITTER_OK

    spec = tmp_path / "a.yaml"
    spec.write_text("kernels:\n  - " + "\n    ".join(SPEC.strip().splitlines()) + "\n")
    out = tmp_path / "out"
    emit([spec], out)
    entries = json.loads((out / "manifest.json").read_text())["instances"]
    assert len(entries) == 1
    summary = build(out, options=BuildOptions(jobs=1))
    (rec,) = summary.results
    assert rec.status in ("ok", "cached"), rec.error
    name = entries[0]["name"]
    record = json.loads((out / "build" / name / "record.json").read_text())
    assert record["resources"], "ptxas reported no resources"
    shim = abi.AttentionShim(out / record["artifacts"]["host"], name)
    cfg = runtime.config_from_entry(entries[0], out)

    p = make_problem(heads_q=16, heads_kv=4, seqlens_q=(100, 37, 5), seqlens_k=(120, 37, 0), head_dim=128)
    c = runtime.c_problem(cfg, p, {"lse": 256})
    status, launch = shim.query(c)
    assert status == EMITTER_OK
    assert list(launch.grid) == [(100 + 31) // 32, 16, 3] and list(launch.block) == [32, 4, 1]
    assert launch.shared_bytes == sm80.smem_bytes(cfg.instance) and launch.workspace_bytes == 0
    assert launch.params_align == 8

    def status_of(**kw):
        q = runtime.c_problem(cfg, p, {"lse": 256})
        for k, v in kw.items():
            if k.startswith("stride_"):
                getattr(q, k)[1] = v
            else:
                setattr(q, k, v)
        return shim.query(q)[0]

    assert status_of(head_dim=64) == EMITTER_CANNOT_IMPLEMENT          # compiled for d128
    assert status_of(heads_kv=3) == EMITTER_INVALID_ARGUMENT           # does not divide heads_q
    assert status_of(stride_q=16 * 128 + 4) == EMITTER_CANNOT_IMPLEMENT  # rows not 16-byte aligned
    assert status_of(flags=1) == EMITTER_CANNOT_IMPLEMENT
    assert status_of(cu_seqlens_q=None, cu_seqlens_k=None, total_q=0, total_k=0) == EMITTER_CANNOT_IMPLEMENT  # varlen only
    assert status_of(scale=float("nan")) == EMITTER_INVALID_ARGUMENT
    # initialize needs the tensors
    st, params, _ = shim.initialize(c, None, None, 4096)
    assert st == EMITTER_INVALID_ARGUMENT


@pytest.mark.nvcc
def test_shared_memory_model_matches_cutlass(tmp_path):
    """sizeof(AttentionKernel::SharedStorage) for every sm80 tile, single- and multi-pass, from the compiler
    (a host-only program: seconds, no kernel code generated) equals sm80.py's model."""
    from emitter.build.nvcc import find_nvcc
    from emitter.cutlass_path import find_cutlass

    headers = find_cutlass()
    cases = [(tq, tkv, d) for tq in sm80.TILE_Q for tkv in sm80.TILE_KV for d in (64, 256)]
    lines = "".join(f"  pr<{tq}, {tkv}, {d}>();\n" for tq, tkv, d in cases)
    src = tmp_path / "probe.cu"
    src.write_text('#include <cstdio>\n#include "cutlass/cutlass.h"\n'
                   '#include "../examples/41_fused_multi_head_attention/kernel_forward.h"\n'
                   "template <int Q, int K, int D> void pr() {\n"
                   "  using A = AttentionKernel<cutlass::half_t, cutlass::arch::Sm80, true, Q, K, D, false, false>;\n"
                   '  printf("%d %d %d %zu\\n", Q, K, D, sizeof(typename A::SharedStorage));\n}\n'
                   f"int main() {{\n{lines}}}\n")
    exe = tmp_path / "probe"
    inc = [*headers.include_flags(), *(f"-I{d}" for d in sm80.include_dirs())]
    subprocess.run([find_nvcc(), "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_80,code=sm_80",
                    *inc, "-o", str(exe), str(src)], check=True, capture_output=True, timeout=600)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        tq, tkv, d, size = map(int, line.split())
        got[(tq, tkv, d)] = size
    for tq, tkv, d in cases:
        inst = AttentionInstance(Arch.sm80, DType.f16, d, d, tq, tkv)
        assert got[(tq, tkv, d)] == sm80.smem_bytes(inst), (tq, tkv, d)
