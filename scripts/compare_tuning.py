"""Compare two profile runs' winners: `python3 scripts/compare_tuning.py RESULTS_A RESULTS_B` (directories
holding tuning.json). One line per (op, problem): each run's winner and median, and whether they agree exactly,
agree within the measured noise (the other run's winner is among this run's ties), or differ. Exit 0 when every
problem agrees at least within the noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _entries(d: Path) -> dict[tuple, dict]:
    data = json.loads((d / "tuning.json").read_text(encoding="utf-8"))
    out = {}
    for e in data["entries"]:
        p = e["problem"]
        key = (json.dumps(e["op"], sort_keys=True), f"{p['m']}x{p['n']}x{p['k']}" + (f"x{p['batch']}" if p.get("batch", 1) != 1 else ""))
        out[key] = e
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = (_entries(Path(x)) for x in argv)
    bad = 0
    print(f"{'problem':>20}  {'same':<6} {'A ms':>9} {'B ms':>9}  winner A / winner B")
    for key in sorted(set(a) | set(b)):
        ea, eb = a.get(key), b.get(key)
        if ea is None or eb is None:
            print(f"{key[1]:>20}  {'MISSING':<6} in {'A' if ea is None else 'B'}")
            bad += 1
            continue
        la, lb = ea["fastest"], eb["fastest"]
        if la == lb:
            verdict = "yes"
        elif lb in ea.get("ties", []) or la in eb.get("ties", []):
            verdict = "noise"
        else:
            verdict = "NO"
            bad += 1
        print(f"{key[1]:>20}  {verdict:<6} {ea['median_ms']:9.4f} {eb['median_ms']:9.4f}  {la}" + ("" if la == lb else f" / {lb}"))
    print(f"{len(set(a) | set(b)) - bad} of {len(set(a) | set(b))} problems agree (exactly or within the noise)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
