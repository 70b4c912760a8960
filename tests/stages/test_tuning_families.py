"""One tuning path for every family: `emitter profile` (fake backend) on attention and conv manifests writes
tuning.json entries that `emitter library` reads; the exported attention and conv dispatch walk the tuned records
nearest-first, then their static order (checked on the generated C API, compiled with g++ against stand-in shims
and a stand-in CUDA runtime, and on the Python mirror of the attention rule); a tuning entry whose kernel is not
in the export is reported (a warning line naming the entry and the kernel, a count in the summary).
No nvcc, no GPU."""

from __future__ import annotations

import ctypes
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import test_attention_library as tal  # noqa: E402
import test_conv_library as tcl  # noqa: E402


def _cli(*args: str):
    from click.testing import CliRunner

    from emitter.cli import main

    return CliRunner().invoke(main, list(args))


def _table(entries: list[dict]) -> dict:
    return {"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {"name": "NVIDIA H100 80GB HBM3", "cc": "9.0"},
            "entries": entries}


# ---- attention -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def attn_gen(tmp_path_factory):
    from emitter.emit import emit

    d = tmp_path_factory.mktemp("tuneattn")
    (d / "spec.yaml").write_text(tal.SPEC)
    emit([d / "spec.yaml"], d / "gen", jobs=1)
    return d


def _akernels(d: Path):
    from emitter.families.attention.library import kernel_records
    from emitter.kit.library import DTYPES, LibraryError

    entries = [e for e in json.loads((d / "gen" / "manifest.json").read_text())["instances"]
               if e.get("family") == "attention" and e["config"].get("op") != "backward"]
    return kernel_records(entries, DTYPES, LibraryError)


def _attn_entry(kernel: str, b: int, hq: int, hkv: int, sq: int, sk: int, d: int = 128, mask: str = "none") -> dict:
    return {"op": {"family": "attention", "dtype": "f16", "head_dim": d, "head_dim_v": d, "mask": mask,
                   "layout": "bshd", "key": f"attn_f16_d{d}_full_bshd"},
            "problem": {"family": "attention", "batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk,
                        "head_dim": d, "head_dim_v": d, "causal": mask != "none"},
            "kernel": kernel, "split_k": 1, "options": 0}


def test_fake_profile_of_attention_feeds_the_exported_dispatch(attn_gen, tmp_path):
    from emitter.library.export import export_library

    res = _cli("profile", str(attn_gen / "gen"), "--backend", "fake", "-o", str(tmp_path / "p"), "--quick",
               "--no-plots", "--problem", "b=2,hq=8,hkv=2,sq=512,sk=512,d=128",
               "--problem", "b=1,hq=8,sq=64,sk=2048,d=128")
    assert res.exit_code == 0, res.output
    tuning = json.loads((tmp_path / "p" / "tuning.json").read_text())
    att = [e for e in tuning["entries"] if e["problem"].get("family") == "attention"]
    assert len(att) == 2, tuning["entries"]
    r = export_library([attn_gen / "gen"], tal.LIB, tmp_path / "lib", tuning=[tmp_path / "p" / "tuning.json"],
                       allow_unmeasured_tuning=True)
    assert r.family_tuned == {"attention": 2} and not r.dropped_tuning, (r.family_tuned, r.dropped_tuning)
    api = (tmp_path / "lib" / "src" / f"{tal.LIB}_api.cpp").read_text()
    rows = api[api.index("kAttentionTuning[] = {"):api.index("kAttentionTuningCount")]
    ks = {k.name: k.index for k in _akernels(attn_gen)}
    for e in att:
        p = e["problem"]
        row = f"{{{ks[e['kernel']]}, {p['batch']}, {p['heads_q']}, {p['heads_kv']}, {p['seq_q']}, {p['seq_k']}, 90}}"
        assert row in rows, (row, rows)
    # without the tuning table the export is what it was: no tuning records in the attention piece
    plain = export_library([attn_gen / "gen"], tal.LIB, tmp_path / "plain")
    text = (tmp_path / "plain" / "src" / f"{tal.LIB}_api.cpp").read_text()
    assert "kAttentionTuning" not in text and "No tuning table holds attention entries" in text
    assert plain.family_tuned == {"attention": 0}


def _build_attention_api(d: Path, out: Path, gemm_kernels, ks):
    """The attention C API of `out` over stand-in shims (tests/attention/test_attention_library.py's `api` fixture)."""
    fake = d / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "cuda_runtime_api.h").write_text(tal._FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in gemm_kernels)
    (fake / "fake_kernels.cpp").write_text(tal._FAKE_KERNELS.format(lib=tal.LIB, rows=rows))
    defs = "\n".join(
        f'extern "C" int {tal.LIB}_a_{k.name}_query(const emitter_attention_problem* p, emitter_launch* o) '
        f"{{ return query_({k.index}, p, o); }}\n"
        f'extern "C" int {tal.LIB}_a_{k.name}_run(const emitter_attention_problem* p, void* w, void* s, int* c) '
        f"{{ return run_({k.index}, p, w, s, c); }}" for k in ks)
    (fake / "fake_attention.cpp").write_text(tal._FAKE_ATTENTION % {"defs": defs})
    (fake / "main.cpp").write_text(tal._MAIN % {"lib": tal.LIB})
    exe = d / "api"
    tal._compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
                  str(out / f"src/{tal.LIB}_api.cpp"), str(out / f"src/{tal.LIB}_table.cpp"),
                  str(fake / "fake_kernels.cpp"), str(fake / "fake_attention.cpp"), str(fake / "main.cpp"),
                  "-o", str(exe)])

    def run(cases: list[dict]) -> list[int]:
        """The kernel index the library runs for each case (-1: none)."""
        lines = []
        for c in cases:
            v = [1, c.get("mask", 0), c["batch"], c["hq"], c["hkv"], c["sq"], c["sk"], 128, 128, 0, 0, *[0] * 14,
                 1 << 32, 2 << 32, 3 << 32, 4 << 32, 0, 0, c.get("refuse", 0)]
            lines.append(" ".join(map(str, v)) + " 0 -")
        res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        got = [int(line.split()[1]) for line in res.stdout.splitlines()]
        assert len(got) == len(cases)
        return got

    return ks, run


def test_attention_dispatch_takes_the_tuned_kernel_then_the_nearest_record(attn_gen, tmp_path):
    if tal.CXX is None:
        pytest.skip("needs a host C++ compiler")
    from emitter.families.attention.library import candidates, tuning_records
    from emitter.library.export import export_library

    ks = _akernels(attn_gen)
    plain = [k for k in ks if k.inst.head_dim == 128 and k.inst.mask.value == "none" and not k.inst.varlen
             and not k.inst.lse and k.arch == "sm80"]
    # two sm80 kernels the static order puts after the sm90a one on cc 9.0: tuned, each wins its region
    x, y = sorted(plain, key=lambda k: k.name)[:2]
    static = candidates(ks, cc=90, dtype=1, head_dim=128, head_dim_v=128, mask=0, varlen=False, heads_q=8, heads_kv=8,
                        seq_q=4096, seq_k=4096, lse=False, batch=2)
    assert static[0].arch == "sm90a" and x in static and y in static
    (tmp_path / "tuning.json").write_text(json.dumps(_table([
        _attn_entry(x.name, 2, 8, 8, 4096, 4096), _attn_entry(y.name, 2, 8, 8, 128, 128)])))
    r = export_library([attn_gen / "gen"], tal.LIB, tmp_path / "lib", tuning=[tmp_path / "tuning.json"])
    assert r.family_tuned == {"attention": 2} and not r.dropped_tuning
    ks, run = _build_attention_api(tmp_path, tmp_path / "lib", r.kernels, ks)
    got = run([dict(batch=2, hq=8, hkv=8, sq=4096, sk=4096),     # the tuned problem: its kernel
               dict(batch=2, hq=8, hkv=8, sq=128, sk=128),       # the other tuned problem: its kernel
               dict(batch=4, hq=8, hkv=8, sq=2048, sk=3000),     # untuned, nearer the long record
               dict(batch=1, hq=8, hkv=8, sq=100, sk=200),       # untuned, nearer the short record
               dict(batch=2, hq=8, hkv=8, sq=4096, sk=4096, refuse=1 << x.index)])   # its shim says no: next
    assert got[:4] == [x.index, y.index, x.index, y.index], got
    assert got[4] == y.index, got                 # the other tuned kernel before the static order
    # the C walk and the Python mirror agree on random problems (with refusals)
    recs, dropped = tuning_records(ks, [dict(e, source="t", position=i, gpu_cc=90) for i, e in enumerate(
        json.loads((tmp_path / "tuning.json").read_text())["entries"])])
    assert len(recs) == 2 and not dropped
    rnd = random.Random(37)
    cases = []
    for _ in range(300):
        hq = rnd.choice((4, 8))
        cases.append(dict(batch=rnd.randint(1, 8), hq=hq, hkv=rnd.choice((hq, hq // 2, 1)),
                          sq=rnd.choice((1, 100, 512, 4096, 9000)), sk=rnd.choice((64, 128, 130, 4096, 9000)),
                          refuse=rnd.choice((0, 0, rnd.randint(0, 1023)))))
    for c, want_run in zip(cases, run(cases)):
        order = candidates(ks, cc=90, dtype=1, head_dim=128, head_dim_v=128, mask=0, varlen=False, heads_q=c["hq"],
                           heads_kv=c["hkv"], seq_q=c["sq"], seq_k=c["sk"], lse=False, batch=c["batch"], tuning=recs)
        accepting = [k.index for k in order if not (c["refuse"] >> k.index) & 1]
        assert want_run == (accepting[0] if accepting else -1), (c, want_run, [k.index for k in order])


def test_attention_entries_that_do_not_fit_are_reported(attn_gen, tmp_path):
    from emitter.library.export import export_library

    ks = _akernels(attn_gen)
    nogqa = next(k for k in ks if not k.inst.gqa) if any(not k.inst.gqa for k in ks) else None
    d128 = next(k for k in ks if k.inst.head_dim == 128 and k.inst.mask.value == "none" and not k.inst.varlen)
    notail = next(k for k in ks if not k.inst.key_tail and not k.inst.varlen)
    entries = [_attn_entry(d128.name, 2, 8, 8, 512, 512, d=64),                 # head dims of another kernel
               dict(_attn_entry(d128.name, 2, 8, 8, 512, 512), split_k=4),      # attention has no run-time options
               _attn_entry(notail.name, 2, 8, 8, 512, 1000, d=notail.inst.head_dim,   # seq_k not a tile_kv multiple:
                           mask=notail.inst.mask.value),                               # it cannot run its own problem
               _attn_entry(d128.name, 2, 8, 8, 512, 512)]
    if nogqa is not None:
        entries.append(_attn_entry(nogqa.name, 2, 8, 2, 512, 512, d=nogqa.inst.head_dim, mask=nogqa.inst.mask.value))
    (tmp_path / "tuning.json").write_text(json.dumps(_table(entries)))
    r = export_library([attn_gen / "gen"], tal.LIB, tmp_path / "lib", tuning=[tmp_path / "tuning.json"])
    assert r.family_tuned == {"attention": 1}
    reasons = [d["reason"] for d in r.dropped_tuning]
    assert len(reasons) == len(entries) - 1 and not any(d["missing_kernel"] for d in r.dropped_tuning)
    assert "head dims 64/64" in reasons[0] and "no run-time options" in reasons[1]
    assert "at its own problem the dispatch would try" in reasons[2], reasons[2]


# ---- conv ------------------------------------------------------------------------------------------------------

def _conv_entry(kernel: str, op: str, n: int, hw: int, c: int, k: int, rs: int, pad: int, split_k: int = 1) -> dict:
    return {"op": {"family": "conv", "op": op, "dims": 2, "a": "f16", "c": "f16", "accumulator": "f32",
                   "activation": "identity", "bias": False, "layout": "nhwc", "key": f"conv2d_{op}_f16f16_accf32_nhwc"},
            "problem": {"family": "conv", "n": n, "d": 1, "h": hw, "w": hw, "c": c, "k": k, "t": 1, "r": rs, "s": rs,
                        "pad_front": [0, pad, pad], "pad_back": [0, pad, pad], "stride": [1, 1, 1],
                        "dilation": [1, 1, 1]},
            "kernel": kernel, "split_k": split_k, "options": 0}


@pytest.fixture(scope="module")
def conv_gen(tmp_path_factory):
    from emitter.emit import emit

    d = tmp_path_factory.mktemp("tuneconv")
    (d / "spec.yaml").write_text(tcl.SPEC)
    emit([d / "spec.yaml"], d / "gen", jobs=1)
    return d


def _conv_names(gen: Path) -> list[str]:
    return sorted(e["name"] for e in json.loads((gen / "manifest.json").read_text())["instances"]
                  if e.get("family") == "conv")


def test_fake_profile_of_conv_feeds_the_exported_table(conv_gen, tmp_path):
    from emitter.library.export import export_library

    res = _cli("profile", str(conv_gen / "gen"), "--backend", "fake", "-o", str(tmp_path / "p"), "--quick",
               "--no-plots", "--problem", "n=8,h=28,w=28,c=64,k=64,r=3,s=3,pad=1",
               "--problem", "n=4,h=14,w=14,c=128,k=256,r=1,s=1")
    assert res.exit_code == 0, res.output
    entries = [e for e in json.loads((tmp_path / "p" / "tuning.json").read_text())["entries"]
               if e["problem"].get("family") == "conv"]
    assert len(entries) >= 2 and {e["op"]["op"] for e in entries} <= {"fprop", "dgrad", "wgrad"}
    r = export_library([conv_gen / "gen"], tcl.LIB, tmp_path / "lib", tuning=[tmp_path / "p" / "tuning.json"],
                       allow_unmeasured_tuning=True)
    assert r.family_tuned == {"conv": len(entries)} and not r.dropped_tuning, r.dropped_tuning
    table = (tmp_path / "lib" / "src" / f"{tcl.LIB}_table.cpp").read_text()
    names = _conv_names(conv_gen / "gen")
    for e in entries:
        p = e["problem"]
        row = (f"{{{names.index(e['kernel'])}, {p['n']}, {p['h']}, {p['w']}, {p['c']}, {p['k']}, {p['r']}, {p['s']}, 1, "
               f"{p['h'] + 2 * p['pad_front'][1] - p['r'] + 1}, {p['w'] + 2 * p['pad_front'][2] - p['s'] + 1}, "
               f"{e['split_k']}}}")
        assert row in table, (row, table)


def test_conv_dispatch_takes_the_tuned_kernel_then_the_nearest_record(conv_gen, tmp_path):
    if tcl.CXX is None:
        pytest.skip("needs a host C++ compiler")
    from emitter.library.export import export_library

    names = _conv_names(conv_gen / "gen")
    sm80 = next(n for n in names if "fprop_sm80_f16" in n)         # the static priority puts sm90a first on cc 9.0
    (tmp_path / "tuning.json").write_text(json.dumps(_table([_conv_entry(sm80, "fprop", 2, 9, 16, 24, 3, 1)])))
    r = export_library([conv_gen / "gen"], tcl.LIB, tmp_path / "lib", tuning=[tmp_path / "tuning.json"])
    assert r.family_tuned == {"conv": 1} and not r.dropped_tuning
    so = tcl._build_so(tmp_path, tmp_path / "lib")
    m = tcl._loader(tmp_path / "lib", so, "tunedentries")
    sel = m.ConvSelection()
    sel.struct_size = ctypes.sizeof(sel)
    for shape, want_tuned in (((2, 9, 9, 16, 24, 3, 3), 1),         # the tuned problem
                              ((8, 30, 30, 64, 64, 3, 3), 1),       # untuned, 3x3 stride 1: the nearest record
                              ((2, 9, 9, 16, 24, 1, 1), 0)):        # 1x1: no record of its filter, static priority
        n, h, w, c, k, rr, s = shape
        p = tcl.problem(m, n=n, h=h, w=w, c=c, k=k, r=rr, s=s)
        if rr == 1:
            p.pad_front[1] = p.pad_front[2] = p.pad_back[1] = p.pad_back[2] = 0
        raw = ctypes.string_at(ctypes.addressof(p), ctypes.sizeof(p))
        assert m._lib.cvlib_conv_select(raw, ctypes.byref(sel)) == 0, m._lib.cvlib_last_error()
        name = m._lib.cvlib_conv_kernel_name(sel.kernel).decode()
        assert sel.tuned == want_tuned and (name == sm80) == bool(want_tuned), (shape, name, sel.tuned)


def test_conv_bench_table_and_profile_table_together(conv_gen, tmp_path):
    """conv.json (the bench's older format) stays readable beside tuning.json; the first winner of a shape is kept."""
    from emitter.library.export import export_library

    names = _conv_names(conv_gen / "gen")
    sm80 = next(n for n in names if "fprop_sm80_f16" in n)
    sm90 = next(n for n in names if "fprop_sm90a" in n)
    (tmp_path / "conv.json").write_text(json.dumps({"n": 2, "rows": [
        {"layer": "C16 9² K24 3x3", "op": "fprop", "dtype": "f16", "kernel": sm80, "check": "ok"}]}))
    (tmp_path / "tuning.json").write_text(json.dumps(_table([
        _conv_entry(sm90, "fprop", 2, 9, 16, 24, 3, 1),                 # the same shape: the bench row came first
        _conv_entry(sm90, "fprop", 32, 56, 64, 64, 3, 1)])))
    r = export_library([conv_gen / "gen"], tcl.LIB, tmp_path / "lib",
                       tuning=[tmp_path / "conv.json", tmp_path / "tuning.json"])
    assert r.family_tuned == {"conv": 2}
    assert [d["reason"] for d in r.dropped_tuning] == [
        "a second winner for fprop f16 (2, 9, 9, 16, 24, 3, 3, 1, 9, 9); the first one is kept"]


# ---- the missing-kernel report ------------------------------------------------------------------------------

def test_entries_naming_kernels_not_in_the_export_are_reported(conv_gen, tmp_path):
    names = _conv_names(conv_gen / "gen")
    gone = "conv2d_fprop_sm90a_f16_f16_accf32_nhwc_256x128x64_not_built"
    (tmp_path / "tuning.json").write_text(json.dumps(_table([
        _conv_entry(gone, "fprop", 32, 56, 64, 64, 3, 1),
        _conv_entry(next(n for n in names if "fprop_sm80_f16" in n), "fprop", 32, 28, 64, 64, 3, 1),
        _attn_entry("attn_sm90a_f16_d128_not_here", 2, 8, 8, 512, 512)])))
    res = _cli("library", str(conv_gen / "gen"), "--tuning", str(tmp_path / "tuning.json"), "--name", tcl.LIB,
               "-o", str(tmp_path / "lib"))
    assert res.exit_code == 0, res.output
    out = res.output
    assert (f"warning: tuning entry {tmp_path / 'tuning.json'}: entries[0] (n=32,d=1,h=56,w=56,c=64,k=64,t=1,r=3,s=3,"
            f"pad_front=0x1x1,pad_back=0x1x1,stride=1x1x1,dilation=1x1x1) names kernel {gone}, which is not in this "
            "export: not used") in out, out
    assert "entries[2]" in out and "names kernel attn_sm90a_f16_d128_not_here" in out
    assert "(1 tuned problems)" in out and "2 tuning entries name kernels not in the export" in out, out
    left = json.loads((tmp_path / "lib" / "manifest.json").read_text())["left_out"]["tuning_entries"]
    assert sorted(d["kernel"] for d in left) == sorted([gone, "attn_sm90a_f16_d128_not_here"])
