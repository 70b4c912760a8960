"""The nvcc command lines for one instance: device image and host shim, with the flags that make it fast.

The device image is a cubin (SASS) for arch-specific targets (sm90a) and a fatbin (SASS + PTX of the
instance's arch) for the others, so a 2.x instance built for sm80 also runs on sm86/sm89/sm90 GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from emitter.errors import EmitterError

# -O3 is nvcc's host optimization level (device code is always optimized by ptxas); -DNDEBUG matters for
# both: without it CUTLASS's device asserts make ptxas serialize wgmma (C7510), a large silent slowdown.
COMMON_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr")

# arch (manifest spelling) -> (virtual arch, real arch)
GENCODE = {
    "sm75": ("compute_75", "sm_75"),
    "sm80": ("compute_80", "sm_80"),
    "sm86": ("compute_86", "sm_86"),
    "sm89": ("compute_89", "sm_89"),
    "sm90": ("compute_90", "sm_90"),
    "sm90a": ("compute_90a", "sm_90a"),
}

# nvcc's peak resident memory per compile, for sizing -j. Measured on a CUTLASS 3.x sm90a cooperative
# instance: 3.3 GB (device pass); 2.x sm80 GemmUniversal instances stay under 2 GB.
MEMORY_PER_JOB = {"sm90a": 4 << 30, "sm90": 4 << 30}
DEFAULT_MEMORY_PER_JOB = 2 << 30


class NvccNotFound(EmitterError):
    exit_code = 2


class UnknownArch(EmitterError):
    exit_code = 2


def find_nvcc(env: dict[str, str] | None = None) -> str:
    """$EMITTER_NVCC, nvcc on PATH, $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc."""
    env = os.environ if env is None else env
    if env.get("EMITTER_NVCC"):
        return env["EMITTER_NVCC"]
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    raise NvccNotFound("nvcc not found (looked at $EMITTER_NVCC, PATH, $CUDA_HOME, /usr/local/cuda)\n"
                       "  fix: install the CUDA toolkit (12.4 or newer; 13.0 is what we test) and put its bin/ "
                       "on PATH, or set EMITTER_NVCC=/path/to/nvcc")


@lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """`nvcc --version` output (which also names the build), once per process."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise NvccNotFound(f"cannot run {nvcc}: {e}") from None
    if out.returncode != 0:
        raise NvccNotFound(f"`{nvcc} --version` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


@lru_cache(maxsize=8)
def host_compiler_version(nvcc: str) -> str:
    """The host compiler nvcc drives (it builds the host shim): its `--version` first line."""
    cxx = os.environ.get("NVCC_CCBIN") or shutil.which("g++") or shutil.which("c++") or ""
    if not cxx:
        return "unknown"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        return f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else ''}"
    except OSError:
        return "unknown"


# Arch-specific targets (the `a` suffix): their SASS runs only on that one arch and their PTX is not forward
# compatible, so they ship SASS alone. Every other arch also ships its PTX so that the driver can JIT-compile
# the kernel for a newer GPU (an sm80 instance on an H100).
ARCH_SPECIFIC = frozenset({"sm90a"})


def gencode(arch: str, *, ptx: bool = False) -> str:
    """nvcc's -gencode for arch: SASS only, or (ptx=True, not for arch-specific targets) SASS + the PTX."""
    try:
        virtual, real = GENCODE[arch]
    except KeyError:
        raise UnknownArch(f"unknown arch {arch!r} in the manifest (known: {', '.join(GENCODE)})") from None
    if ptx and arch not in ARCH_SPECIFIC:
        return f"-gencode=arch={virtual},code=[{real},{virtual}]"
    return f"-gencode=arch={virtual},code={real}"


def device_image_kind(arch: str) -> str:
    """What the device compile writes: "fatbin" (SASS + PTX, loads on this arch and newer through the driver's
    JIT) for portable archs, "cubin" (SASS only) for arch-specific ones. cuModuleLoadData takes either."""
    gencode(arch)  # raises UnknownArch
    return "cubin" if arch in ARCH_SPECIFIC else "fatbin"


def memory_per_job(arch: str) -> int:
    return MEMORY_PER_JOB.get(arch, DEFAULT_MEMORY_PER_JOB)


@dataclass(frozen=True)
class Commands:
    """The two compiles of one instance, with `{src}` / `{out}` placeholders for paths.

    Placeholders keep the cache key independent of where the manifest lives."""

    device: tuple[str, ...]
    host: tuple[str, ...]

    @staticmethod
    def fill(template: tuple[str, ...], src: str, out: str) -> list[str]:
        return [src if a == "{src}" else out if a == "{out}" else a for a in template]


def commands(nvcc: str, arch: str, include_flags: list[str], extra: tuple[str, ...] = (),
             host_syntax_only: bool = False) -> Commands:
    """host_syntax_only: stop the host shim's device pass after parsing (-fdevice-syntax-only). The shim
    holds no kernels (they are all in the cubin), so its device code is an empty image either way. Measured
    (benchmarks/build_overhead.py --only-experiments, CPU-time medians of alternated runs): sm80 shim
    14.6 -> 12.8 s (-12%), sm90a shim 24.1 -> 23.3 s (-3%). Off by default until a GPU run shows such
    shims initialize workspaces fine (eager module loading registers the shim's image too)."""
    kind = device_image_kind(arch)
    base = [nvcc, *COMMON_FLAGS]
    device = (*base, gencode(arch, ptx=kind == "fatbin"), *include_flags, *extra,
              "-Xptxas=-v", "-DEMITTER_DEVICE", f"-{kind}", "-o", "{out}", "{src}")
    # the shim holds no kernels: SASS of its (empty) device image is enough
    host = (*base, gencode(arch), *include_flags, *extra, *(("-fdevice-syntax-only",) if host_syntax_only else ()),
            "--shared", "-Xcompiler", "-fPIC", "-o", "{out}", "{src}")
    return Commands(device, host)
