import os
import shutil
import sys
from pathlib import Path

import pytest

from tests._helpers import NVCC_REQUIRED as _NVCC_REQUIRED, nvcc_path

ROOT = Path(__file__).resolve().parent.parent

# The tests live in one folder per family plus stages/, and some import another folder's test module by its bare
# name (`from test_library import _run`); pytest only puts a test's own folder on sys.path, and only once it
# collects that folder, so every folder goes on it here (test file names stay unique across the folders).
TEST_FOLDERS = ("gemm", "attention", "conv", "stages")
for _folder in reversed(TEST_FOLDERS):
    if str(ROOT / "tests" / _folder) not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / _folder))


def _has_gpu() -> bool:
    try:
        import pycuda.driver as drv  # noqa: F401
        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False


# On the GPU machine's suite (scripts/gpu_suite.sh sets it) a GPU test that skips is a failure: it did not run.
_GPU_SUITE = os.environ.get("EMITTER_GPU_SUITE") == "1"


_NVCC_MISSING = "CI=true but nvcc was not found ($EMITTER_NVCC, PATH, $CUDA_HOME, /usr/local/cuda): the nvcc " \
                "tests must compile on CI, not skip"


def pytest_runtest_setup(item):
    if "nvcc" in item.keywords and _NVCC_REQUIRED and nvcc_path() is None:
        pytest.fail(_NVCC_MISSING)


def pytest_collection_modifyitems(config, items):
    gpu = None
    nvcc = ...
    for item in items:
        if "gpu" in item.keywords:
            if gpu is None:
                gpu = _has_gpu()
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU and PyCUDA (pip install -e '.[gpu]')"))
        if "nvcc" in item.keywords:
            if nvcc is ...:
                nvcc = nvcc_path()
            if nvcc is None and not _NVCC_REQUIRED:
                item.add_marker(pytest.mark.skip(reason="nvcc not found ($EMITTER_NVCC, PATH, $CUDA_HOME)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if _GPU_SUITE and rep.skipped and "gpu" in item.keywords:
        why = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"GPU test skipped on the GPU machine (EMITTER_GPU_SUITE=1): {why}"


@pytest.fixture
def write_spec(tmp_path):
    def write(text: str, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return write
