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

from emitter.families.base import PROFILE_HOOKS, RUNTIME_DATA, VERIFY_HOOKS, FamilyNotRunnable, Footprint
from emitter.families.gemm.problem import GemmProblem
from emitter.families.registry import runtime_family
from emitter.verify.problems import VerifyProblem
from emitter.verify.runner import ProblemTooLarge, VerifyOptions, verify

ROOT = Path(__file__).resolve().parents[2]


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
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "emitter.kit.hostdata"
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
    import emitter.kit.arena as arena
    from emitter.families.gemm.profile import Problem
    from emitter.families.gemm.profile import Op
    from emitter.profile.worker import GpuEngine, ProblemTooLarge as ProfileTooLarge

    monkeypatch.setattr(arena, "free_memory", lambda: 1 << 30)
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


# ---------------------------------------------------------------------------------------------- a new family
TOY_RUNTIME = '''
"""A toy family for the seam tests: y = scale * x on vectors (verify + the fake profile engine)."""
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from emitter.errors import SpecError
from emitter.families.base import Footprint, Inputs

NAME = "toy"
DATA_KINDS = ("normal",)
PROBLEM_KEYS = ("length",)
FAKE_FAULTS = ("toy_wrong",)
BASELINES = ("copy",)
PROBLEM_HELP = "toy `length=N`"
DATA_HELP = "toy: normal only"


@dataclass(frozen=True)
class ToyConfig:
    FAMILY: ClassVar[str] = "toy"
    name: str
    arch: str
    scale: float


@dataclass(frozen=True, order=True)
class ToyProblem:
    FAMILY: ClassVar[str] = "toy"
    length: int

    @property
    def key(self):
        return f"len{self.length}"

    @property
    def flops(self):
        return self.length

    def as_dict(self):
        return {"family": "toy", "length": self.length}


@dataclass(frozen=True)
class ToyOp:
    FAMILY: ClassVar[str] = "toy"
    scale: float

    @property
    def key(self):
        return f"toy_scale{self.scale:g}"

    def to_json(self):
        return {"family": "toy", "scale": self.scale, "key": self.key}


def config_from_entry(entry, root=None):
    return ToyConfig(entry["name"], entry["arch"], float(entry["config"]["scale"]))


def problem_from_dict(d):
    return ToyProblem(int(d["length"]))


def problem_to_dict(p):
    return {"length": p.length}


def problem_label(p, data):
    return f"len{p.length}_{data}" if data else f"len{p.length}"


def parse_problem(text, where="<command line>"):
    if not text.startswith("len="):
        raise SpecError("a toy problem is len=N", file=where, key_path="--problem", value=text)
    return [{"length": int(text[4:])}]


def problem_from_mapping(item, where, line, key_path):
    if set(item) != {"length"}:
        raise SpecError("a toy problem has exactly `length`", file=where, line=line, key_path=key_path,
                        value=dict(item))
    return ToyProblem(int(item["length"]))


def default_problems(cfg, quick=False):
    return [(ToyProblem(100), "normal"), (ToyProblem(7), "normal")]


def not_supported_reasons(cfg, p):
    return ["length 0 is empty"] if p.length == 0 else []


def resolve_problem(cfg, p):
    return p


def with_options(cfg, p, options):
    return p if not options else "toy kernels have no run-time options"


def footprint(cfg, p):
    return Footprint(device=16 * p.length, host=40 * p.length)


def flops(cfg, p):
    return p.length


def make_inputs(cfg, p, data, seed):
    x = np.random.default_rng(seed).standard_normal(p.length)
    return Inputs(buffers={"x": x, "y": np.full(p.length, np.nan)}, outputs=("y",), values={"x": x})


def reference(cfg, p, inputs, device=None):
    return cfg.scale * inputs.values["x"]


def compare(cfg, p, inputs, outputs, ref):
    y = outputs["y"]
    bad = ~np.isfinite(y) | (np.abs(y - ref) > 1e-12)
    n = int(bad.sum())
    return {"status": "FAILED" if n else "PASSED", "reason": f"{n} elements wrong" if n else "",
            "check": "tolerance", "rel_err": float(np.abs(y - ref).max()) if not n else None, "tol": 1e-12,
            "mismatches": n}


def c_problem(cfg, p, pointers):
    raise NotImplementedError("the toy family has no shim")


def fake_run(cfg, p, buffers, faults):
    y = buffers["x"] * cfg.scale
    if "toy_wrong" in faults:
        y[0] += 1.0
    return {"y": y}


def profile_op(cfg):
    return ToyOp(cfg.scale)


def profile_op_from_json(d):
    return ToyOp(float(d["scale"]))


def profile_problem(p):
    return p


def profile_problem_from_dict(d):
    return ToyProblem(int(d["length"]))


def profile_fake_problem(cfg, problem, settings, limit=64, **run_options):
    return ToyProblem(min(problem.length, limit * limit))


def _gpu_only(*a, **k):
    raise NotImplementedError("GPU profiling of the toy family")


profile_set_bytes = profile_allocate = kernel_launch = baseline = profile_check = profile_poison = _gpu_only
'''


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """A family registered for this test only: emitter/families/registry.FAMILIES["toy"] -> a tmp package."""
    from emitter.families import registry

    pkg = tmp_path / "toyfam"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""toy family (tests)"""\n')
    (pkg / "runtime.py").write_text(TOY_RUNTIME)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.FAMILIES, "toy", "toyfam")
    yield "toy"
    for mod in [m for m in sys.modules if m == "toyfam" or m.startswith("toyfam.")]:
        del sys.modules[mod]


def toy_entry(name, scale=2.0):
    return {"name": name, "family": "toy", "arch": "sm80", "source": f"{name}.cu", "spec": "t.yaml",
            "spec_hash": "0" * 64, "config": {"scale": scale}}


def test_a_new_family_is_verified_through_its_hooks_alone(tmp_path, toy_family):
    """Only the toy family's runtime module and one registry line: verify runs its default problems and user
    problems beside GEMM's, its planted fault fails by its own check, and the problem strings go to the family
    that parses them."""
    from emitter.verify.problems import problems_from_strings

    entries = [entry("g"), toy_entry("t1"), toy_entry("t2", 0.5)]
    run = run_fake(tmp_path / "a", entries, problems=None)
    by = {(r["instance"], r["problem"]): r["status"] for r in run.results}
    assert by[("t1", "len100_normal")] == by[("t2", "len7_normal")] == "PASSED"
    assert all(s == "PASSED" for s in by.values()), by
    user = problems_from_strings(["len=33", "72x40x24"], families=["gemm", "toy"])
    assert sorted(p.family for p in user) == ["gemm", "gemm", "toy"]        # GEMM's `both`: int and normal
    run = verify(manifest(tmp_path / "b", entries), entries, user,
                 VerifyOptions(backend="fake", isolation=False, seed=1,
                               backend_options={"faults": [{"kind": "toy_wrong", "select": "t2"}]}))
    got = {(r["instance"], r["problem"]): (r["status"], r["reason"]) for r in run.results}
    assert got[("t1", "len33_normal")][0] == "PASSED"
    assert got[("t2", "len33_normal")] == ("FAILED", "1 elements wrong")
    assert {k[1] for k in got if k[0] == "g"} == {"72x40x24_alpha1_beta0_int", "72x40x24_alpha1_beta0_normal"}


def test_a_new_family_is_profiled_beside_gemm_through_its_hooks_alone(tmp_path, toy_family):
    """The fake profile engine over a manifest of GEMM and toy instances and problems of both families: each op
    meets only its family's problems, baselines are the family's, and the records round-trip through JSON
    (problem_from_json / op_from_json) into the report and the tuning table."""
    from emitter.profile import report as rep
    from emitter.profile.config import ProfileConfig, problems_from_text
    from emitter.families.gemm.profile import Problem
    from emitter.profile.records import Measurement
    from emitter.profile.runner import plan
    from emitter.profile.worker import run_job

    root = manifest(tmp_path / "m", [entry("g"), toy_entry("t1"), toy_entry("t2", 0.5)])
    probs = (Problem(128, 64, 32), *problems_from_text(["len=5000"]))
    assert [type(p).FAMILY for p in probs] == ["gemm", "toy"]
    cfg = ProfileConfig(file="p.yaml", manifests=(str(root),), problems=probs, baselines=("cublas", "copy"))
    pl = plan(cfg)
    assert {i["entry"]["name"] for i in pl.instances} == {"g", "t1", "t2"} and not pl.skipped
    out = tmp_path / "shard.jsonl"
    job = {"config": cfg.to_json(), "instances": pl.instances, "backend": "fake", "gpu": 0, "out": str(out),
           "problems": [p.as_dict() for p in probs]}
    assert run_job(job) == 0
    ms = [Measurement.from_json(json.loads(line)["measurement"]) for line in out.read_text().splitlines()
          if json.loads(line)["type"] == "result"]
    pairs = {(m.kind, m.name, m.problem.key) for m in ms}
    assert pairs >= {("kernel", "g", "128x64x32"), ("kernel", "t1", "len5000"), ("kernel", "t2", "len5000")}
    assert not any(m.name in ("t1", "t2") and m.problem.key == "128x64x32" for m in ms)
    assert not any(m.name == "g" and m.problem.key == "len5000" for m in ms)
    assert {(m.name, m.op.key) for m in ms if m.kind == "baseline"} == {("copy", "toy_scale0.5"), ("copy", "toy_scale2"),
                                                                       ("cublas", "f16f16_f16f16_accf32_tnt")}
    assert all(m.ok for m in ms), [(m.name, m.status, m.reason) for m in ms if not m.ok]
    report = rep.build(ms, {0: {"name": "fake GPU (numpy backend)", "sm_count": 132}}, cfg)
    rows = rep.rows(report)
    toy_rows = [r for r in rows if r["op"].startswith("toy")]
    assert toy_rows and all(r["m"] is None and r["a"] is None and r["tflops"] is not None for r in toy_rows)
    table = json.loads(json.dumps(rep.to_json(report)))
    again = [Measurement.from_json(d) for d in table["measurements"]]
    from collections import Counter

    assert Counter((m.op, m.problem) for m in again) == Counter((m.op, m.problem) for m in report.measurements)
    assert any(type(m.op).__name__ == "ToyOp" for m in again)
