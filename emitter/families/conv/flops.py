"""Useful floating-point operations of one convolution: 2 * N * K * Z*P*Q * C/groups * T*R*S (the same count for
fprop, dgrad and wgrad -- the three are the same multiply-adds arranged differently), and bytes moved."""

from __future__ import annotations


def conv_flops(p) -> int:
    z, pp, q = p.output_extents()
    return 2 * p.n * p.k * z * pp * q * (p.c // getattr(p, "groups", 1)) * p.t * p.r * p.s


def conv_bytes(p, element_bytes: int) -> int:
    """The fewest bytes one launch moves: each operand read once, the output written once."""
    z, pp, q = p.output_extents()
    x = p.n * p.d * p.h * p.w * p.c
    w = p.k * p.t * p.r * p.s * (p.c // getattr(p, "groups", 1))
    y = p.n * z * pp * q * p.k
    return (x + w + y) * element_bytes
