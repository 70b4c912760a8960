"""Per-instance compile time: `emitter build` (cold cache) against plain nvcc of the same .cu, same flags.

    python benchmarks/build_overhead.py                      # a tiny synthetic instance (Python overhead)
    python benchmarks/build_overhead.py generated/demo --per-arch 1 [--experiments]

For each picked instance, in a private copy of the manifest holding only it:
  plain        the two nvcc command lines emitter records (device cubin, then host shim), one after another
  plain -t0    the same with nvcc --threads 0
  emitter -j1  `emitter build --cache-dir <empty> -j 1` (the two compiles one after another), whole CLI
  emitter -j2  the same with -j 2: device and host compiles overlap
ratio = time / plain; the target is emitter -j1 <= 1.05x (bookkeeping overhead) and -j2 below 1x.
--experiments also times alternatives for the host shim and device pass one by one (see the report).
Heavy CUTLASS compiles on a shared machine: run it under `flock /tmp/nvcc.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from emitter.build.builder import plan, toolchain  # noqa: E402
from emitter.build.nvcc import Commands  # noqa: E402
from emitter.selection import select  # noqa: E402

TINY = """#ifdef EMITTER_DEVICE
extern "C" __global__ void emitter_tiny_kernel(float* p) { p[threadIdx.x] = 1.0f; }
#else
extern "C" int emitter_tiny_query(void) { return 0; }
#endif
"""


def one_instance_manifest(work: Path, src_root: Path | None, entry: dict | None) -> Path:
    out = work / "m"
    out.mkdir(parents=True)
    if entry is None:
        (out / "tiny.cu").write_text(TINY)
        entry = {"name": "tiny", "family": "gemm", "arch": "sm80", "source": "tiny.cu", "spec": "-",
                 "spec_hash": "0", "config": {}}
    else:
        shutil.copy(src_root / entry["source"], out / entry["source"])
    (out / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "bench",
                                                   "generated_at": None, "specs": [], "instances": [entry],
                                                   "rejected": []}))
    return out


class T:
    """Wall and CPU seconds (user + system of the process tree, which contention on a shared machine
    disturbs far less than wall time)."""

    def __init__(self, wall: float = 0.0, cpu: float = 0.0):
        self.wall, self.cpu = wall, cpu

    def __add__(self, other: "T") -> "T":
        return T(self.wall + other.wall, self.cpu + other.cpu)


def timed(argv: list[str], cwd: Path, env: dict | None = None) -> T:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(argv)}\n{r.stdout.decode()[-3000:]}")
    return T(dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))


def plain(out: Path, extra: tuple[str, ...] = ()) -> T:
    p = plan(out, json.loads((out / "manifest.json").read_text())["instances"], toolchain())[0]
    (out / "plain").mkdir(exist_ok=True)
    dev = Commands.fill(p.cmds.device, p.src_rel, "plain/x.cubin")
    host = Commands.fill(p.cmds.host, p.src_rel, "plain/libx.so")
    return timed(dev[:1] + list(extra) + dev[1:], out) + timed(host[:1] + list(extra) + host[1:], out)


def emitter_build(out: Path, jobs: int) -> T:
    cache = Path(tempfile.mkdtemp(prefix="emitter-bench-cache-"))
    shutil.rmtree(out / "build", ignore_errors=True)
    try:
        return timed([sys.executable, "-m", "emitter", "build", str(out), "-j", str(jobs), "--cache-dir", str(cache),
                      "--no-progress"], ROOT, dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def experiments(out: Path, repeat: int) -> None:
    """Alternatives for each compile alone, A/B alternated `repeat` times: what nvcc offers to make one
    instance cheaper. Medians; CPU time is the figure to trust on a shared machine."""
    p = plan(out, json.loads((out / "manifest.json").read_text())["instances"], toolchain())[0]
    dev = Commands.fill(p.cmds.device, p.src_rel, "x.cubin")
    host = Commands.fill(p.cmds.host, p.src_rel, "libx.so")
    rows = [
        ("device cubin (as built)", dev),
        ("device cubin --split-compile 0", dev[:1] + ["--split-compile", "0"] + dev[1:]),
        ("host shim (as built)", host),
        ("host shim -fdevice-syntax-only", host[:1] + ["-fdevice-syntax-only"] + host[1:]),
    ]
    times: dict[str, list[T]] = {label: [] for label, _ in rows}
    for _ in range(repeat):
        for label, argv in rows:
            times[label].append(timed(argv, out))
    for label, ts in times.items():
        print(f"    {label:<36} wall {statistics.median(t.wall for t in ts):7.2f} s   "
              f"cpu {statistics.median(t.cpu for t in ts):7.2f} s   (cpu runs: "
              f"{', '.join(f'{t.cpu:.1f}' for t in ts)})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest", nargs="?", help="an emitted output directory; default: a tiny synthetic instance")
    ap.add_argument("--select", action="append", default=[], help="selection pattern (as emitter build)")
    ap.add_argument("--per-arch", type=int, default=1, help="instances per arch to time (default 1)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (default: 5 tiny, 1 real)")
    ap.add_argument("--experiments", action="store_true", help="also time nvcc alternatives per compile")
    ap.add_argument("--only-experiments", action="store_true", help="time only the nvcc alternatives")
    args = ap.parse_args()

    picks: list[tuple[Path | None, dict | None]] = []
    if args.manifest:
        src = Path(args.manifest)
        entries = select(json.loads((src / "manifest.json").read_text())["instances"], args.select)
        per: dict[str, int] = {}
        for e in entries:
            if per.get(e["arch"], 0) < args.per_arch:
                per[e["arch"]] = per.get(e["arch"], 0) + 1
                picks.append((src, e))
    else:
        picks.append((None, None))
    repeat = args.repeat or (1 if args.manifest else 5)
    print(f"{'instance':<44} {'':4} {'plain':>8} {'plain-t0':>9} {'emit-j1':>8} {'ratio':>6} {'emit-j2':>8} {'ratio':>6}")
    for src, entry in picks:
        with tempfile.TemporaryDirectory(prefix="emitter-bench-") as tmp:
            out = one_instance_manifest(Path(tmp), src, entry)
            name = entry["name"] if entry else "tiny (synthetic, sm80)"
            t: dict[str, list[T]] = {"plain": [], "t0": [], "j1": [], "j2": []}
            if args.only_experiments:
                print(name)
                experiments(out, repeat)
                continue
            for _ in range(repeat):          # interleaved, so drift on a shared machine hits all alike
                t["plain"].append(plain(out))
                t["j1"].append(emitter_build(out, 1))
                t["t0"].append(plain(out, ("--threads", "0")))
                t["j2"].append(emitter_build(out, 2))
            for what in ("wall", "cpu"):
                m = {k: statistics.median(getattr(x, what) for x in v) for k, v in t.items()}
                print(f"{name[:44] if what == 'wall' else '':<44} {what:4} {m['plain']:8.2f} {m['t0']:9.2f} "
                      f"{m['j1']:8.2f} {m['j1'] / m['plain']:6.3f} {m['j2']:8.2f} {m['j2'] / m['plain']:6.3f}",
                      flush=True)
            if args.experiments:
                experiments(out, repeat)


if __name__ == "__main__":
    main()
