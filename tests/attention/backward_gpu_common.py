"""What the sm80 and sm90a attention-backward GPU tests share: planting bugs into emitted sources, one line per
verdict, a verdict report under EMITTER_GPU_REPORTS, running one case of a planted (or its base) instance, and a
median of CUDA-event timings."""

import json
import os
from pathlib import Path


def plant_bugs(root: Path, real: list[dict], plants: list) -> list[dict]:
    """Each (kind, base instance name, [(exact text, replacement)]) of `plants` as a new source beside its base."""
    by_name = {e["name"]: e for e in real}
    planted = []
    for kind, base_name, edits in plants:
        base = by_name[base_name]
        text = (root / base["source"]).read_text()
        for old, new in edits:
            assert old in text, f"planting {kind}: {base_name}.cu no longer contains {old!r}"
            text = text.replace(old, new, 1)
        name = f"{base_name}_bug_{kind}"
        text = text.replace(base_name, name)
        (root / f"{name}.cu").write_text(text)
        planted.append({**base, "name": name, "source": f"{name}.cu", "planted": kind})
    return planted


def report(prefix: str, name: str, data) -> None:
    d = os.environ.get("EMITTER_GPU_REPORTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / f"{prefix}_{name}.json").write_text(json.dumps(data, indent=1, default=str))


def verdict_line(v) -> str:
    errs = " ".join(f"{k} {x:.1e}" for k, x in (v.get("errors") or {}).items())
    word = {"PASSED": "PASS", "FAILED": "FAIL", "SKIPPED": "SKIP"}.get(v["status"], v["status"])
    text = f"{word} {v['instance']} [{v['label']}] {errs}"
    if v["status"] != "PASSED":
        text += f": {v.get('reason', '')} tensors={v.get('failed_tensors')} heads={v.get('failed_heads')}"
    return text


def run_planted(suite, kind: str, base: bool = False, **problem):
    """One case on the planted `kind` instance (base=True: on the instance it was planted into)."""
    from emitter.families.attention.problem import make_problem

    root, real, planted, records, runner = suite
    entry = planted[kind]
    if base:
        entry = next(e for e in real if e["name"] == entry["name"].split("_bug_")[0])
    else:
        assert records[entry["name"]].status != "failed", f"the planted {kind} variant must build"
    v = runner.run_case(entry, make_problem(**problem), "normal", seed=7)
    print(verdict_line(v))
    return v


def median_ms(torch, fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]
