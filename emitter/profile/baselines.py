"""What every family's profile baselines share: whether torch is here, and its version for the outputs.
The baselines themselves are the families' (RuntimeFamily.baseline; GEMM: emitter/families/gemm/baselines.py)."""

from __future__ import annotations

import importlib.util

from emitter.families.base import BaselineLaunch, BaselineUnavailable  # noqa: F401  (re-exported for stages)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_version() -> str | None:
    if not torch_available():
        return None
    import torch

    return f"{torch.__version__} (CUDA {torch.version.cuda})"
