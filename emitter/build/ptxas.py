"""Reading `nvcc -Xptxas=-v` output: per-function resources, spills, and the wgmma-serialization warning.

ptxas -v prints, per entry or device function:
    ptxas info    : Compiling entry function 'emitter_x_kernel' for 'sm_90a'
    ptxas info    : Function properties for emitter_x_kernel
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 168 registers, used 2 barriers, 1024 bytes smem, 400 bytes cmem[0]
and, when the wgmma pipeline cannot be kept asynchronous (C7510 and its siblings, e.g. a debug build
without -DNDEBUG, extern calls, too few registers):
    ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_COMPILING = re.compile(r"Compiling (?:entry )?function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CUM_STACK = re.compile(r"(\d+) bytes cumulative stack size")
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized|\(C7510\)")
_WARNING = re.compile(r"^\s*(?:ptxas|nvlink)?\s*warning\s*:|warning #|: warning:", re.IGNORECASE)


@dataclass
class FunctionResources:
    name: str
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass
class PtxasReport:
    functions: dict[str, FunctionResources] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    serialized_wgmma: list[str] = field(default_factory=list)   # the C7510-style lines

    def resources(self, entry: str | None = None) -> dict[str, int]:
        """Resources of `entry` when ptxas reported it, else the maximum over all functions."""
        if entry and entry in self.functions:
            picked = [self.functions[entry]]
        else:
            picked = list(self.functions.values())
        if not picked:
            return {"registers": 0, "shared_bytes": 0, "spill_bytes": 0, "stack_bytes": 0}
        return {
            "registers": max(f.registers for f in picked),
            "shared_bytes": max(f.shared_bytes for f in picked),
            "spill_bytes": max(f.spill_bytes for f in picked),
            "stack_bytes": max(f.stack_bytes for f in picked),
        }

    @property
    def spilling(self) -> list[FunctionResources]:
        return [f for f in self.functions.values() if f.spill_bytes]


def parse(log: str) -> PtxasReport:
    report = PtxasReport()
    current: FunctionResources | None = None

    def fn(name: str) -> FunctionResources:
        return report.functions.setdefault(name, FunctionResources(name))

    for line in log.splitlines():
        m = _COMPILING.search(line) or _PROPS.search(line)
        if m:
            current = fn(m.group(1))
            continue
        m = _FRAME.search(line)
        if m and current is not None:
            current.stack_bytes = max(current.stack_bytes, int(m.group(1)))
            current.spill_stores = int(m.group(2))
            current.spill_loads = int(m.group(3))
            continue
        m = _USED.search(line)
        if m and current is not None:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            if s:
                current.shared_bytes = int(s.group(1))
            s = _CUM_STACK.search(line)
            if s:
                current.stack_bytes = max(current.stack_bytes, int(s.group(1)))
            continue
        if _SERIALIZED.search(line):
            report.serialized_wgmma.append(line.strip())
            report.warnings.append(line.strip())
        elif _WARNING.search(line):
            report.warnings.append(line.strip())
    return report
