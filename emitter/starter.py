"""`emitter init [DIR]`: a starter project (specs for the GPU, a profile config, a README of next steps).

The files are shipped configs (configs/demo.yaml or configs/demo_sm90a.yaml, configs/starter/), copied
as they are. Nothing is overwritten: if any target exists, nothing is written and the error names them."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from emitter.errors import EmitterError
from emitter.resources import configs_root

__all__ = ["StarterResult", "InitError", "detect_gpu", "write_starter", "GPUS"]

GPUS = ("sm80", "sm90a", "auto")
_SPECS = {"sm80": "demo.yaml", "sm90a": "demo_sm90a.yaml"}


class InitError(EmitterError):
    exit_code = 2


@dataclass
class StarterResult:
    directory: Path
    gpu: str                        # the arch the specs are for
    reason: str                     # why that arch (found GPU, told, no GPU)
    written: list[Path] = field(default_factory=list)


def detect_gpu(run=None) -> tuple[str, str]:
    """(arch, reason) from nvidia-smi's compute capability of GPU 0; sm80 where no GPU is found."""
    run = run or subprocess.run
    try:
        out = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                  capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "sm80", "no nvidia-smi here: sm80 kernels (they run on every GPU from Ampere on)"
    lines = [ln for ln in (out.stdout or "").splitlines() if ln.strip()] if out.returncode == 0 else []
    if not lines:
        return "sm80", "nvidia-smi found no GPU: sm80 kernels (they run on every GPU from Ampere on)"
    name, _, cc = lines[0].rpartition(",")
    try:
        major, minor = (int(x) for x in cc.strip().split("."))
    except ValueError:
        return "sm80", f"cannot read nvidia-smi's compute capability {cc.strip()!r}: sm80 kernels"
    gpu = f"{name.strip()} (compute capability {major}.{minor})"
    if (major, minor) == (9, 0):
        return "sm90a", f"found {gpu}: sm90a (Hopper wgmma) kernels"
    if major >= 8:
        return "sm80", f"found {gpu}: sm80 kernels" + ("" if major == 8 else " (run through their PTX)")
    raise InitError(f"found {gpu}: emitter's kernels need compute capability 8.0 or newer\n"
                    f"  fix: pass --gpu sm80 or --gpu sm90a to write specs for another machine")


def write_starter(directory: str | os.PathLike, gpu: str = "auto") -> StarterResult:
    directory = Path(directory)
    if gpu not in GPUS:
        raise InitError(f"--gpu {gpu!r} is not one of {', '.join(GPUS)}")
    arch, reason = detect_gpu() if gpu == "auto" else (gpu, f"--gpu {gpu}")
    root = configs_root()
    files = {"specs.yaml": root / _SPECS[arch], "profile.yaml": root / "starter" / "profile.yaml",
             "README.md": root / "starter" / "README.md"}
    if directory.exists() and not directory.is_dir():
        raise InitError(f"{directory} exists and is not a directory")
    taken = [n for n in files if (directory / n).exists() or (directory / n).is_symlink()]
    if taken:
        raise InitError(f"{directory} already holds {', '.join(taken)}: emitter init writes nothing over existing "
                        f"files (nothing was written)\n  fix: pick a new directory (`emitter init my-kernels`) or "
                        f"move those files away")
    directory.mkdir(parents=True, exist_ok=True)
    result = StarterResult(directory, arch, reason)
    # created with O_EXCL: a file that appeared since the check above is not overwritten either; on any failure
    # the files this call wrote are removed again, so the directory holds all three or none of them
    try:
        for name, src in files.items():
            data = src.read_bytes()
            fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            result.written.append(directory / name)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as e:
        for p in result.written:
            p.unlink(missing_ok=True)
        raise InitError(f"cannot write {e.filename}: {e.strerror} (nothing was written)") from None
    return result
