"""cuDNN through torch, called the way a torch model's training step calls it: the one conv baseline.

    fprop   F.conv2d / F.conv3d(x, w)
    dgrad   torch.ops.aten.convolution_backward(dy, x, w, ..., output_mask=[True, False, False])[0]
    wgrad   torch.ops.aten.convolution_backward(dy, x, w, ..., output_mask=[False, True, False])[1]

aten.convolution_backward is what autograd runs for a convolution's backward, on the real (channels_last) x and
w. torch.nn.grad.conv2d_input / conv2d_weight are not used: they hand cuDNN a zero-strided stand-in
(`new_empty(1).expand(...)`) for the tensor they do not need, which sends cuDNN down a slow non-channels_last
path (1.3x to 13x slower dgrad on an H100) and made emitter's dgrad look 3x faster than cuDNN when it was 0.67x.

`emitter profile` (families/conv/profile.py), benchmarks/conv_bench.py and the GPU test that guards this
(tests/conv/test_conv_baseline_gpu.py) all call `torch_conv` below.
"""

from __future__ import annotations

from typing import Any, Sequence

OUTPUT_MASK = {"dgrad": (True, False, False), "wgrad": (False, True, False)}


def call_name(op: str, dims: int = 2) -> str:
    """What the baseline calls, as a torch user would write it (for provider strings and docs)."""
    if op == "fprop":
        return f"F.conv{dims}d"
    mask = ", ".join(str(m) for m in OUTPUT_MASK[op])
    return f"aten.convolution_backward(output_mask=[{mask}])"


def _tup(v: Any, dims: int) -> list[int]:
    return [int(v)] * dims if isinstance(v, int) else [int(e) for e in v]


def torch_conv(torch: Any, op: str, x: Any, w: Any, y: Any, *, stride: Sequence[int] | int = 1,
               padding: Sequence[int] | int = 0, dilation: Sequence[int] | int = 1, groups: int = 1) -> Any:
    """The op's result as torch computes it from the real tensors: x (N, C, [D,] H, W), w (K, C/groups, [T,] R, S)
    and y / dy (N, K, [Z,] P, Q), each in the memory format the caller holds (channels_last for a model).

    dgrad reads only x's shape and memory format, wgrad only w's; both are still the caller's real tensors, as
    in autograd, never stand-ins."""
    dims = x.dim() - 2
    if dims not in (2, 3):
        raise ValueError(f"x must be 4-D or 5-D (N, C, [D,] H, W); got {x.dim()}-D")
    st, pad, dil = _tup(stride, dims), _tup(padding, dims), _tup(dilation, dims)
    if op == "fprop":
        import torch.nn.functional as F

        return (F.conv2d if dims == 2 else F.conv3d)(x, w, stride=st, padding=pad, dilation=dil, groups=groups)
    if op not in OUTPUT_MASK:
        raise ValueError(f"op must be fprop, dgrad or wgrad; got {op!r}")
    gx, gw, _ = torch.ops.aten.convolution_backward(y, x, w, None, st, pad, dil, False, [0] * dims, groups,
                                                    list(OUTPUT_MASK[op]))
    return gx if op == "dgrad" else gw
