"""Host (Python-side) cost of the exported library's loader per gemm() call, without a GPU: the loader against the
fake C library of tests/gemm/test_loader.py (records the problem, returns), with real CPU torch tensors posing as
cuda:0 (`Tensor.get_device` patched to 0; the same patch in every row). It isolates what loader_overhead.py's
GPU numbers hold beyond the C API + launch: the fast path's checks, key, packing and output allocation.

    .venv/bin/python benchmarks/loader_host_cpu.py --torch-python /path/to/python-with-torch

The export + fake library are made with this interpreter (emitter's dependencies), the timing runs under
--torch-python (any Python with torch; CPU torch is enough). Prints us/call of gemm(a, b) (allocating),
gemm(a, b, out), the prebuilt C call through ctypes, and torch's allocation primitives for reference.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMING = r'''
import importlib.util, sys, timeit
from pathlib import Path
import torch
d = Path(sys.argv[1])
torch.Tensor.get_device = lambda self: 0          # CPU tensors posing as cuda:0 (same cost in every row)
spec = importlib.util.spec_from_file_location("fakelib", d / "lib" / "python" / "fakelib.py")
mod = importlib.util.module_from_spec(spec); sys.modules["fakelib"] = mod; spec.loader.exec_module(mod)
mod.load(str(d / "libfakelib.so"))
mod.init_torch()
mod.raw_stream = lambda dev: 0x5000
mod.current_device = lambda: 0
mod.empty_tensor = lambda shape, dt, dev: torch.empty(shape, dtype=dt)   # the full path's first allocation, on the CPU
m = n = k = 64
a = torch.randn(m, k, dtype=torch.bfloat16); b = torch.randn(n, k, dtype=torch.bfloat16).t()
out = torch.empty(m, n, dtype=torch.bfloat16)
mod.gemm(a, b); mod.gemm(a, b, out)               # the plans
r = mod.gemm(a, b)
assert tuple(r.shape) == (m, n) and r.stride() == (n, 1) and r.dtype == torch.bfloat16
packed = mod._problem(a, b, out, None, 1.0, 0.0, None, None, "identity", None, None, None, None, None, True, None,
                      False)[0]
rows = {"gemm(a, b)          (allocates out)": lambda: mod.gemm(a, b),
        "gemm(a, b, out)": lambda: mod.gemm(a, b, out),
        "C call via ctypes   (prebuilt problem)": lambda: mod._GEMM(packed, None, 0, None),
        "torch.empty(shape, dtype=, device=)": lambda: torch.empty((m, n), dtype=torch.bfloat16, device=torch.device("cpu")),
        "torch.empty_like(1-elem expanded)": (lambda t: lambda: torch.empty_like(t))(a.new_empty((1, 1)).expand(m, n))}
for label, fn in rows.items():
    t = min(timeit.repeat(fn, number=20000, repeat=9)) / 20000 * 1e6
    print(f"  {label:42s} {t:7.3f} us/call")
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch-python", default=sys.executable, help="a Python interpreter with torch (CPU is enough)")
    ap.add_argument("--keep", type=Path, help="work in this directory (kept)")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gemm")]
    import test_loader as T  # the fake C library and the spec the loader tests use

    from emitter.emit import emit
    from emitter.library.export import export_library

    d = args.keep or Path(tempfile.mkdtemp(prefix="loader_host_cpu_"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "tiny.yaml").write_text(T.SPEC)
    emit([d / "tiny.yaml"], d / "gen", jobs=1)
    export_library([d / "gen"], T.LIB, d / "lib")
    (d / "fake.c").write_text(T._FAKE_C)
    subprocess.run([T.CC, "-std=c99", "-O2", "-shared", "-fPIC", f"-I{d / 'lib' / 'include'}", str(d / "fake.c"),
                    "-o", str(d / "libfakelib.so")], check=True)
    (d / "timing.py").write_text(TIMING)
    print(f"loader host cost per call (CPU torch, fake C library; {d}):", flush=True)
    try:
        subprocess.run([args.torch_python, str(d / "timing.py"), str(d)], check=True)
    finally:
        if args.keep is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
