"""The by-value launch path (emitter/kit/launcher.py) without a GPU: Params packing and the entry
signatures the launcher relies on."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from emitter.kit.launcher import PackedParams

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", [1, 63, 64, 65, 1792, 4000])
def test_packed_params_are_aligned_and_intact(size):
    data = bytes((i * 37 + 11) % 256 for i in range(size))
    packed = PackedParams(data)
    ptr = ctypes.cast(packed.array, ctypes.POINTER(ctypes.c_void_p))[0]
    assert ptr % 64 == 0                       # CUtensorMap members are alignas(64)
    assert packed.data() == data and packed.size == size


def test_packed_params_reject_empty():
    with pytest.raises(ValueError):
        PackedParams(b"")


@pytest.mark.parametrize("arch", ["sm80", "sm90a"])
def test_entries_take_params_by_value(arch):
    """The launcher passes Params by value (kernelParams form); an entry taking a pointer would read the
    Params bytes as an address and fault."""
    text = (ROOT / "templates" / "gemm" / arch / "entry.cu.j2").read_text()
    assert "Params const*" not in text and "Params*" not in text
    if arch == "sm90a":
        assert "__grid_constant__" in text
