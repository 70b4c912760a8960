"""GEMM library pieces that several exported-library tests share (tests/stages/test_library.py,
tests/gemm/test_gemm_library.py, tests/gemm/test_loader.py and the attention and conv library tests): the
two GEMM kernels every exported library holds (names and spec), their emitted manifest and a tuning table as
module fixtures, hand-made kernel configs and manifests, and the host-only harness that compiles a library's
C API with g++ against a stand-in CUDA runtime and fake shims.

Imported by its bare name (`from library_helpers import ...`, with tests/ on sys.path); a test module that
imports the `manifest_dir` / `tuning_file` fixtures gets its own module-scoped copy of each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from _helpers import GEMM_SPEC

SM80 = "gemm_sm80_f16f16_f16f16_accf32_tnt_64x64x64_w32x32x64_i16x8x16_s3_swz8_al8x8x8_identity"
SM90A = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_64x128x64_c1x1x1_i64x128x16_sauto_pingpong_epitma_persistent_al8x8x8_identity"

SPEC = GEMM_SPEC   # the two GEMM kernels every exported library needs (SM80, SM90A)


def _tuning(entries: list[tuple], path: Path) -> Path:
    """(kernel, m, n, k[, split_k]) rows -> a tuning table file."""
    path.write_text(json.dumps({"schema_version": 1, "kind": "emitter.tuning_table", "entries": [
        {"problem": {"m": m, "n": n, "k": k, "batch": 1}, "kernel": name, "median_ms": 0.1,
         **({"split_k": rest[0]} if rest else {})} for name, m, n, k, *rest in entries]}))
    return path


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory) -> Path:
    from emitter.emit import emit

    d = tmp_path_factory.mktemp("lib")
    spec = d / "tiny.yaml"
    spec.write_text(SPEC)
    r = emit([spec], d / "gen", jobs=1)
    assert sorted(i.name for i in r.instances) == sorted([SM80, SM90A])
    return d / "gen"


@pytest.fixture(scope="module")
def tuning_file(manifest_dir) -> Path:
    return _tuning([(SM90A, 4096, 4096, 4096), (SM90A, 128, 4096, 4096), (SM80, 1024, 1024, 1024),
                    ("gemm_not_in_this_manifest", 64, 64, 64)], manifest_dir.parent / "tuning.json")



def _cfg(a="bf16", la="row", lb="col", lc="row", arch="sm90a", tile=(128, 128, 64), align=8, act="identity",
         bias="none", acc="f32", batched=False, split_k="none", cd=None, fast=False):
    return {"arch": arch, "a": a, "b": a, "c": cd or a, "d": cd or a, "layout_a": la, "layout_b": lb, "layout_c": lc,
            "accumulator": acc, "tile": list(tile), "cluster": [1, 1, 1] if arch == "sm90a" else None,
            "alignment_a": align, "alignment_b": align, "alignment_c": align,
            "epilogue": {"activation": act, "bias": bias}, "split_k": split_k, "batched": batched,
            "fp8_fast_accum": fast}


def _write_manifest(d: Path, cfgs: dict[str, dict]) -> Path:
    """A manifest of hand-made (never compiled) kernels."""
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, cfg in cfgs.items():
        (d / f"{name}.cu").write_text("// not compiled\n")
        entries.append({"name": name, "family": "gemm", "arch": cfg["arch"], "source": f"{name}.cu", "spec": "x.yaml",
                        "spec_hash": "0", "config": cfg})
    (d / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0", "generated_at": None,
                                                 "specs": [], "instances": entries, "rejected": []}))
    return d


def _cxx() -> str:
    return shutil.which("g++") or shutil.which("c++") or "c++"


def _compile(args: list[str]) -> None:
    """Host C++ compiles go through `flock $EMITTER_NVCC_LOCK` when that is set (shared machines)."""
    cmd = [_cxx(), "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", *args]
    if os.environ.get("EMITTER_NVCC_LOCK") and shutil.which("flock"):
        cmd = ["flock", os.environ["EMITTER_NVCC_LOCK"], *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-6000:]}\n{res.stderr[-6000:]}"


# A stand-in for the CUDA runtime: just what <lib>_api.cpp calls, on a "device" of compute capability 9.0.
_FAKE_CUDA = """\
#pragma once
#include <cstddef>
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidDeviceFunction = 98, cudaErrorNoKernelImageForDevice = 209 };
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };
typedef struct CUstream_st* cudaStream_t;
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t) { return "fake"; }
inline cudaError_t cudaMallocAsync(void** p, size_t, cudaStream_t) { *p = reinterpret_cast<void*>(0x800000); return cudaSuccess; }
inline cudaError_t cudaFreeAsync(void*, cudaStream_t) { return cudaSuccess; }
"""

# Fake shims: they accept every problem a real shim would (split_k_slices > 1 only on split-K kernels), need a
# workspace that depends on the kernel and the slice count, and the launcher records what it was launched with.
_FAKE_KERNELS = """\
#include "{lib}_dispatch.h"
#include "{lib}_kernels.h"
using namespace {lib}_detail;
int g_run_kernel = -1, g_run_split = 0, g_run_options = -1;
long long fake_need(int kernel, int split) {{ return split > 1 ? 4096LL * split + kernel : 0; }}
namespace {{
template <int I> int query(const emitter_gemm_problem* p, emitter_launch* out) {{
  if (p->split_k_slices < 1) return EMITTER_INVALID_ARGUMENT;
  if (p->split_k_slices > 1 && !kKernels[I].split_k) return EMITTER_CANNOT_IMPLEMENT;
  *out = emitter_launch{{}};
  out->workspace_bytes = fake_need(I, p->split_k_slices);
  return EMITTER_OK;
}}
template <int I> int run(const emitter_gemm_problem* p, void* workspace, void*, int*) {{
  if (p->split_k_slices > 1 && !kKernels[I].split_k) return EMITTER_CANNOT_IMPLEMENT;
  if (fake_need(I, p->split_k_slices) > 0 && workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
  g_run_kernel = I;
  g_run_split = p->split_k_slices;
  g_run_options = p->options;
  return EMITTER_OK;
}}
}}  // namespace
namespace {lib}_detail {{
const KernelFns kFns[] = {{
{rows}
}};
}}
"""
