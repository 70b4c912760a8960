"""benchmarks/profile_sm90a.py's report (summary, goal checks, markdown) from a profile.json, without a GPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("profile_sm90a", ROOT / "benchmarks" / "profile_sm90a.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(op, a, m, n, k, kind, name, tflops, ratio=None, best=False, split_k=1, provider="emitter"):
    return {"op": op, "a": a, "m": m, "n": n, "k": k, "kind": kind, "name": name, "tflops": tflops,
            "ratio_to_baseline": ratio, "best": best, "tied": False, "split_k": split_k, "provider": provider}


def test_summary_goals_and_markdown(tmp_path):
    bench = _bench()
    bf = "bf16bf16_bf16bf16_accf32_tnt"
    f8 = "e4m3e4m3_bf16bf16_accf32_tnt_fastacc"
    name = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity"
    rows = [
        _row(bf, "bf16", 8192, 8192, 8192, "baseline", "cublas", 700.0, provider="torch.matmul"),
        _row(bf, "bf16", 8192, 8192, 8192, "kernel", name, 840.0, 1.2, best=True),
        _row(bf, "bf16", 16, 4096, 4096, "baseline", "cublas", 40.0, provider="torch.matmul"),
        _row(bf, "bf16", 16, 4096, 4096, "kernel", name, 36.0, 0.9, best=True, split_k=4),
        _row(f8, "e4m3", 4096, 4096, 4096, "baseline", "cublas", 1300.0, provider="torch._scaled_mm"),
        _row(f8, "e4m3", 4096, 4096, 4096, "kernel", name, 1400.0, 1.0769, best=True),
        _row(f8, "e4m3", 16, 4096, 4096, "kernel", name, 30.0, 0.5, best=True),   # decode: not in the fp8 goal set
    ]
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "profile.json").write_text(json.dumps(
        {"environment": {"name": "NVIDIA H200", "sm_count": 132}, "baselines": ["cuBLAS"], "rows": rows}))
    s = bench.summarize(run / "profile" / "profile.json")
    g = s["ops"][bf]
    assert g["problems"] == 2 and abs(g["geomean"] - (1.2 * 0.9) ** 0.5) < 1e-9 and g["below_0.97"] == 1
    assert g["rows"][0]["split_k"] == 4              # smallest problem first, with its split count
    assert abs(s["ops"][f8]["geomean_square_and_large_llm"] - 1.0769) < 1e-9
    goals = {what: met for what, _got, met in s["goals"]}
    assert goals[f"{bf}: no shape below 0.97x"] is False
    assert any(w.startswith("bf16 8192^3") and met for w, met in goals.items())   # 1.2x and 84.9% of 989
    doc = tmp_path / "docs" / "performance.md"
    bench.write_report(run, doc, None)
    text = doc.read_text()
    assert "split-K 4" in text and "| 8192x8192x8192 |" in text and "**NOT met**" in text
    assert "NVIDIA H200" in text


def test_shape_sets_parse_and_small_m_is_the_llm_rows_up_to_512():
    """Each --shapes choice is a valid profile `problems:` list; small-m is the LLM set's M <= 512 rows."""
    from emitter.profile.config import parse_config_text
    from emitter.families.gemm.profile import LLM_M, LLM_NK

    bench = _bench()
    sets = {}
    for name, lines in bench.SHAPES.items():
        text = "manifests: [x]\nproblems:\n" + "".join(f"  {line}\n" for line in lines)
        sets[name] = {(p.m, p.n, p.k) for p in parse_config_text(text, f"{name}.yaml").problems}
    assert sets["small-m"] == {(m, n, k) for m in LLM_M if m <= 512 for n, k in LLM_NK}
    assert sets["small-m"] < sets["llm"] and sets["square"] | sets["llm"] == sets["all"]
    assert sets["explore"] == sets["small-m"] | {(8192, 8192, 8192), (16384, 16384, 16384)}
    assert sets["large"] == sets["square"] | {(m, n, k) for m in LLM_M if m >= 2048 for n, k in LLM_NK}
    assert sets["large"] | sets["small-m"] == sets["all"] and len(sets["large"]) == 16
    assert len(sets["all"]) == 34      # 5 square + 30 LLM shapes, 8192^3 in both
    assert sets["mid-m"] == {(m, n, k) for m in (128, 512) for n, k in LLM_NK}
    assert sets["no-decode"] == sets["all"] - {(16, n, k) for n, k in LLM_NK}


def test_error_column_sets_ours_beside_the_baselines(tmp_path):
    """Runs whose baselines recorded their check get an error column (ours / cuBLAS); older runs do not."""
    bench = _bench()
    f8 = "e4m3e4m3_bf16bf16_accf32_tnt"
    name = "gemm_sm90a_e4m3e4m3_bf16bf16_accf32_tnt_128x128x128_c1x2x1_i64x128x32_sauto_coop_epitma_persistent_promo8_al16x16x8_identity"
    rows = [{**_row(f8, "e4m3", 8192, 8192, 8192, "baseline", "cublas", 1200.0), "check_rel_err": 3.1e-4},
            {**_row(f8, "e4m3", 8192, 8192, 8192, "kernel", name, 1260.0, 1.05, best=True), "check_rel_err": 4.2e-4},
            _row(f8, "e4m3", 4096, 4096, 4096, "baseline", "cublas", 1100.0),
            _row(f8, "e4m3", 4096, 4096, 4096, "kernel", name, 1000.0, 0.91, best=True)]
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "profile.json").write_text(json.dumps(
        {"environment": {"name": "NVIDIA H200", "sm_count": 132}, "baselines": ["cuBLASLt"], "rows": rows}))
    doc = tmp_path / "performance.md"
    s = bench.write_report(run, doc, None)
    x = {r["m"]: r for r in s["ops"][f8]["rows"]}
    assert (x[8192]["rel_err"], x[8192]["baseline_rel_err"]) == (4.2e-4, 3.1e-4)
    text = doc.read_text()
    assert "error, ours / cuBLAS" in text and "| 4.20e-04 / 3.10e-04 |" in text and "| - / - |" in text
    old = {"environment": {"name": "NVIDIA H200", "sm_count": 132}, "baselines": ["cuBLASLt"],
           "rows": [{k: v for k, v in r.items() if k != "check_rel_err"} for r in rows]}
    (run / "profile" / "profile.json").write_text(json.dumps(old))
    bench.write_report(run, doc, None)
    assert "error, ours" not in doc.read_text()


def test_report_over_several_runs_takes_each_shape_from_the_latest_run(tmp_path):
    """Runs merge oldest first: each (op, problem) row comes from the last run that measured it, keeps its own
    run's ratio and label; the saved run records alone write the same report again (make perf-doc)."""
    bench = _bench()
    bf = "bf16bf16_bf16bf16_accf32_tnt"
    old_k = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity"
    new_k = old_k.replace("_persistent_", "_persistent_swz4_")

    def run(name, rows, date):
        d = tmp_path / name
        (d / "profile").mkdir(parents=True)
        (d / "profile" / "profile.json").write_text(json.dumps(
            {"environment": {"name": "NVIDIA H200", "sm_count": 132}, "baselines": ["cuBLAS"], "rows": rows}))
        (d / "profile" / "tuning.json").write_text(json.dumps({"schema_version": 1, "entries": [
            {"op": {"key": bf}, "problem": {"m": r["m"], "n": r["n"], "k": r["k"], "batch": 1}, "kernel": r["name"]}
            for r in rows if r["best"]]}))
        (d / "run.json").write_text(json.dumps({"commands": [f"cmd {name}"], "times": {}, "argv": ["--shapes", name],
                                                "date": date, "label": f"{date}-{name}"}))
        return d

    full = run("all", [_row(bf, "bf16", 8192, 8192, 8192, "baseline", "cublas", 700.0),
                       _row(bf, "bf16", 8192, 8192, 8192, "kernel", old_k, 665.0, 0.95, best=True),
                       _row(bf, "bf16", 16, 4096, 4096, "baseline", "cublas", 40.0),
                       _row(bf, "bf16", 16, 4096, 4096, "kernel", old_k, 36.0, 0.90, best=True)], "2026-11-22")
    large = run("large", [_row(bf, "bf16", 8192, 8192, 8192, "baseline", "cublas", 690.0),
                          _row(bf, "bf16", 8192, 8192, 8192, "kernel", new_k, 745.0, 1.08, best=True)], "2026-11-23")
    doc = tmp_path / "docs" / "performance.md"
    s = bench.write_report([full, large], doc, None)
    rows = {(x["m"], x["n"], x["k"]): x for x in s["ops"][bf]["rows"]}
    assert rows[(8192, 8192, 8192)]["ratio"] == 1.08 and rows[(8192, 8192, 8192)]["run"] == "2026-11-23-large"
    assert rows[(16, 4096, 4096)]["ratio"] == 0.90 and rows[(16, 4096, 4096)]["run"] == "2026-11-22-all"
    assert abs(s["ops"][bf]["geomean"] - (1.08 * 0.90) ** 0.5) < 1e-9
    text = doc.read_text()
    assert "| 1.080 | 2026-11-23-large |" in text and "cmd all" in text and "cmd large" in text
    tuning = json.loads((doc.parent / "perf" / "tuning.json").read_text())
    assert {(e["problem"]["m"], e["kernel"]) for e in tuning["entries"]} == {(8192, new_k), (16, old_k)}
    records = sorted((doc.parent / "perf" / "runs").glob("*[0-9a-z].json"))
    assert [r.name for r in records if not r.name.endswith(".tuning.json")] == ["2026-11-22-all.json",
                                                                               "2026-11-23-large.json"]
    again = tmp_path / "again" / "performance.md"
    (again.parent / "perf" / "runs").mkdir(parents=True)
    for r in records:
        (again.parent / "perf" / "runs" / r.name).write_bytes(r.read_bytes())
    bench.write_report(sorted(p for p in (again.parent / "perf" / "runs").glob("*.json")
                              if not p.name.endswith(".tuning.json")), again, None)
    assert again.read_text() == text
    # `make perf-doc RUN=<dir>` after the first report: the run's saved record and its directory are one run
    saved = sorted(p for p in (doc.parent / "perf" / "runs").glob("*.json") if not p.name.endswith(".tuning.json"))
    bench.write_report(saved + [large], again, None)
    assert again.read_text() == text and again.read_text().count("cmd large") == 1


def test_a_run_whose_every_row_was_replaced_is_named_not_described(tmp_path):
    """A later run that measured every shape again replaces all of an earlier run's rows: the report names the
    earlier run in one line (its record stays) and describes and lists commands for the runs that supply rows."""
    bench = _bench()
    bf = "bf16bf16_bf16bf16_accf32_tnt"
    k = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity"

    def run(name, ratio, date):
        d = tmp_path / name
        (d / "profile").mkdir(parents=True)
        (d / "profile" / "profile.json").write_text(json.dumps(
            {"environment": {"name": "NVIDIA H200", "sm_count": 132}, "baselines": ["cuBLAS"],
             "rows": [_row(bf, "bf16", 8192, 8192, 8192, "baseline", "cublas", 700.0),
                      _row(bf, "bf16", 8192, 8192, 8192, "kernel", k, 700.0 * ratio, ratio, best=True)]}))
        (d / "run.json").write_text(json.dumps({"commands": [f"cmd {name}"], "times": {}, "argv": [],
                                                "date": date, "label": f"{date}-{name}"}))
        return d

    doc = tmp_path / "docs" / "performance.md"
    bench.write_report([run("old", 0.9, "2026-11-22"), run("new", 1.1, "2026-11-23")], doc, None)
    text = doc.read_text()
    assert "cmd new" in text and "cmd old" not in text and "**2026-11-22-old**" not in text
    assert "a later run replaced (their records stay in docs/perf/runs/): 2026-11-22-old." in text
    assert "outputs of 1 run on" in text
    assert (doc.parent / "perf" / "runs" / "2026-11-22-old.json").is_file()


def test_runs_on_two_gpus_get_a_section_and_a_tuning_table_each(tmp_path):
    """An H100 run after H200 runs replaces none of their rows: one section per GPU, each with its own rows,
    goals, plots and tuning table (the first GPU's stays tuning.json)."""
    bench = _bench()
    bf = "bf16bf16_bf16bf16_accf32_tnt"
    k = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity"

    def run(name, gpu, ratio, date):
        d = tmp_path / name
        (d / "profile").mkdir(parents=True)
        (d / "profile" / "profile.json").write_text(json.dumps(
            {"environment": {"name": gpu, "sm_count": 132}, "baselines": ["cuBLAS"],
             "rows": [_row(bf, "bf16", 8192, 8192, 8192, "baseline", "cublas", 700.0),
                      _row(bf, "bf16", 8192, 8192, 8192, "kernel", k, 700.0 * ratio, ratio, best=True)]}))
        (d / "profile" / "tuning.json").write_text(json.dumps({"schema_version": 1, "gpu": gpu, "entries": [
            {"op": {"key": bf}, "problem": {"m": 8192, "n": 8192, "k": 8192, "batch": 1}, "kernel": k, "tag": name}]}))
        (d / "run.json").write_text(json.dumps({"commands": [f"cmd {name}"], "times": {}, "argv": [],
                                                "date": date, "label": f"{date}-{name}"}))
        return d

    doc = tmp_path / "docs" / "performance.md"
    s = bench.write_report([run("h200", "NVIDIA H200", 0.98, "2026-11-23"),
                            run("h100", "NVIDIA H100 80GB HBM3", 1.04, "2026-11-24")], doc, None)
    assert list(s["gpus"]) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert s["gpus"]["NVIDIA H200"]["ops"][bf]["rows"][0]["ratio"] == 0.98
    assert s["gpus"]["NVIDIA H100 80GB HBM3"]["ops"][bf]["rows"][0]["ratio"] == 1.04
    text = doc.read_text()
    assert text.startswith("# Hopper GEMM performance (issue 6)") and text.count("# Hopper GEMM") == 1
    assert "\n## NVIDIA H200\n" in text and "\n## NVIDIA H100 80GB HBM3\n" in text
    assert text.index("| 0.980 |") < text.index("## NVIDIA H100") < text.index("| 1.040 |")
    assert f"### {bf} (NVIDIA H100 80GB HBM3)" in text and "cmd h200" in text and "cmd h100" in text
    perf = doc.parent / "perf"
    assert json.loads((perf / "tuning.json").read_text())["entries"][0]["tag"] == "h200"
    assert json.loads((perf / "tuning.nvidia-h100-80gb-hbm3.json").read_text())["entries"][0]["tag"] == "h100"
    assert "docs/perf/tuning.nvidia-h100-80gb-hbm3.json" in text
    assert len(json.loads((perf / "summary.json").read_text())["gpus"]) == 2


def test_problem_option_replaces_the_shape_set():
    """--problem MxNxK (repeatable) profiles just those problems; a malformed one is refused with the form."""
    import argparse

    import pytest

    from emitter.profile.config import parse_config_text

    bench = _bench()
    probs = [bench._problem("1024x1024x1024"), bench._problem("512X4096x14336")]
    assert probs == [(1024, 1024, 1024), (512, 4096, 14336)]
    text = "manifests: [x]\nproblems:\n" + "".join(f"  {line}\n" for line in bench.problem_lines(probs, "all"))
    assert [(p.m, p.n, p.k) for p in parse_config_text(text, "p.yaml").problems] == probs
    assert bench.problem_lines([], "square") == bench.SHAPES["square"]
    for bad in ("1024x1024", "1024x0x1024", "axbxc"):
        with pytest.raises(argparse.ArgumentTypeError, match="MxNxK|positive"):
            bench._problem(bad)


def test_the_published_tuning_tables_name_only_kernels_of_the_tuned_configs(tmp_path):
    """docs/perf/tuning*.json (make perf-doc's merged tables, one per GPU) are what a user hands to
    `emitter library --tuning`: every kernel they name must be emitted by the benchmark's default specs (the tuned
    set), with split-K and options the library accepts, or the library cannot be built from them."""
    from emitter.emit import emit
    from emitter.families.gemm.library_tuning import load

    bench = _bench()
    gen = tmp_path / "gen"
    emit([ROOT / s for s in bench.DEFAULT_SPECS], gen)
    names = {i["name"] for i in json.loads((gen / "manifest.json").read_text())["instances"]}
    tables = sorted((ROOT / "docs" / "perf").glob("tuning*.json"))
    assert tables
    for table in tables:
        entries = load(table)
        assert entries, table
        missing = sorted({e.kernel for e in entries} - names)
        assert not missing, f"{table.name} names kernels the tuned configs do not emit: {missing}"
