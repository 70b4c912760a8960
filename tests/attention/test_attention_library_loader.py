"""The exported library's Python attention() (templates/attention/library/loader.py.j2) against a fake C library
(gcc, from the exported header; it records every attention problem it is passed) and the torch-like stand-ins of
tests/gemm/test_loader.py: every operand set ends in OperandError or in one call whose pointers and strides are the
tensors' own and whose every addressed element lies inside each tensor's buffer, with the output's elements
disjoint and clear of the inputs (hypothesis), plus explicit bad sets naming what is wrong, exact good sets,
the cached fast path. No GPU, no torch."""

from __future__ import annotations

import ctypes
import itertools
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import fake_devices, load_module  # noqa: E402
from test_attention_library import ATTENTION_SPEC, GEMM_SPEC  # noqa: E402
from test_loader import _FAKE_C, CC, DT, CaiArray, FakeTensor, contiguous  # noqa: E402

LIB = "fakelib"

_FAKE_ATTENTION_C = r"""
#include <string.h>
#include <stdint.h>
#include "fakelib/fakelib.h"
static fakelib_attention_problem alast;
static int acalls = 0, astatus = 0;
static void* astream = 0;
static void arecord(const fakelib_attention_problem* p) { memcpy(&alast, p, sizeof(alast)); ++acalls; }
void fakelib_attention_problem_init(fakelib_attention_problem* p) { memset(p, 0, sizeof(*p)); p->struct_size = sizeof(*p); }
fakelib_status fakelib_attention_can_implement(const fakelib_attention_problem* p) { arecord(p); return astatus; }
fakelib_status fakelib_attention_workspace_size(const fakelib_attention_problem* p, size_t* b) { arecord(p); *b = 0; return astatus; }
fakelib_status fakelib_attention_select(const fakelib_attention_problem* p, fakelib_attention_selection* s) {
  arecord(p); memset(s, 0, sizeof(*s)); s->struct_size = sizeof(*s); s->kernel = 3; s->name = "fake_attention"; return astatus;
}
fakelib_status fakelib_attention(const fakelib_attention_problem* p, void* ws, size_t wsb, fakelib_stream_t stream) {
  (void)ws; (void)wsb; arecord(p); astream = (void*)stream; return astatus;
}
int fakelib_attention_kernel_count(void) { return 1; }
const char* fakelib_attention_kernel_name(int i) { return i == 0 ? "fake_attention" : 0; }
int fake_acalls(void) { return acalls; }
void fake_alast(fakelib_attention_problem* out) { memcpy(out, &alast, sizeof(alast)); }
void* fake_astream(void) { return astream; }
void fake_aset_status(int s) { astatus = s; }
"""


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    if CC is None:
        pytest.skip("needs a C compiler")
    from emitter.emit import emit
    from emitter.library.export import export_library

    d = tmp_path_factory.mktemp("attloader")
    (d / "spec.yaml").write_text(GEMM_SPEC + ATTENTION_SPEC)
    emit([d / "spec.yaml"], d / "gen", jobs=1)
    out = d / "lib"
    export_library([d / "gen"], LIB, out)
    (d / "fake.c").write_text(_FAKE_C)
    (d / "fake_att.c").write_text(_FAKE_ATTENTION_C)
    so = d / "libfakelib.so"
    subprocess.run([CC, "-std=c99", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{out / 'include'}", str(d / "fake.c"),
                    str(d / "fake_att.c"), "-o", str(so)], check=True)
    m = load_module("fakelib_att_loader", out / "python" / f"{LIB}.py")
    c = m.load(str(so))
    c.fake_acalls.restype = ctypes.c_int
    c.fake_alast.argtypes = [ctypes.POINTER(m.AttentionProblem)]
    c.fake_astream.restype = ctypes.c_void_p
    device = fake_devices(m, FakeTensor)
    m.torch_module = types.SimpleNamespace(cuda=types.SimpleNamespace(device=device), device=lambda kind, index: index)
    m.torch_dtypes.update({"f16": DT["float16"], "bf16": DT["bfloat16"], "f32": DT["float32"],
                             "s32": DT["int32"], "e4m3": DT["float8_e4m3fn"]})
    m.empty_tensor = lambda shape, dtype, dev: FakeTensor(shape, dtype, device=dev)
    m._fake = c
    return m


def acalls(m) -> int:
    return m._fake.fake_acalls()


def alast(m) -> dict:
    p = m.AttentionProblem()
    m._fake.fake_alast(ctypes.byref(p))
    return {f: getattr(p, f) for f, _ in m.AttentionProblem._fields_}


def T(shape, dtype="float16", strides=None, device=0, storage=None, offset=0):
    return FakeTensor(shape, dtype, strides, device=device, storage=storage, offset=offset)


def bhsd(b, s, h, d, dtype="float16"):
    """A BSHD view of a contiguous (B, H, S, D) tensor (what x.transpose(1, 2) gives)."""
    return T((b, s, h, d), dtype, strides=(h * s * d, d, s * d, 1))


class Cu(FakeTensor):
    def __init__(self, values, device=0, dtype="int32"):
        super().__init__((len(values),), dtype, device=device)
        self.values = list(values)

    def tolist(self):
        return list(self.values)


# ---- what the kernel may touch --------------------------------------------------------------------------

def check_call(m, q, k, v, out, lse_t, kw) -> None:
    """The recorded problem describes exactly these tensors, and every element the kernel addresses from it lies
    inside each tensor's own buffer; out's elements are disjoint and clear of the inputs."""
    p = alast(m)
    varlen = kw.get("cu_seqlens_q") is not None
    assert p["struct_size"] == ctypes.sizeof(m.AttentionProblem) and p["flags"] == 0
    assert p["q"] == q.data_ptr() and p["k"] == k.data_ptr() and p["v"] == v.data_ptr()
    assert p["o"] == out.data_ptr()
    assert p["lse"] == (lse_t.data_ptr() if lse_t is not None else None) or (lse_t is None and not p["lse"])
    assert p["mask"] == (0 if not kw.get("causal") else 1 if kw.get("causal_align", "top_left") == "top_left" else 2)
    scale = kw.get("scale")
    assert p["scale"] == (0.0 if scale is None else pytest.approx(float(scale), rel=1e-6))
    if varlen:
        batch = kw["cu_seqlens_q"].shape[0] - 1
        rows_q, rows_k = q.shape[0], k.shape[0]
        assert (p["total_q"], p["total_k"], p["seq_q"], p["seq_k"]) == (rows_q, rows_k, kw["max_seqlen_q"],
                                                                        kw["max_seqlen_k"])
        assert p["cu_seqlens_q"] == kw["cu_seqlens_q"].data_ptr() and p["cu_seqlens_k"] == kw["cu_seqlens_k"].data_ptr()
    else:
        batch, rows_q, rows_k = q.shape[0], q.shape[1], k.shape[1]
        assert (p["seq_q"], p["seq_k"], p["total_q"], p["total_k"]) == (rows_q, rows_k, 0, 0)
    hq, hkv = q.shape[-2], k.shape[-2]
    assert (p["batch"], p["heads_q"], p["heads_kv"], p["head_dim"], p["head_dim_v"]) == (
        batch, hq, hkv, q.shape[-1], v.shape[-1])
    assert hq % hkv == 0 and k.shape[-1] == q.shape[-1]
    spans = {}
    for name, t, rows, heads, dim in (("q", q, rows_q, hq, q.shape[-1]), ("k", k, rows_k, hkv, k.shape[-1]),
                                      ("v", v, rows_k, hkv, v.shape[-1]), ("o", out, rows_q, hq, v.shape[-1])):
        sb, ss, sh = (p[f"{name}_stride_{x}"] for x in ("batch", "seq", "head"))
        st_ = t.stride()
        nb = 1 if varlen else batch
        dims = ([] if varlen else [(nb, sb, st_[0])]) + [(rows, ss, st_[-3]), (heads, sh, st_[-2])]
        for n, got, want in dims:
            if n > 1:
                assert got == want != 0, (name, dims)     # exactly the tensor's stride (0 would mean "packed")
        if varlen:
            assert sb == 0
        assert t.shape[-1] == dim and (dim == 1 or st_[-1] == 1)
        item = t.dtype.bits // 8
        last = (nb - 1) * sb + (rows - 1) * ss + (heads - 1) * sh + (dim - 1)
        lo, hi = t.data_ptr(), t.data_ptr() + (last + 1) * item
        assert t.base <= lo and hi <= t.base + t.nbytes, (name, hex(lo), hex(hi), hex(t.base), t.nbytes)
        spans[name] = (lo, hi)
        if name == "o":   # disjoint elements (small sizes: brute force)
            if nb * rows * heads * dim <= 20000:
                seen = {b * sb + s * ss + h * sh + e for b in range(nb) for s in range(rows) for h in range(heads)
                        for e in range(dim)}
                assert len(seen) == nb * rows * heads * dim
    for name in ("q", "k", "v"):
        assert spans["o"][1] <= spans[name][0] or spans[name][1] <= spans["o"][0], name
    if lse_t is not None:
        shape = (hq, rows_q) if varlen else (batch, hq, rows_q)
        assert tuple(lse_t.shape) == shape and lse_t.dtype is DT["float32"]
        assert p["lse_stride_head"] == rows_q and p["lse_stride_batch"] == (0 if varlen else hq * rows_q)


# ---- explicit cases ---------------------------------------------------------------------------------------

B, S, SK, H, HKV, D = 2, 100, 130, 8, 2, 64


def good():
    return T((B, S, H, D)), T((B, SK, HKV, D)), T((B, SK, HKV, D))


def _bad_cases():
    q, k, v = good()
    cu = Cu([0, 30, 100])
    return [
        ("dtypes differ", lambda: ((q, k, T((B, SK, HKV, D), "bfloat16")), {}), "one dtype"),
        ("f32 inputs", lambda: ((T((B, S, H, D), "float32"), T((B, SK, HKV, D), "float32"),
                                 T((B, SK, HKV, D), "float32")), {}), "attention takes f16, bf16, e4m3"),
        ("head dims differ", lambda: ((q, T((B, SK, HKV, 32)), v), {}), "head dim is 64"),
        ("hkv does not divide hq", lambda: ((T((B, S, 6, D)), T((B, SK, 4, D)), T((B, SK, 4, D))), {}), "does not divide"),
        ("k and v lengths", lambda: ((q, k, T((B, SK + 1, HKV, D))), {}), "same sequence length"),
        ("batch differs", lambda: ((q, T((3, SK, HKV, D)), T((3, SK, HKV, D))), {}), "one batch size"),
        ("3-D without cu_seqlens", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))), {}), "has 3 dimensions"),
        ("two devices", lambda: ((q, T((B, SK, HKV, D), device=1), v), {}), "on one GPU"),
        ("CPU tensor", lambda: ((T((B, S, H, D), device=-1), k, v), {}), "CPU tensor"),
        ("head dim not contiguous", lambda: ((T((B, S, H, D), strides=(S * H * D * 2, H * D * 2, D * 2, 2)), k, v), {}),
         "head dim must be contiguous"),
        ("broadcast KV heads", lambda: ((q, T((B, SK, HKV, D), strides=(SK * D, D, 0, 1)), v), {}), "stride of 0"),
        ("2^31 sequence", lambda: ((T((1, 2 ** 31, 1, 8)), T((1, 8, 1, 8)), T((1, 8, 1, 8))), {}), "does not fit"),
        ("out overlapping itself", lambda: ((q, k, v), {"out": T((B, S, H, D), strides=(S * D, D, D, 1))}),
         "elements overlap"),
        ("out aliasing q", lambda: ((q, k, v), {"out": q}), "must not alias"),
        ("out shape", lambda: ((q, k, v), {"out": T((B, S, H, 32))}), "must have shape"),
        ("out dtype", lambda: ((q, k, v), {"out": T((B, S, H, D), "bfloat16")}), "q's dtype"),
        ("scale negative", lambda: ((q, k, v), {"scale": -1.0}), "finite and > 0"),
        ("scale nan", lambda: ((q, k, v), {"scale": float("nan")}), "finite and > 0"),
        ("scale beyond float", lambda: ((q, k, v), {"scale": 1e300}), "fits a float"),
        ("scale a list", lambda: ((q, k, v), {"scale": [0.5]}), "fits a float"),
        ("causal not a bool", lambda: ((q, k, v), {"causal": 1}), "causal must be True or False"),
        ("causal_align", lambda: ((q, k, v), {"causal": True, "causal_align": "center"}), "causal_align"),
        ("lse not a bool", lambda: ((q, k, v), {"lse": "yes"}), "lse must be True or False"),
        ("one cu_seqlens", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))), {"cu_seqlens_q": cu}), "both"),
        ("cu_seqlens int64", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                      {"cu_seqlens_q": Cu([0, 30, 100], dtype="int64"), "cu_seqlens_k": Cu([0, 60, 130]),
                                       "max_seqlen_q": 70, "max_seqlen_k": 70}), "int32"),
        ("cu_seqlens lengths", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                        {"cu_seqlens_q": cu, "cu_seqlens_k": Cu([0, 130]), "max_seqlen_q": 70,
                                         "max_seqlen_k": 130}), "one per sequence"),
        ("cu_seqlens device", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                       {"cu_seqlens_q": cu, "cu_seqlens_k": Cu([0, 60, 130], device=1),
                                        "max_seqlen_q": 70, "max_seqlen_k": 70}), "on one GPU"),
        ("max_seqlen missing", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                        {"cu_seqlens_q": cu, "cu_seqlens_k": Cu([0, 60, 130])}), "max_seqlen_q must be"),
        ("max_seqlen past the rows", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                              {"cu_seqlens_q": cu, "cu_seqlens_k": Cu([0, 60, 130]), "max_seqlen_q": 101,
                                               "max_seqlen_k": 70}), "[1, 100]"),
        ("checked offsets decrease", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                              {"cu_seqlens_q": Cu([0, 50, 40]), "cu_seqlens_k": Cu([0, 60, 130]),
                                               "max_seqlen_q": 70, "max_seqlen_k": 70, "check_cu_seqlens": True}),
         "never decrease"),
        ("checked sequence too long", lambda: ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
                                               {"cu_seqlens_q": cu, "cu_seqlens_k": Cu([0, 60, 130]),
                                                "max_seqlen_q": 60, "max_seqlen_k": 70, "check_cu_seqlens": True}),
         "longer than max_seqlen"),
        ("max_seqlen without varlen", lambda: ((q, k, v), {"max_seqlen_q": 10}), "for variable lengths"),
        ("seq_k 0", lambda: ((q, T((B, 0, HKV, D)), T((B, 0, HKV, D))), {}), "no key"),
        ("kernel name", lambda: ((q, k, v), {"kernel": ""}), "kernel must be"),
        ("not an array", lambda: (([[1.0]], k, v), {}), "must be a torch tensor"),
        ("CAI without out", lambda: ((CaiArray((B, S, H, D)), CaiArray((B, SK, HKV, D)), CaiArray((B, SK, HKV, D))), {}),
         "pass out="),
    ]


@pytest.mark.parametrize("label,make,message", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_operand_sets_are_refused(mod, label, make, message):
    args, kw = make()
    before = acalls(mod)
    with pytest.raises(mod.OperandError) as e:
        mod.attention(*args, **kw)
    assert message in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{LIB}.attention: invalid argument: ")
    assert isinstance(e.value, ValueError) and e.value.status == 2
    assert acalls(mod) == before


def test_good_operand_sets_reach_the_library_exactly(mod):
    cases = [
        (good(), {}),
        (good(), {"causal": True, "causal_align": "bottom_right", "scale": 0.125, "lse": True}),
        ((bhsd(B, S, H, D), bhsd(B, SK, HKV, D), bhsd(B, SK, HKV, D)), {"causal": True}),        # BHSD views
        ((T((B, S, H, D), strides=(S * (H * D + 8), H * D + 8, D, 1)), T((B, SK, 1, D)), T((B, SK, 1, 32))),
         {"lse": True}),                                                                    # padded rows, MQA, dv 32
        ((T((S, H, D)), T((SK, HKV, D)), T((SK, HKV, D))),
         {"cu_seqlens_q": Cu([0, 30, 100]), "cu_seqlens_k": Cu([0, 60, 130]), "max_seqlen_q": 70, "max_seqlen_k": 70,
          "lse": True, "check_cu_seqlens": True}),
        ((T((1, 1, 1, D)), T((1, 1, 1, D)), T((1, 1, 1, D))), {}),
    ]
    for (q, k, v), kw in cases:
        before = acalls(mod)
        r = mod.attention(q, k, v, **kw)
        out, lse_t = r if kw.get("lse") else (r, None)
        assert acalls(mod) == before + 1
        check_call(mod, q, k, v, out, lse_t, kw)
        assert mod._fake.fake_astream() == 0x5000
    # given out: written in place, returned
    q, k, v = good()
    o = T((B, S, H, D))
    assert mod.attention(q, k, v, out=o) is o
    check_call(mod, q, k, v, o, None, {})
    # nothing to compute: no call
    before = acalls(mod)
    r = mod.attention(T((0, S, H, D)), T((0, SK, HKV, D)), T((0, SK, HKV, D)))
    assert acalls(mod) == before and r.shape == (0, S, H, D)


def test_fast_path_packs_the_same_problem(mod):
    q, k, v = good()
    mod._ATTN_PLANS.clear()
    mod.attention(q, k, v, causal=True, lse=True)
    first = alast(mod)
    assert len(mod._ATTN_PLANS) == 1
    q2, k2, v2 = good()
    o2, l2 = mod.attention(q2, k2, v2, causal=True, lse=True)
    second = alast(mod)
    check_call(mod, q2, k2, v2, o2, l2, {"causal": True, "lse": True})
    for f in first:
        if f not in ("q", "k", "v", "o", "lse"):
            assert first[f] == second[f], f


def test_select_and_kernels(mod):
    q, k, v = good()
    assert mod.attention_select(q, k, v, causal=True) == {"kernel": "fake_attention", "index": 3, "tried": 0,
                                                          "forced": False, "workspace_bytes": 0}
    assert mod.attention_kernels() == ["fake_attention"]
    with pytest.raises(mod.OperandError, match="attention_select"):
        mod.attention_select(q, k, v, bogus=1)


def test_library_errors_raise_error(mod):
    q, k, v = good()
    mod._fake.fake_aset_status(1)
    try:
        with pytest.raises(mod.Error) as e:
            mod.attention(q, k, v)
        assert e.value.status == 1 and not isinstance(e.value, mod.OperandError)
    finally:
        mod._fake.fake_aset_status(0)


# ---- property test -------------------------------------------------------------------------------------------

_STATS = {"called": 0, "refused": 0}


@st.composite
def tensor(draw, shape, dtype):
    """A tensor of `shape` with one of: packed BSHD, a BHSD view, padded rows, an offset view into a larger
    buffer, or (rarely) a broken layout: broadcast, non-contiguous head dim, rows overlapping."""
    kind = draw(st.sampled_from(["packed"] * 12 + ["bhsd"] * 3 + ["padded"] * 3 + ["offset"] * 3
                                + ["broadcast", "strided_dim", "overlap"]))
    shape = tuple(shape)
    if kind == "bhsd" and len(shape) == 4:
        b, s, h, d = shape
        return T(shape, dtype, strides=(h * s * d, d, s * d, 1))
    if kind == "padded":
        pad = draw(st.integers(1, 16))
        strides = list(contiguous(shape))
        row = shape[-2] * shape[-1] + pad
        strides[-3] = row
        if len(shape) == 4:
            strides[0] = row * shape[1]
        return T(shape, dtype, strides=tuple(strides))
    if kind == "offset":
        off = draw(st.integers(1, 64))
        n = math.prod(shape)
        item = DT[dtype].bits // 8
        from test_loader import _alloc
        return T(shape, dtype, offset=off, storage=(_alloc(0), (n + off) * item))
    if kind == "broadcast":
        strides = list(contiguous(shape))
        strides[draw(st.integers(0, len(shape) - 2))] = 0
        return T(shape, dtype, strides=tuple(strides))
    if kind == "strided_dim":
        strides = tuple(2 * s for s in contiguous(shape))
        return T(shape, dtype, strides=strides)
    if kind == "overlap":
        strides = list(contiguous(shape))
        strides[-2] = max(1, shape[-1] // 2)
        return T(shape, dtype, strides=tuple(strides))
    return T(shape, dtype)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_operands_are_refused_or_stay_inside_their_buffers(mod, data):
    draw = data.draw
    varlen = draw(st.booleans()) and draw(st.booleans())
    b = draw(st.sampled_from([1, 2, 3]))
    sq, sk = draw(st.sampled_from([1, 5, 17, 64])), draw(st.sampled_from([0, 1, 7, 64]))
    hkv = draw(st.sampled_from([1, 2, 3]))
    hq = hkv * draw(st.sampled_from([1, 2, 4])) + (1 if draw(st.integers(0, 19)) == 0 else 0)
    d = draw(st.sampled_from([8, 16, 64]))
    dv = d if draw(st.integers(0, 4)) else draw(st.sampled_from([8, 32]))
    dk = d if draw(st.integers(0, 19)) else d + 8
    dt = draw(st.sampled_from(["float16"] * 12 + ["bfloat16"] * 4 + ["float32"]))
    dt_k = dt if draw(st.integers(0, 19)) else "bfloat16"
    kw = {}
    if varlen:
        lq = [draw(st.integers(0, 9)) for _ in range(b)]
        lk = [draw(st.integers(1, 9)) for _ in range(b)]
        cq, ck = [0, *itertools.accumulate(lq)], [0, *itertools.accumulate(lk)]
        qs, ks, vs, os_ = (sum(lq), hq, d), (sum(lk), hkv, dk), (sum(lk), hkv, dv), (sum(lq), hq, dv)
        kw.update(cu_seqlens_q=Cu(cq, device=draw(st.sampled_from([0] * 9 + [1]))),
                  cu_seqlens_k=Cu(ck if draw(st.integers(0, 9)) else ck[:-1]),
                  max_seqlen_q=max(max(lq), 1) + draw(st.sampled_from([0, 0, 0, 1000])),
                  max_seqlen_k=max(lk), check_cu_seqlens=draw(st.booleans()))
    else:
        qs, ks, vs, os_ = (b, sq, hq, d), (b, sk, hkv, dk), (b, sk, hkv, dv), (b, sq, hq, dv)
    q = draw(tensor(qs, dt))
    k = draw(tensor(ks, dt_k))
    v = draw(tensor(vs, dt))
    if draw(st.integers(0, 19)) == 0:
        k = T(ks, dt_k, device=1)
    if draw(st.booleans()):
        kw["out"] = q if draw(st.integers(0, 19)) == 0 else draw(tensor(os_, dt if draw(st.integers(0, 9)) else "bfloat16"))
    kw["causal"] = draw(st.sampled_from([False] * 6 + [True] * 6 + [1]))
    kw["causal_align"] = draw(st.sampled_from(["top_left"] * 6 + ["bottom_right"] * 6 + ["middle"]))
    kw["scale"] = draw(st.sampled_from([None] * 8 + [0.5, 0.125] * 3 + [-1.0, float("nan"), 1e300]))
    kw["lse"] = draw(st.booleans())
    before = acalls(mod)
    try:
        r = mod.attention(q, k, v, **kw)
    except mod.OperandError:
        assert acalls(mod) == before
        _STATS["refused"] += 1
        return
    out, lse_t = r if kw["lse"] else (r, None)
    if acalls(mod) == before:     # nothing to compute (no query rows)
        assert (0 in qs[:1]) or (not varlen and sq == 0) or (varlen and qs[0] == 0)
        return
    assert acalls(mod) == before + 1
    _STATS["called"] += 1
    check_call(mod, q, k, v, out, lse_t, kw)


def test_the_property_test_reached_the_library_often():
    if _STATS["called"] + _STATS["refused"] == 0:
        pytest.skip("the property test did not run")
    print("attention property test:", _STATS)
    assert _STATS["called"] >= 30 and _STATS["refused"] >= 30, _STATS
