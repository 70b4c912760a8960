"""Host-side storage of operands, shared by every family: dtype codecs (bf16, fp8 as bit patterns), poison.

Device buffers hold *storage* (the bytes the kernel reads and writes). numpy has no bfloat16 or fp8, so
those are kept as uint16 / uint8 bit patterns and converted here with round-to-nearest-even, the
rounding CUTLASS's NumericConverter uses by default. Everything the verifier compares is decoded to
float64 first.
"""

from __future__ import annotations

import functools

import numpy as np

from emitter.dtypes import DType

# numpy storage dtype per element type
_STORAGE = {
    DType.f16: np.float16,
    DType.bf16: np.uint16,
    DType.f32: np.float32,
    DType.tf32: np.float32,
    DType.f64: np.float64,
    DType.s8: np.int8,
    DType.s32: np.int32,
    DType.e4m3: np.uint8,
    DType.e5m2: np.uint8,
}

# Output poison: a NaN bit pattern a kernel does not produce (CUDA's canonical NaNs are 0x7fff / 0x7fffffff),
# so "still poison" means "never written" and any other NaN means "computed NaN". Integers: 0x7f bytes.
_POISON_BITS = {
    DType.f16: 0x7D5A,
    DType.bf16: 0x7FA5,
    DType.f32: 0x7FA5A5A5,
    DType.tf32: 0x7FA5A5A5,
    DType.f64: 0x7FF4A5A5A5A5A5A5,
    DType.s8: 0x7F,
    DType.s32: 0x7F7F7F7F,
    DType.e4m3: 0x7F,   # the only NaN of e4m3fn (with 0xff)
    DType.e5m2: 0x7D,
}

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def storage_dtype(dt: DType) -> np.dtype:
    return np.dtype(_STORAGE[dt])


def poison_value(dt: DType) -> np.ndarray:
    """One element of poison in storage form (a 0-d array)."""
    bits = np.array(_POISON_BITS[dt], dtype=_UINT[dt.bytes])
    return bits.view(storage_dtype(dt)).reshape(())


def bits_of(storage: np.ndarray) -> np.ndarray:
    """Storage reinterpreted as unsigned integers of the same width (for bit-exact comparison)."""
    return storage.view(_UINT[storage.dtype.itemsize])


# ---------------------------------------------------------------------------------------------- fp8
@functools.lru_cache(maxsize=None)
def _fp8_table(dt: DType) -> np.ndarray:
    """float64 value of every fp8 code (NaN for NaN codes)."""
    exp_bits, man_bits, bias = (4, 3, 7) if dt is DType.e4m3 else (5, 2, 15)
    vals = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if dt is DType.e4m3 and e == 0xF and m == 0x7:
            vals[code] = np.nan
            continue
        if dt is DType.e5m2 and e == 0x1F:
            vals[code] = np.nan if m else sign * np.inf
            continue
        if e == 0:
            vals[code] = sign * m * 2.0 ** (1 - bias - man_bits)
        else:
            vals[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return vals


@functools.lru_cache(maxsize=None)
def _fp8_positive(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    table = _fp8_table(dt)
    codes = np.arange(0x80)
    vals = table[:0x80]
    ok = np.isfinite(vals)
    return vals[ok], codes[ok]


def _encode_fp8(x: np.ndarray, dt: DType) -> np.ndarray:
    """Round to nearest even, saturating to the largest finite value (cvt.rn.satfinite); NaN -> NaN code."""
    x = np.asarray(x, dtype=np.float64)
    vals, codes = _fp8_positive(dt)
    a = np.minimum(np.abs(x), vals[-1])
    hi = np.clip(np.searchsorted(vals, a, side="left"), 0, len(vals) - 1)
    lo = np.clip(hi - 1, 0, len(vals) - 1)
    d_hi = vals[hi] - a
    d_lo = a - vals[lo]
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (codes[lo] % 2 == 0))
    code = np.where(pick_lo, codes[lo], codes[hi]).astype(np.uint8)
    code = np.where(np.signbit(x), code | np.uint8(0x80), code).astype(np.uint8)
    nan_code = 0x7F if dt is DType.e4m3 else 0x7E
    return np.where(np.isnan(x), np.uint8(nan_code), code).astype(np.uint8)


# ---------------------------------------------------------------------------------------------- bf16
def _encode_bf16(x: np.ndarray) -> np.ndarray:
    f = np.asarray(x).astype(np.float32)
    u = f.view(np.uint32)
    r = (u >> 16) & 1
    r += 0x7FFF
    r += u                      # finite values cannot overflow 32 bits here; NaN is fixed below
    out = (r >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def _decode_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---------------------------------------------------------------------------------------------- public
def encode(x: np.ndarray, dt: DType) -> np.ndarray:
    """float64 values -> storage array of `dt` (round to nearest even; integers round and saturate)."""
    x = np.asarray(x, dtype=np.float64)
    if dt is DType.bf16:
        return _encode_bf16(x)
    if dt.is_fp8:
        return _encode_fp8(x, dt)
    if dt in (DType.s8, DType.s32):
        info = np.iinfo(_STORAGE[dt])
        return np.clip(np.rint(np.nan_to_num(x)), info.min, info.max).astype(_STORAGE[dt])
    return x.astype(_STORAGE[dt])


def decode(storage: np.ndarray, dt: DType) -> np.ndarray:
    """storage array of `dt` -> float64 values."""
    with np.errstate(invalid="ignore"):      # signalling-NaN poison converts quietly
        if dt is DType.bf16:
            return _decode_bf16(storage)
        if dt.is_fp8:
            return _fp8_table(dt)[np.asarray(storage).astype(np.int64)]
        return np.asarray(storage).astype(np.float64)


def quantize(x: np.ndarray, dt: DType) -> np.ndarray:
    """Values exactly representable in `dt` (nearest), as float64. tf32 keeps 10 mantissa bits."""
    if dt is DType.tf32:
        f = np.asarray(x, dtype=np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        r = ((u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32)
        return r.view(np.float32).astype(np.float64)
    return decode(encode(x, dt), dt)


def exact_int_limit(dt: DType) -> int:
    """Largest n such that every integer in [-n, n] is exactly representable in `dt`."""
    return {
        DType.f16: 2048, DType.bf16: 256, DType.f32: 1 << 24, DType.tf32: 2048, DType.f64: 1 << 53,
        DType.s8: 127, DType.s32: (1 << 31) - 1, DType.e4m3: 16, DType.e5m2: 8,
    }[dt]
