import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _has_gpu() -> bool:
    try:
        import pycuda.driver as drv  # noqa: F401
        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    gpu = None
    for item in items:
        if "gpu" in item.keywords:
            if gpu is None:
                gpu = _has_gpu()
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU and PyCUDA (pip install -e '.[gpu]')"))
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(pytest.mark.skip(reason="nvcc not on PATH"))


@pytest.fixture
def write_spec(tmp_path):
    def write(text: str, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return write
