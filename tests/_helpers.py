"""Pieces the exported-library tests share (library_helpers, test_loader, the attention and conv library tests):
the two GEMM kernels every exported library holds (one per arch group), and loading an exported tree's
generated Python module with its torch hooks pointed at stand-ins.

Imported as `from _helpers import ...` (the tests put tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

# One GEMM kernel per arch group: sm80 f16 and sm90a bf16 (spec entries, under a `kernels:` line).
GEMM_SM80_ENTRY = """\
  - arch: sm80
    dtype: {a: f16, b: f16, c: f16, d: f16, accumulator: f32}
    layout: tn
    tile: 64x64x64
    warp: 32x32x64
    stages: 3
"""
GEMM_SM90A_ENTRY = """\
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 64x128x64
    cluster: 1x1x1
    stages: auto
    schedule: {kernel: pingpong}
"""
# The pair with the sm80 kernel's swizzle 8: library_helpers.py's SM80 / SM90A instance names.
GEMM_SPEC = "kernels:\n" + GEMM_SM80_ENTRY + "    swizzle: 8\n" + GEMM_SM90A_ENTRY
# The same pair without the swizzle (the conv library tests' GEMM kernels).
GEMM_SPEC_NO_SWIZZLE = "kernels:\n" + GEMM_SM80_ENTRY + GEMM_SM90A_ENTRY

# Family kernels the CPU and the GPU library tests both export.
CONV_SM80_F16_ENTRY = """\
  - family: conv
    arch: sm80
    op: [fprop, dgrad, wgrad]
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    warp: 64x64x64
    stages: 3
"""    # fprop, dgrad and wgrad
CONV_SM80_WGRAD_SPLITK_ENTRY = """\
  - family: conv
    arch: sm80
    op: wgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    split_k: serial
"""    # serial split-K: a workspace of semaphores the shim zeroes on every call
ATTENTION_SM80_VARLEN_ENTRY = """\
  - family: attention
    arch: sm80
    dtype: bf16
    head_dim: 64
    tile: 64x64
    varlen: true
    mask: causal_top_left
    lse: true
    gqa: true
"""    # bf16, variable sequence lengths, causal from the top left


def load_module(name: str, path: Path) -> ModuleType:
    """Import the Python file `path` as module `name` (registered in sys.modules), e.g. an exported
    library's python/<lib>.py loader."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_devices(mod: Any, tensor_type: type) -> Callable[[int], Any]:
    """Point a loaded library module's torch hooks at stand-ins (what init_torch sets from torch): tensors of
    `tensor_type`, stream 0x5000 + device, and a current device that the returned `device(index)` context
    manager (the torch.cuda.device stand-in) switches."""
    mod.tensor_type = tensor_type
    mod.raw_stream = lambda dev: 0x5000 + dev
    current = [0]

    @contextlib.contextmanager
    def device(index):
        saved, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = saved

    mod.current_device = lambda: current[0]
    return device


def nvcc_path() -> str | None:
    """nvcc the way `emitter build` finds it ($EMITTER_NVCC, PATH, $CUDA_HOME, /usr/local/cuda), or None."""
    from emitter.build.nvcc import NvccNotFound, find_nvcc

    try:
        return find_nvcc()
    except NvccNotFound:
        return None


# On CI (CI=true) a missing nvcc fails the nvcc tests instead of skipping them: CI must compile real instances.
NVCC_REQUIRED = os.environ.get("CI", "").lower() in ("1", "true", "yes")
