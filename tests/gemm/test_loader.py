"""The exported library's Python loader (python/<lib>.py) against a fake C library (a small C .so compiled
with gcc against the library's own header, which records every problem the loader passes) and duck-typed
tensors (torch-like stand-ins and __cuda_array_interface__ objects over fake address ranges): every operand set
either ends in the loader's OperandError or in a call whose pointers, extents and strides stay inside every
buffer (hypothesis property tests), plus explicit bad-operand cases of every class issue 25 lists. No GPU and
no torch needed; the torch custom-op / CUDA-graph checks are tests/gemm/test_loader_gpu.py."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from emitter.families.gemm import library_abi as abi

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import fake_devices, load_module  # noqa: E402
from library_helpers import SPEC  # noqa: E402

LIB = "fakelib"
CC = shutil.which("gcc") or shutil.which("cc")

_FAKE_C = r"""
#include <string.h>
#include <stdint.h>
#include "fakelib/fakelib.h"
static fakelib_gemm_problem last;
static int calls = 0, status = 0;
static void* last_stream = 0;
static void* last_ws = 0;
static size_t last_ws_bytes = 0;
static char kernel_copy[256];
const char* fakelib_status_string(fakelib_status s) { (void)s; return "fake"; }
const char* fakelib_last_error(void) { return "fake error message"; }
const char* fakelib_version(void) { return "fakelib 1 (fake)"; }
void fakelib_gemm_problem_init(fakelib_gemm_problem* p) {
  memset(p, 0, sizeof(*p)); p->struct_size = sizeof(*p); p->batch_count = 1; p->split_k_slices = 1; p->alpha = 1.0f;
}
static void record(const fakelib_gemm_problem* p) {
  memcpy(&last, p, sizeof(last));
  kernel_copy[0] = 0;
  if (p->kernel) { strncpy(kernel_copy, p->kernel, sizeof(kernel_copy) - 1); kernel_copy[sizeof(kernel_copy) - 1] = 0; }
  ++calls;
}
fakelib_status fakelib_gemm_workspace_size(const fakelib_gemm_problem* p, size_t* bytes) { record(p); *bytes = 4096; return status; }
fakelib_status fakelib_gemm_can_implement(const fakelib_gemm_problem* p) { record(p); return status; }
fakelib_status fakelib_gemm_select(const fakelib_gemm_problem* p, fakelib_selection* s) {
  record(p); memset(s, 0, sizeof(*s)); s->struct_size = sizeof(*s); s->kernel = 0; s->split_k_slices = 1; return status;
}
fakelib_status fakelib_gemm(const fakelib_gemm_problem* p, void* ws, size_t ws_bytes, fakelib_stream_t stream) {
  record(p); last_stream = (void*)stream; last_ws = ws; last_ws_bytes = ws_bytes; return status;
}
int fakelib_kernel_count(void) { return 1; }
const char* fakelib_kernel_name(int i) { return i == 0 ? "fake_kernel" : 0; }
int fakelib_kernel_index(const char* n) { return strcmp(n, "fake_kernel") == 0 ? 0 : -1; }
fakelib_status fakelib_get_kernel_info(int i, fakelib_kernel_info* out) {
  (void)i; memset(out, 0, sizeof(*out)); out->struct_size = sizeof(*out); out->name = "fake_kernel"; return 0;
}
/* the test's view */
int fake_calls(void) { return calls; }
void fake_last(fakelib_gemm_problem* out) { memcpy(out, &last, sizeof(last)); }
const char* fake_kernel(void) { return kernel_copy; }
void* fake_stream(void) { return last_stream; }
void* fake_ws(void) { return last_ws; }
size_t fake_ws_bytes(void) { return last_ws_bytes; }
void fake_set_status(int s) { status = s; }
"""


# ---- duck-typed tensors over fake address ranges ----------------------------------------------------

class FakeDtype:
    def __init__(self, name: str, bits: int):
        self.name, self.bits = name, bits

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


DT = {n: FakeDtype(n, b) for n, b in (("float16", 16), ("bfloat16", 16), ("float32", 32), ("float64", 64),
                                     ("int8", 8), ("int32", 32), ("float8_e4m3fn", 8), ("uint16", 16),
                                     ("int64", 64), ("bool", 8))}
_next_base = [1 << 32]


def _alloc(nbytes: int) -> int:
    """A fake device address: 4 KiB aligned, below 2^48 (huge stand-ins may overlap others: each operand is
    checked against its own buffer)."""
    _next_base[0] += 1
    return (1 << 32) + (_next_base[0] % 65536) * (1 << 30)


def _extent(shape, strides) -> int:
    """Elements a strided view spans (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def contiguous(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.insert(0, acc)
        acc *= max(s, 1)
    return tuple(out)


class FakeTensor:
    """What the loader reads of a torch tensor: data_ptr(), shape, stride(), dtype, get_device(), element_size(),
    dim(), new_empty. `base`/`nbytes`: the storage it views (the bytes a kernel may touch)."""

    def __init__(self, shape, dtype="bfloat16", strides=None, device=0, offset=0, storage=None):
        self.shape = tuple(shape)
        self._strides = tuple(strides) if strides is not None else contiguous(self.shape)
        self.dtype = DT[dtype] if isinstance(dtype, str) else dtype
        self.device_index = device
        item = self.dtype.bits // 8
        need = (offset + _extent(self.shape, self._strides)) * item
        if storage is None:
            storage = (_alloc(max(need, 1)), max(need, 1))
        self.base, self.nbytes = storage
        assert need <= self.nbytes
        self.offset = offset

    def data_ptr(self) -> int:
        return self.base + self.offset * (self.dtype.bits // 8)

    def stride(self) -> tuple:
        return self._strides

    def get_device(self) -> int:
        return self.device_index

    def element_size(self) -> int:
        return self.dtype.bits // 8

    def dim(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        return self._strides == contiguous(self.shape)

    def new_empty(self, shape) -> "FakeTensor":
        return FakeTensor(shape, self.dtype, device=self.device_index)

    def expand(self, shape) -> "FakeTensor":
        assert all(s == 1 for s in self.shape) and len(shape) == len(self.shape)
        return FakeTensor(shape, self.dtype, (0,) * len(shape), self.device_index, storage=(self.base, self.nbytes))


class CaiArray:
    """A __cuda_array_interface__ object over a fake address range (strides in bytes, or None = C order)."""

    def __init__(self, shape, typestr="<f2", strides=None):
        item = int(typestr[2:])
        self.shape = tuple(shape)
        el = tuple(strides) if strides is not None else contiguous(self.shape)
        self.nbytes = max(_extent(self.shape, el) * item, 1)
        self.base = _alloc(self.nbytes)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": typestr, "data": (self.base, False),
                                         "strides": None if strides is None else tuple(s * item for s in el),
                                         "version": 3}


# ---- the loader and the fake library ----------------------------------------------------------------

@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    if CC is None:
        pytest.skip("needs a C compiler")
    from emitter.emit import emit
    from emitter.library.export import export_library

    d = tmp_path_factory.mktemp("loader")
    spec = d / "tiny.yaml"
    spec.write_text(SPEC)
    emit([spec], d / "gen", jobs=1)
    out = d / "lib"
    export_library([d / "gen"], LIB, out)
    src = d / "fake.c"
    src.write_text(_FAKE_C)
    so = d / "libfakelib.so"
    subprocess.run([CC, "-std=c99", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{out / 'include'}", str(src), "-o",
                    str(so)], check=True)
    mod = load_module("fakelib_loader", out / "python" / f"{LIB}.py")
    c = mod.load(str(so))
    c.fake_calls.restype = ctypes.c_int
    c.fake_last.argtypes = [ctypes.POINTER(mod.Problem)]
    c.fake_kernel.restype = ctypes.c_char_p
    c.fake_stream.restype = ctypes.c_void_p
    c.fake_ws.restype = ctypes.c_void_p
    c.fake_ws_bytes.restype = ctypes.c_size_t
    # the torch hooks, pointed at the stand-ins (what init_torch sets from torch)
    device = fake_devices(mod, FakeTensor)
    mod.torch_module = types.SimpleNamespace(cuda=types.SimpleNamespace(device=device), device=lambda kind, index: index,
                                       empty=lambda shape, dtype, device: FakeTensor(shape, dtype, device=device),
                                       empty_like=lambda t: FakeTensor(t.shape, t.dtype, device=t.device_index))
    mod.torch_dtypes.update({"f16": DT["float16"], "bf16": DT["bfloat16"], "f32": DT["float32"],
                               "f64": DT["float64"], "s8": DT["int8"], "s32": DT["int32"], "e4m3": DT["float8_e4m3fn"]})
    mod.empty_tensor = lambda shape, dtype, dev: FakeTensor(shape, dtype, device=dev)
    mod._fake = c
    return mod


def last(mod) -> dict:
    p = mod.Problem()
    mod._fake.fake_last(ctypes.byref(p))
    return {f: getattr(p, f) for f, _ in abi.PROBLEM_FIELDS}


def calls(mod) -> int:
    return mod._fake.fake_calls()


# ---- what a call may touch ------------------------------------------------------------------------

BITS = {1: 16, 2: 16, 3: 32, 4: 32, 5: 64, 6: 8, 7: 32, 8: 8, 9: 8}


def touched(ptr: int, bits: int, layout: int, rows: int, cols: int, ld: int, batch: int, bs: int) -> tuple[int, int]:
    """[first, end) bytes a kernel addresses for a rows x cols matrix (C ABI: 0 = packed ld / batch stride)."""
    row = layout == 1
    ld = ld or (cols if row else rows)
    bs = bs or ld * (rows if row else cols)
    last_ = (batch - 1) * bs + ((rows - 1) * ld + (cols - 1) if row else (rows - 1) + (cols - 1) * ld)
    return ptr, ptr + (last_ + 1) * bits // 8


def d_offsets(p: dict) -> list[int]:
    row = p["c_layout"] == 1
    m, n, batch = p["m"], p["n"], p["batch_count"]
    ld = p["ldd"] or (n if row else m)
    bs = p["batch_stride_d"] or ld * (m if row else n)
    return [b * bs + (i * ld + j if row else i + j * ld) for b in range(batch) for i in range(m) for j in range(n)]


def assert_inside(p: dict, bufs: dict) -> None:
    """Every operand the recorded problem addresses lies inside the buffer the caller passed for it."""
    m, n, k, batch = p["m"], p["n"], p["k"], p["batch_count"]
    assert 1 <= batch and 0 < m and 0 < n and 0 < k
    views = {"A": (p["A"], p["a_type"], p["a_layout"], m, k, p["lda"], p["batch_stride_a"]),
             "B": (p["B"], p["b_type"], p["b_layout"], k, n, p["ldb"], p["batch_stride_b"]),
             "D": (p["D"], p["d_type"], p["c_layout"], m, n, p["ldd"], p["batch_stride_d"])}
    if p["C"]:
        views["C"] = (p["C"], p["c_type"], p["c_layout"], m, n, p["ldc"], p["batch_stride_c"])
    else:
        assert p["beta"] == 0.0
    for name, (ptr, dt, layout, rows, cols, ld, bs) in views.items():
        base, nbytes = bufs[name]
        lo, hi = touched(ptr, BITS[dt], layout, rows, cols, ld, batch, bs)
        assert base <= lo and hi <= base + nbytes, (name, p, bufs[name])
    if p["bias_kind"]:
        base, nbytes = bufs["bias"]
        length = m if p["bias_kind"] == 1 else n
        assert base <= p["bias"] and p["bias"] + length * BITS[p["c_type"]] // 8 <= base + nbytes
    else:
        assert not p["bias"]
    if batch * m * n <= 20000:
        offs = d_offsets(p)
        assert len(set(offs)) == len(offs), ("D's matrices overlap", p)


def buf(x) -> tuple[int, int]:
    return (x.base, x.nbytes)


# ---- property tests: random operand sets --------------------------------------------------------------

@st.composite
def size(draw):
    r = draw(st.integers(0, 99))
    return draw(st.sampled_from([2 ** 31, 2 ** 32 + 64, 2 ** 31 - 1])) if r < 3 else 0 if r < 6 else draw(st.integers(1, 5))


@st.composite
def batches(draw):
    r = draw(st.integers(0, 99))
    return 0 if r < 2 else 2 ** 31 if r < 4 else draw(st.sampled_from([1, 1, 2, 3]))


TORCH_DTS = ["bfloat16", "float16", "float32", "int8", "uint16", "float64"]


def rare(draw, percent: int) -> bool:
    return draw(st.integers(0, 99)) < percent


@st.composite
def strided(draw, shape):
    """Strides for `shape`: a random memory order of the dims with padding (valid layouts), sometimes a 0 or
    random strides (broadcast / overlapping views)."""
    nd = len(shape)
    order = list(range(nd - 1, -1, -1))
    how = draw(st.sampled_from(["dense", "dense", "transposed", "transposed", "permuted"]))
    if how == "transposed" and nd >= 2:
        order[0], order[1] = order[1], order[0]
    elif how == "permuted":
        order = draw(st.permutations(range(nd)))
    strides = [0] * nd
    acc = 1
    for d in order:
        strides[d] = acc
        acc = acc * max(shape[d], 1) + draw(st.sampled_from([0, 0, 0, 1, 3]))
    if nd and rare(draw, 3):
        strides[draw(st.integers(0, nd - 1))] = 0
    elif rare(draw, 3):
        strides = [draw(st.integers(0, 9)) for _ in range(nd)]
    return tuple(strides)


@st.composite
def operand(draw, rows, cols, batch, dtype="bfloat16"):
    """A matrix operand (rows x cols, batch) as a torch stand-in or a __cuda_array_interface__ array, sometimes
    with another batch, rank, size, dtype or device."""
    shape = (batch, rows, cols) if batch != 1 or draw(st.booleans()) else (rows, cols)
    if rare(draw, 6):
        form = draw(st.sampled_from(["2d", "other_batch", "1d", "4d", "off_by_one"]))
        if form == "2d":
            shape = (rows, cols)
        elif form == "other_batch":
            shape = (draw(st.integers(0, 4)), rows, cols)
        elif form == "1d":
            shape = (cols,)
        elif form == "4d":
            shape = (2, batch, rows, cols)
        else:
            shape = (rows + 1, cols) if draw(st.booleans()) else (rows, cols + 1)
    strides = draw(strided(shape))
    if not rare(draw, 15):
        dt = dtype if not rare(draw, 6) else draw(st.sampled_from(TORCH_DTS))
        dev = 0 if not rare(draw, 5) else draw(st.sampled_from([1, -1]))
        offset = draw(st.sampled_from([0, 0, 8, 3]))
        return FakeTensor(shape, dt, strides, device=dev, offset=offset)
    typestr = {"bfloat16": "<u2", "float16": "<f2"}.get(dtype, "<f2")
    return CaiArray(shape, typestr if not rare(draw, 10) else draw(st.sampled_from(["<f4", "<i1", ">f2"])), strides)


def _describes(p: dict, a, b, out, batch3: bool) -> None:
    """The recorded problem is exactly the operands' problem: m, n, k, batch and the pointers."""
    sa, sb = a.shape, b.shape
    assert (p["m"], p["k"]) == (sa[-2], sa[-1]) and (p["k"], p["n"]) == (sb[-2], sb[-1])
    assert p["batch_count"] == (sa[0] if len(sa) == 3 else 1)
    assert p["A"] == _ptr(a) and p["B"] == _ptr(b) and p["D"] == _ptr(out)


def _ptr(x) -> int:
    return x.data_ptr() if isinstance(x, FakeTensor) else x.__cuda_array_interface__["data"][0]


def _buf(x) -> tuple[int, int]:
    return (x.base, x.nbytes)


TALLY = {"refused": 0, "called": 0, "batched": 0, "C": 0, "bias": 0, "col": 0}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_random_operands_are_refused_or_stay_inside_their_buffers(loader, data):
    mod = loader
    m, n, k = data.draw(size()), data.draw(size()), data.draw(size())
    batch = data.draw(batches())
    a = data.draw(operand(m, k, batch))
    b = data.draw(operand(k, n, batch))
    out = data.draw(st.one_of(st.none(), operand(m, n, batch)))
    if out is None and not isinstance(a, FakeTensor):
        out = data.draw(operand(m, n, batch))
    c = data.draw(st.one_of(st.none(), operand(m, n, batch)))
    beta = data.draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, 0.5, 1e300])) if c is not None else \
        data.draw(st.sampled_from([0.0] * 9 + [1.0]))
    bias = None
    if data.draw(st.integers(0, 2)) == 0:
        length = data.draw(st.sampled_from([m, n, n, m + 1]))
        dt = "bfloat16" if not rare(data.draw, 15) else "float32"
        if rare(data.draw, 15):
            bias = FakeTensor((1, length), dt, (length, 1), device=0)
        else:
            bias = FakeTensor((length,), dt, (1 if not rare(data.draw, 15) else data.draw(st.sampled_from([0, 2])),),
                              device=0)
    dtype_kw = data.draw(st.sampled_from([None] * 12 + ["bf16", "f16", "f32", "tf32"]))
    function = data.draw(st.sampled_from(["gemm"] * 6 + ["select", "workspace_size"]))
    before = calls(mod)
    try:
        r = getattr(mod, function)(a, b, out, c, beta=beta, bias=bias, dtype=dtype_kw)
    except mod.OperandError as e:
        TALLY["refused"] += 1
        assert calls(mod) == before, "refused, but the library was called"
        assert str(e).startswith(f"{LIB}.{function}: invalid argument: ")
        return
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{type(e).__name__} (not OperandError): {e}")
    if calls(mod) == before:   # nothing to compute
        assert 0 in (m, n) or (len(a.shape) == 3 and a.shape[0] == 0), (m, n, a.shape)
        return
    p = last(mod)
    TALLY["called"] += 1
    TALLY["batched"] += p["batch_count"] > 1
    TALLY["C"] += bool(p["C"])
    TALLY["bias"] += bool(p["bias"])
    TALLY["col"] += p["a_layout"] == 2 or p["b_layout"] == 2 or p["c_layout"] == 2
    if function == "gemm":
        out = r
    if out is None:
        return   # select / workspace_size allocated an out the test does not see; gemm's is checked below
    _describes(p, a, b, out, len(a.shape) == 3)
    bufs = {"A": _buf(a), "B": _buf(b), "D": _buf(out)}
    if c is not None:
        bufs["C"] = _buf(c)
        assert p["C"] == _ptr(c)
    if bias is not None:
        bufs["bias"] = _buf(bias)
    assert_inside(p, bufs)
    assert max(p["m"], p["n"], p["k"], p["batch_count"]) <= 2 ** 31 - 1
    if function == "gemm" and isinstance(a, FakeTensor):
        assert mod._fake.fake_stream() == 0x5000 + a.get_device()


def test_the_property_test_reached_the_library_often():
    """The random operand sets above are not all refused: many reach the (fake) library, batched, with C, bias,
    column-major operands (the test is only as strong as the calls it checks)."""
    if TALLY["refused"] + TALLY["called"] == 0:
        pytest.skip("the property test did not run")
    assert TALLY["called"] >= 30 and TALLY["refused"] >= 100, TALLY
    assert TALLY["batched"] >= 5 and TALLY["C"] >= 5 and TALLY["col"] >= 5 and TALLY["bias"] >= 1, TALLY


# ---- explicit bad operand sets: one per class of issue 25 (and a few more) -------------------------------

def T(shape, dtype="bfloat16", strides=None, device=0):
    return FakeTensor(shape, dtype, strides, device=device)


def _bad_cases():
    m, n, k = 64, 48, 32
    big = 2 ** 31
    return [
        ("2-D out with 3-D inputs", lambda: ((T((2, m, k)), T((2, k, n)), T((m, n))), {}), "out (shape (64, 48)"),
        ("A batch 3 against B batch 5", lambda: ((T((3, m, k)), T((5, k, n))), {}), "same batch count"),
        ("2-D A against a 3-D B", lambda: ((T((m, k)), T((5, k, n))), {}), "A has batch 1"),
        ("stride-0 broadcast B", lambda: ((T((3, m, k)), T((3, k, n), strides=(0, n, 1))), {}), "batch stride 0"),
        ("4-D A", lambda: ((T((2, 3, m, k)), T((2, 3, k, n))), {}), "A has 4 dimensions"),
        ("2^31 rows", lambda: ((T((big, k)), T((k, n))), {}), "m = 2147483648 does not fit"),
        ("2^32+64 rows", lambda: ((T((2 ** 32 + 64, k)), T((k, n))), {}), "m = 4294967360 does not fit"),
        ("2^31 batch", lambda: ((T((big, 1, 1)), T((big, 1, 1))), {}), "batch = 2147483648"),
        ("1-D operand", lambda: ((T((k,)), T((k, n))), {}), "A has 1 dimensions"),
        ("operands on two GPUs", lambda: ((T((m, k)), T((k, n), device=1)), {}), "on one GPU"),
        ("out on another GPU", lambda: ((T((m, k)), T((k, n)), T((m, n), device=1)), {}), "on one GPU"),
        ("a CPU tensor", lambda: ((T((m, k), device=-1), T((k, n))), {}), "CPU tensor"),
        ("bias dtype", lambda: ((T((m, k)), T((k, n))), {"bias": T((n,), "float32")}), "C's element type"),
        ("bias length", lambda: ((T((m, k)), T((k, n))), {"bias": T((n + 1,))}), "bias has 49 elements"),
        ("bias kind against length", lambda: ((T((m, k)), T((k, n))), {"bias": T((n,)), "bias_kind": "row"}),
         "per-row bias has m=64"),
        ("bias strided", lambda: ((T((m, k)), T((k, n))), {"bias": T((n,), strides=(2,))}), "contiguous"),
        ("bias 2-D", lambda: ((T((m, k)), T((k, n))), {"bias": T((1, n))}), "must be 1-D"),
        ("overlapping D matrices", lambda: ((T((2, m, k)), T((2, k, n)), T((2, m, n), strides=(n, n, 1))), {}),
         "matrices overlap"),
        ("2-D C with 3-D out", lambda: ((T((2, m, k)), T((2, k, n)), T((2, m, n)), T((m, n))), {"beta": 1.0}),
         "no broadcasting"),
        ("broadcast C", lambda: ((T((2, m, k)), T((2, k, n)), T((2, m, n)), T((2, m, n), strides=(0, n, 1))),
                                 {"beta": 1.0}), "C (shape (2, 64, 48), strides (0, 48, 1)) has batch stride 0"),
        ("inner dimensions", lambda: ((T((m, k)), T((k + 1, n))), {}), "inner dimensions differ"),
        ("beta without C", lambda: ((T((m, k)), T((k, n))), {"beta": 1.0}), "needs C"),
        ("expanded rows", lambda: ((T((m, k), strides=(0, 1)), T((k, n))), {}), "neither row- nor column-major"),
        ("overlapping rows", lambda: ((T((m, k), strides=(k // 2, 1)), T((k, n))), {}), "neither row- nor"),
        ("k = 0", lambda: ((T((m, 0)), T((0, n))), {}), "k = 0"),
        ("out shape", lambda: ((T((m, k)), T((k, n)), T((n, m))), {}), "out (shape (48, 64)"),
        ("C layout differs from out", lambda: ((T((m, k)), T((k, n)), T((m, n)), T((n, m)).__class__(
            (m, n), "bfloat16", (1, m))), {"beta": 1.0}), "same layout"),
        ("dtype= of another size", lambda: ((T((m, k)), T((k, n))), {"dtype": "f32"}), "32-bit elements"),
        ("unknown storage dtype", lambda: ((T((m, k), "uint16"), T((k, n))), {}), "pass dtype="),
        ("alpha beyond float", lambda: ((T((m, k)), T((k, n))), {"alpha": 1e300}), "does not fit the C ABI"),
        ("alpha not a number", lambda: ((T((m, k)), T((k, n))), {"alpha": "x"}), "must be numbers"),
        ("kernel name with NUL", lambda: ((T((m, k)), T((k, n))), {"kernel": "a\0b"}), "kernel must be"),
        ("split_k 0", lambda: ((T((m, k)), T((k, n))), {"split_k": 0}), "split_k must be"),
        ("activation", lambda: ((T((m, k)), T((k, n))), {"activation": "tanh"}), "activation 'tanh'"),
        ("not an array", lambda: (([[1.0]], T((k, n))), {}), "must be a torch tensor"),
        ("big-endian CAI", lambda: ((CaiArray((m, k), ">f2"), CaiArray((k, n)), CaiArray((m, n))), {}),
         "little-endian"),
        ("CAI negative strides", lambda: ((_negative(), CaiArray((k, n)), CaiArray((m, n))), {}), "negative strides"),
        ("workspace not contiguous", lambda: ((T((m, k)), T((k, n))), {"workspace": T((64, 64), strides=(128, 1))}),
         "workspace (shape (64, 64), strides (128, 1)) must be contiguous"),
        ("workspace tuple", lambda: ((T((m, k)), T((k, n))), {"workspace": (-1, 10)}), "two non-negative integers"),
        ("fast_accum not a bool", lambda: ((T((m, k)), T((k, n))), {"fast_accum": 1}), "fast_accum must be True"),
    ]


def _negative():
    x = CaiArray((64, 32))
    x.__cuda_array_interface__["strides"] = (-64, 2)
    return x


@pytest.mark.parametrize("label,make,message", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_operand_sets_are_refused(loader, label, make, message):
    mod = loader
    args, kw = make()
    before = calls(mod)
    with pytest.raises(mod.OperandError) as e:
        mod.gemm(*args, **kw)
    assert message in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{LIB}.gemm: invalid argument: ")
    assert isinstance(e.value, ValueError) and isinstance(e.value, mod.Error) and e.value.status == 2
    assert calls(mod) == before


def test_good_operand_sets_reach_the_library_exactly(loader):
    """Batched, transposed, padded, permuted (interleaved batch) and batch-1 mixes pass, with the exact strides."""
    mod = loader
    m, n, k = 64, 48, 32
    # batched, packed
    a, b = T((3, m, k)), T((3, k, n))
    out = mod.gemm(a, b)
    p = last(mod)
    assert (p["m"], p["n"], p["k"], p["batch_count"]) == (m, n, k, 3) and out.shape == (3, m, n)
    assert (p["lda"], p["ldb"], p["ldd"], p["batch_stride_a"], p["batch_stride_b"], p["batch_stride_d"]) == \
        (k, n, n, m * k, k * n, m * n)
    # a transposed view: column-major B with its leading dimension; a padded A; 3-D batch-1 with 2-D
    bt = FakeTensor((n, k + 8), "bfloat16")
    bview = FakeTensor((1, k, n), "bfloat16", (n * (k + 8), 1, k + 8), storage=(bt.base, bt.nbytes))
    apad = FakeTensor((m, k), "bfloat16", (k + 16, 1))
    mod.gemm(apad, bview, T((m, n)))
    p = last(mod)
    assert (p["a_layout"], p["lda"], p["b_layout"], p["ldb"], p["batch_count"]) == (1, k + 16, 2, k + 8, 1)
    # D whose batch matrices interleave by rows (a permuted (m, batch, n) tensor): disjoint, accepted
    d = FakeTensor((2, m, n), "bfloat16", (n, 2 * n, 1))
    mod.gemm(T((2, m, k)), T((2, k, n)), d)
    p = last(mod)
    assert (p["ldd"], p["batch_stride_d"]) == (2 * n, n)
    assert_inside(p, {"A": (p["A"], 10 ** 9), "B": (p["B"], 10 ** 9), "D": _buf(d)})
    # the fast path's plan (second call, same shapes): the new pointers, the same checked fields
    for _ in range(2):
        a2, b2, o2 = T((m, k)), T((k, n)), T((m, n))
        mod.gemm(a2, b2, o2, alpha=2.0)
        p2 = last(mod)
        assert (p2["A"], p2["B"], p2["D"], p2["alpha"], p2["lda"], p2["m"]) == (a2.data_ptr(), b2.data_ptr(),
                                                                              o2.data_ptr(), 2.0, k, m)
    r = mod.gemm(a2, b2)
    assert last(mod)["D"] == r.data_ptr() and r.shape == (m, n)
    # the allocating fast path: a plan with an output template (empty_like of a 1-element expanded tensor), each
    # call a fresh contiguous output of A's dtype on A's device, the same checked fields as the full path's
    full = last(mod)
    plan = mod._PLANS[(a2.shape, a2.stride(), a2.dtype, 0, b2.shape, b2.stride(), b2.dtype, 0, 1.0, "identity", True,
                       False)]
    assert plan[2] is not None and plan[2].stride() == (0, 0)
    for _ in range(2):
        a3, b3 = T((m, k)), T((k, n))
        before = calls(mod)
        r2 = mod.gemm(a3, b3)
        p3 = last(mod)
        assert calls(mod) == before + 1 and r2 is not r and r2.shape == (m, n) and r2.stride() == (n, 1)
        assert r2.dtype is a3.dtype and r2.get_device() == 0
        assert (p3["A"], p3["B"], p3["D"], p3["C"], p3["bias"]) == (a3.data_ptr(), b3.data_ptr(), r2.data_ptr(), None, None)
        assert {f: v for f, v in p3.items() if f not in ("A", "B", "D")} == \
            {f: v for f, v in full.items() if f not in ("A", "B", "D")}
    # ... and a plan never lets through what the full path refuses (the key holds every checked property)
    with pytest.raises(mod.OperandError, match="on one GPU"):
        mod.gemm(a2, b2, T((m, n), device=1), alpha=2.0)
    with pytest.raises(mod.OperandError, match="overlap"):
        mod.gemm(T((2, m, k)), T((2, k, n)), T((2, m, n), strides=(n, n, 1)))
    # m or n = 0: nothing reaches the library, out comes back
    before = calls(mod)
    assert mod.gemm(T((0, k)), T((k, n))).shape == (0, n) and calls(mod) == before
    # C, bias, explicit stream and workspace reach the call
    c, bias, ws = T((m, n)), T((n,)), T((1024,), "int8")
    mod.gemm(T((m, k)), T((k, n)), T((m, n)), c, beta=0.5, bias=bias, stream=0x1234, workspace=ws, kernel="fake_kernel")
    p = last(mod)
    assert p["C"] == c.data_ptr() and p["bias"] == bias.data_ptr() and p["bias_kind"] == 2 and p["beta"] == 0.5
    assert mod._fake.fake_stream() == 0x1234 and mod._fake.fake_ws() == ws.data_ptr()
    assert mod._fake.fake_ws_bytes() == 1024 and mod._fake.fake_kernel() == b"fake_kernel"
    # errors of the library itself still come back as Error with its message
    mod._fake.fake_set_status(1)
    try:
        with pytest.raises(mod.Error, match="not supported: fake error message"):
            mod.gemm(T((m, k)), T((k, n)))
    finally:
        mod._fake.fake_set_status(0)


def test_loader_imports_without_torch(loader):
    """The C-only path never imports torch (this test process may not even have it)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(loader.__file__).parent)!r}); import {LIB}; "
            f"assert 'torch' not in sys.modules; print({LIB}.__all__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "register_torch_ops" in r.stdout and "OperandError" in r.stdout
