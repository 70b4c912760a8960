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

ROOT = Path(__file__).resolve().parents[1]


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
