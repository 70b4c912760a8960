"""The family seam at run time (issue 27.1, 27.4, 27.5; issue 25.7; issue 26 problem flags): verify, profile and
the runtime backends go through emitter.families.base.RuntimeFamily hooks only; GEMM's fake backend computes
independently of its reference; interleaved timing warms every side up; problems that cannot fit are refused
before anything is allocated; one set of problem flags for verify and profile, and a replay line that replays."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.families.base import (
    PROFILE_HOOKS, RUNTIME_DATA, VERIFY_HOOKS, FamilyNotRunnable, Footprint, runtime_family,
)
from emitter.families.gemm.problem import GemmProblem
from emitter.verify.problems import VerifyProblem
from emitter.verify.runner import ProblemTooLarge, VerifyOptions, verify

ROOT = Path(__file__).resolve().parents[1]


def entry(name, **kw):
    c = {"arch": "sm80", "a": "f16", "b": "f16", "c": "f16", "d": "f16", "layout_a": "row", "layout_b": "col",
         "layout_c": "row", "accumulator": "f32", "epilogue_compute": "f32", "op_class": "tensorop",
         "tile": [128, 128, 32], "warp": [64, 64, 32], "cluster": None, "instruction": [16, 8, 16], "stages": 3,
         "kernel_schedule": "auto", "epilogue_schedule": "auto", "tile_scheduler": "persistent", "swizzle": 1,
         "alignment_a": 8, "alignment_b": 8, "alignment_c": 8,
         "epilogue": {"activation": "identity", "bias": "none"}, "split_k": "none", "batched": False}
    c.update(kw)
    return {"name": name, "family": "gemm", "arch": c["arch"], "source": f"{name}.cu", "spec": "t.yaml",
            "spec_hash": "0" * 64, "config": c}


def manifest(root: Path, entries) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0.1.0",
                                                    "generated_at": None, "specs": [], "instances": list(entries),
                                                    "rejected": []}))
    return root


PROBLEMS = [VerifyProblem(GemmProblem(72, 40, 24), "int", source="user"),
            VerifyProblem(GemmProblem(136, 72, 64, alpha=1.25, beta=0.5), "normal", source="user"),
            VerifyProblem(GemmProblem(64, 48, 40, lda=48, ldc=56, ldd=64, beta=1.0), "int", source="user")]


def run_fake(tmp_path, entries, problems=PROBLEMS, **kw):
    root = manifest(tmp_path / "m", entries)
    return verify(root, entries, problems, VerifyOptions(backend="fake", isolation=False, seed=3, quick=True, **kw))


def statuses(run):
    return [r["status"] for r in run.results]


# ---------------------------------------------------------------------------------------------- the protocol
def test_gemm_provides_every_run_time_hook_and_unknown_families_are_named():
    hooks = runtime_family("gemm", need=VERIFY_HOOKS + PROFILE_HOOKS)
    assert hooks.NAME == "gemm" and all(hasattr(hooks, h) for h in RUNTIME_DATA)
    cfg = hooks.config_from_entry(entry("x"))
    assert type(cfg).FAMILY == "gemm" and GemmProblem.FAMILY == "gemm"
    p = GemmProblem(100, 60, 40, beta=0.5)
    assert hooks.problem_from_dict(hooks.problem_to_dict(p)) == p
    assert hooks.flops(cfg, p) == 2 * 100 * 60 * 40
    fp = hooks.footprint(cfg, hooks.resolve_problem(cfg, p))
    assert isinstance(fp, Footprint) and fp.device == 2 * (100 * 40 + 40 * 60 + 2 * 100 * 60)
    assert fp.host > fp.device
    assert hooks.parse_problem("100x60x40x2") == [{"m": 100, "n": 60, "k": 40, "batch": 2}]
    assert hooks.parse_problem("m=1,n=2,k=3,beta=0.5") == [{"m": 1, "n": 2, "k": 3, "beta": 0.5}]
    with pytest.raises(FamilyNotRunnable):
        runtime_family("gemm", need=("no_such_hook",))


def test_stages_hold_no_gemm_code():
    """verify, profile and runtime import nothing from emitter.families.gemm (they go through the registry)."""
    offenders = []
    for stage in ("verify", "profile", "runtime"):
        for path in sorted((ROOT / "emitter" / stage).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("emitter.families.gemm"):
                    offenders.append(f"{path.name}: {node.module}")
                if isinstance(node, ast.Import) and any(a.name.startswith("emitter.families.gemm") for a in node.names):
                    offenders.append(path.name)
    assert not offenders, offenders


def test_verify_reports_an_entry_of_a_family_without_run_time_hooks(tmp_path):
    bogus = {"name": "w", "family": "warp_shuffle", "arch": "sm80", "source": "w.cu", "config": {}}
    run = run_fake(tmp_path, [entry("g"), bogus], problems=PROBLEMS[:1])
    by = {r["instance"]: r for r in run.results}
    assert by["g"]["status"] == "PASSED"
    assert by["w"]["status"] == "FAILED" and "warp_shuffle" in by["w"]["reason"]


# ---------------------------------------------------------------------------------------------- 27.4
def test_gemm_fake_shares_no_code_with_the_reference_side():
    src = (ROOT / "emitter" / "families" / "gemm" / "fake.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    for shared in ("emitter.families.gemm.reference", "emitter.families.gemm.inputs", "emitter.families.gemm.layout"):
        assert shared not in mods, shared
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "emitter.runtime.hostdata"
             for a in n.names}
    assert not names & {"encode", "decode", "quantize"}, names      # its own codecs too


def test_a_bug_planted_in_the_reference_is_caught_by_the_fake(tmp_path, monkeypatch):
    """With the fake computing on its own, a wrong reference (a GELU of the wrong form, a bias of the wrong
    orientation, a layout helper that reads transposed) makes verify FAIL instead of agreeing with itself."""
    import emitter.families.gemm.reference as ref

    gelu = entry("gelu", epilogue={"activation": "gelu", "bias": "row"})
    assert statuses(run_fake(tmp_path / "ok", [gelu])) == ["PASSED"] * 3

    real = ref.apply_activation
    monkeypatch.setattr(ref, "apply_activation",
                        lambda z, act, lo=0.0, hi=6.0, gelu="erf": real(z, act, lo, hi, "tanh" if act == "gelu" else gelu)
                        * (1.0 + 1e-2))
    run = run_fake(tmp_path / "act", [gelu])
    assert statuses(run) == ["FAILED"] * 3, [r["reason"] for r in run.results]
    assert all("rel err" in r["reason"] or "exact check" in r["reason"] for r in run.results)


def test_a_bug_planted_in_the_layout_helper_is_caught_by_the_fake(tmp_path, monkeypatch):
    """The inputs and the check read D and the operands through MatrixLayout; a leading-dimension bug there
    (ignoring the given ld) no longer cancels out: the fake reads storage with its own strides."""
    from emitter.families.gemm.layout import MatrixLayout

    padded = [PROBLEMS[2]]
    assert statuses(run_fake(tmp_path / "ok", [entry("g")], padded)) == ["PASSED"]
    real_index = MatrixLayout.index

    def packed_index(self):
        return real_index(MatrixLayout(self.rows, self.cols, self.row_major, self.packed_ld, self.batch,
                                       self.batch_stride))

    monkeypatch.setattr(MatrixLayout, "index", packed_index)
    run = run_fake(tmp_path / "bug", [entry("g")], padded)
    assert statuses(run) == ["FAILED"], run.results


# ---------------------------------------------------------------------------------------------- 27.5
def test_interleaved_timing_warms_up_every_function_alike():
    """EventTimer.interleave on a fake clock: before the first timed event, the kernel and each baseline have
    had the same number of warm-up launches (at least `warmup` each), not the kernel alone."""
    from types import SimpleNamespace

    from emitter.profile.config import Timing
    from emitter.profile.timing import EventTimer

    log: list[str] = []
    clock = {"t": 0.0}

    class Event:
        t = 0.0

        def record(self, stream):
            self.t = clock["t"]
            log.append("event")

        def synchronize(self):
            pass

        def time_since(self, other):
            return self.t - other.t

    def fn(name, cost):
        def launch(i):
            clock["t"] += cost
            log.append(name)
        return launch

    for warmup, width in ((5, 2), (4, 3), (1, 2)):
        log.clear()
        timer = EventTimer.__new__(EventTimer)
        timer.drv, timer.stream, timer._events, timer._spin = SimpleNamespace(Event=Event), SimpleNamespace(
            synchronize=lambda: None), [], None
        timer.timing = Timing(warmup=warmup, iterations=10, repeats=1)
        names = ["kernel", "cublas", "other"][:width]
        timer.interleave([fn(n, 1.0 + i) for i, n in enumerate(names)], sets=2)
        first_event = log.index("event")
        warm = log[:first_event]
        counts = {n: warm.count(n) for n in names}
        assert len(set(counts.values())) == 1 and counts["kernel"] >= warmup, counts


# ---------------------------------------------------------------------------------------------- 25.7
def test_verify_refuses_a_user_problem_that_cannot_fit_before_allocating(tmp_path):
    huge = [VerifyProblem(GemmProblem(1 << 20, 1 << 20, 1 << 20), "normal", source="user")]
    with pytest.raises(ProblemTooLarge) as e:
        run_fake(tmp_path, [entry("g")], huge)
    text = str(e.value)
    assert "does not fit" in text and "bytes" in text and "available" in text
    assert e.value.exit_code == 2


def test_a_case_larger_than_the_device_is_skipped_with_bytes_needed_and_free(tmp_path, monkeypatch):
    from emitter.runtime.fake_backend import FakeBackend

    monkeypatch.setattr(FakeBackend, "memory_available", lambda self: (10_000, 1 << 40))
    run = run_fake(tmp_path, [entry("g")], PROBLEMS[1:2])
    (r,) = run.results
    need = 2 * (136 * 64 + 64 * 72 + 2 * 136 * 72)
    assert r["status"] == "SKIPPED" and "does not fit" in r["reason"], r
    assert f"({need} bytes) of device memory" in r["reason"] and "9.8 KiB are free" in r["reason"]
    assert "refused before allocating" in r["reason"]


def test_profile_refuses_operands_that_cannot_fit_the_device(monkeypatch):
    import emitter.families.gemm.workload as wl
    import emitter.profile.timing as timing
    from emitter.profile.config import Problem
    from emitter.profile.records import Op
    from emitter.profile.worker import GpuEngine, ProblemTooLarge as ProfileTooLarge

    monkeypatch.setattr(timing, "free_memory", lambda: 1 << 30)
    monkeypatch.setattr(wl.ProblemData, "allocate", classmethod(lambda *a, **k: pytest.fail("allocated")))
    eng = GpuEngine.__new__(GpuEngine)
    eng.config = type("C", (), {"alpha": 1.0, "beta": 0.0, "timing": None})()
    eng.env = lambda: {"l2_bytes": 50 << 20}
    op = Op("bf16", "bf16", "bf16", "bf16", "row", "col", "row")
    with pytest.raises(ProfileTooLarge, match="does not fit.*bytes"):
        eng.prepare(op, Problem(1 << 20, 1 << 20, 1 << 14))


def test_cli_verify_of_a_huge_problem_exits_2_without_a_traceback(tmp_path):
    root = manifest(tmp_path / "m", [entry("g")])
    out = subprocess.run([sys.executable, "-m", "emitter", "verify", str(root), "--backend", "fake", "--no-isolation",
                          "--m", str(1 << 20), "--n", str(1 << 20), "--k", str(1 << 20)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "does not fit" in out.stderr and "Traceback" not in out.stderr + out.stdout


# ---------------------------------------------------------------------------------------------- problem flags
def test_verify_problem_flags_and_a_replay_line_that_replays(tmp_path):
    root = manifest(tmp_path / "m", [entry("g1"), entry("g2", layout_a="col"), entry("other")])
    cmd = [sys.executable, "-m", "emitter", "verify", str(root), "--backend", "fake", "--no-isolation", "-q",
           "--select", "g*", "--problem", "72x40x24", "--problem", "m=136,n=72,k=64,beta=0.5", "--data", "int"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "COLUMNS": "300"})
    assert out.returncode == 0, out.stdout + out.stderr
    first = json.loads((root / "verify" / "results.json").read_text())
    assert {r["instance"] for r in first["results"]} == {"g1", "g2"}
    assert sorted({r["problem"] for r in first["results"]}) == ["136x72x64_alpha1_beta0.5_int",
                                                                "72x40x24_alpha1_beta0_int"]
    replay = first["replay"]
    for piece in ("--select", "--problem 72x40x24", "--backend fake", "--data int", f"--seed {first['seed']}"):
        assert piece in replay, replay
    assert "replay: emitter verify" in out.stdout
    args = shlex.split(replay)
    assert args[:2] == ["emitter", "verify"]
    again = subprocess.run([sys.executable, "-m", "emitter", *args[1:]], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads((root / "verify" / "results.json").read_text())

    def key(doc):
        return [(r["instance"], r["problem"], r["seed"], r["status"], r.get("max_abs_err")) for r in doc["results"]]

    assert key(second) == key(first) and second["seed"] == first["seed"]


def test_bad_problem_strings_are_clean_errors(tmp_path):
    root = manifest(tmp_path / "m", [entry("g")])
    for bad in ("12x12", "m=1,n=2", "m=1,n=2,k=x", "q=3"):
        out = subprocess.run([sys.executable, "-m", "emitter", "verify", str(root), "--backend", "fake",
                              "--problem", bad], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (bad, out.stderr)
        assert "--problem" in out.stderr or "problem" in out.stderr


def test_profile_takes_a_manifest_directory_and_the_shared_problem_flags(tmp_path):
    root = manifest(tmp_path / "m", [entry("g")])
    out = subprocess.run([sys.executable, "-m", "emitter", "profile", str(root), "--backend", "fake", "--no-plots",
                          "--quick", "--problem", "256x256x256", "--m", "128", "--n", "64", "--k", "32",
                          "-o", str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "r" / "profile.json").read_text())
    keys = {m["problem"]["m"] for m in data["measurements"]}
    assert keys == {256, 128}
    refused = subprocess.run([sys.executable, "-m", "emitter", "profile", str(root), "--backend", "fake",
                              "--problem", "m=256,n=256,k=256,beta=0.5", "-o", str(tmp_path / "r2")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode == 2 and "sizes only" in refused.stderr and "Traceback" not in refused.stderr
