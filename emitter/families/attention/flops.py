"""Useful floating-point operations of one attention launch, counted exactly over the unmasked pairs:
each visible (query row, key) pair costs 2*D (a multiply-add per element of q . k) plus 2*Dv (p * v into O),
per query head. Full attention: 4*B*H*Sq*Sk*D when Dv = D; causal counts only the pairs the mask leaves
(about half; exactly Sq*(Sq+1)/2 for top-left with Sq = Sk). Softmax exponentials are not counted (the
convention of FlashAttention's and cuDNN's TFLOP/s figures)."""

from __future__ import annotations

from emitter.families.attention.problem import AttentionProblem


def visible_pairs(mask: str, sq: int, sk: int) -> int:
    """Number of (i, j) pairs with key j visible from query row i."""
    if mask == "none":
        return sq * sk
    offset = 0 if mask == "causal_top_left" else sk - sq
    # row i sees min(sk, max(0, i + 1 + offset)) keys: sum in closed form over the three regions
    total = 0
    lo = max(0, -offset)                    # rows before lo see nothing
    hi = min(sq, max(lo, sk - 1 - offset))  # rows in [lo, hi) see i + 1 + offset < sk keys
    if hi > lo:
        n = hi - lo
        first = lo + 1 + offset
        total += n * first + n * (n - 1) // 2
    total += max(0, sq - max(hi, lo)) * sk  # the remaining rows see every key
    return total


def flops(inst, p: AttentionProblem) -> int:
    pairs = sum(visible_pairs(inst.mask.value, sq, sk) for sq, sk in p.lengths())
    return 2 * pairs * (p.head_dim + p.head_dim_v) * p.heads_q


def bytes_moved(inst, p: AttentionProblem) -> int:
    """Compulsory bytes: Q, K, V read once, O written once (LSE f32 when on)."""
    e = p.elements()
    size = inst.dtype.bytes
    return (e["q"] + e["k"] + e["v"] + e["o"]) * size + (e["lse"] * 4 if inst.lse else 0)


__all__ = ["flops", "visible_pairs", "bytes_moved"]
