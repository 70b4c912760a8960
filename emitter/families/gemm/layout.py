"""Strided (batch, rows, cols) matrices in flat storage: GEMM's operand layouts (leading dimension, batch
stride), used by its input generation, its profile workload and its checks (never by its fake backend,
which reads storage with its own index arithmetic: emitter/families/gemm/fake.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# ---------------------------------------------------------------------------------------------- matrices
@dataclass(frozen=True)
class MatrixLayout:
    """A (batch, rows, cols) logical matrix stored with a leading dimension and a batch stride (elements)."""

    rows: int
    cols: int
    row_major: bool
    ld: int
    batch: int = 1
    batch_stride: int = 0

    @property
    def packed_ld(self) -> int:
        return self.cols if self.row_major else self.rows

    def elements(self) -> int:
        """Storage elements needed (the last batch's last element + 1)."""
        if self.rows == 0 or self.cols == 0:
            return 0
        if self.row_major:
            one = (self.rows - 1) * self.ld + self.cols
        else:
            one = (self.cols - 1) * self.ld + self.rows
        return (self.batch - 1) * self.batch_stride + one

    def index(self) -> np.ndarray:
        """Flat storage index of every logical element, shape (batch, rows, cols)."""
        b = np.arange(self.batch, dtype=np.int64)[:, None, None] * self.batch_stride
        r = np.arange(self.rows, dtype=np.int64)[None, :, None]
        c = np.arange(self.cols, dtype=np.int64)[None, None, :]
        return b + (r * self.ld + c if self.row_major else r + c * self.ld)

    @property
    def packed(self) -> bool:
        """Storage is exactly the matrices back to back (no padding): gather/scatter are reshapes."""
        return self.ld == self.packed_ld and (self.batch == 1 or self.batch_stride == self.rows * self.cols)

    def _view(self, storage: np.ndarray) -> np.ndarray:
        n = self.batch * self.rows * self.cols
        if self.row_major:
            return storage[:n].reshape(self.batch, self.rows, self.cols)
        return storage[:n].reshape(self.batch, self.cols, self.rows).transpose(0, 2, 1)

    def gather(self, storage: np.ndarray) -> np.ndarray:
        if self.packed:
            return np.ascontiguousarray(self._view(storage))
        return storage[self.index()]

    def scatter(self, storage: np.ndarray, values: np.ndarray) -> None:
        if self.packed:
            self._view(storage)[...] = values
            return
        storage[self.index()] = values

    def outside_mask(self, n: int) -> np.ndarray | None:
        """Storage positions (of n) that belong to no logical element, or None when there are none."""
        if self.packed and n == self.elements():
            return None
        mask = np.ones(n, dtype=bool)
        mask[self.index().ravel()] = False
        return mask
