"""Benchmark: emit >= 10,000 instances (validate + render + write + manifest) and print the time.

Target (issue 2): under 10 s on the 2-core development machine. Run: `make bench` or
`python benchmarks/emit_speed.py [--repeat 3]`. Prints a table; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emitter.emit import emit  # noqa: E402

# A sweep that yields well over 10,000 accepted sm90a + sm80 instances (and some rejections).
SPEC = """
kernels:
  - arch: sm90a
    dtype: [bf16, f16]
    layout: [tn, nn, nt, tt]
    tile: [64x64x64, 64x128x64, 64x256x64, 128x64x64, 128x128x64, 128x256x64, 256x128x64]
    cluster: [1x1x1, 2x1x1, 1x2x1, 2x2x1, 4x1x1]
    schedule: {kernel: [cooperative, pingpong], tile_scheduler: [persistent, stream_k]}
    exclude: [{schedule: {kernel: pingpong, tile_scheduler: stream_k}}]
    epilogue: {activation: [identity, relu, gelu, silu, sigmoid], bias: [none, row, column]}
  - arch: sm80
    dtype: [f16, bf16]
    layout: [tn, nn, nt, tt]
    tile: [128x128x32, 128x256x32, 256x128x32, 64x64x32, 128x128x64]
    stages: [3, 4, 5]
    swizzle: [1, 2, 4, 8]
    epilogue: [identity, relu, gelu, silu, sigmoid]
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "generated"),
                    help="where the scratch output goes (default: generated/, like a real emit)")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".emit-bench-", dir=args.dir))
    try:
        spec = work / "sweep.yaml"
        spec.write_text(SPEC)
        times, fresh = [], []
        result = None
        for i in range(args.repeat):
            out = work / f"out{i}"
            t0 = time.perf_counter()
            result = emit([spec], out)
            times.append(time.perf_counter() - t0)
            fresh.append(result.written)
        # a re-emit into an existing directory (files unchanged: compared, not rewritten)
        t0 = time.perf_counter()
        again = emit([spec], work / "out0")
        t_again = time.perf_counter() - t0
        assert result is not None
        n, rej = len(result.instances), len(result.rejected)
        print(f"{'case':34} {'instances':>9} {'rejected':>8} {'median s':>9} {'min s':>7} {'per 10k s':>9}")
        med = statistics.median(times)
        print(f"{'emit into an empty directory':34} {n:9d} {rej:8d} {med:9.2f} {min(times):7.2f} {med / n * 1e4:9.2f}")
        print(f"{'re-emit, nothing changed':34} {len(again.instances):9d} {len(again.rejected):8d} {t_again:9.2f} "
              f"{t_again:7.2f} {t_again / n * 1e4:9.2f}")
        print(f"target: 10,000 instances under 10 s -> {'MET' if med / n * 1e4 < 10 and n >= 10000 else 'NOT MET'}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
