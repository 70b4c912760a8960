"""Compare two profile runs' winners: `python3 scripts/compare_tuning.py RESULTS_A RESULTS_B` (directories
holding tuning.json). One line per (op, problem) of every family (GEMM, attention, conv): each run's winner and
median, and whether they agree exactly, agree within the measured noise (the other run's winner is among this
run's ties), or differ. Exit 0 when every problem agrees at least within the noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def problem_label(p: dict) -> str:
    """The problem's key as emitter names it (its family's profile problem), else its fields in one string."""
    try:
        from emitter.profile.config import problem_from_json

        return problem_from_json(p).key
    except Exception:  # noqa: BLE001 - emitter not importable here: a label of the fields themselves
        if {"m", "n", "k"} <= set(p) and p.get("family", "gemm") == "gemm":
            return f"{p['m']}x{p['n']}x{p['k']}" + (f"x{p['batch']}" if p.get("batch", 1) != 1 else "")
        return ",".join(f"{k}={v}" for k, v in sorted(p.items()) if k != "family")


def _entries(d: Path) -> dict[tuple, dict]:
    data = json.loads((d / "tuning.json").read_text(encoding="utf-8"))
    out = {}
    for e in data["entries"]:
        op = e["op"]
        out[(op.get("family", "gemm"), op.get("key") or json.dumps(op, sort_keys=True), problem_label(e["problem"]))] = e
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = (_entries(Path(x)) for x in argv)
    bad = 0
    per: dict[str, list[int]] = {}
    print(f"{'family':<9} {'op':<36} {'problem':>40}  {'same':<6} {'A ms':>9} {'B ms':>9}  winner A / winner B")
    for key in sorted(set(a) | set(b)):
        fam, op, prob = key
        counts = per.setdefault(fam, [0, 0])
        counts[1] += 1
        ea, eb = a.get(key), b.get(key)
        if ea is None or eb is None:
            print(f"{fam:<9} {op[:36]:<36} {prob[-40:]:>40}  {'MISSING':<6} in {'A' if ea is None else 'B'}")
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
        if verdict != "NO":
            counts[0] += 1
        ma, mb = ea.get("median_ms"), eb.get("median_ms")
        print(f"{fam:<9} {op[:36]:<36} {prob[-40:]:>40}  {verdict:<6} {ma if ma is None else f'{ma:9.4f}':>9} "
              f"{mb if mb is None else f'{mb:9.4f}':>9}  {la}" + ("" if la == lb else f" / {lb}"))
    n = len(set(a) | set(b))
    fams = ", ".join(f"{f} {ok}/{all_}" for f, (ok, all_) in sorted(per.items()))
    print(f"{n - bad} of {n} problems agree (exactly or within the noise; {fams})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
