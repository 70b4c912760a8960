"""The dynamic shared memory each built instance launches with, from its own host shim's launch query.

ptxas -v reports only static shared memory ("0 bytes smem" for a CUTLASS kernel whose SharedStorage is
dynamic: 48 KiB and more). The shim knows the launch's size (emitter_<name>_query fills shared_bytes), so
after a build each built shim is asked once, on the first of its family's default problems it can run,
in a child process (a shim is a shared library: loading it into the build process would keep it mapped
and let a crash in it take the build down). Family-agnostic: the problem comes from the family's runtime
hooks (config_from_entry, default_problems, resolve_problem, c_problem).

Where the query needs a GPU (sm90a shims ask the device for its SM count) and none is present, or anything
else fails, the size is recorded as unknown (None) with the reason, never guessed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["probe_shared_bytes", "probe_in_child"]


def _probe_one(root: Path, entry: Mapping[str, Any], record: Mapping[str, Any]) -> tuple[int | None, str | None]:
    from emitter.families.registry import entry_family, runtime_family
    from emitter.kit.shim import HostShim

    fam = runtime_family(entry_family(entry), need=("config_from_entry", "default_problems",
                                                                 "resolve_problem", "c_problem"))
    cfg = fam.config_from_entry(entry, root)
    shim = HostShim(root / record["artifacts"]["host"], str(entry["name"]))
    last = "no default problem"
    for problem, _label in fam.default_problems(cfg, quick=True):
        status, launch = shim.query(fam.c_problem(cfg, fam.resolve_problem(cfg, problem), {}))
        if status == 0:
            return int(launch.shared_bytes), None
        last = f"the shim's query returned status {status}"
    return None, last


def probe_shared_bytes(root: str | Path, items: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
                       ) -> dict[str, dict[str, Any]]:
    """{name: {"dynamic_shared_bytes": int | None, "reason": str | None}} for (entry, record) pairs."""
    root = Path(root)
    out: dict[str, dict[str, Any]] = {}
    for entry, record in items:
        try:
            size, why = _probe_one(root, entry, record)
        except Exception as e:  # noqa: BLE001 - any failure is "unknown", with its reason
            size, why = None, f"{type(e).__name__}: {e}"
        out[str(entry["name"])] = {"dynamic_shared_bytes": size, "reason": why}
    return out


def probe_in_child(root: str | Path, items: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                   timeout_s: float = 120.0) -> dict[str, dict[str, Any]]:
    """probe_shared_bytes in a child process; {} (all unknown) when the child fails."""
    if not items:
        return {}
    payload = json.dumps({"root": str(root), "items": [[dict(e), dict(r)] for e, r in items]})
    try:
        r = subprocess.run([sys.executable, "-m", "emitter.build.launch_probe"], input=payload, capture_output=True,
                           text=True, timeout=timeout_s)
        return json.loads(r.stdout) if r.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}


if __name__ == "__main__":
    data = json.loads(sys.stdin.read())
    print(json.dumps(probe_shared_bytes(data["root"], [tuple(x) for x in data["items"]])))
