"""The fake backend's convolution: computes a conv instance's output from the storage buffers without a GPU,
written independently of reference.py (no shared arithmetic or layout code: this one builds an explicit im2col
matrix by index arithmetic per output element and multiplies matrices, the reference slides windows), so a bug in
one cannot cancel in the other. Planted faults (FAKE_FAULTS) imitate kernel bugs verification must catch:

  conv_wrong_padding        no bounds check on the halo: a tap in the padding reads (fprop, wgrad) or, for
                            dgrad, adds into the memory at its flat NDHW offset (the neighbouring row, column
                            or image; zero before or past the buffer) instead of being zero / dropped
  conv_swapped_filter_axes  the filter read (wgrad: written) with R and S exchanged; a square filter only
  conv_stride_ignored       the window stepped by 1 instead of the stride
  conv_row_short            the last output row (wgrad: the last filter) never written
  conv_group_offset         grouped problems: the group's channel offset never applied, so every group reads
                            (dgrad: writes, wgrad: correlates with) the input channels of group 0

An sm90a `stride_support: strided` dgrad (phased_dgrad) is computed as its kernel computes it: one unit-stride dgrad a
stride phase (sm90a.dgrad_phase_plan: filter view w[r0::s], dx view dx[a::s]), the dx no phase writes left at 0,
so a wrong phase plan (a tap, a row or a phase missed) fails on CPU.

Grouped problems (p.groups > 1) are computed as the ungrouped convolution with a block-diagonal filter (zero
outside each group's input channels), not by slicing groups as reference.py does.

check.py says where each one shows in the output (its signature)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

FAKE_FAULTS = ("conv_wrong_padding", "conv_swapped_filter_axes", "conv_stride_ignored", "conv_row_short",
               "conv_group_offset")


def _geometry(p: Any, faults: Mapping[str, Any]) -> dict[str, Any]:
    g = {"pf": list(p.pad_front), "st": list(p.stride), "dl": list(p.dilation),
         "halo_from_memory": "conv_wrong_padding" in faults}
    if "conv_stride_ignored" in faults:
        g["st"] = [1, 1, 1]
    return g


def _halo_alias(n_i, di, hi, wi, shape: tuple[int, ...], taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(which taps, flat NDHW offset) of the padding taps whose flat offset lands inside the buffer: the memory
    a kernel without the halo's bounds check touches."""
    N, D, H, W = shape[:4]
    flat = ((n_i * D + di) * H + hi) * W + wi
    hit = ~taps & (flat >= 0) & (flat < N * D * H * W)
    return hit, flat[hit]


def _im2col(x5: np.ndarray, p: Any, g: dict[str, Any], outs: tuple[int, int, int]) -> np.ndarray:
    """rows: (n, z, p, q); columns: (t, r, s, c); zero where the tap falls in the padding."""
    N, D, H, W, C = x5.shape
    Z, P, Q = outs
    rows = N * Z * P * Q
    cols = np.zeros((rows, p.t * p.r * p.s * C))
    n_i, z_i, p_i, q_i = np.meshgrid(np.arange(N), np.arange(Z), np.arange(P), np.arange(Q), indexing="ij")
    n_i, z_i, p_i, q_i = (a.reshape(-1) for a in (n_i, z_i, p_i, q_i))
    col = 0
    for tt in range(p.t):
        for rr in range(p.r):
            for ss in range(p.s):
                di = z_i * g["st"][0] - g["pf"][0] + tt * g["dl"][0]
                hi = p_i * g["st"][1] - g["pf"][1] + rr * g["dl"][1]
                wi = q_i * g["st"][2] - g["pf"][2] + ss * g["dl"][2]
                ok = (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
                vals = np.zeros((rows, C))
                vals[ok] = x5[n_i[ok], di[ok], hi[ok], wi[ok], :]
                if g["halo_from_memory"]:
                    hit, flat = _halo_alias(n_i, di, hi, wi, x5.shape, ok)
                    vals[hit] = x5.reshape(-1, C)[flat]
                cols[:, col:col + C] = vals
                col += C
    return cols


def _swapped_filter(faults: Mapping[str, Any], w_shape: tuple[int, ...]) -> bool:
    if "conv_swapped_filter_axes" not in faults:
        return False
    if w_shape[2] != w_shape[3]:
        from emitter.kit.failures import FakeFaultError

        raise FakeFaultError(f"conv_swapped_filter_axes needs a square filter (R = S), this problem's is "
                             f"R={w_shape[2]} S={w_shape[3]}: exchanging them would not fit the filter; plant it on "
                             f"a problem with R = S (its `problem` glob)")
    return True


def _block_columns(p: Any, faults: Mapping[str, Any]) -> list[int]:
    """The first input channel each output channel's group reads (the group offset; 0 for all with the
    conv_group_offset fault)."""
    kg, cg = p.k // p.groups, p.c // p.groups
    return [0 if "conv_group_offset" in faults else (k // kg) * cg for k in range(p.k)]


def _grouped(op: str, p: Any, x: np.ndarray, w: np.ndarray, y: np.ndarray, faults: Mapping[str, Any]) -> np.ndarray:
    from dataclasses import replace

    cg = p.c // p.groups
    starts = _block_columns(p, faults)
    full = replace(p, groups=1)
    faults = {k: v for k, v in faults.items() if k != "conv_group_offset"}    # done by the block columns
    if op == "wgrad":
        wide = fake_conv(op, full, x, np.zeros(full.shape("w")), y, faults)       # K x T x R x S x C
        return np.stack([wide[k, ..., c0:c0 + cg] for k, c0 in enumerate(starts)])
    wide = np.zeros(full.shape("w"))
    for k, c0 in enumerate(starts):
        wide[k, ..., c0:c0 + cg] = w[k]
    return fake_conv(op, full, x, wide, y, faults)


def fake_conv(op: str, p: Any, x: np.ndarray, w: np.ndarray, y: np.ndarray, faults: Mapping[str, Any] = {}) -> np.ndarray:
    """float64 raw convolution of op on 5-D arrays, with planted faults."""
    if getattr(p, "groups", 1) > 1:
        return _grouped(op, p, x, w, y, faults)
    if "conv_group_offset" in faults:
        from emitter.kit.failures import FakeFaultError

        raise FakeFaultError("conv_group_offset needs a grouped problem (groups > 1): an ungrouped convolution has no "
                             "group offset to get wrong; plant it on a grouped instance's problem")
    g = _geometry(p, faults)
    outs = p.output_extents()
    swapped = _swapped_filter(faults, (p.k, p.t, p.r, p.s, p.c))
    wf = w.transpose(0, 1, 3, 2, 4) if (swapped and op != "wgrad") else w
    wmat = wf.reshape(wf.shape[0], -1)                                   # K x (T R S C)
    if op == "fprop":
        out = (_im2col(x, p, g, outs) @ wmat.T).reshape(p.shape("y"))
    elif op == "wgrad":
        ymat = y.reshape(-1, y.shape[-1])                                 # (N Z P Q) x K
        out = (ymat.T @ _im2col(x, p, g, outs)).reshape(p.shape("w"))
        if swapped:
            out = out.transpose(0, 1, 3, 2, 4).copy()        # the gradient written with R and S exchanged
    else:
        # dgrad is the adjoint of fprop's im2col: scatter dy @ w back through the same index map
        ymat = y.reshape(-1, y.shape[-1])
        colgrad = ymat @ wmat                                             # (N Z P Q) x (T R S C)
        out = np.zeros(p.shape("x"))
        N, D, H, W, C = out.shape
        Z, P, Q = outs
        n_i, z_i, p_i, q_i = (a.reshape(-1) for a in np.meshgrid(np.arange(N), np.arange(Z), np.arange(P),
                                                                  np.arange(Q), indexing="ij"))
        col = 0
        for tt in range(p.t):
            for rr in range(p.r):
                for ss in range(p.s):
                    di = z_i * g["st"][0] - g["pf"][0] + tt * g["dl"][0]
                    hi = p_i * g["st"][1] - g["pf"][1] + rr * g["dl"][1]
                    wi = q_i * g["st"][2] - g["pf"][2] + ss * g["dl"][2]
                    ok = (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
                    np.add.at(out, (n_i[ok], di[ok], hi[ok], wi[ok]), colgrad[ok, col:col + C])
                    if g["halo_from_memory"]:
                        hit, flat = _halo_alias(n_i, di, hi, wi, out.shape, ok)
                        np.add.at(out.reshape(-1, C), flat, colgrad[hit, col:col + C])
                    col += C
    return out


def phased_dgrad(p: Any, w: np.ndarray, y: np.ndarray, faults: Mapping[str, Any] = {}) -> np.ndarray:
    """dgrad of a strided problem through the stride phases of sm90a's strided dgrad (each a unit-stride dgrad by
    fake_conv on the phase's views; the dx no tap reaches stays 0, the epilogue adds beta * source after)."""
    from dataclasses import replace

    from emitter.families.conv.sm90a import dgrad_phase_plan

    if "conv_stride_ignored" in faults:     # the stride dropped: no phases, the plain window stepped by 1
        return fake_conv("dgrad", p, None, w, y, faults)
    out = np.zeros(p.shape("x"))
    for ph in dgrad_phase_plan(p):
        if not ph["runs"]:
            continue
        (r0d, r0h, r0w), (md, mh, mw), st = ph["r0"], ph["taps"], p.stride
        wv = w[:, r0d::st[0], r0h::st[1], r0w::st[2]][:, :md, :mh, :mw]
        tc = ph["conv"]
        q = replace(p, d=tc[0], h=tc[1], w=tc[2], t=md, r=mh, s=mw, pad_front=ph["pad"], pad_back=ph["pad_back"],
                    stride=(1, 1, 1))
        assert q.output_extents() == p.output_extents(), (p, ph)    # dy is read whole by every phase
        (ad, ah, aw) = ph["a"]
        view = out[:, ad::st[0], ah::st[1], aw::st[2]]
        view[:, :tc[0], :tc[1], :tc[2]] = fake_conv("dgrad", q, None, wv, y, faults)
    return out


def row_short_mask(op: str, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of the output a kernel that stops one output row short never writes."""
    return (slice(None), slice(None), slice(shape[2] - 1, None)) if op != "wgrad" else (slice(shape[0] - 1, None),)
