"""Libraries of any family mix: `emitter library` exports conv-only and attention-only kernel sets (no GEMM kernel),
CMake builds them (one conv kernel with nvcc, no GPU), and on a GPU the conv-only library's conv2d runs against
torch. A library without GEMM kernels keeps GEMM's C API, which finds no kernel (NOT_SUPPORTED)."""

from __future__ import annotations

import ctypes
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import CONV_SM80_F16_ENTRY, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ATTENTION_SM80 = """\
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
"""


def _emit(tmp: Path, entries: str) -> Path:
    from emitter.emit import emit

    spec = tmp / "spec.yaml"
    spec.write_text("kernels:\n" + entries if not entries.startswith("kernels:") else entries)
    emit([spec], tmp / "gen", jobs=1)
    return tmp / "gen"


def _run(cmd: list, log: Path) -> subprocess.CompletedProcess:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)


def test_an_attention_only_and_a_conv_only_library_export(tmp_path):
    from emitter.library.export import export_library

    gen = _emit(tmp_path, ATTENTION_SM80 + CONV_SM80_F16_ENTRY)
    att = export_library([gen], "attonly", tmp_path / "att", select=["family=attention"])
    conv = export_library([gen], "convonly", tmp_path / "conv", select=["family=conv"])
    assert (att.kernels, att.families) == ([], {"attention": 1})
    assert (conv.kernels, conv.families) == ([], {"conv": 3})
    header = (tmp_path / "att" / "include" / "attonly" / "attonly.h").read_text()
    assert "attonly_attention(" in header and "attonly_gemm(" in header          # GEMM's API is there, empty
    assert "const int kKernelCount = 0;" in (tmp_path / "att" / "src" / "attonly_table.cpp").read_text()
    cmake = (tmp_path / "conv" / "CMakeLists.txt").read_text()
    assert "set(_convonly_gemm_kernels_sm80 0)" in cmake and cmake.count("src/conv/") >= 3
    mixed = export_library([gen], "both", tmp_path / "both")
    assert mixed.kernels == [] and mixed.families == {"attention": 1, "conv": 3}


@pytest.mark.nvcc
def test_a_conv_only_library_builds_with_cmake(tmp_path):
    """One sm80 conv kernel and no GEMM kernel: CMake configures, nvcc builds it, the shared library exports the conv
    API and counts no GEMM kernel (about 30 s on 2 cores)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    from emitter.library.export import export_library

    gen = _emit(tmp_path, CONV_SM80_F16_ENTRY.replace("op: [fprop, dgrad, wgrad]", "op: fprop"))
    tree = tmp_path / "convlib"
    export_library([gen], "convlib", tree)
    log = tmp_path / "build.log"
    jobs = os.environ.get("EMITTER_TEST_JOBS", "2")
    assert _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=80",
                 "-DCMAKE_BUILD_TYPE=Release"], log).returncode == 0, log.read_text()[-3000:]
    assert _run(["cmake", "--build", tree / "build", "-j", jobs], log).returncode == 0, log.read_text()[-3000:]
    so = tree / "build" / "libconvlib.so"
    lib = ctypes.CDLL(str(so))
    assert lib.convlib_kernel_count() == 0
    for fn in ("convlib_conv", "convlib_conv_select", "convlib_conv_can_implement", "convlib_gemm"):
        assert hasattr(lib, fn), fn


@pytest.mark.nvcc
def test_a_conv_only_static_library_links_its_kernels_without_whole_archive(tmp_path):
    """BUILD_SHARED_LIBS=OFF for a library without GEMM kernels: the API reaches the conv kernels only through weak
    references (which pull no archive member), so the archive must be one object. A C consumer that calls two C API
    functions and links lib<lib>.a plainly gets the conv kernel's entry points (nm, and non-NULL at run time; no GPU
    call). One sm80 fprop kernel, about 30 s on 2 cores."""
    for tool in ("cmake", "nm", "ar", "g++"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found")
    from emitter.library.export import export_library

    gen = _emit(tmp_path, CONV_SM80_F16_ENTRY.replace("op: [fprop, dgrad, wgrad]", "op: fprop"))
    tree = tmp_path / "convst"
    export_library([gen], "convst", tree)
    entries = sorted(set(re.findall(r"\b(convst_ck_\w+_(?:query|run))\(", (tree / "src/convst_api.cpp").read_text())))
    assert len(entries) == 2, entries          # one conv kernel: its query and run
    log = tmp_path / "build.log"
    build = tree / "build"
    assert _run(["cmake", "-S", tree, "-B", build, "-DCMAKE_CUDA_ARCHITECTURES=80", "-DBUILD_SHARED_LIBS=OFF"],
                log).returncode == 0, log.read_text()[-3000:]
    assert _run(["cmake", "--build", build, "-j", os.environ.get("EMITTER_TEST_JOBS", "2")],
                log).returncode == 0, log.read_text()[-3000:]
    archive = build / "libconvst.a"
    members = subprocess.run(["ar", "t", archive], capture_output=True, text=True, check=True).stdout.split()
    assert members == ["convst_static.o"], members
    decls = "".join(f"extern int {e}(void) __attribute__((weak));\n" for e in entries)
    checks = "".join(f'  printf("{e} %d\\n", {e} != 0);\n' for e in entries)
    (tmp_path / "main.c").write_text(
        f'#include <stdio.h>\n#include "convst/convst.h"\n{decls}'
        f'int main(void) {{\n  printf("version %s\\nconv kernels %d\\n", convst_version(), convst_conv_kernel_count());\n'
        f'{checks}  return 0;\n}}\n')
    cudart = re.search(r"^CUDA_cudart_static_LIBRARY:\w+=(.+)$", (build / "CMakeCache.txt").read_text(), re.M)
    assert cudart, "CMake found no static CUDA runtime"
    exe = tmp_path / "consumer"
    assert _run(["g++", "-x", "c", tmp_path / "main.c", "-x", "none", f"-I{tree / 'include'}", archive,
                 cudart.group(1).strip(), "-ldl", "-lpthread", "-lrt", "-o", exe], log).returncode == 0, \
        log.read_text()[-3000:]
    nm = subprocess.run(["nm", "--defined-only", exe], capture_output=True, text=True, check=True).stdout
    defined = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    assert set(entries) <= defined, f"not linked: {sorted(set(entries) - defined)}"
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "conv kernels 1" in res.stdout and all(f"{e} 1" in res.stdout for e in entries), res.stdout


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_conv_only_library_runs_conv2d_against_torch(tmp_path):
    """On the GPU: the conv-only library (sm80 fprop / dgrad / wgrad, no GEMM kernel) built with CMake, conv2d and
    its two gradients on channels_last tensors against torch in float64."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("needs an sm_80+ GPU visible to torch")
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    import torch.nn.functional as F

    from emitter.library.export import export_library

    gen = _emit(tmp_path, CONV_SM80_F16_ENTRY)
    tree = tmp_path / "convgpu"
    export_library([gen], "convgpu", tree)
    log = Path(os.environ.get("OUT", tmp_path)) / "conv_only_library_build.log"
    archs = "80;90" if torch.cuda.get_device_capability(0) == (9, 0) else "80"
    assert _run(["cmake", "-S", tree, "-B", tree / "build", f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
                 "-DCMAKE_BUILD_TYPE=Release"], log).returncode == 0, f"see {log}"
    assert _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")],
                log).returncode == 0, f"see {log}"
    lib = load_module("convgpu", tree / "python" / "convgpu.py")
    lib.load(str(tree / "build" / "libconvgpu.so"))
    assert len(lib.conv_kernels()) == 3

    def cl(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def close(got, want, what):
        err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
        assert err < 1e-2, f"{what}: max relative error {err:.3e}"

    x, w = cl(3, 16, 13, 11), cl(24, 16, 3, 3)
    want = F.conv2d(x.double(), w.double(), padding=1)
    close(lib.conv2d(x, w, padding=1), want, "conv2d")
    gy = cl(*want.shape)
    close(lib.conv2d_input_grad(gy, w, tuple(x.shape), padding=1),
          torch.nn.grad.conv2d_input(x.shape, w.double(), gy.double(), padding=1), "conv2d_input_grad")
    close(lib.conv2d_weight_grad(x, gy, tuple(w.shape), padding=1),
          torch.nn.grad.conv2d_weight(x.double(), w.shape, gy.double(), padding=1), "conv2d_weight_grad")
