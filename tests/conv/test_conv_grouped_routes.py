"""The exported loader's routes for grouped convolution (groups > 1) without a GPU: torch's CPU tensors in float64
against torch.nn.functional.conv2d(groups=g) and its autograd, the C API's selection replaced by a stand-in that
follows its rules (a grouped kernel where one takes the groups, else one launch a group; sm90a for 8-channel rows at
unit stride, else sm80) over a kernel table of the kinds configs/conv/grouped.yaml exports.

* the block-diagonal dense route: the (K, C, R, S) weight (zeros outside the groups, channels_last), fprop and dgrad
  on it and wgrad's diagonal blocks taken out of the (K, C, R, S) gradient, equal to the grouped op for g in
  {2, 4, 32}, odd sizes, strides, padding, dilation, a 3D case; out= written in place, channels_last kept;
* the route choice (_conv_group_route's cost model): ResNeXt's 4 channels a group on the dense kernels, two groups
  on per-group sm90a launches, depthwise on a depthwise kernel where the library has one (dgrad as the fprop of dy),
  the dense weight's size cap, every route's estimate reported; the choice is the cheapest estimate;
* conv_select's report: the route label (what benchmarks/conv_grouped_bench.py shows), the reason with the estimates;
* a grouped call end to end on CPU (route chosen, then run with the ungrouped op replaced by torch's), and the
  per-group route's pointers (the C API's conv_group_slice arithmetic) against the slice views' own.
No nvcc, no GPU."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import load_module  # noqa: E402
from test_conv_library import LIB, built  # noqa: E402,F401  (the exported library fixture)

torch = pytest.importorskip("torch")
F = torch.nn.functional
CL = torch.channels_last

# (name, CUTLASS 3.x, tile m, n, k, bytes a load, split-K, iterator, tiles an SM, cluster m, n, depthwise
# direct), as _CONV_KMODEL
_SM80 = "conv2d_{}_sm80_f16_f16_nhwc_128x128x64_w64x64x64_s3_opt"
_SM90A = "conv2d_{}_sm90a_f16_f16_nhwc_128x128x64_c1x{}x1_s6"
KERNELS = [
    ("conv2d_fprop_sm80_f16_f16_nhwc_64x64x32_analytic_al1x1x8_groupmultiple", False, 64, 64, 32, 2, False,
     "analytic", 1, 1, 1, False),
    ("conv2d_fprop_sm80_f16_f16_nhwc_128x64x64_opt_al8x8x8_groupsingle", False, 128, 64, 64, 16, False,
     "optimized", 1, 1, 1, False),
    (_SM80.format("fprop"), False, 128, 128, 64, 16, False, "optimized", 1, 1, 1, False),
    (_SM80.format("dgrad") + "_strided", False, 128, 128, 64, 16, False, "optimized", 1, 1, 1, False),
    (_SM80.format("wgrad"), False, 128, 128, 64, 16, False, "optimized", 1, 1, 1, False),
    (_SM90A.format("fprop", 1), True, 128, 128, 64, 16, False, "optimized", 1, 1, 1, False),
    (_SM90A.format("dgrad", 1) + "_unity", True, 128, 128, 64, 16, False, "optimized", 1, 1, 1, False),
    (_SM90A.format("wgrad", 2) + "_splitkparallel", True, 128, 128, 64, 16, True, "optimized", 1, 1, 2, False),
]
DEPTHWISE = ("conv2d_fprop_sm80_f16_f16_nhwc_8x8x16_s3_dwdirect_f3x3_st1x1_dl1x1", False, 8, 8, 16, 2, False,
             "analytic", 1, 1, 1, True)
GROUPMULTIPLE, GROUPSINGLE, DIRECT = 0, 1, len(KERNELS)


@pytest.fixture(scope="module")
def m(built):  # noqa: F811
    d, out, so = built
    mod = load_module(f"{LIB}_routes", out / "python" / f"{LIB}.py")
    mod.load(str(so))
    mod.init_torch()
    return mod


class StandIn:
    """The C API's selection (_conv_route_select's place) over KERNELS, each call recorded."""

    def __init__(self, m, kernels, sms=132):
        self.m, self.kernels, self.sms, self.calls = m, kernels, sms, []

    def _sel(self, i, split=1):
        return {"kernel": self.kernels[i][0], "index": i, "reason": "static priority", "tried": 0,
                "workspace_bytes": 0, "split_k_slices": split}

    def split(self, i, n, c, k, rs, npq):
        """conv_split_k of a parallel split-K wgrad kernel: one wave of SMs, at most 1/8 of the k-steps (64)."""
        _, _, tm, tn, tk, _, splitk, _, _, cm, cn, _ = self.kernels[i]
        if not splitk:
            return 1
        tiles = -(-(-(-k // tm)) // cm) * cm * (-(-(-(-c // tn) * rs) // cn) * cn)
        most = max(1, min(64, -(-npq // tk) // 8))
        return max(1, min(self.sms // tiles, most))

    def grouped(self, op, c, k, g):
        """The kernel that takes the groups in one launch, or None."""
        if op != "fprop":
            return None
        kg = k // g
        if len(self.kernels) > DIRECT and g == c == k:
            return DIRECT
        if kg % 64 == 0:
            return GROUPSINGLE
        if 64 % kg == 0:
            return GROUPMULTIPLE
        return None

    def ungrouped(self, op, c, k, stride):
        three = c % 8 == 0 and k % 8 == 0 and (op != "dgrad" or all(s == 1 for s in stride))
        return {"fprop": (2, 5), "dgrad": (3, 6), "wgrad": (4, 7)}[op][three]

    def __call__(self, op, x, w, y, out, bias, shape, stride, padding, dilation, function, groups, nd, epilogue,
                 kernel=None):
        if out is None:      # the C API's caller allocates the written tensor (channels_last)
            t = x if x is not None else w
            if op == "fprop":
                geo = [list(v) if isinstance(v, (list, tuple)) else [v] * nd for v in (stride, padding, dilation)]
                shape = (x.shape[0], w.shape[0], *[(x.shape[2 + i] + 2 * geo[1][i] - geo[2][i] * (w.shape[2 + i] - 1)
                                                    - 1) // geo[0][i] + 1 for i in range(nd)])
            out = torch.empty(tuple(shape), dtype=t.dtype).to(
                memory_format=torch.channels_last_3d if nd == 3 else CL)
        role = {"x": x, "w": w, "y": y}
        role[{"fprop": "y", "dgrad": "x", "wgrad": "w"}[op]] = out
        c, k = role["x"].shape[1], role["y"].shape[1]
        st = list(stride) if isinstance(stride, (list, tuple)) else [stride] * nd
        self.calls.append((op, tuple(role["x"].shape), tuple(role["w"].shape), tuple(role["y"].shape), groups,
                           kernel))
        rs = 1
        for v in role["w"].shape[2:]:
            rs *= v
        npq = role["y"].shape[0]
        for v in role["y"].shape[2:]:
            npq *= v
        if groups == 1:
            i = self.ungrouped(op, c, k, st)
            return self._sel(i, self.split(i, 0, c, k, rs, npq)), out
        gi = self.grouped(op, c, k, groups)
        if kernel is not None:
            return (self._sel(gi) if gi is not None and self.kernels[gi][0] == kernel else None), out
        if gi is not None:
            return self._sel(gi), out
        i = self.ungrouped(op, c // groups, k // groups, st)
        return self._sel(i, self.split(i, 0, c // groups, k // groups, rs, npq)), out


def _tensors(n, c, h, w, k, g, r, stride=1, padding=0, dilation=1, dtype=torch.float64, seed=0, nd=2, fill=True):
    gen = torch.Generator().manual_seed(seed)
    fmt = torch.channels_last_3d if nd == 3 else CL
    sp = (h, w) if nd == 2 else (h, h, w)
    if not fill:     # the shapes only (route planning reads no values)
        ext = [(v + 2 * padding - dilation * (r - 1) - 1) // stride + 1 for v in sp]
        return (torch.empty(n, c, *sp, dtype=dtype).to(memory_format=fmt),
                torch.empty(k, c // g, *([r] * nd), dtype=dtype).to(memory_format=fmt),
                torch.empty(n, k, *ext, dtype=dtype).to(memory_format=fmt))
    x = torch.randn(n, c, *sp, dtype=dtype, generator=gen).to(memory_format=fmt)
    wt = torch.randn(k, c // g, *([r] * nd), dtype=dtype, generator=gen).to(memory_format=fmt)
    conv = F.conv3d if nd == 3 else F.conv2d
    y = conv(x, wt, stride=stride, padding=padding, dilation=dilation, groups=g).contiguous(memory_format=fmt)
    return x, wt, y


def _cpu_run(calls):
    """_conv_run's place: torch's own CPU convolution, groups as given, each call recorded (op, groups, shapes)."""

    def run(op, function, x, w, y, out, bias, shape, stride, padding, dilation, stream=None, kernel=None, groups=1,
            nd=2, epilogue=None):
        calls.append((op, groups, None if w is None else tuple(w.shape), None if shape is None else tuple(shape)))
        geo = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        conv = F.conv3d if nd == 3 else F.conv2d
        grad = torch.nn.grad
        if op == "fprop":
            r = conv(x, w, bias, **geo)
        elif op == "dgrad":
            r = (grad.conv3d_input if nd == 3 else grad.conv2d_input)(tuple(shape), w, y, **geo)
        else:
            r = (grad.conv3d_weight if nd == 3 else grad.conv2d_weight)(x, tuple(shape), y, **geo)
        r = r.contiguous(memory_format=torch.channels_last_3d if nd == 3 else CL)
        if out is not None:
            out.copy_(r)
            return out
        return r
    return run


# ---- the block-diagonal dense route's math -------------------------------------------------------------------

def test_block_diagonal_weight_is_the_groups_on_the_diagonal(m):
    for g, k, cg, fs in ((2, 6, 3, (3, 5)), (4, 8, 1, (1, 1)), (32, 64, 4, (3, 3)), (4, 12, 5, (2, 3, 3))):
        w = torch.randn(k, cg, *fs, dtype=torch.float64)
        wd = m._conv_block_diagonal(w, g)
        fmt = torch.channels_last_3d if len(fs) == 3 else CL
        assert wd.shape == (k, cg * g, *fs) and wd.is_contiguous(memory_format=fmt)
        kg = k // g
        for i in range(g):
            for j in range(g):
                block = wd[i * kg:(i + 1) * kg, j * cg:(j + 1) * cg]
                assert torch.equal(block, w[i * kg:(i + 1) * kg] if i == j else torch.zeros_like(block)), (g, i, j)


# (N, C, H, W, K, groups, R, stride, padding, dilation)
DENSE_CASES = [
    (2, 6, 9, 7, 4, 2, 3, 1, 1, 1),
    (3, 8, 11, 10, 12, 4, 3, (2, 1), (1, 2), (1, 2)),
    (2, 128, 9, 7, 64, 32, 3, 2, 1, 1),        # ResNeXt's 4 channels a group, 2 output channels a group
    (1, 32, 7, 9, 32, 32, 5, 1, 2, 1),         # depthwise
    (2, 12, 6, 5, 8, 4, 1, 1, 0, 1),           # 1x1
]


@pytest.mark.parametrize("case", DENSE_CASES, ids=[f"g{c[5]}_{c[1]}x{c[4]}" for c in DENSE_CASES])
def test_dense_route_equals_the_grouped_op(m, case):
    n, c, h, w_, k, g, r, stride, padding, dilation = case
    geo = dict(stride=stride, padding=padding, dilation=dilation)
    x, w, y = _tensors(n, c, h, w_, k, g, r, **geo)
    gy = torch.randn_like(y)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xs, ws, groups=g, **geo).backward(gy)
    calls = []
    run = _cpu_run(calls)
    st, pd, dl = m._conv_geo(stride, padding, dilation, "conv2d")
    got = m._conv_dense("fprop", "conv2d", x, w, None, None, None, None, st, pd, dl, g, 2, None, run)
    assert torch.allclose(got, F.conv2d(x, w, groups=g, **geo)) and got.is_contiguous(memory_format=CL)
    gx = m._conv_dense("dgrad", "conv2d_input_grad", None, w, gy, None, None, tuple(x.shape), st, pd, dl, g, 2,
                       None, run)
    assert torch.allclose(gx, xs.grad) and gx.is_contiguous(memory_format=CL)
    gw = m._conv_dense("wgrad", "conv2d_weight_grad", x, None, gy, None, None, tuple(w.shape), st, pd, dl, g, 2,
                       None, run)
    assert gw.shape == w.shape and torch.allclose(gw, ws.grad) and gw.is_contiguous(memory_format=CL)
    # one ungrouped op each, on the (K, C, R, S) weight / into a (K, C, R, S) gradient
    dense = (k, c, r, r)
    assert calls == [("fprop", 1, dense, None), ("dgrad", 1, dense, tuple(x.shape)), ("wgrad", 1, None, dense)]
    # out= is written in place and returned (a channels_last buffer with padded rows: strides of its own)
    for op, want, args in (("fprop", F.conv2d(x, w, groups=g, **geo), (x, w, None)), ("dgrad", xs.grad, (None, w, gy)),
                           ("wgrad", ws.grad, (x, None, gy))):
        big = torch.full((want.shape[0], want.shape[1] + 3, *want.shape[2:]), 7.0,
                         dtype=want.dtype).to(memory_format=CL)
        out = big[:, 1:1 + want.shape[1]]
        assert out.stride(1) == 1
        shape = {"fprop": None, "dgrad": tuple(x.shape), "wgrad": tuple(w.shape)}[op]
        res = m._conv_dense(op, "f", *args, out, None, shape, st, pd, dl, g, 2, None, run)
        assert res is out and torch.allclose(out, want), op
        assert torch.all(big[:, 0] == 7.0) and torch.all(big[:, 1 + want.shape[1]:] == 7.0), op


def test_dense_route_in_3d(m):
    g = 4
    x, w, y = _tensors(2, 8, 5, 6, 12, g, 3, stride=(1, 2, 1), padding=1, nd=3)
    gy = torch.randn_like(y)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv3d(xs, ws, stride=(1, 2, 1), padding=1, groups=g).backward(gy)
    run = _cpu_run([])
    st, pd, dl = m._conv_geo((1, 2, 1), 1, 1, "conv3d", 3)
    y2 = m._conv_dense("fprop", "conv3d", x, w, None, None, None, None, st, pd, dl, g, 3, None, run)
    assert torch.allclose(y2, y) and y2.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(m._conv_dense("dgrad", "f", None, w, gy, None, None, tuple(x.shape), st, pd, dl, g, 3, None,
                                        run), xs.grad)
    gw = m._conv_dense("wgrad", "f", x, None, gy, None, None, tuple(w.shape), st, pd, dl, g, 3, None, run)
    assert torch.allclose(gw, ws.grad) and gw.is_contiguous(memory_format=torch.channels_last_3d)


def test_group_pointers_are_the_slice_views(m):
    for g, c, k, r in ((2, 6, 4, 3), (4, 8, 12, 1), (32, 128, 64, 3)):
        x, w, y = _tensors(2, c, 5, 4, k, g, r, padding=r // 2, dtype=torch.float16)
        b = torch.zeros(k, dtype=torch.float16)
        base = (x.data_ptr(), w.data_ptr(), y.data_ptr(), b.data_ptr())
        for i in range(g):
            xs, ws, ys, bs = m._conv_group_slices(x, w, y, b, i, g)
            want = (xs.data_ptr(), ws.data_ptr(), ys.data_ptr(), bs.data_ptr())
            assert m._conv_group_ptrs(base, i, c // g, k // g, w.stride(0), 2) == want, (g, i)
        assert m._conv_group_ptrs(base[:3] + (0,), 1, c // g, k // g, w.stride(0), 2)[3] == 0


# ---- the route choice ------------------------------------------------------------------------------------------

def _route(m, monkeypatch, op, n, c, h, w_, k, g, r, stride=1, padding=1, kernels=KERNELS, sms=132):
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(kernels))
    stand = StandIn(m, kernels)
    monkeypatch.setattr(m, "_conv_route_select", stand)
    monkeypatch.setattr(m, "_CONV_SMS", {-1: sms})
    x, w, y = _tensors(n, c, h, w_, k, g, r, stride, padding, dtype=torch.float16, fill=False)
    st, pd, dl = m._conv_geo(stride, padding, 1, "f")
    args = {"fprop": (x, w, None, y, None, None), "dgrad": (None, w, y, x, None, tuple(x.shape)),
            "wgrad": (x, None, y, w, None, tuple(w.shape))}[op]
    dec = m._conv_group_route(op, "f", *args, st, pd, dl, g, 2, None)
    return dec, stand


def _check_cheapest(dec):
    assert dec["costs"] and min(dec["costs"].values()) == dec["costs"][dec["code"]], dec["costs"]
    assert dec["reason"].split(": ")[0].startswith(("depthwise dgrad", dec["label"]))
    assert "cost model: " in dec["reason"]


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_resnext_four_channels_a_group_run_on_the_dense_kernels(m, monkeypatch, op):
    for stride in (1, 2):
        dec, stand = _route(m, monkeypatch, op, 32, 128, 56, 56, 128, 32, 3, stride=stride)
        _check_cheapest(dec)
        assert dec["route"] == "dense" and dec["label"] == "block-diagonal dense (32x the FLOPs)", dec["reason"]
        assert "sm90a" in dec["select"]["kernel"] or (op == "dgrad" and stride == 2), dec["select"]
        # today's routes are still priced: the grouped kernel (fprop) or 32 launches, each dearer
        other = dec["costs"]["grouped" if op == "fprop" else "per-group"]
        assert other > 2 * dec["costs"]["dense"], dec["costs"]


def test_two_groups_run_a_group_a_launch_on_sm90a(m, monkeypatch):
    dec, _ = _route(m, monkeypatch, "fprop", 32, 256, 56, 56, 256, 2, 3)
    _check_cheapest(dec)
    # the sm80 grouped kernel takes it, yet two sm90a launches are cheaper, and cheaper than twice the FLOPs
    assert dec["route"] == "slices" and set(dec["costs"]) == {"grouped", "slices", "dense"}, dec["costs"]
    assert "sm90a" in dec["select"]["kernel"] and dec["label"] == "2 launches (a group each)"
    for op in ("dgrad", "wgrad"):
        dec, _ = _route(m, monkeypatch, op, 32, 256, 56, 56, 256, 2, 3)
        _check_cheapest(dec)
        assert dec["route"] == "as-given" and dec["code"] == "per-group", (op, dec["costs"])


def test_depthwise_prefers_a_depthwise_kernel_and_falls_back_to_dense(m, monkeypatch):
    with_dw = KERNELS + [DEPTHWISE]
    dec, _ = _route(m, monkeypatch, "fprop", 32, 144, 56, 56, 144, 144, 3, kernels=with_dw)
    _check_cheapest(dec)
    assert dec["code"] == "grouped" and dec["select"]["index"] == DIRECT and dec["route"] == "as-given"
    dec, _ = _route(m, monkeypatch, "dgrad", 32, 144, 56, 56, 144, 144, 3, kernels=with_dw)
    _check_cheapest(dec)
    assert dec["route"] == "depthwise-dgrad" and dec["select"]["index"] == DIRECT
    assert dec["reason"].startswith("depthwise dgrad as the fprop of dy (rotated filter): static priority; ")
    assert dec["label"] == "depthwise fprop of dy (rotated filter)"
    dec, _ = _route(m, monkeypatch, "dgrad", 32, 144, 56, 56, 144, 144, 3, stride=2, kernels=with_dw)
    assert dec["route"] == "depthwise-dgrad" and dec["label"].endswith("zero-inserted dy)")
    # without one: the 2.x grouped kernel at 1-element loads loses to 144x the FLOPs on the dense kernels
    for op in ("fprop", "dgrad", "wgrad"):
        dec, _ = _route(m, monkeypatch, op, 32, 144, 56, 56, 144, 144, 3)
        _check_cheapest(dec)
        assert dec["route"] == "dense", (op, dec["costs"])


def test_the_dense_weight_cap_and_no_route(m, monkeypatch):
    monkeypatch.setattr(m, "_CONV_DENSE_MAX", 128 * 128 * 9 - 1)
    dec, stand = _route(m, monkeypatch, "wgrad", 4, 128, 14, 14, 128, 32, 3)
    assert "dense" not in dec["costs"] and dec["code"] == "per-group"
    assert all(c[2] != (128, 128, 3, 3) for c in stand.calls)     # nothing of the dense shape was planned
    monkeypatch.setattr(m, "_conv_route_select", lambda *a, **kw: (None, a[4]))
    x, w, y = _tensors(2, 8, 5, 5, 8, 2, 3, padding=1, fill=False)
    dec = m._conv_group_route("fprop", "f", x, w, None, y, None, None, [1, 1], [1, 1], [1, 1], 2, 2, None)
    assert dec["route"] == "as-given" and dec["select"] is None     # run as given: the C API says why


def test_the_cost_model_counts_tiles_waves_and_launches(m, monkeypatch):
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(KERNELS))
    sec = m._conv_kernel_seconds
    dims = (32, 128, 128, (56, 56), (3, 3), (56, 56))
    dense = sec(5, "fprop", dims, 1, 1, 132, 2)
    # 784 x 1 tiles of 128x128 on 132 SMs: 6 waves of 18 k-steps of 64 at the sm90a rate, one launch
    want = m._CONV_LAUNCH_S + 6 * 132 * 2.0 * 128 * 128 * 64 * 18 / m._CONV_RATE[3]
    assert dense == pytest.approx(want)
    assert sec(5, "fprop", dims, 1, 1, 132, 4) == pytest.approx(m._CONV_LAUNCH_S + 2 * (want - m._CONV_LAUNCH_S))
    # the grouped 2.x kernel in multiple mode: 16 groups of 4 channels a CTA, reduced one after another, at
    # 2-byte loads (1/8) and the analytic iterator (1/2) of the 2.x rate
    g = sec(GROUPMULTIPLE, "fprop", dims, 32, 1, 132, 2)
    assert g == pytest.approx(m._CONV_LAUNCH_S + 24 * 132 * 2.0 * 64 * 64 * 32 * 32 / (m._CONV_RATE[2] / 16))
    # split-K: the slices share the reduction, and their f32 partial sums are written and read back
    w1 = sec(7, "wgrad", dims, 1, 1, 132, 2)
    w8 = sec(7, "wgrad", dims, 1, 8, 132, 2)
    assert w8 < w1 / 4
    # the depthwise direct kernel: its bytes at the bandwidth (3x3) or its FLOPs at the SIMT rate (7x7 at C 96)
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(KERNELS + [DEPTHWISE]))
    dw = sec(DIRECT, "fprop", (32, 144, 144, (56, 56), (3, 3), (56, 56)), 144, 1, 132, 2)
    assert dw == pytest.approx(m._CONV_LAUNCH_S + (2 * 32 * 144 * 56 * 56 + 144 * 9) * 2 / m._CONV_BW)
    dw7 = sec(DIRECT, "fprop", (32, 96, 96, (56, 56), (7, 7), (56, 56)), 96, 1, 132, 2)
    assert dw7 == pytest.approx(m._CONV_LAUNCH_S + 2.0 * 32 * 56 * 56 * 96 * 49 / m._CONV_RATE_SIMT)


# ---- conv_select's report and a call end to end ----------------------------------------------------------------

def test_conv_select_reports_the_route_and_the_estimates(m, monkeypatch):
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(KERNELS))
    monkeypatch.setattr(m, "_conv_route_select", StandIn(m, KERNELS))
    x, w, y = _tensors(32, 64, 12, 12, 64, 16, 3, padding=1, dtype=torch.float16, fill=False)
    sel = m.conv_select("wgrad", x, w, y, padding=1, groups=16, shape=tuple(w.shape))
    assert sel["route"] == "block-diagonal dense (16x the FLOPs)" and "splitkparallel" in sel["kernel"]
    assert sel["reason"].startswith("block-diagonal dense (16x the FLOPs): static priority; cost model: dense ")
    assert set(sel["costs_us"]) == {"dense", "per-group"} and sel["split_k_slices"] == 9
    # the depthwise dgrad route keeps its reason's head (the bench reads the route from it)
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(KERNELS + [DEPTHWISE]))
    monkeypatch.setattr(m, "_conv_route_select", StandIn(m, KERNELS + [DEPTHWISE]))
    x, w, y = _tensors(32, 144, 56, 56, 144, 144, 3, stride=2, padding=1, dtype=torch.float16, fill=False)
    sel = m.conv_select("dgrad", x, w, y, stride=2, padding=1, groups=144, shape=tuple(x.shape))
    assert sel["reason"].startswith("depthwise dgrad as the fprop of dy (rotated filter): ")
    assert sel["route"] == "depthwise fprop of dy (rotated filter, zero-inserted dy)"


def test_a_grouped_call_takes_its_route_end_to_end(m, monkeypatch):
    """conv2d / conv2d_input_grad / conv2d_weight_grad with groups: the route chosen once per problem (remembered),
    then run with the ungrouped op replaced by torch's CPU convolution; gradients as torch's autograd."""
    monkeypatch.setattr(m, "_CONV_KMODEL", tuple(KERNELS))
    stand = StandIn(m, KERNELS)
    monkeypatch.setattr(m, "_conv_route_select", stand)
    monkeypatch.setattr(m, "_CONV_ROUTES", {})
    calls = []
    monkeypatch.setattr(m, "_conv_run", _cpu_run(calls))
    x, w, y = _tensors(2, 64, 11, 10, 32, 16, 3, stride=2, padding=1)
    gy = torch.randn_like(y)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xs, ws, stride=2, padding=1, groups=16).backward(gy)
    # _conv_grouped is what _conv_run does first for groups > 1 (its own stand-in here runs the routes' launches)
    geo = ([2, 2], [1, 1], [1, 1])
    out = torch.empty_like(y)
    for _ in range(2):
        got = m._conv_grouped("fprop", "conv2d", x, w, None, out, None, None, *geo, 16, 2, None)
        assert got is out and torch.allclose(out, y)
    assert len([c for c in stand.calls if c[5] is None and c[4] == 16]) == 1    # planned once, then remembered
    gx = m._conv_grouped("dgrad", "conv2d_input_grad", None, w, gy, None, None, tuple(x.shape), *geo, 16, 2, None)
    gw = m._conv_grouped("wgrad", "conv2d_weight_grad", x, None, gy, None, None, tuple(w.shape), *geo, 16, 2, None)
    assert torch.allclose(gx, xs.grad) and torch.allclose(gw, ws.grad)
    assert [c[:2] for c in calls] == [("fprop", 1), ("fprop", 1), ("dgrad", 1), ("wgrad", 1)]


# ---- the routes through the generated C API (fake kernels: every query accepts, runs recorded) ---------------------

@pytest.fixture(scope="module")
def cm(built):  # noqa: F811
    """The loader over the C API linked with fake conv shims (test_conv_library's), torch's CPU tensors standing in
    for device 0's: the routes' real planning, selection and launch glue, no GPU."""
    import ctypes

    d, out, so = built
    mod = load_module(f"{LIB}_routes_capi", out / "python" / f"{LIB}.py")
    mod.load(str(so))
    mod.init_torch()
    real_view = mod.operand_view
    names = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

    def view(x, want, what, fallback=None):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype in names:
            return x.data_ptr(), x.shape, x.stride(), names[x.dtype], 0, x
        return real_view(x, want, what, fallback)

    mod.operand_view = view
    mod.current_device = lambda: 0
    mod.raw_stream = lambda dev: 0x5000 + max(dev, 0)
    mod._conv_empty = lambda shape, tdt, dev: torch.empty_strided(shape, mod._channels_last(shape), dtype=tdt)
    mod._CONV_SMS.update({0: 132, -1: 132})
    c = mod._lib
    for n in ("g_runs", "g_last_kernel", "g_refuse", "g_ungrouped"):
        setattr(mod, "_" + n, ctypes.c_int.in_dll(c, n))
    return mod


def _last(mod) -> dict:
    from test_conv_library import last
    return last(mod)


@contextlib.contextmanager
def forced(mod, route):
    """The route decisions with `route` taken wherever the model priced it."""
    real = mod._conv_group_route

    def pick(*args, **kw):
        dec = real(*args, **kw)
        if route in dec["costs"]:
            dec = dict(dec, route="as-given" if route in ("grouped", "per-group") else route, code=route)
        return dec

    mod._conv_group_route = pick
    mod._CONV_ROUTES.clear()
    try:
        yield
    finally:
        mod._conv_group_route = real
        mod._CONV_ROUTES.clear()


def test_routes_through_the_c_api(cm):
    names = sorted(k[0] for k in cm._CONV_KMODEL)
    sm90a = [i for i, k in enumerate(cm._CONV_KMODEL) if "fprop_sm90a" in k[0]][0]
    everything = (1 << len(names)) - 1
    x = torch.randn(2, 16, 9, 7).half().to(memory_format=CL)
    w = torch.randn(24, 8, 3, 3).half().to(memory_format=CL)
    gy = torch.randn(2, 24, 9, 7).half().to(memory_format=CL)
    eb = 2
    try:
        # every kernel ungrouped: as given is the C API's launch a group; the dense route is priced beside it
        cm._g_ungrouped.value = everything
        sel = cm.conv_select("fprop", x, w, None, padding=1, groups=2)
        assert set(sel["costs_us"]) == {"per-group", "dense"} and sel["route"] in (
            "2 launches (a group each)", "block-diagonal dense (2x the FLOPs)"), sel
        runs = cm._g_runs.value
        with forced(cm, "per-group"):
            y = cm.conv2d(x, w, padding=1, groups=2)
        e = _last(cm)
        assert cm._g_runs.value == runs + 2 and (e["c"], e["k"], e["groups"]) == (8, 12, 1)
        assert e["ptr_x"] == x.data_ptr() + 8 * eb and e["ptr_y"] == y.data_ptr() + 12 * eb
        assert e["ptr_w"] == w.data_ptr() + 12 * 8 * 9 * eb
        with forced(cm, "dense"):
            y2 = cm.conv2d(x, w, padding=1, groups=2)
            e = _last(cm)
            assert cm._g_runs.value == runs + 3 and (e["c"], e["k"], e["groups"]) == (16, 24, 1), e
            assert e["ptr_x"] == x.data_ptr() and e["ptr_y"] == y2.data_ptr() and e["ptr_w"] not in (0, w.data_ptr())
            gx = cm.conv2d_input_grad(gy, w, x.shape, padding=1, groups=2)
            e = _last(cm)
            assert "_dgrad_" in names[cm._g_last_kernel.value]
            assert (e["c"], e["k"], e["ptr_x"], e["ptr_y"]) == (16, 24, gx.data_ptr(), gy.data_ptr())
            out = torch.full_like(w, 5.0)
            assert cm.conv2d_weight_grad(x, gy, w.shape, padding=1, groups=2, out=out) is out
            e = _last(cm)      # the (K, C, R, S) temporary written, out taken from its diagonal blocks
            assert "_wgrad_" in names[cm._g_last_kernel.value]
            assert (e["c"], e["k"], e["groups"]) == (16, 24, 1) and e["ptr_w"] != out.data_ptr()
            assert cm._g_runs.value == runs + 5
        # one kernel takes the groups: as given is one launch; the loader's launch a group is priced beside it
        cm._g_ungrouped.value = everything & ~(1 << sm90a)
        sel = cm.conv_select("fprop", x, w, None, padding=1, groups=2)
        assert {"grouped", "slices", "dense"} == set(sel["costs_us"]), sel
        runs = cm._g_runs.value
        with forced(cm, "grouped"):
            cm.conv2d(x, w, padding=1, groups=2)
        assert cm._g_runs.value == runs + 1 and _last(cm)["groups"] == 2 and cm._g_last_kernel.value == sm90a
        with forced(cm, "slices"):
            for _ in range(2):      # the second call on the remembered head
                y = cm.conv2d(x, w, padding=1, groups=2)
                e = _last(cm)
                assert (e["c"], e["k"], e["groups"]) == (8, 12, 1)
                assert (e["ptr_x"], e["ptr_w"], e["ptr_y"], e["ptr_bias"]) == (
                    x.data_ptr() + 8 * eb, w.data_ptr() + 12 * 8 * 9 * eb, y.data_ptr() + 12 * eb, None)
        assert cm._g_runs.value == runs + 5
        # no kernel fuses a bias here: no route runs it, and the C API's refusal says so
        with pytest.raises(cm.Error, match="no conv kernel of this library runs fprop f16 -> f16 \\+ bias"):
            cm.conv2d(x, w, padding=1, groups=2, bias=torch.randn(24).half())
        # bad operands are still the loader's clear refusals, before any route is planned
        with pytest.raises(cm.OperandError, match="must divide"):
            cm.conv2d(x, torch.randn(24, 16, 3, 3).half().to(memory_format=CL), groups=3)
        with pytest.raises(cm.OperandError, match=r"\(K, C/groups, R, S\)"):
            cm.conv2d(x, torch.randn(24, 4, 3, 3).half().to(memory_format=CL), groups=2)
        with pytest.raises(cm.OperandError, match="not channels_last"):
            cm.conv2d(x, w.contiguous(), groups=2, padding=1)
    finally:
        cm._g_ungrouped.value = 0
        cm._CONV_ROUTES.clear()


def test_conv_select_on_other_operands_reports_the_c_apis_route(built):  # noqa: F811
    """Operands that are not torch tensors run as the C API dispatches them: conv_select says whether that is one
    launch (a kernel that takes the groups) or one a group (test_conv_library's stand-in tensors)."""
    import ctypes
    import types

    from test_conv_library import cl
    from test_loader import DT, FakeTensor

    d, out, so = built
    mod = load_module(f"{LIB}_routes_fake", out / "python" / f"{LIB}.py")
    mod.load(str(so))
    mod.tensor_type = FakeTensor
    mod.raw_stream = lambda dev: 0x5000 + dev
    mod.current_device = lambda: 0
    mod.torch_module = types.SimpleNamespace()
    mod._conv_empty = lambda shape, tdt, dev: FakeTensor(shape, tdt, strides=mod._channels_last(shape), device=dev)
    mod.torch_dtypes.update({"f16": DT["float16"], "bf16": DT["bfloat16"], "f32": DT["float32"]})
    ungrouped = ctypes.c_int.in_dll(mod._lib, "g_ungrouped")
    sm90a = [i for i, k in enumerate(mod._CONV_KMODEL) if "fprop_sm90a" in k[0]][0]
    x, w = cl((2, 16, 9, 7)), cl((24, 8, 3, 3))
    try:
        ungrouped.value = (1 << len(mod._CONV_KMODEL)) - 1
        sel = mod.conv_select("fprop", x, w, None, padding=1, groups=2)
        assert sel["route"] == "2 launches (a group each)" and "costs_us" not in sel, sel
        ungrouped.value &= ~(1 << sm90a)
        sel = mod.conv_select("fprop", x, w, None, padding=1, groups=2)
        assert sel["route"] == "grouped kernel" and sel["index"] == sm90a, sel
        assert "route" not in mod.conv_select("fprop", x, cl((24, 16, 3, 3)), None, padding=1)
    finally:
        ungrouped.value = 0
