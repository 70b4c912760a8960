"""Head-to-head confirmation (emitter.profile.confirm) on a fake profile run: which launches it times, in
which order, the figure it reports, resume, a fault, and the benchmark report that takes its ratios."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.profile import confirm
from emitter.profile.worker import FakeEngine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A finished fake profile: bf16 + fp8 sm90a kernels on two problems, with a run-time swizzle variant."""
    from emitter.cli import main
    from emitter.emit import emit

    tmp = tmp_path_factory.mktemp("confirm")
    gen = tmp / "gen"
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml", ROOT / "configs/gemm/sm90a_fp8.yaml"], gen)
    cfg = tmp / "p.yaml"
    cfg.write_text(f"manifests: [{gen}]\nproblems: [{{square: 1024}}, {{m: 128, n: 4096, k: 4096}}]\n"
                   f"timing: {{iterations: 10, repeats: 2}}\nscheduler: {{swizzle: [null, 4]}}\n"
                   f"output: {{dir: {tmp / 'run' / 'profile'}, plots: false}}\n")
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake"])
    assert res.exit_code == 0, res.output
    return tmp / "run" / "profile"


class Drifting(FakeEngine):
    """The fake engine with a clock that drifts: each head-to-head round is 1% slower than the one before, for
    both sides alike (they are timed launch by launch, so they share the clock), and a baseline 3% slower head
    to head than in the sweep. Records what it timed."""

    def __init__(self, config, gpu, fail_on: str | None = None, fatal: bool = False):
        super().__init__(config, gpu)
        self.calls: list[tuple] = []
        self.fail_on, self.fatal = fail_on, fatal

    def head_to_head(self, kernel, data, m, baseline):
        from dataclasses import replace

        from emitter.runtime.backend import CudaFault

        self.calls.append((m.name, data["problem"].key, m.split_k, m.options, self.config.check, baseline))
        if self.fail_on and self.fail_on in m.name:
            if self.fatal:
                raise CudaFault("an illegal memory access was encountered")
            raise RuntimeError("launch refused")
        drift = 1.01 ** len(self.calls)
        k, b = super().head_to_head(kernel, data, m, baseline)
        return replace(k, median_ms=k.median_ms * drift), replace(b, median_ms=b.median_ms * drift * 1.03)


def test_confirms_each_winner_head_to_head_with_the_baseline(profiled):
    wins = confirm.winners(profiled)
    rows = json.loads((profiled / "profile.json").read_text())["rows"]
    best = {(r["op"], r["m"], r["n"], r["k"]): (r["name"], r["split_k"], r["options"])
            for r in rows if r.get("best")}
    # one winner per (op, problem): 3 ops (bf16, fp8, fp8 fast accumulation) x 2 problems
    assert len(wins) == 6 and {(w["op"], w["m"], w["n"], w["k"]): (w["kernel"], w["split_k"], w["options"])
                               for w in wins} == best
    engines = []

    def factory(cfg, gpu):
        engines.append(Drifting(cfg, gpu))
        return engines[0]

    res = confirm.run(profiled, rounds=4, engine_factory=factory, say=lambda s: None)
    calls = engines[0].calls
    assert len(calls) == 6 * 4 and len(res["rows"]) == 6 and res["method"] == confirm.METHOD
    w0 = wins[0]
    # the winner itself, at its split-K count and run-time options, with the check off, against cuBLAS
    assert calls[:4] == [(w0["kernel"], f"{w0['m']}x{w0['n']}x{w0['k']}", w0["split_k"], w0["options"], False,
                          "cublas")] * 4
    for r in res["rows"]:
        assert r["status"] == "ok" and len(r["samples"]) == 4
        ratios = [b / k for k, b in r["samples"]]
        assert r["ratio"] == pytest.approx(statistics.median(ratios))
        assert r["ratio_min"] == min(ratios) and r["ratio_max"] == max(ratios)
        assert r["kernel_ms"] == pytest.approx(statistics.median(k for k, _ in r["samples"]))
        # each round's ratio pairs that round's two figures: a drift both sides share leaves it as it is
        assert r["ratio_min"] == pytest.approx(r["ratio_max"])
    assert json.loads((profiled / confirm.CONFIRM_FILE).read_text()) == json.loads(json.dumps(res))


def test_a_failed_winner_is_recorded_and_a_fault_stops_the_run_for_resume(profiled, tmp_path):
    import shutil

    out = tmp_path / "res"
    shutil.copytree(profiled, out)
    (out / confirm.CONFIRM_FILE).unlink(missing_ok=True)
    wins = confirm.winners(out)
    victim = wins[2]["kernel"]
    engine = Drifting
    res = confirm.run(out, rounds=2, engine_factory=lambda c, g: engine(c, g, fail_on=victim), say=lambda s: None)
    failed = [r for r in res["rows"] if r["status"] != "ok"]
    assert failed and all(r["kernel"] == victim and "launch refused" in r["reason"] for r in failed)
    assert len(res["rows"]) == 6          # not fatal: the others go on

    (out / confirm.CONFIRM_FILE).unlink()
    said = []
    res = confirm.run(out, rounds=2, engine_factory=lambda c, g: engine(c, g, fail_on=victim, fatal=True),
                      say=said.append)
    stop = next(i for i, r in enumerate(res["rows"]) if r["status"] != "ok")
    assert res["rows"][stop]["status"] == "fault" and len(res["rows"]) == stop + 1 and "stopping" in said[-1]
    # --resume keeps the confirmed rows and times the rest
    fresh: list[Drifting] = []

    def factory(c, g):
        fresh.append(Drifting(c, g))
        return fresh[-1]

    again = confirm.run(out, rounds=2, engine_factory=factory, resume=True, say=lambda s: None)
    assert [r["status"] for r in again["rows"]] == ["ok"] * 6
    assert again["rows"][:stop] == res["rows"][:stop]
    assert len(fresh[0].calls) == (6 - stop) * 2


def test_cli_and_errors(profiled, tmp_path, capsys):
    assert confirm.main([str(tmp_path)]) == 2
    assert "profile.json: not found" in capsys.readouterr().err
    assert confirm.main([str(profiled), "--rounds", "0", "--backend", "fake"]) == 2
    assert confirm.main([str(profiled), "--rounds", "2", "--backend", "fake"]) == 0
    assert "confirmed 6 of 6" in capsys.readouterr().out


def test_benchmark_report_takes_the_head_to_head_ratio(profiled):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_sm90a as bench
    finally:
        sys.path.pop(0)
    confirm.run(profiled, rounds=3, engine_factory=lambda c, g: Drifting(c, g), say=lambda s: None)
    conf = {(r["op"], r["m"], r["n"], r["k"]): r for r in json.loads((profiled / confirm.CONFIRM_FILE).read_text())["rows"]}
    s = bench.summarize(profiled / "profile.json")
    for op, g in s["ops"].items():
        for x in g["rows"]:
            c = conf[(op, x["m"], x["n"], x["k"])]
            assert x["ratio"] == pytest.approx(c["ratio"]) and x["sweep_ratio"] != x["ratio"]
            assert x["confirm"] == {"rounds": 3, "grain": "launch", "min": c["ratio_min"], "max": c["ratio_max"]}
            flops = 2 * x["m"] * x["n"] * x["k"]
            assert x["tflops"] == pytest.approx(flops / (c["kernel_ms"] * 1e-3) / 1e12, rel=1e-3)
        assert g["geomean"] == pytest.approx(statistics.geometric_mean([x["ratio"] for x in g["rows"]]))


def test_report_marks_confirmed_rows(profiled, tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_sm90a as bench
    finally:
        sys.path.pop(0)
    confirm.run(profiled, rounds=2, engine_factory=lambda c, g: Drifting(c, g), say=lambda s: None)
    s = bench.load_run(profiled.parent)     # a run directory: profile/profile.json + profile/confirm.json
    text = bench.markdown({**bench.merge_runs([s]), "runs": [s["run"]]}, [], "")
    x = s["ops"][next(iter(s["ops"]))]["rows"][0]
    assert f"{x['ratio']:.3f} [{x['confirm']['min']:.3f}-{x['confirm']['max']:.3f}]" in text
    assert "confirmed head to head" in text and "launched one by one in alternation" in text
    assert "each side's whole measurement in turn" not in text


def test_other_gpu_processes_by_nvidia_smi(tmp_path, monkeypatch):
    from emitter.profile import device

    monkeypatch.setenv("PATH", str(tmp_path))
    assert device.other_compute_processes() is None            # no nvidia-smi: cannot say
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"
                   "printf '4242, python3, 1200\\n777, /usr/bin/bench, 300\\n'\n")
    smi.chmod(0o755)
    got = device.other_compute_processes(3, own={4242})
    assert got == [{"pid": "777", "name": "/usr/bin/bench", "used_mib": "300"}]
    args = (tmp_path / "args").read_text()
    assert "--id=3" in args and "--query-compute-apps=pid,process_name,used_memory" in args
    smi.write_text("#!/bin/sh\nprintf ''\n")
    assert device.other_compute_processes() == []


def test_a_row_timed_beside_another_process_is_marked(profiled, tmp_path):
    import shutil

    out = tmp_path / "run" / "profile"
    shutil.copytree(profiled, out)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_sm90a as bench
    finally:
        sys.path.pop(0)
    n = {"calls": 0}

    def watch():            # a neighbour appears after the first row's rounds and stays
        n["calls"] += 1
        return {"smi": {"sm_clock_mhz": "1755", "power_w": "690"},
                "others": [] if n["calls"] == 1 else [{"pid": "777", "name": "bench", "used_mib": "300"}]}

    said: list[str] = []
    res = confirm.run(out, rounds=2, engine_factory=lambda c, g: Drifting(c, g), say=said.append, watch=watch)
    first, second = res["rows"][0], res["rows"][1]
    assert first["shared_with"] == [{"pid": "777", "name": "bench", "used_mib": "300"}]   # seen after its rounds
    assert "shared_with" in second and first["gpu"]["before"]["sm_clock_mhz"] == "1755"
    assert any("WARNING: 777 bench also on the GPU" in s for s in said)
    s = bench.load_run(out.parent)
    text = bench.markdown({**bench.merge_runs([s]), "runs": [s["run"]]}, [], "")
    assert "**shared GPU**" in text
    clean = confirm.run(out, rounds=2, engine_factory=lambda c, g: Drifting(c, g), say=lambda s: None,
                        watch=lambda: {"smi": {}, "others": []})
    assert not any("shared_with" in r for r in clean["rows"])


def test_round_grain_match_and_out(profiled, tmp_path):
    """--grain round (each side's whole measurement in turn, the order swapped each round), --match (some rows
    only) and --out (another file: confirm.json, which the report reads, is left alone)."""
    import shutil

    out = tmp_path / "res"
    shutil.copytree(profiled, out)
    (out / confirm.CONFIRM_FILE).unlink(missing_ok=True)
    calls: list[str] = []

    class Recording(FakeEngine):
        def baseline(self, data, name):
            calls.append("baseline")
            return super().baseline(data, name)

        def kernel(self, kernel, data, m, prune_ms=None):
            calls.append("kernel")
            return super().kernel(kernel, data, m, prune_ms)

        def head_to_head(self, *a):
            raise AssertionError("round grain times each side whole")

    target = tmp_path / "round.json"
    res = confirm.run(out, rounds=2, engine_factory=Recording, say=lambda s: None, grain="round",
                      match="^bf16", out=target)
    assert [r["op"].startswith("bf16") for r in res["rows"]] == [True, True]
    assert calls == ["baseline", "kernel", "kernel", "baseline"] * 2
    assert res["method"] == confirm.METHODS["round"] != confirm.METHOD
    assert json.loads(target.read_text()) == json.loads(json.dumps(res))
    assert not (out / confirm.CONFIRM_FILE).exists()
    for bad, msg in [({"grain": "warp"}, "grain must be one of"), ({"match": "^nothing"}, "matches"),
                     ({"match": "(["}, "not a regular expression")]:
        with pytest.raises(confirm.ConfirmError, match=msg):
            confirm.run(out, rounds=1, engine_factory=Recording, say=lambda s: None, **bad)
    assert confirm.main([str(out), "--rounds", "1", "--backend", "fake", "--match", "1024x1024x1024",
                         "--out", str(tmp_path / "m.json")]) == 0
    assert len(json.loads((tmp_path / "m.json").read_text())["rows"]) == 3


def test_a_tuning_table_is_confirmed_from_its_manifest(profiled, tmp_path):
    """--tuning + --manifest: a tuning table's entries (kernel, split-K count, options) against the baseline, with
    the kernels loaded from the emitted library; no profile directory needed."""
    tuning = profiled / "tuning.json"
    entries = json.loads(tuning.read_text())["entries"]
    gen = profiled.parent.parent / "gen"
    engines: list[Drifting] = []

    def factory(c, g):
        engines.append(Drifting(c, g))
        return engines[-1]

    out = tmp_path / "t.json"
    res = confirm.run(None, rounds=2, engine_factory=factory, say=lambda s: None, tuning=tuning, manifests=(gen,),
                      out=out)
    assert len(res["rows"]) == len(entries) and all(r["status"] == "ok" for r in res["rows"])
    want = {(e["op"]["key"], e["problem"]["m"], e["problem"]["n"], e["problem"]["k"]): (e["kernel"], e.get("split_k", 1),
                                                                                        e.get("options", 0))
            for e in entries}
    assert {(r["op"], r["m"], r["n"], r["k"]): (r["kernel"], r["split_k"], r["options"]) for r in res["rows"]} == want
    assert engines[0].config.timing == confirm.TUNING_TIMING and not engines[0].config.check
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    for kw, msg in [({"tuning": tuning, "manifests": (gen,)}, "needs --manifest"),       # no --out
                    ({"tuning": tuning, "out": out}, "needs --manifest"),
                    ({"tuning": tmp_path / "none.json", "manifests": (gen,), "out": out}, "not a tuning table"),
                    ({"tuning": tuning, "manifests": (tmp_path,), "out": out}, "no manifest here")]:
        with pytest.raises(confirm.ConfirmError, match=msg):
            confirm.run(None, rounds=1, engine_factory=factory, say=lambda s: None, **kw)
    with pytest.raises(confirm.ConfirmError, match="give a profile directory"):
        confirm.run(profiled, rounds=1, engine_factory=factory, say=lambda s: None, tuning=tuning)
    assert confirm.main(["--tuning", str(tuning), "--manifest", str(gen), "--out", str(tmp_path / "c.json"),
                         "--backend", "fake", "--rounds", "1"]) == 0
    assert confirm.main(["--rounds", "1", "--backend", "fake"]) == 2


class Favouring(Drifting):
    """Drifting, with one kernel twice as fast head to head as the sweep timed it (the sweep's standalone times
    mislead at the power cap) and, optionally, one kernel that cannot be launched."""

    def __init__(self, config, gpu, favour: str = "", refuse: str | None = None):
        super().__init__(config, gpu, fail_on=refuse)
        self.favour = favour

    def head_to_head(self, kernel, data, m, baseline):
        from dataclasses import replace

        k, b = super().head_to_head(kernel, data, m, baseline)
        return (replace(k, median_ms=k.median_ms * 0.5) if m.name == self.favour else k), b


def _groups_with_rivals(profile_dir, k=3, within=1.0):
    return [g for g in confirm.candidates(profile_dir, k, within) if len(g) > 1]


def test_candidates_are_the_sweeps_fastest_within_range(profiled):
    rows = json.loads((profiled / "profile.json").read_text())["rows"]
    wins = confirm.winners(profiled)
    groups = confirm.candidates(profiled, 3, 1.0)
    assert [g[0] for g in groups] == [{**w, "sweep_ms": g[0]["sweep_ms"]} for w, g in zip(wins, groups)]
    for g in groups:
        assert 1 <= len(g) <= 3
        idents = [(c["kernel"], c["split_k"], c["options"]) for c in g]
        assert len(set(idents)) == len(idents)
        times = [c["sweep_ms"] for c in g]
        assert times[1:] == sorted(times[1:]) and all(t >= times[0] for t in times)
        w = g[0]
        ok = sorted(r["median_ms"] for r in rows if r["kind"] == "kernel" and r["status"] == "ok" and r["median_ms"]
                    and (r["op"], r["m"], r["n"], r["k"]) == (w["op"], w["m"], w["n"], w["k"]))
        assert times == ok[:len(g)]      # the fastest ones, in order (no rival is closer than the ones taken)
    assert all(len(g) == 1 for g in confirm.candidates(profiled, 1, 1.0))
    # `within` bounds them: nothing slower than the winner by more than that fraction
    for g in confirm.candidates(profiled, 10, 0.05):
        assert all(c["sweep_ms"] <= g[0]["sweep_ms"] * 1.05 for c in g)
    assert _groups_with_rivals(profiled), "the fake profile should have problems with several kernels"


def test_candidates_choose_the_best_head_to_head_and_retime_it(profiled, tmp_path):
    """--candidates: each candidate head to head, the best ratio chosen (here a kernel the sweep ranked second),
    timed once more for the row's figure; the tuning table and the benchmark report follow the choice."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_sm90a as bench
    finally:
        sys.path.pop(0)
    out = tmp_path / "run" / "profile"
    shutil.copytree(profiled, out)
    for f in (confirm.CONFIRM_FILE, "tuning.sweep.json"):
        (out / f).unlink(missing_ok=True)
    sweep_table = json.loads((out / "tuning.json").read_text())
    groups = confirm.candidates(out, 3, 1.0)
    target = next(g for g in groups if len(g) > 1)
    favour = target[1]["kernel"]
    engines: list[Favouring] = []

    def factory(c, g):
        engines.append(Favouring(c, g, favour=favour))
        return engines[-1]

    said: list[str] = []
    res = confirm.run(out, rounds=2, engine_factory=factory, say=said.append, candidates_k=3, within=1.0)
    assert res["candidates"] == 3 and res["within"] == 1.0 and len(res["rows"]) == len(groups)
    # every candidate `rounds` times, plus the chosen one again where there was a choice
    assert len(engines[0].calls) == 2 * (sum(len(g) for g in groups) + sum(1 for g in groups if len(g) > 1))
    row = next(r for r in res["rows"] if (r["op"], r["m"], r["n"], r["k"]) == (target[0]["op"], target[0]["m"],
                                                                                  target[0]["n"], target[0]["k"]))
    assert row["kernel"] == favour and row["sweep_kernel"]["kernel"] == target[0]["kernel"]
    assert any(f"chose {confirm._what(row)} over the sweep's {confirm._what(target[0])}" in s for s in said)
    assert [c["kernel"] for c in row["candidates"]] == [c["kernel"] for c in target]
    picked = next(c for c in row["candidates"] if c["kernel"] == favour)
    assert picked["ratio"] == max(c["ratio"] for c in row["candidates"])
    # the row's figure is the re-timing's (a later round on the drifting clock), not the one that chose it
    assert len(row["samples"]) == 2 and row["kernel_ms"] != picked["kernel_ms"]
    # a kernel that is not faster head to head leaves the sweep's choice
    for r in res["rows"]:
        if r is not row and favour not in [c["kernel"] for c in r.get("candidates", [])]:
            assert "sweep_kernel" not in r
    # the tuning table follows; the sweep's is kept
    table = json.loads((out / "tuning.json").read_text())
    assert json.loads((out / "tuning.sweep.json").read_text()) == sweep_table
    e = next(e for e in table["entries"] if (e["op"]["key"], e["problem"]["m"], e["problem"]["n"], e["problem"]["k"])
             == (row["op"], row["m"], row["n"], row["k"]))
    assert e["kernel"] == favour and e["confirm"]["ratio"] == row["ratio"] and e["confirm"]["sweep_kernel"]["kernel"] \
        == target[0]["kernel"] and e["confirm"]["candidates"] == len(target)
    assert all("confirm" in x for x in table["entries"])
    from emitter.families.gemm.library_tuning import load

    assert any(t.kernel == favour for t in load(out / "tuning.json", allow_unmeasured=True))   # the library reads it (fake: opted in)
    # the benchmark report takes the chosen kernel, its head-to-head figure, and marks it
    s = bench.summarize(out / "profile.json")
    x = next(x for x in s["ops"][row["op"]]["rows"] if (x["m"], x["n"], x["k"]) == (row["m"], row["n"], row["k"]))
    assert x["kernel"] == favour and x["ratio"] == pytest.approx(row["ratio"])
    assert x["confirm"]["sweep_kernel"] == target[0]["kernel"] and x["confirm"]["candidates"] == len(target)
    text = bench.markdown({**bench.merge_runs([bench.load_run(out.parent)]), "runs": []}, [], "")
    assert f"{x['ratio']:.3f} [{x['confirm']['min']:.3f}-{x['confirm']['max']:.3f}] *" in text
    assert "chosen over the sweep's winner" in text
    # --resume keeps the groups done; a second confirmation leaves tuning.sweep.json as the sweep wrote it
    again = confirm.run(out, rounds=2, engine_factory=factory, say=lambda s: None, candidates_k=3, within=1.0,
                        resume=True)
    assert len(engines[-1].calls) == 0 and again["rows"] == res["rows"]
    assert json.loads((out / "tuning.sweep.json").read_text()) == sweep_table


def test_a_candidate_that_fails_is_passed_over(profiled, tmp_path):
    import shutil

    out = tmp_path / "res"
    shutil.copytree(profiled, out)
    (out / confirm.CONFIRM_FILE).unlink(missing_ok=True)
    target = _groups_with_rivals(out)[0]
    refused = target[0]["kernel"]            # the sweep's own winner cannot be launched head to head
    res = confirm.run(out, rounds=1, engine_factory=lambda c, g: Favouring(c, g, refuse=refused), say=lambda s: None,
                      candidates_k=3, within=1.0)
    row = next(r for r in res["rows"] if (r["op"], r["m"], r["n"], r["k"]) == (target[0]["op"], target[0]["m"],
                                                                                  target[0]["n"], target[0]["k"]))
    assert row["status"] == "ok" and row["kernel"] != refused
    bad = [c for c in row["candidates"] if c["status"] != "ok"]
    assert [c["kernel"] for c in bad] == [refused] and "launch refused" in bad[0]["reason"]
    # a candidate search needs the sweep's ranking: a tuning table has one kernel per problem
    with pytest.raises(confirm.ConfirmError, match="needs a profile directory"):
        confirm.run(None, rounds=1, say=lambda s: None, tuning=out / "tuning.json", manifests=(out,),
                    out=tmp_path / "x.json", candidates_k=2)
    with pytest.raises(confirm.ConfirmError, match="candidates must be at least 1"):
        confirm.run(out, rounds=1, say=lambda s: None, candidates_k=0)
    assert confirm.main([str(out), "--rounds", "1", "--backend", "fake", "--candidates", "2", "--within", "0.5"]) == 0
    assert json.loads((out / confirm.CONFIRM_FILE).read_text())["candidates"] == 2
