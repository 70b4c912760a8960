"""The runtime Backend interface: load a built instance of any family, run one problem on host storage buffers.

Two backends implement it: PycudaBackend (the GPU: cubin through PyCUDA, params from the ctypes host
shim) and FakeBackend (pure numpy, for CI, with hooks to plant faults). The verifier only talks to this
interface, so everything above it (problems, references, runner, reports) is tested without a GPU.
Neither backend holds family code: the manifest entry's `family` names the run-time hooks
(emitter.families.base.RuntimeFamily) that parse the config, build the shim's problem struct
(`c_problem`) and, for the fake backend, compute the outputs (`fake_run`).

Data crosses the interface as *storage* numpy arrays (emitter.kit.hostdata): the bytes the device
buffers hold, in an `Inputs` (emitter.families.base) from the family's make_inputs. The backend copies
every buffer (outputs poisoned) to the device, launches, and returns the outputs' storage after the launch.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from emitter.errors import EmitterError, ManifestError
from emitter.fsutil import PathEscape, resolve_inside
from emitter.families.base import FamilyNotRunnable, Inputs
from emitter.families.registry import entry_family, runtime_family
from emitter.kit.failures import (  # noqa: F401  (the backend interface's errors; emitter.runtime exports them)
    BackendUnavailable, CannotImplement, CudaFault, LaunchFailed, NotBuilt, RuntimeBackendError,
)


# ---------------------------------------------------------------------------------------------- data
@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]      # storage of each output buffer (Inputs.outputs) after the launch
    time_ms: float | None = None        # the launch alone (device events), when the backend times it
    launch: dict[str, Any] = field(default_factory=dict)   # grid/block/cluster/shared/params/workspace

    @property
    def D(self) -> np.ndarray:
        """The output named D (GEMM's only output; other families name theirs)."""
        return self.outputs["D"]


@dataclass
class Kernel:
    """A loaded instance: what the backend needs to run it (backend-specific handles in `handle`)."""

    name: str
    config: Any                         # the family's config (config_from_entry)
    entry: dict[str, Any]
    root: Path
    handle: Any = None
    family: str = ""                    # the manifest entry's family

    @property
    def hooks(self) -> Any:
        """The family's run-time hooks (emitter.families.<family>.runtime)."""
        return runtime_family(self.family or entry_family(self.entry))


def family_config(entry: Mapping[str, Any], root: Path | str | None = None) -> tuple[Any, Any]:
    """(hooks, config) of a manifest entry, through the family registry. ManifestError when the entry names
    no family with run-time hooks or its config is unreadable."""
    name = str(entry.get("name", "?")) if isinstance(entry, Mapping) else "?"
    family = entry_family(entry)
    try:
        hooks = runtime_family(family)
    except FamilyNotRunnable as e:
        raise ManifestError(f"instance {name}: {e}") from None
    except EmitterError as e:          # UnknownFamily
        raise ManifestError(f"instance {name}: {e}") from None
    return hooks, hooks.config_from_entry(entry, root)


def host_memory_available() -> int:
    """Bytes of host memory available now (MemAvailable; sysconf where /proc is not there)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


# ---------------------------------------------------------------------------------------------- build records
def build_record(root: Path, name: str) -> dict[str, Any]:
    """<root>/build/<name>/record.json; NotBuilt when it is missing, unreadable or its build failed."""
    path = Path(root) / "build" / name / "record.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotBuilt(f"not built: {path} is missing (run `emitter build {root}`)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise NotBuilt(f"unreadable build record {path}: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("artifacts") or {}, dict):
        raise NotBuilt(f"build record {path} is not a build record (re-run `emitter build {root}`)")
    status = record.get("status")
    if status not in ("ok", "cached"):
        err = record.get("error") or f"status {status!r}"
        first = str(err).strip().splitlines()[:3]
        raise NotBuilt(f"build {status}: " + " | ".join(first), build_failed=True)
    arts = record.get("artifacts") or {}
    for key in ("cubin", "host"):
        if not arts.get(key):
            raise NotBuilt(f"build record {path} names no existing {key} artifact ({arts.get(key)!r})")
        try:   # a record may be edited or written by another tool: load nothing from outside the directory
            art = resolve_inside(root, arts[key], f"build record {path}: {key} artifact")
        except PathEscape as e:
            raise NotBuilt(str(e)) from None
        if not art.is_file():
            raise NotBuilt(f"build record {path} names no existing {key} artifact ({arts.get(key)!r})")
    return record


# ---------------------------------------------------------------------------------------------- interface
class Backend(abc.ABC):
    """Runs instances of any family. One backend object lives in one (worker) process."""

    name: str = "?"
    #: torch device string for GPU-side references (None: compute references on the host)
    reference_device: str | None = None

    @abc.abstractmethod
    def device_name(self) -> str:
        """The device in words (GPU name, or 'numpy (fake)')."""

    @abc.abstractmethod
    def load(self, root: Path, entry: Mapping[str, Any]) -> Kernel:
        """Load instance `entry` of the manifest in `root`. Raises NotBuilt."""

    @abc.abstractmethod
    def run(self, kernel: Kernel, problem: Any, inputs: Inputs) -> RunResult:
        """Copy inputs.buffers in, launch once on the (resolved) problem, copy inputs.outputs back.
        Raises CannotImplement, LaunchFailed or CudaFault."""

    def memory_available(self) -> tuple[int | None, int]:
        """(free device bytes, or None where buffers live on the host; available host bytes): what a
        problem's Footprint is checked against before anything is allocated."""
        return None, host_memory_available()

    def close(self) -> None:  # pragma: no cover - default no-op
        pass
