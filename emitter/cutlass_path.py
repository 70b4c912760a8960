"""Where the CUTLASS C++ headers are: $CUTLASS_PATH (a checkout), else the nvidia-cutlass package.

The package is located with importlib.util.find_spec, never imported: importing cutlass_library costs
time and runs its own set-up, and we only need the header tree that ships inside it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from emitter.errors import CutlassNotFound

_FIX = ("install the headers with `pip install nvidia-cutlass==4.2.0.0 --no-deps` (they ship inside it; "
        "--no-deps leaves out the ~200 MB of scipy, networkx and cuda-python it asks for, which emitter does not "
        "use; `pip install 'emitter[cutlass]'` takes them too), or point CUTLASS_PATH at a CUTLASS checkout: "
        "`export CUTLASS_PATH=$HOME/cutlass` (it must hold include/cutlass and tools/util/include)")


@dataclass(frozen=True)
class CutlassHeaders:
    root: Path            # holds include/ and tools/util/include/
    origin: str           # "CUTLASS_PATH" or "nvidia-cutlass <version>"
    version: str | None   # package version when it came from nvidia-cutlass

    @property
    def include_dirs(self) -> tuple[Path, Path]:
        return (self.root / "include", self.root / "tools" / "util" / "include")

    def include_flags(self) -> list[str]:
        return [f"-I{d}" for d in self.include_dirs]


def _check(root: Path, origin: str) -> Path:
    missing = [str(p) for p in (root / "include" / "cutlass" / "cutlass.h", root / "tools" / "util" / "include")
               if not p.exists()]
    if missing:
        raise CutlassNotFound(f"CUTLASS headers not found: {origin} points at {root}, which lacks "
                              f"{', '.join(missing)}\n  fix: {_FIX}")
    return root


def _package_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("nvidia-cutlass")
    except PackageNotFoundError:  # pragma: no cover - source tree present without metadata
        return None


def find_cutlass(env: dict[str, str] | None = None) -> CutlassHeaders:
    """The CUTLASS header tree to compile against; raises CutlassNotFound with a fix."""
    env = os.environ if env is None else env
    if env.get("CUTLASS_PATH"):
        root = Path(env["CUTLASS_PATH"]).expanduser().resolve()
        return CutlassHeaders(_check(root, "CUTLASS_PATH"), "CUTLASS_PATH", None)
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise CutlassNotFound(f"CUTLASS headers not found: CUTLASS_PATH is not set and the nvidia-cutlass "
                              f"package is not installed\n  fix: {_FIX}")
    root = Path(list(spec.submodule_search_locations)[0]).resolve() / "source"
    version = _package_version()
    return CutlassHeaders(_check(root, f"nvidia-cutlass {version or ''}".strip()),
                          f"nvidia-cutlass {version or '?'}", version)


@lru_cache(maxsize=8)
def _tree_digest(root: str, with_mtime: bool) -> str:
    h = hashlib.sha256()
    for top in ("include", os.path.join("tools", "util", "include")):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                p = os.path.join(dirpath, fn)
                st = os.stat(p)
                h.update(os.path.relpath(p, root).encode())
                h.update(f"\0{st.st_size}".encode())
                if with_mtime:
                    h.update(f"\0{st.st_mtime_ns}".encode())
                h.update(b"\n")
    return h.hexdigest()


def headers_digest(headers: CutlassHeaders) -> str:
    """A cheap digest of the header tree in use (file list + sizes, + mtimes for a checkout).

    A pip-installed tree is immutable, so its version + file list + sizes identify it and two virtual
    environments with the same nvidia-cutlass share cache entries. A checkout is edited in place, so its
    mtimes count too. Computed once per process (~10 ms for ~900 headers)."""
    tree = _tree_digest(str(headers.root), headers.version is None)
    return hashlib.sha256(f"{headers.version or 'checkout'}\0{tree}".encode()).hexdigest()
