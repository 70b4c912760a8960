"""What Ray adds to a build, apart from nvcc: `python benchmarks/ray_overhead.py [-n 200] [-j 2]`.

Builds n tiny instances with a stand-in nvcc that returns at once (so only the dispatch is timed: packing the
source, the task's round trip through Ray's object store, writing the artifact, the cache commit), through
the local thread pool and through Ray (a local instance, started inside the timing and separately), and
prints the wall time of each and Ray's cost per compile. Real compiles take 5-25 s of CPU each
(docs/scale-out.md), so a few ms per task is what to compare against.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

FAKE = r'''#!/bin/sh
# a no-op nvcc: --version, else copy the source (the last argument) to the -o path
case " $* " in *" --version "*) echo "Cuda compilation tools, release 13.0, V13.0.fake"; exit 0;; esac
out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
cp "$a" "$out"
'''


def manifest(out: Path, n: int) -> Path:
    out.mkdir(parents=True)
    inst = []
    for i in range(n):
        name = f"k{i:04d}"
        (out / f"{name}.cu").write_text(f"// {name}\n" + "x" * 20000)      # ~ an emitted source's size
        inst.append({"name": name, "family": "gemm", "arch": "sm80", "source": f"{name}.cu", "spec": "b.yaml",
                     "spec_hash": "0" * 64, "config": {}})
    (out / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0.1.0",
                                                   "generated_at": None, "specs": [], "instances": inst,
                                                   "rejected": []}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-j", type=int, default=2)
    args = ap.parse_args()
    from emitter.build import BuildOptions, build

    tmp = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    nvcc = tmp / "nvcc"
    nvcc.write_text(FAKE)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    os.environ["EMITTER_NVCC"] = str(nvcc)
    rows = {}
    t0 = time.perf_counter()
    s = build(manifest(tmp / "local", args.n), options=BuildOptions(jobs=args.j, cache_dir=tmp / "c1"))
    rows["local thread pool"] = time.perf_counter() - t0
    assert s.ok, s.failed[:1]
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=args.j, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = build(manifest(tmp / "ray", args.n), options=BuildOptions(executor="ray", cache_dir=tmp / "c2"))
    rows["ray (running instance)"] = time.perf_counter() - t0
    assert s.ok, s.failed[:1]
    ray.shutdown()
    print(f"{args.n} instances ({2 * args.n} compiles of a no-op nvcc), {args.j} CPUs:")
    for k, v in rows.items():
        print(f"  {k:<24} {v:7.2f} s   {v / (2 * args.n) * 1e3:6.1f} ms a compile")
    print(f"  ray.init                 {start:7.2f} s")
    extra = rows["ray (running instance)"] - rows["local thread pool"]
    print(f"  Ray's cost: {extra / (2 * args.n) * 1e3:.1f} ms a compile over the local pool, + {start:.1f} s to start")


if __name__ == "__main__":
    main()
