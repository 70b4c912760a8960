"""Tuned dispatch of the attention backward in the exported library, without a GPU: `emitter profile` (fake backend)
writes backward winners (op attnbwd_...) that `emitter library` turns into kBackwardTuning records; the exported
<lib>_attention_backward walks the tuned kernels nearest record first, then its static order (the C API compiled
with g++ against the stand-in CUDA runtime, an sm_90 device, and fake backward shims), the same order as the Python
mirror (backward_candidates) on random problems; entries it cannot use are reported with the reason, a kernel
not in the export as missing; forward and backward records never mix."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC  # noqa: E402
from library_helpers import _FAKE_CUDA, _FAKE_KERNELS, _compile  # noqa: E402
from test_attention_backward_library import _FAKE_BACKWARD, _MAIN, CXX, bnames  # noqa: E402
from test_attention_backward_sm90a_library import SPEC  # noqa: E402

LIB = "bwlib"     # _MAIN and _FAKE_BACKWARD are written for this library name
D64_CAUSAL = {"family": "attention", "op": "backward", "dtype": "f16", "head_dim": 64, "head_dim_v": 64,
              "mask": "causal_top_left", "layout": "bshd", "key": "attnbwd_f16_d64_causal_bshd"}


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    from emitter.emit import emit

    d = tmp_path_factory.mktemp("bwtune")
    (d / "spec.yaml").write_text(GEMM_SPEC + SPEC)
    emit([d / "spec.yaml"], d / "gen", jobs=1)
    return d


def _table(entries: list[dict], cc: str = "9.0") -> dict:
    return {"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {"name": "NVIDIA H100 80GB HBM3", "cc": cc},
            "entries": entries}


def _entry(kernel: str, b: int, hq: int, hkv: int, sq: int, sk: int, d: int = 64, **more) -> dict:
    return {"op": dict(D64_CAUSAL, head_dim=d, head_dim_v=d),
            "problem": {"family": "attention", "batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk,
                        "head_dim": d, "head_dim_v": d, "causal": True, "pass": "backward"},
            "kernel": kernel, "split_k": 1, "options": 0, **more}


def _bkernels(d: Path):
    from emitter.families.attention.backward_library import backward_records
    from emitter.kit.library import DTYPES, LibraryError

    entries = [e for e in json.loads((d / "gen" / "manifest.json").read_text())["instances"]
               if e.get("family") == "attention" and e["config"].get("op") == "backward"]
    return backward_records(entries, DTYPES, LibraryError)


def _export(gen: Path, out: Path, table: dict | None):
    from emitter.library.export import export_library

    tuning = []
    if table is not None:
        (out.parent / f"{out.name}.tuning.json").write_text(json.dumps(table))
        tuning = [out.parent / f"{out.name}.tuning.json"]
    return export_library([gen / "gen"], LIB, out, tuning=tuning)


def _api(d: Path, out: Path, r):
    """The backward C API of `out` over fake shims: run(cases) -> the kernel index each case runs (-1: none)."""
    fake = d / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib=LIB, rows=rows))
    names = bnames(out)
    defs = "\n".join(
        f'extern "C" int {LIB}_ab_{n}_query(const emitter_attention_backward_problem* p, emitter_launch* o) '
        f"{{ return bquery_({i}, p, o); }}\n"
        f'extern "C" int {LIB}_ab_{n}_run(const emitter_attention_backward_problem* p, void* w, void* s, int* c) '
        f"{{ return brun_({i}, p, w, s, c); }}" for i, n in enumerate(names))
    (fake / "fake_backward.cpp").write_text(_FAKE_BACKWARD % {"defs": defs})
    (fake / "main.cpp").write_text(_MAIN % {"lib": LIB})
    exe = d / "bapi"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / f"src/{LIB}_api.cpp"), str(out / f"src/{LIB}_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "fake_backward.cpp"), str(fake / "main.cpp"), "-o", str(exe)])

    def run(cases: list[dict]) -> list[int]:
        lines = []
        for c in cases:
            v = [1, 1, c["batch"], c["hq"], c["hkv"], c["sq"], c["sk"], 64, c.get("det", 0), 1, 0, c.get("refuse", 0),
                 7 << 36]
            lines.append(" ".join(map(str, v)) + " -")
        res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        got = [int(line.split()[1]) for line in res.stdout.splitlines()]
        assert len(got) == len(cases)
        return got

    return names, run


def test_fake_profile_backward_winners_become_backward_records(gen, tmp_path):
    """profile (fake) -> tuning.json -> export: the backward winner is a kBackwardTuning row of its problem, the
    forward winner a kAttentionTuning row; without the table neither table exists."""
    from click.testing import CliRunner

    from emitter.cli import main

    res = CliRunner().invoke(main, ["profile", str(gen / "gen"), "--backend", "fake", "-o", str(tmp_path / "p"),
                                    "--quick", "--no-plots", "--problem", "b=2,hq=8,hkv=2,sq=512,sk=512,d=64,causal"])
    assert res.exit_code == 0, res.output
    entries = json.loads((tmp_path / "p" / "tuning.json").read_text())["entries"]
    att = [e for e in entries if e["problem"].get("family") == "attention"]
    # the spec's backward ops: f16 and bf16 (one winner each), one f16 forward
    bwd = sorted((e for e in att if e["op"]["key"].startswith("attnbwd_")), key=lambda e: e["op"]["dtype"] != "f16")
    assert [e["op"]["dtype"] for e in bwd] == ["f16", "bf16"] and len(att) == 3, att
    from emitter.library.export import export_library

    r = export_library([gen / "gen"], LIB, tmp_path / "lib", tuning=[tmp_path / "p" / "tuning.json"],
                       allow_unmeasured_tuning=True)
    assert r.family_tuned.get("attention") == 3, r.family_tuned
    assert not r.dropped_tuning, r.dropped_tuning
    api = (tmp_path / "lib" / "src" / f"{LIB}_api.cpp").read_text()
    rows = api[api.index("kBackwardTuning[] = {"):api.index("kBackwardTuningCount")]
    ks = {k.name: k.index for k in _bkernels(gen)}
    p = bwd[0]["problem"]
    assert f"{{{ks[bwd[0]['kernel']]}, {p['batch']}, {p['heads_q']}, {p['heads_kv']}, {p['seq_q']}, {p['seq_k']}, 90}}" in rows
    assert "kAttentionTuning[] = {" in api
    plain = _export(gen, tmp_path / "plain", None)
    text = (tmp_path / "plain" / "src" / f"{LIB}_api.cpp").read_text()
    assert "kBackwardTuning" not in text and plain.family_tuned.get("attention", 0) == 0


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
def test_backward_dispatch_takes_the_tuned_kernel_then_the_nearest_record(gen, tmp_path):
    from emitter.families.attention.backward_library import backward_candidates, backward_tuning_records

    ks = _bkernels(gen)
    idx = {k.name: k.index for k in ks}
    s90_big = idx["attn_bwd_sm90a_f16_d64_128x128_causaltl_bshd_gqa_dqsplit"]
    s80 = idx["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa"]
    s80_det = idx["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa_det"]
    static = backward_candidates(ks, cc=90, dtype=1, head_dim=64, head_dim_v=64, mask=1, varlen=False, heads_q=8,
                                 heads_kv=8, seq_q=4096, seq_k=4096, batch=2)
    assert static[0].arch == "sm90a" and ks[s80] in static
    # the sm80 key-split kernel wins a long problem, the deterministic one a short one: both after sm90a statically
    table = _table([_entry(ks[s80].name, 2, 8, 8, 4096, 4096), _entry(ks[s80_det].name, 2, 8, 8, 128, 128)])
    r = _export(gen, tmp_path / "lib", table)
    assert not r.dropped_tuning, r.dropped_tuning
    names, run = _api(tmp_path, tmp_path / "lib", r)
    assert names == [k.name for k in ks]
    got = run([dict(batch=2, hq=8, hkv=8, sq=4096, sk=4096),          # the tuned problem: its kernel
               dict(batch=2, hq=8, hkv=8, sq=128, sk=128),            # the other record's problem: its kernel
               dict(batch=4, hq=8, hkv=8, sq=2048, sk=3000),          # untuned, nearer the long record
               dict(batch=1, hq=8, hkv=8, sq=100, sk=200),            # untuned, nearer the short record
               dict(batch=2, hq=8, hkv=8, sq=4096, sk=4096, refuse=1 << s80),   # its shim says no: the other record's
               dict(batch=2, hq=8, hkv=8, sq=4096, sk=4096, refuse=(1 << s80) | (1 << s80_det))])   # then static
    assert got == [s80, s80_det, s80, s80_det, s80_det, s90_big], got      # then the split-dQ sm90a kernel
    # the C walk and the Python mirror agree on random problems (with refusals and determinism asked for)
    entries = [dict(e, source="t", position=i, gpu_cc=90) for i, e in enumerate(table["entries"])]
    recs, dropped = backward_tuning_records(ks, entries)
    assert len(recs) == 2 and not dropped
    rnd = random.Random(41)
    cases = []
    for _ in range(300):
        hq = rnd.choice((4, 8))
        cases.append(dict(batch=rnd.randint(1, 8), hq=hq, hkv=rnd.choice((hq, hq // 2, 1)),
                          sq=rnd.choice((1, 100, 512, 4096, 9000)), sk=rnd.choice((64, 130, 4096, 9000)),
                          det=rnd.choice((0, 0, 1)), refuse=rnd.choice((0, 0, rnd.randint(0, 15)))))
    for c, want in zip(cases, run(cases)):
        order = backward_candidates(ks, cc=90, dtype=1, head_dim=64, head_dim_v=64, mask=1, varlen=False,
                                    heads_q=c["hq"], heads_kv=c["hkv"], seq_q=c["sq"], seq_k=c["sk"], batch=c["batch"],
                                    deterministic=bool(c["det"]), tuning=recs)
        accepting = [k.index for k in order if not (c["refuse"] >> k.index) & 1]
        assert want == (accepting[0] if accepting else -1), (c, want, [k.index for k in order])


def test_backward_entries_that_do_not_fit_are_reported(gen, tmp_path):
    ks = _bkernels(gen)
    by = {k.name: k for k in ks}
    s90 = by["attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd_gqa"]
    s80 = by["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa"]
    forward = "attn_sm80_f16_d64_64x64_multistage_s4_causaltl_bshd_lse_gqa"
    entries = [
        _entry("attn_bwd_sm80_f16_d64_32x32_causaltl_bshd_gqa", 2, 8, 8, 512, 512),     # not in this library
        _entry(forward, 2, 8, 8, 512, 512),                                          # a forward kernel
        _entry(s80.name, 2, 8, 8, 512, 512, d=128),                                  # head dims of another kernel
        _entry(s80.name, 2, 8, 8, 512, 512, split_k=2),                              # no run-time options
        _entry(s80.name, 2, 8, 8, 512, 512),                                         # kept
        _entry(by["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa_det"].name, 2, 8, 8, 512, 512),   # a second winner
    ]
    r = _export(gen, tmp_path / "lib", _table(entries))
    reasons = [(d["reason"], d["missing_kernel"]) for d in r.dropped_tuning]
    assert len(reasons) == len(entries) - 1, reasons
    assert "not in this library" in reasons[0][0] and reasons[0][1]
    assert "forward kernel" in reasons[1][0] and not reasons[1][1]
    assert "head dims 128/128" in reasons[2][0] or "head_dim=128" in reasons[2][0]
    assert "no run-time options" in reasons[3][0]
    assert "second winner" in reasons[4][0]
    assert r.family_tuned.get("attention") == 1
    # an sm90a record measured on an sm_80 GPU cannot run there: at its own problem the dispatch tries another
    r80 = _export(gen, tmp_path / "lib80", _table([_entry(s90.name, 2, 8, 8, 512, 512)], cc="8.0"))
    assert [d["reason"] for d in r80.dropped_tuning] == [
        "at its own problem the dispatch would try attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa first (its kernel "
        "does not compute this problem, or another record claims it)"]


def test_backward_entries_without_backward_kernels_are_missing(tmp_path):
    """A library of forward kernels only: backward entries are reported as missing kernels, forward entries used."""
    from emitter.emit import emit
    from emitter.library.export import export_library

    fwd_only = SPEC.split("  - family: attention\n    op: backward")[0]
    (tmp_path / "spec.yaml").write_text(GEMM_SPEC + fwd_only)
    emit([tmp_path / "spec.yaml"], tmp_path / "gen", jobs=1)
    (tmp_path / "t.json").write_text(json.dumps(_table([
        _entry("attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa", 2, 8, 8, 512, 512)])))
    r = export_library([tmp_path / "gen"], LIB, tmp_path / "lib", tuning=[tmp_path / "t.json"])
    assert [d["missing_kernel"] for d in r.dropped_tuning] == [True]
    assert "backward kernel not in this library" in r.dropped_tuning[0]["reason"]
