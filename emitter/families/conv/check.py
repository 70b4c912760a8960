"""Where a conv output goes wrong, and whether that is where a planted fault puts it.

A whole-output error norm says that an output is wrong, not why: a kernel that garbles its padding and one
that ignores its stride both fail it. Each planted fault (fake.py's FAKE_FAULTS, runner.py's PLANTED) leaves
its own mark on the output, and `signature_misses` checks the verdict for that mark:

  wrong_padding        the padding taps read (fprop, wgrad) or write (dgrad) the neighbouring memory instead of
                       zeros, as a kernel without the halo's bounds check does: only output positions whose
                       window reaches into the padding go wrong (border rows and columns; for wgrad the filter
                       taps that ever see the padding), the interior stays right
  swapped_filter_axes  the filter read (or, for wgrad, written) with R and S exchanged: wgrad's diagonal taps
                       (r == s) stay right and every other tap is wrong; fprop/dgrad equal the convolution with
                       the transposed filter (the fault model's reference)
  stride_ignored       the kernel steps its window by 1: fprop's output position (0, 0) stays right, every
                       other one is wrong; dgrad leaves the input rows past the stride-1 window's reach at zero
                       (the skipped rows); every op equals the stride-1 convolution (the fault model)
  row_short            the last output row (wgrad: the last filters) never written, everything else right
  group_offset         (grouped problems) the group's input-channel offset never applied: every group reads group
                       0's input channels, so fprop's output channels (wgrad's filters) of group 0 stay right and
                       those of every other group go wrong; dgrad writes every group's gradient into group 0's
                       channels

`fault_model_reference` computes the float64 output a kernel with the fault produces, from transformed
inputs and reference.conv_numpy (fake.py computes the faults inside its own arithmetic instead): a failing
case that matches it failed for the fault's reason and no other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from emitter.families.conv import reference as _reference
from emitter.families.conv.reference import MAP_LIMIT, element_mismatches, locate  # noqa: F401 (check's names)
from emitter.families.conv.problem import ConvProblem

FAULTS = ("wrong_padding", "swapped_filter_axes", "stride_ignored", "row_short")   # any problem
GROUP_FAULTS = ("group_offset",)                                                      # grouped problems only


def fault_name(kind: str) -> str:
    """The fault without the fake backend's family prefix (conv_wrong_padding -> wrong_padding)."""
    return kind[len("conv_"):] if kind.startswith("conv_") else kind


# ------------------------------------------------------------------------------------------------ geometry
def padding_reach(op: str, p: ConvProblem) -> tuple[set[int], set[int]]:
    """Axis-2 and axis-3 indices of the output that a halo fault can reach: fprop, the output rows/columns
    whose window overlaps the padding; wgrad, the filter taps that overlap it at some output position; dgrad,
    the input rows/columns the padding's neighbouring memory aliases (row -i of an image is row H - i of the
    one before, row H + i - 1 row i - 1 of the next; columns the same within a row)."""
    z, pp, q = p.output_extents()
    (_, fh, fw), (_, bh, bw) = p.pad_front, p.pad_back
    _, sh, sw = p.stride
    _, dh, dw = p.dilation
    if op == "fprop":
        rows = {i for i in range(pp) if i * sh - fh < 0 or i * sh - fh + (p.r - 1) * dh >= p.h}
        cols = {j for j in range(q) if j * sw - fw < 0 or j * sw - fw + (p.s - 1) * dw >= p.w}
        return rows, cols
    if op == "wgrad":
        rows = {r for r in range(p.r) if any(not 0 <= i * sh - fh + r * dh < p.h for i in range(pp))}
        cols = {s for s in range(p.s) if any(not 0 <= j * sw - fw + s * dw < p.w for j in range(q))}
        return rows, cols
    rows = set(range(min(bh, p.h))) | set(range(max(p.h - fh, 0), p.h))
    cols = set(range(min(bw, p.w))) | set(range(max(p.w - fw, 0), p.w))
    return rows, cols


def halo_source(shape: tuple[int, ...], pad_front: tuple[int, int, int], pad_back: tuple[int, int, int]) -> np.ndarray:
    """For an NDHWC tensor of `shape` grown by the padding: the flat (n, d, h, w) row of the original tensor
    that each grown position holds when the padding is read from memory instead of zeros (-1: before or past
    the buffer, read as zero). Inside the image it is the element itself."""
    n_, d_, h_, w_ = shape[:4]
    (fd, fh, fw), (bd, bh, bw) = pad_front, pad_back
    n, d, h, w = np.meshgrid(np.arange(n_), np.arange(-fd, d_ + bd), np.arange(-fh, h_ + bh), np.arange(-fw, w_ + bw),
                             indexing="ij")
    flat = ((n * d_ + d) * h_ + h) * w_ + w
    return np.where((flat >= 0) & (flat < n_ * d_ * h_ * w_), flat, -1)


def grow_with_halo(x: np.ndarray, p: ConvProblem) -> np.ndarray:
    """x (NDHWC, any dtype) grown by p's padding, the halo holding what memory holds around it."""
    src = halo_source(x.shape, p.pad_front, p.pad_back)
    rows = x.reshape(-1, x.shape[-1])
    out = np.zeros(src.shape + (x.shape[-1],), dtype=x.dtype)
    ok = src >= 0
    out[ok] = rows[src[ok]]
    return out


def fold_halo(x_big: np.ndarray, p: ConvProblem) -> np.ndarray:
    """The adjoint of grow_with_halo: a gradient over the grown input folded back onto the image, each halo
    position added into the memory it aliases (dropped before or past the buffer)."""
    shape = p.shape("x")
    src = halo_source(shape, p.pad_front, p.pad_back)
    out = np.zeros((int(np.prod(shape[:4])), shape[4]))
    ok = src >= 0
    np.add.at(out, src[ok], x_big[ok])
    return out.reshape(shape)


def unpadded(p: ConvProblem) -> ConvProblem:
    """p with its padding made part of the image (what a halo fault is launched as)."""
    return replace(p, d=p.d + p.pad_front[0] + p.pad_back[0], h=p.h + p.pad_front[1] + p.pad_back[1],
                   w=p.w + p.pad_front[2] + p.pad_back[2], pad_front=(0, 0, 0), pad_back=(0, 0, 0))


# ------------------------------------------------------------------------------------------------ fault model
def fault_model_reference(fault: str, cfg: Mapping[str, Any], p: ConvProblem, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """The float64 output (epilogue applied) of a kernel with `fault`, from transformed inputs."""
    fault = fault_name(fault)
    op = cfg["op"]
    x, w, y = values["x"], values["w"], values["y"]
    if fault == "wrong_padding":
        big = unpadded(p)
        if op == "dgrad":
            acc = fold_halo(_reference.conv_numpy(op, big, x, w, y), p)
        else:
            acc = _reference.conv_numpy(op, big, grow_with_halo(x, p), w, y)
    elif fault == "swapped_filter_axes":
        if p.r != p.s:
            raise ValueError(f"swapped_filter_axes needs a square filter (R = S), not R={p.r} S={p.s}")
        if op == "wgrad":
            acc = _reference.conv_numpy(op, p, x, w, y).transpose(0, 1, 3, 2, 4)
        else:
            acc = _reference.conv_numpy(op, p, x, w.transpose(0, 1, 3, 2, 4), y)
    elif fault == "stride_ignored":
        one = replace(p, stride=(1, 1, 1))
        z, pp, q = p.output_extents()
        if op == "fprop":
            acc = _reference.conv_numpy(op, one, x, w, y)[:, :z, :pp, :q]
        else:                       # dy of the strided geometry, zero-padded to the stride-1 one
            dy = np.zeros(one.shape("y"))
            dy[:, :z, :pp, :q] = y
            acc = _reference.conv_numpy(op, one, x, w, dy)
    elif fault == "group_offset":
        if p.groups < 2:
            raise ValueError("group_offset needs a grouped problem (groups > 1)")
        cg = p.c // p.groups
        if op == "dgrad":
            one = _reference.conv_numpy(op, p, x, w, y)
            acc = np.zeros_like(one)
            acc[..., :cg] = one.reshape(one.shape[:4] + (p.groups, cg)).sum(axis=4)
        else:                       # every group's slice of x is group 0's
            acc = _reference.conv_numpy(op, p, np.tile(x[..., :cg], (1, 1, 1, 1, p.groups)), w, y)
    else:
        raise ValueError(f"no fault model for {fault!r} (row_short is checked by its unwritten elements)")
    return _reference.epilogue(dict(cfg), p, acc, values.get("source"), values.get("bias"))


def signature_misses(fault: str, op: str, p: ConvProblem, verdict: Mapping[str, Any],
                     model: Mapping[str, Any] | None = None) -> list[str]:
    """Why `verdict` (the case's comparison with the true reference, with locate()'s fields) does not show
    `fault`'s own mark; `model` is the comparison with fault_model_reference (not for row_short). Empty: the
    fault was caught, and for its own reason."""
    fault = fault_name(fault)
    miss: list[str] = []
    if verdict.get("status") != "FAILED":
        return [f"status {verdict.get('status')}, not FAILED"]
    if fault == "row_short":
        rows, cols, outer = verdict.get("unwritten_rows"), verdict.get("unwritten_cols"), verdict.get("unwritten_outer")
        if op == "wgrad":
            if not outer or outer != list(range(outer[0], p.k)):
                miss.append(f"unwritten filters {outer}, not the last ones of {p.k}")
        else:
            last = (p.output_extents()[1] if op == "fprop" else p.h) - 1
            width = p.output_extents()[2] if op == "fprop" else p.w
            if rows != [last]:
                miss.append(f"unwritten rows {rows}, not the last row {last}")
            if cols != list(range(width)):
                miss.append("the last row is not unwritten in every column")
        if verdict.get("mismatches", 0):
            miss.append(f"{verdict['mismatches']} written elements wrong besides the short row")
        return miss
    if verdict.get("unwritten", 0):
        miss.append(f"{verdict['unwritten']} elements unwritten: {fault} writes every element")
    bad_map = np.asarray(verdict.get("bad_map", []), dtype=int)
    if not verdict.get("mismatches", 0) or bad_map.size == 0:
        return miss + ["no element-wise mismatch located (or the output too large for a map)"]
    if fault == "wrong_padding":
        rows, cols = padding_reach(op, p)
        inner = [(i, j) for i, j in zip(*np.nonzero(bad_map)) if i not in rows and j not in cols]
        if inner:
            miss.append(f"mismatches away from the padding's reach at {inner[:4]} (reach: rows {sorted(rows)}, "
                        f"cols {sorted(cols)})")
    elif fault == "swapped_filter_axes" and op == "wgrad":
        diag = [int(bad_map[i, i]) for i in range(min(bad_map.shape))]
        off = [(i, j) for i in range(bad_map.shape[0]) for j in range(bad_map.shape[1]) if i != j and not bad_map[i, j]]
        if any(diag):
            miss.append(f"diagonal taps (r == s) wrong: {diag}")
        if off:
            miss.append(f"off-diagonal taps right: {off}")
    elif fault == "stride_ignored" and op == "fprop":
        if bad_map[0, 0]:
            miss.append("output position (0, 0) wrong: a stride-1 window starts there too")
        right = [(i, j) for i in range(bad_map.shape[0]) for j in range(bad_map.shape[1])
                 if (i, j) != (0, 0) and not bad_map[i, j]
                 and ((i > 0 and p.stride[1] > 1) or (j > 0 and p.stride[2] > 1))]
        if right:
            miss.append(f"positions a stride-1 window misses are right: {right[:4]}")
    elif fault == "group_offset" and op in ("fprop", "wgrad"):
        kg = p.k // p.groups
        bad = set(verdict.get("bad_channels" if op == "fprop" else "bad_outer", []))
        if bad & set(range(kg)):
            miss.append(f"group 0's output channels wrong ({sorted(bad & set(range(kg)))[:4]}): its offset is 0 anyway")
        wrong_groups = {k // kg for k in bad}
        if wrong_groups != set(range(1, p.groups)):
            miss.append(f"groups with wrong output channels {sorted(wrong_groups)}, not every group but the first")
    elif fault == "stride_ignored" and op == "dgrad":
        z, pp, q = p.output_extents()
        reach = (pp - 1) - p.pad_front[1] + (p.r - 1) * p.dilation[1]     # last input row a stride-1 dy reaches
        skipped = set(range(reach + 1, p.h))
        if skipped and not skipped <= set(verdict.get("bad_rows", [])):
            miss.append(f"rows past the stride-1 reach ({sorted(skipped)}) not all wrong")
    if model is not None and model.get("status") != "PASSED":
        miss.append(f"the output is not the fault model's: {model.get('reason')}")
    return miss


__all__ = ["FAULTS", "GROUP_FAULTS", "element_mismatches", "locate", "padding_reach", "grow_with_halo", "fold_halo", "unpadded",
           "fault_model_reference", "signature_misses", "fault_name"]
