"""Device memory for one measurement: PyCUDA allocations freed together, filled with random values that are never all
zeros, or with an output's poison pattern. Every family's profile operand sets live in a DeviceArena. PyCUDA is
imported when an arena is made, never at import."""

from __future__ import annotations

from typing import Any

import numpy as np

_RNG_CHUNK_ELEMS = 1 << 22      # 4 Mi random elements generated on the host, tiled into device buffers


class DeviceArena:
    """PyCUDA allocations for one measurement, freed together; random fills that are never all zeros."""

    def __init__(self, seed: int = 0) -> None:
        import pycuda.driver as drv

        self.drv = drv
        self.allocations: list[Any] = []
        self.rng = np.random.default_rng(seed)
        self._chunks: dict[str, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        buf = self.drv.mem_alloc(max(int(nbytes), 1))
        self.allocations.append(buf)
        return int(buf)

    def _random_chunk(self, dtype: Any) -> np.ndarray:
        """Host storage of random values of `dtype` (emitter.dtypes.DType), never zero-filled."""
        from emitter.kit.hostdata import encode

        key = dtype.yaml
        if key not in self._chunks:
            if dtype.is_float:
                vals = self.rng.uniform(-1.0, 1.0, _RNG_CHUNK_ELEMS)
                if dtype.is_fp8:
                    vals *= 4.0
            else:
                vals = self.rng.integers(-8, 9, _RNG_CHUNK_ELEMS).astype(np.float64)
            self._chunks[key] = np.ascontiguousarray(encode(vals, dtype))
        return self._chunks[key]

    def fill_random(self, ptr: int, dtype: Any, count: int) -> None:
        chunk = self._random_chunk(dtype)
        itemsize = chunk.dtype.itemsize
        done = 0
        offset = int(self.rng.integers(0, len(chunk) // 2))   # sets differ from each other
        while done < count:
            n = min(count - done, len(chunk) - offset)
            self.drv.memcpy_htod(ptr + done * itemsize, chunk[offset:offset + n])
            done += n
            offset = 0

    def fill_bytes(self, ptr: int, pattern: np.ndarray, count: int) -> None:
        """Fill `count` elements with one element's bit pattern (the output poison)."""
        bits = pattern.reshape(-1)[:1]
        width = bits.dtype.itemsize
        if width == 1:
            self.drv.memset_d8(ptr, int(bits.view(np.uint8)[0]), count)
        elif width == 2:
            self.drv.memset_d16(ptr, int(bits.view(np.uint16)[0]), count)
        elif width == 4:
            self.drv.memset_d32(ptr, int(bits.view(np.uint32)[0]), count)
        else:
            host = np.full(count, bits[0], dtype=bits.dtype)
            self.drv.memcpy_htod(ptr, host)

    def to_host(self, ptr: int, storage_dtype: np.dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype=storage_dtype)
        self.drv.memcpy_dtoh(out, ptr)
        return out

    def free(self) -> None:
        for a in self.allocations:
            try:
                a.free()
            except Exception:
                pass
        self.allocations.clear()


def free_memory() -> int | None:
    try:
        import pycuda.driver as drv

        free, _total = drv.mem_get_info()
        return int(free)
    except Exception:
        return None
