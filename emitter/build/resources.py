"""How many nvcc processes this machine can hold at once: cores and memory (cgroup limits included).

CUTLASS sm90a instances take ~3.3 GB of resident memory in nvcc's device pass, so on a 2-core 24 GB
machine memory is not the limit but on a 16-core 32 GB one it is: the default is the smaller of the
usable cores and what the available memory holds (keeping 1 GiB of headroom), never less than 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from emitter.build.nvcc import DEFAULT_MEMORY_PER_JOB, memory_per_job

HEADROOM = 1 << 30


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def mem_available(meminfo: str | None = None, cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """MemAvailable from /proc/meminfo, lowered to a cgroup v2 memory.max - memory.current when set."""
    text = _read("/proc/meminfo") if meminfo is None else meminfo
    avail = None
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
            break
    if meminfo is None:
        limit, used = _read(f"{cgroup_root}/memory.max"), _read(f"{cgroup_root}/memory.current")
        if limit and used and limit.strip().isdigit() and used.strip().isdigit():
            room = int(limit) - int(used)
            avail = room if avail is None else min(avail, room)
    return avail


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    quota = _read(f"{cgroup_root}/cpu.max")
    if quota:
        q, _, period = quota.strip().partition(" ")
        if q.isdigit() and period.isdigit() and int(period) > 0:
            n = min(n, max(1, int(q) // int(period)))
    return max(1, n)


def memory_budget(available: int | None) -> int | None:
    return None if available is None else max(0, available - HEADROOM)


def default_jobs(archs: Iterable[str], cpus: int | None = None, meminfo: str | None = None) -> int:
    """min(cores, memory budget / the largest per-nvcc need among `archs`), at least 1."""
    cpus = usable_cpus() if cpus is None else cpus
    need = max((memory_per_job(a) for a in archs), default=DEFAULT_MEMORY_PER_JOB)
    budget = memory_budget(mem_available(meminfo))
    if budget is None:
        return max(1, cpus)
    return max(1, min(cpus, budget // need))
