"""What the profile ran on (GPU name, SMs, clocks, L2, driver, CUDA, CUTLASS, torch, emitter), and peaks.

Peaks are datasheet figures for the H100 SXM / H200 (dense, no sparsity): bf16/f16 989 TFLOP/s, fp8 1979,
tf32 494, HBM 3.35 TB/s (H100) and 4.8 TB/s (H200). Other GPUs get a bandwidth computed from the memory
clock and bus width and no compute peak unless the config's `peaks:` gives one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

from emitter.version import __version__

# dense tensor-core peaks in TFLOP/s, by input type (H100 SXM5 and H200 share them)
HOPPER_TFLOPS = {"bf16": 989.0, "f16": 989.0, "e4m3": 1979.0, "e5m2": 1979.0, "s8": 1979.0, "tf32": 494.0,
                 "f32": 67.0, "f64": 67.0}
HOPPER_PCIE_TFLOPS = {"bf16": 756.0, "f16": 756.0, "e4m3": 1513.0, "e5m2": 1513.0, "s8": 1513.0, "tf32": 378.0,
                      "f32": 51.0, "f64": 51.0}


def peaks_for(gpu_name: str, env: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"tflops": {dtype: peak}, "hbm_tbs": float | None, "source": str}."""
    name = (gpu_name or "").upper()
    tflops: dict[str, float] = {}
    hbm: float | None = None
    source = "datasheet"
    if "H200" in name:
        tflops, hbm = dict(HOPPER_TFLOPS), 4.8
    elif "H100" in name and "PCIE" in name:
        tflops, hbm = dict(HOPPER_PCIE_TFLOPS), 2.0
    elif "H100" in name and "NVL" in name:
        tflops, hbm = {k: v * 835 / 989 for k, v in HOPPER_TFLOPS.items()}, 3.9
    elif "H100" in name or "GH200" in name:
        tflops, hbm = dict(HOPPER_TFLOPS), 3.35
    elif env and env.get("memory_clock_khz") and env.get("memory_bus_bits"):
        hbm = 2 * env["memory_clock_khz"] * 1e3 * env["memory_bus_bits"] / 8 / 1e12
        source = "memory clock x bus width (no compute peak known for this GPU)"
    if overrides:
        tflops.update(overrides.get("tflops", {}))
        if overrides.get("hbm_tbs"):
            hbm = overrides["hbm_tbs"]
        source += " + config overrides"
    return {"tflops": tflops, "hbm_tbs": hbm, "source": source}


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def nvidia_smi(index: int | None = None) -> dict[str, Any]:
    """Read-only clock / driver query (never changes any setting)."""
    fields = ["name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "temperature.gpu", "power.draw"]
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if index is not None:
        argv.insert(1, f"--id={index}")
    text = _run(argv)
    if not text:
        return {}
    vals = [v.strip() for v in text.strip().splitlines()[0].split(",")]
    return dict(zip(["smi_name", "driver", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "temperature_c",
                     "power_w"], vals))


def other_compute_processes(index: int | None = None, own: set[int] | None = None) -> list[dict[str, str]] | None:
    """Processes other than `own` (default: this one) that hold a CUDA context on the GPU, by nvidia-smi
    (read-only); None when nvidia-smi cannot say. A timing taken beside one of them is not a timing of the card."""
    argv = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
    if index is not None:
        argv.insert(1, f"--id={index}")
    text = _run(argv)
    if text is None:
        return None
    own = own if own is not None else {os.getpid()}
    out = []
    for line in text.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) >= 2 and vals[0].isdigit() and int(vals[0]) not in own:
            out.append(dict(zip(["pid", "name", "used_mib"], vals)))
    return out


def nvcc_version() -> str | None:
    text = _run(["nvcc", "--version"])
    if not text:
        return None
    m = re.search(r"release (\S+),", text)
    return m.group(1) if m else text.strip().splitlines()[-1]


def cutlass_version() -> str | None:
    try:
        from emitter.cutlass_path import find_cutlass

        h = find_cutlass()
    except Exception:
        return None
    try:
        text = (h.root / "include" / "cutlass" / "version.h").read_text()
        parts = [re.search(rf"#define CUTLASS_{k} (\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(p.group(1) for p in parts) + f" ({h.origin})"  # type: ignore[union-attr]
    except OSError:
        pass
    return h.origin


def _version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def gpu_env(physical_index: int | None = None) -> dict[str, Any]:
    """Facts about the current device (PyCUDA primary context must be current)."""
    import pycuda.driver as drv

    dev = drv.Context.get_device()
    a = drv.device_attribute
    cc = dev.compute_capability()
    env: dict[str, Any] = {
        "name": dev.name(),
        "cc": f"{cc[0]}.{cc[1]}",
        "sm_count": dev.get_attribute(a.MULTIPROCESSOR_COUNT),
        "sm_clock_khz": dev.get_attribute(a.CLOCK_RATE),
        "memory_clock_khz": dev.get_attribute(a.MEMORY_CLOCK_RATE),
        "memory_bus_bits": dev.get_attribute(a.GLOBAL_MEMORY_BUS_WIDTH),
        "l2_bytes": dev.get_attribute(a.L2_CACHE_SIZE),
        "memory_bytes": dev.total_memory(),
        "pci_bus_id": dev.pci_bus_id(),
        "cuda_driver_api": _version_text(drv.get_driver_version()),
        "pycuda_cuda": ".".join(map(str, drv.get_version())),
    }
    smi = nvidia_smi(physical_index)
    env.update({k: v for k, v in smi.items() if k != "smi_name"})
    env.update(software_env())
    return env


def software_env() -> dict[str, Any]:
    from emitter.kit.torch_interop import torch_version

    return {"emitter_version": __version__, "nvcc": nvcc_version(), "cutlass": cutlass_version(),
            "torch": torch_version(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def fake_env() -> dict[str, Any]:
    env = {"name": "fake GPU (numpy backend)", "cc": "9.0", "sm_count": 132, "sm_clock_khz": 1980000,
           "memory_clock_khz": 2619000, "memory_bus_bits": 5120, "l2_bytes": 50 * 1024 * 1024,
           "memory_bytes": 80 * 1024 ** 3, "pci_bus_id": "fake", "cuda_driver_api": None, "pycuda_cuda": None,
           "driver": None}
    env.update({"emitter_version": __version__, "nvcc": None, "cutlass": None, "torch": None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    return env


def device_count() -> int:
    """Visible CUDA devices (0 when PyCUDA or the driver is missing); creates no context."""
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count()
    except Exception:
        return 0
