"""Verify reports: a terminal table (rich), JSON results per instance x problem, JUnit XML, the exit code."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Iterable

from emitter.fsutil import atomic_write_text
from emitter.verify.runner import VerifyRun

STATUSES = ("PASSED", "FAILED", "SKIPPED")
SCHEMA_VERSION = 1


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become strings, numpy scalars plain Python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def replay_line(run: VerifyRun) -> str:
    """The command that repeats the run: the CLI's (selection, problems, --quick, backend, seed), else the
    manifest directory and the seed."""
    return getattr(run, "replay", "") or f"emitter verify {run.root} --seed {run.seed}"


def summary(run: VerifyRun) -> dict[str, Any]:
    counts = Counter(r["status"] for r in run.results)
    per_instance = instance_status(run.results)
    return {
        "cases": {s: counts.get(s, 0) for s in STATUSES},
        "instances": {s: sum(v == s for v in per_instance.values()) for s in STATUSES},
        "total_cases": len(run.results),
        "total_instances": len(per_instance),
    }


def instance_status(results: Iterable[dict[str, Any]]) -> "OrderedDict[str, str]":
    """FAILED if any case failed; PASSED if any passed (and none failed); else SKIPPED."""
    out: OrderedDict[str, str] = OrderedDict()
    for r in results:
        cur = out.get(r["instance"])
        s = r["status"]
        if cur == "FAILED" or s == "FAILED":
            out[r["instance"]] = "FAILED"
        elif cur == "PASSED" or s == "PASSED":
            out[r["instance"]] = "PASSED"
        else:
            out[r["instance"]] = "SKIPPED"
    return out


def to_json(run: VerifyRun) -> dict[str, Any]:
    return _clean({
        "schema_version": SCHEMA_VERSION,
        "tool": "emitter verify",
        "manifest_dir": run.root,
        "backend": run.backend,
        "device": run.device,
        "seed": run.seed,
        "replay": replay_line(run),
        "started_at": run.started_at,
        "wall_s": round(run.wall_s, 3),
        "summary": summary(run),
        "results": run.results,
    })


def write_json(run: VerifyRun, path: str | Path) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(to_json(run), indent=2) + "\n")
    return path


def to_junit(run: VerifyRun) -> str:
    s = summary(run)
    suites = ET.Element("testsuites", name="emitter verify", tests=str(s["total_cases"]),
                        failures=str(s["cases"]["FAILED"]), skipped=str(s["cases"]["SKIPPED"]), errors="0",
                        time=f"{run.wall_s:.3f}")
    by_inst: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
    for r in run.results:
        by_inst.setdefault(r["instance"], []).append(r)
    for name, rows in by_inst.items():
        c = Counter(r["status"] for r in rows)
        suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(rows)), failures=str(c.get("FAILED", 0)),
                              skipped=str(c.get("SKIPPED", 0)), errors="0",
                              time=f"{sum(float(r.get('wall_s') or 0) for r in rows):.3f}")
        props = ET.SubElement(suite, "properties")
        for k, v in (("backend", run.backend), ("device", run.device), ("seed", str(run.seed))):
            ET.SubElement(props, "property", name=k, value=v)
        for r in rows:
            case = ET.SubElement(suite, "testcase", classname=f"verify.{name}", name=str(r["problem"]),
                                 time=f"{float(r.get('wall_s') or 0):.3f}")
            if r["status"] == "FAILED":
                f = ET.SubElement(case, "failure", message=str(r.get("reason", ""))[:500], type="VerifyFailure")
                f.text = json.dumps(_clean({k: v for k, v in r.items() if k not in ("problem_spec",)}), indent=1)
            elif r["status"] == "SKIPPED":
                ET.SubElement(case, "skipped", message=str(r.get("reason", ""))[:500])
            if r.get("output"):
                out = ET.SubElement(case, "system-out")
                out.text = str(r["output"])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_junit(run: VerifyRun, path: str | Path) -> Path:
    path = Path(path)
    atomic_write_text(path, to_junit(run))
    return path


def exit_code(run: VerifyRun) -> int:
    return 1 if run.failed else 0


def _fmt(x: Any, spec: str = ".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return format(x, spec)


def print_report(run: VerifyRun, console: Any = None, details: int = 30) -> None:
    """The terminal table: one row per instance, then the failures with their reasons."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    table = Table(title=escape(f"verify {run.root}  [{run.backend}: {run.device}]  seed {run.seed}"))
    for col, just in (("instance", "left"), ("status", "left"), ("pass", "right"), ("fail", "right"),
                      ("skip", "right"), ("worst rel err / tol", "right"), ("max ms", "right")):
        table.add_column(col, justify=just, overflow="fold")
    statuses = instance_status(run.results)
    style = {"PASSED": "green", "FAILED": "bold red", "SKIPPED": "yellow"}
    for name, st in statuses.items():
        rows = [r for r in run.results if r["instance"] == name]
        c = Counter(r["status"] for r in rows)
        ratios = [(r["rel_err"] / r["tol"], r) for r in rows
                  if r.get("rel_err") is not None and r.get("tol")]
        worst = max(ratios, key=lambda t: t[0], default=None)
        exact = sum(1 for r in rows if r.get("check") == "exact" and r["status"] == "PASSED")
        worst_txt = f"{_fmt(worst[1]['rel_err'])} / {worst[1]['tol']:g}" if worst else "-"
        if exact:
            worst_txt += f" (+{exact} exact)"
        times = [r["time_ms"] for r in rows if r.get("time_ms")]
        table.add_row(escape(name), f"[{style[st]}]{st}[/]", str(c.get("PASSED", 0)), str(c.get("FAILED", 0)),
                      str(c.get("SKIPPED", 0)), worst_txt, _fmt(max(times), ".3f") if times else "-")
    console.print(table)
    fails = [r for r in run.results if r["status"] == "FAILED"]
    for r in fails[:details]:
        console.print(f"[bold red]FAILED[/] " + escape(f"{r['instance']} [{r['problem']}] seed={r.get('seed')}: {r.get('reason', '')}"),
                      markup=True, highlight=False, soft_wrap=True)
        if r.get("output"):
            console.print("    output: " + str(r["output"])[-600:].replace("\n", "\n    "), markup=False)
    if len(fails) > details:
        console.print(f"... and {len(fails) - details} more failures (see the JSON report)")
    s = summary(run)
    cs, ins = s["cases"], s["instances"]
    console.print(f"verify: {s['total_instances']} instances ({ins['PASSED']} passed, {ins['FAILED']} failed, "
                  f"{ins['SKIPPED']} skipped); {s['total_cases']} cases: {cs['PASSED']} passed, {cs['FAILED']} failed, "
                  f"{cs['SKIPPED']} skipped; {run.wall_s:.1f} s; replay: {escape(replay_line(run))}", highlight=False, soft_wrap=True)
