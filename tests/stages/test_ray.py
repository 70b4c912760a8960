"""emitter on Ray (issue 29): builds and profiles through a local Ray instance give what the local pool gives.

One Ray instance for the whole session (ray.init(num_cpus=2, num_gpus=2): two fake GPUs for the profiler's
actors); it takes a few seconds to start. nvcc is a fake here (a script that writes deterministic artifacts
and a ptxas report, and fails, or kills the Ray worker that runs it, when the source asks), so the build
tests take seconds; one real sm80 compile through Ray is marked `nvcc`. Without Ray the tests that need it
skip, and the one that checks the "how to install it" message runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from emitter.build import BuildOptions, build
from emitter.build.cli import register

ROOT = Path(__file__).resolve().parents[2]
try:                                   # a broken install counts as none: the tests skip
    import ray as _ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'emitter[ray]')")
TIMING_KEYS = ("wall_s", "compile_wall_s")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance for the session: 2 CPUs, 2 fake GPUs, a small object store."""
    if not HAVE_RAY:
        pytest.skip("Ray is not installed")
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, num_gpus=2, object_store_memory=128 << 20, include_dashboard=False,
                 log_to_driver=False, logging_level="WARNING")
    yield ray
    if started:
        ray.shutdown()


# ------------------------------------------------------------------------------------------ a fake nvcc
FAKE_NVCC = r'''#!{python}
"""A stand-in for nvcc: deterministic artifacts from the source and the flags (not the paths)."""
import hashlib, os, signal, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.fake")
    sys.exit(0)
with open({calls!r}, "a") as f:
    f.write(" ".join(args) + "\n")
out = args[args.index("-o") + 1]
src = args[-1]
text = open(src, "rb").read()
name = os.path.basename(src)[:-3]
device = "--shared" not in args
if b"FAKE_ERROR" in text:
    sys.stderr.write(f"{{src}}(3): error: identifier \"nope\" is undefined\n1 error detected\n")
    sys.exit(2)
if b"FAKE_KILL_WORKER" in text and device:
    os.kill(os.getppid(), signal.SIGKILL)      # the process that started nvcc: a Ray worker (never the local pool)
    time.sleep(2)
    sys.exit(9)
flags = [a for i, a in enumerate(args) if not a.startswith("-I") and args[i - 1] != "-o" and a != src]
digest = hashlib.sha256(text + "\0".join(flags).encode()).hexdigest()
with open(out, "w") as f:
    f.write(("cubin " if device else "shim ") + digest + "\n")
if device:
    regs = 32 + int(digest[:2], 16) % 64
    sys.stderr.write(f"ptxas info    : Compiling entry function 'emitter_{{name}}_kernel' for 'sm_80'\n"
                     f"ptxas info    : Function properties for emitter_{{name}}_kernel\n"
                     f"    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                     f"ptxas info    : Used {{regs}} registers, 1024 bytes smem, 400 bytes cmem[0]\n")
'''


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    calls = tmp_path / "nvcc_calls.log"
    script = tmp_path / "bin" / "nvcc"
    script.parent.mkdir()
    script.write_text(FAKE_NVCC.format(python=sys.executable, calls=str(calls)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("EMITTER_NVCC", str(script))
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))

    class Fake:
        path = script

        @staticmethod
        def calls() -> int:
            return len(calls.read_text().splitlines()) if calls.exists() else 0

    return Fake


def tiny_cu(name: str, extra: str = "") -> str:
    return (f"// tiny test instance {name}\n#ifdef EMITTER_DEVICE\n"
            f"extern \"C\" __global__ void emitter_{name}_kernel(float* p) {{ p[threadIdx.x] = 1.0f; }}\n"
            f"#else\nextern \"C\" int emitter_{name}_query(void) {{ return 0; }}\n#endif\n{extra}")


def write_manifest(out: Path, sources: dict[str, str], arch: str = "sm80") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    instances = []
    for name, text in sources.items():
        (out / f"{name}.cu").write_text(text)
        instances.append({"name": name, "family": "gemm", "arch": arch, "source": f"{name}.cu",
                          "spec": "test.yaml", "spec_hash": "0" * 64, "config": {"tile": [128, 128, 32], "a": "f16"}})
    (out / "manifest.json").write_text(json.dumps({
        "schema_version": 1, "emitter_version": "0.1.0", "generated_at": None, "specs": [],
        "instances": instances, "rejected": []}, indent=1))
    return out


def records(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "build").glob("*/record.json"))}


def comparable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in TIMING_KEYS}


def artifacts(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((out / "build").glob("*/*")) if p.suffix in (".cubin", ".fatbin", ".so")}


SOURCES = {
    "k_a": tiny_cu("k_a"),
    "k_b": tiny_cu("k_b", "// b\n"),
    "k_bad": tiny_cu("k_bad", "FAKE_ERROR\n"),
    "k_c": tiny_cu("k_c", "// c\n"),
}


# ------------------------------------------------------------------------------------------------ build
@needs_ray
def test_ray_build_equals_the_local_build(tmp_path, fake_nvcc, ray_local):
    """Same instances, separate caches: the same records (but for timings) and byte-identical artifacts; the
    failing instance fails alone in both, with the same error."""
    local = write_manifest(tmp_path / "local", SOURCES)
    remote = write_manifest(tmp_path / "remote", SOURCES)
    s1 = build(local, options=BuildOptions(jobs=2, cache_dir=tmp_path / "c1"))
    s2 = build(remote, options=BuildOptions(executor="ray", cache_dir=tmp_path / "c2"))
    assert [r.name for r in s2.failed] == ["k_bad"] == [r.name for r in s1.failed]
    assert {r.name: r.status for r in s2.results} == {"k_a": "ok", "k_b": "ok", "k_bad": "failed", "k_c": "ok"}
    assert s2.jobs == 2                                     # the cluster's CPUs
    r1, r2 = records(local), records(remote)
    assert {n: comparable(r) for n, r in r1.items()} == {n: comparable(r) for n, r in r2.items()}
    assert "identifier \"nope\" is undefined" in r2["k_bad"]["error"]
    assert r2["k_a"]["resources"]["registers"] > 0
    assert artifacts(local) == artifacts(remote) and len(artifacts(remote)) == 6
    assert (remote / "build/k_a/build.log").read_text() == (local / "build/k_a/build.log").read_text()
    assert s2.failed[0].repro and "nvcc" in s2.failed[0].repro[0]


@needs_ray
def test_ray_build_consults_and_fills_the_driver_cache(tmp_path, fake_nvcc, ray_local):
    """A cache hit is never sent to Ray; what Ray compiled lands in the cache for the next build."""
    first = write_manifest(tmp_path / "first", {k: v for k, v in SOURCES.items() if k != "k_bad"})
    s1 = build(first, options=BuildOptions(executor="ray"))
    assert s1.ok and s1.count("ok") == 3
    n = fake_nvcc.calls()
    assert n == 6                                           # two compiles an instance, nothing retried
    second = write_manifest(tmp_path / "second", {**{k: v for k, v in SOURCES.items() if k != "k_bad"},
                                                  "k_new": tiny_cu("k_new")})
    s2 = build(second, options=BuildOptions(executor="ray"))
    assert {r.name: r.status for r in s2.results} == {"k_a": "cached", "k_b": "cached", "k_c": "cached",
                                                      "k_new": "ok"}
    assert fake_nvcc.calls() == n + 2                       # only k_new went to Ray
    s3 = build(second)                                      # the local pool finds Ray's results in the cache
    assert s3.count("cached") == 4 and fake_nvcc.calls() == n + 2


@needs_ray
def test_a_worker_killed_mid_build_fails_that_instance_only(tmp_path, fake_nvcc, ray_local):
    """The fake nvcc of k_kill SIGKILLs the Ray worker running it: k_kill is reported failed (the worker died),
    not retried (max_retries=0), and every other instance is built."""
    sources = {"k_a": tiny_cu("k_a"), "k_kill": tiny_cu("k_kill", "// FAKE_KILL_WORKER\n"),
               "k_b": tiny_cu("k_b", "// b\n"), "k_c": tiny_cu("k_c", "// c\n")}
    out = write_manifest(tmp_path / "out", sources)
    s = build(out, options=BuildOptions(executor="ray"))
    assert {r.name: r.status for r in s.results} == {"k_a": "ok", "k_kill": "failed", "k_b": "ok", "k_c": "ok"}
    err = s.failed[0].error
    assert "exited with -1" in err and "Ray worker running nvcc died" in err, err
    calls = [l for l in (tmp_path / "nvcc_calls.log").read_text().splitlines() if "k_kill.cu" in l]
    assert sum("--shared" not in l for l in calls) == 1    # the device compile ran once: not retried
    assert records(out)["k_kill"]["artifacts"] == {"cubin": None, "host": None}


@needs_ray
def test_cli_build_with_ray_exit_codes_and_progress(tmp_path, fake_nvcc, ray_local):
    group = click.Group()
    register(group)
    out = write_manifest(tmp_path / "out", SOURCES)
    res = CliRunner().invoke(group, ["build", str(out), "--executor", "ray", "--no-progress"])
    assert res.exit_code == 1, res.output                   # k_bad failed: the same exit code as locally
    assert "built 4 instances: 3 compiled, 0 cached, 1 failed" in res.output
    assert "[4/4]" in res.output and "FAILED k_bad" in res.output.replace("FAILED\n", "FAILED ")
    ok = write_manifest(tmp_path / "ok", {"k_a": SOURCES["k_a"]})
    res = CliRunner().invoke(group, ["build", str(ok), "--executor", "ray", "--address", "auto", "--progress"])
    assert res.exit_code == 0, res.output                   # an initialized Ray is used as it is
    assert "built 1 instance: 0 compiled, 1 cached, 0 failed" in res.output


@needs_ray
def test_node_refuses_another_toolchain(tmp_path, fake_nvcc):
    """A node whose nvcc or CUTLASS headers differ from the driver's fails the compile instead of filling the
    cache under the driver's key. (compile_on_node is the Ray task's body: run here without Ray.)"""
    from emitter.build.ray_executor import compile_on_node

    job = {"driver_nvcc": str(fake_nvcc.path), "nvcc_version": "Cuda compilation tools, release 12.4, V12.4.99",
           "cutlass_digest": "x", "cutlass_origin": "nvidia-cutlass 4.2.0.0", "argv": ["{nvcc}", "-o", "{out}", "k.cu"],
           "files": {"k.cu": b"int x;"}, "out_name": "k.cubin", "timeout_s": None, "env": []}
    r = compile_on_node(job)
    assert r["returncode"] == 2 and r["artifact"] is None
    assert "another toolchain" in r["output"] and "V12.4.99" in r["output"] and "CUTLASS" in r["output"]
    with pytest.raises(ValueError):
        from emitter.build.ray_executor import _safe_rel
        _safe_rel("../etc/passwd")


def test_task_memory_follows_the_measured_nvcc_peak():
    from emitter.build.nvcc import commands, memory_per_job
    from emitter.build.ray_executor import task_memory

    for arch in ("sm80", "sm90a"):
        c = commands("nvcc", arch, ["-I/x/include"])
        assert task_memory(c.device) == memory_per_job(arch)
        assert task_memory(c.host) == memory_per_job(arch) // 2
    assert task_memory(commands("nvcc", "sm90a", []).device) == 4 << 30


def test_without_ray_the_executor_says_how_to_install_it(tmp_path, fake_nvcc, monkeypatch):
    from emitter.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)           # import ray -> ImportError
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a")})
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"manifests: [{out}]\nproblems: [{{square: 64}}]\n")
    for argv in (["build", str(out), "--executor", "ray"],
                 ["profile", str(cfg), "--executor", "ray", "--backend", "fake"]):
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "pip install 'emitter[ray]'" in res.output and "Traceback" not in res.output
    assert not (out / "build").exists()                     # nothing was started


@needs_ray
@pytest.mark.nvcc
def test_one_real_sm80_compile_through_ray(tmp_path, ray_local, monkeypatch):
    """A real emitted sm80 instance compiled by the real nvcc in a Ray task (records and artifacts equal to the
    local pool's are checked with the fake nvcc above; this checks the real toolchain on a node)."""
    from tests._helpers import NVCC_REQUIRED as _NVCC_REQUIRED, nvcc_path

    if nvcc_path() is None:
        if _NVCC_REQUIRED:
            pytest.fail("CI=true but nvcc was not found")
        pytest.skip("nvcc not found")
    from emitter.emit import emit

    monkeypatch.delenv("EMITTER_NVCC", raising=False)
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    res = emit([ROOT / "configs/gemm/sm80.yaml"], tmp_path / "gen", jobs=1)
    first = res.instances[0].name
    s = build(tmp_path / "gen", select=(first,), options=BuildOptions(executor="ray"))
    assert s.ok and len(s.results) == 1, [(r.name, r.error) for r in s.failed]
    rec = s.results[0].record
    assert rec["status"] == "ok" and rec["resources"]["registers"] > 0
    assert all((tmp_path / "gen" / rec["artifacts"][k]).stat().st_size > 1000 for k in ("cubin", "host"))
    assert rec["commands"][0][0] == nvcc_path() or rec["commands"][0][0].endswith("nvcc")


# ---------------------------------------------------------------------------------------------- profile
@pytest.fixture(scope="module")
def sm90a_manifest(tmp_path_factory):
    from emitter.emit import emit

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], out)
    return out


def _profile_config(manifest: Path, extra: str = ""):
    from emitter.profile.config import parse_config_text

    return parse_config_text(f"manifests: [{manifest}]\nproblems:\n  - {{square: [256, 512, 1024, 2048]}}\n"
                             f"  - {{m: 128, n: 4096, k: 4096}}\ntiming: {{iterations: 10, repeats: 2}}\n{extra}",
                             "p.yaml")


def _tuning(outcome, cfg, out: Path) -> list:
    from emitter.profile import report as rep

    rep.write_all(rep.build(outcome.measurements, outcome.envs, cfg), out, plots=False)
    return json.loads((out / "tuning.json").read_text())["entries"]


@needs_ray
def test_ray_profile_gives_the_local_tuning_table(sm90a_manifest, tmp_path, ray_local, capfd):
    """Two fake GPUs as two Ray GPU actors fed from the runner's queue: every problem measured once, on one GPU,
    both GPUs used, the same measurements and tuning table as a local run, and the run's per-GPU record."""
    from emitter.profile.ray_runner import GpuPool
    from emitter.profile.runner import plan, run

    cfg = _profile_config(sm90a_manifest, "gpus: 2\n")
    pl = plan(cfg)
    local = run(cfg, pl, tmp_path / "local", [0, 1], backend="fake")
    pool = GpuPool.connect(cfg, None, None)
    assert pool.gpus == [0, 1] and len({w["gpu_ids"][0] for w in pool.where}) == 2
    remote = pool.run(cfg, pl, tmp_path / "ray", pool.gpus, backend="fake")
    assert not remote.fatal and remote.restarts == 0
    key = lambda m: (m.kind, m.label, m.op.key, m.problem.key)   # noqa: E731
    assert sorted(map(key, remote.measurements)) == sorted(map(key, local.measurements))
    where: dict[str, set] = {}
    for m in remote.measurements:
        where.setdefault(m.problem.key, set()).add(m.gpu)
    assert all(len(g) == 1 for g in where.values()) and set().union(*where.values()) == {0, 1}
    taken = {g: sorted(remote.run["per_gpu"][str(g)]["taken"]) for g in (0, 1)}
    assert taken == {g: sorted(k for k, gs in where.items() if g in gs) for g in (0, 1)}
    med = lambda o: {key(m): m.stats.median_ms if m.stats else None for m in o.measurements}   # noqa: E731
    assert med(remote) == med(local)
    assert _tuning(remote, cfg, tmp_path / "ray") == _tuning(local, cfg, tmp_path / "local")
    err = capfd.readouterr().err
    assert "[gpu0]" in err and "[gpu1]" in err              # the workers' lines reach the driver


@needs_ray
def test_ray_profile_restarts_a_crashed_worker_and_drops_the_kernel(sm90a_manifest, tmp_path, ray_local):
    """The fake backend's `crash` (the worker process dies, as a segfaulting shim would) on one kernel: the actor
    restarts the worker without it, the kernel gets a fault record, nothing else is lost; as locally."""
    from emitter.profile.ray_runner import GpuPool
    from emitter.profile.records import FAULT
    from emitter.profile.runner import plan, run

    cfg = _profile_config(sm90a_manifest, "gpus: 2\n")
    pl = plan(cfg)
    victim = pl.instances[1]["entry"]["name"]
    faults = [{"kind": "crash", "select": victim, "problem": "2048x2048x2048"}]
    local = run(cfg, pl, tmp_path / "local", [0, 1], backend="fake", faults=faults)
    pool = GpuPool.connect(cfg, "2", None)
    remote = pool.run(cfg, pl, tmp_path / "ray", backend="fake", faults=faults)
    assert remote.restarts == local.restarts == 1 and not remote.fatal
    by = {(m.name, m.problem.key): m for m in remote.measurements if m.kind == "kernel"}
    assert by[(victim, "2048x2048x2048")].status == FAULT
    assert len(remote.measurements) == len(local.measurements)
    assert _tuning(remote, cfg, tmp_path / "ray") == _tuning(local, cfg, tmp_path / "local")


@needs_ray
def test_ray_profile_kills_a_stalled_worker_and_keeps_the_rest(sm90a_manifest, tmp_path, ray_local):
    """A kernel that hangs on one GPU actor: after --stall-timeout the driver has the actor kill its worker, the
    kernel gets a fault record ("no progress"), the worker restarts without it and nothing else is lost."""
    from emitter.profile.ray_runner import GpuPool
    from emitter.profile.records import FAULT
    from emitter.profile.runner import plan, run

    cfg = _profile_config(sm90a_manifest, "gpus: 2\n")
    pl = plan(cfg)
    victim = pl.instances[2]["entry"]["name"]
    faults = [{"kind": "hang", "select": victim, "problem": "512x512x512", "seconds": 120}]
    clean = run(cfg, pl, tmp_path / "clean", [0, 1], backend="fake")
    remote = GpuPool.connect(cfg, None, None).run(cfg, pl, tmp_path / "ray", backend="fake", faults=faults,
                                                  stall_timeout_s=3)
    assert remote.restarts == 1 and not remote.fatal
    key = lambda m: (m.kind, m.label, m.op.key, m.problem.key)   # noqa: E731
    got = {key(m): m for m in remote.measurements}
    assert set(got) == {key(m) for m in clean.measurements}
    hung = [m for m in remote.measurements if m.status == FAULT]
    assert [(m.name, m.problem.key) for m in hung] == [(victim, "512x512x512")] and "no progress" in hung[0].reason
    for m in clean.measurements:
        if key(m) != key(hung[0]):
            assert got[key(m)].stats.median_ms == m.stats.median_ms


@needs_ray
def test_ray_profile_survives_a_lost_gpu_actor(sm90a_manifest, tmp_path, ray_local):
    """The actor of GPU 1 dies (SIGKILL: a node lost) while its worker measures a kernel: that measurement gets a
    fault record, the rest of the problem goes back to the queue (GPU 0 takes it), a new actor takes further
    work, and nothing else is lost."""
    import os
    import signal
    import threading
    import time

    from emitter.profile.ray_runner import GpuPool
    from emitter.profile.records import FAULT
    from emitter.profile.cost import estimate, queue_order
    from emitter.profile.runner import plan, run

    cfg = _profile_config(sm90a_manifest, "gpus: 2\n")
    pl = plan(cfg)
    victim = pl.instances[3]["entry"]["name"]
    where = queue_order(pl.problems, estimate(pl, cfg))[1].key      # the queue hands it to GPU 1 first
    faults = [{"kind": "hang", "select": victim, "problem": where, "seconds": 120}]   # holds it there
    clean = run(cfg, pl, tmp_path / "clean", [0, 1], backend="fake")
    pool = GpuPool.connect(cfg, None, None)
    log = tmp_path / "ray" / "work" / "shard1.jsonl"
    killed = []

    def kill_when_hung() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if log.exists() and f'"name": "{victim}"' in log.read_text() and f'"problem": "{where}"' in log.read_text():
                time.sleep(0.5)
                os.kill(pool.where[1]["pid"], signal.SIGKILL)
                killed.append(pool.where[1]["pid"])
                return
            time.sleep(0.1)

    t = threading.Thread(target=kill_when_hung)
    t.start()
    remote = pool.run(cfg, pl, tmp_path / "ray", backend="fake", faults=faults, stall_timeout_s=60)
    t.join()
    assert killed and remote.restarts == 1 and not remote.fatal
    key = lambda m: (m.kind, m.label, m.op.key, m.problem.key)   # noqa: E731
    got = {key(m): m for m in remote.measurements}
    assert set(got) == {key(m) for m in clean.measurements}
    lost = [m for m in remote.measurements if m.status == FAULT]
    assert [(m.name, m.problem.key, m.gpu) for m in lost] == [(victim, where, 1)] and "died" in lost[0].reason
    row = next(p for p in remote.run["problems"] if p["problem"] == where)
    assert row["gpus"] == [1, 0]
    assert any(e.startswith(f"gpu1: the worker died") and where in e for e in remote.events)


@needs_ray
def test_cli_profile_with_ray(sm90a_manifest, tmp_path, ray_local):
    from emitter.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"manifests: [{sm90a_manifest}]\nproblems: [{{square: [512, 1024]}}]\ngpus: 2\n"
                   f"timing: {{iterations: 10, repeats: 2}}\noutput: {{dir: {tmp_path / 'res'}, plots: false}}\n")
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake", "--executor", "ray"])
    assert res.exit_code == 0, res.output
    assert "Ray: 2 GPU actors" in res.output and "on 2 GPUs" in res.output
    assert len(json.loads((tmp_path / "res" / "tuning.json").read_text())["entries"]) == 2
    res = CliRunner().invoke(main, ["profile", str(cfg), "--backend", "fake", "--executor", "ray", "--gpus", "3"])
    assert res.exit_code == 2 and "the Ray cluster has 2" in res.output, res.output


@needs_ray
def test_an_address_nobody_listens_on_fails_fast():
    """ray.init would wait minutes for a GCS at a dead address; emitter says so in a second, exit 2."""
    import socket
    import time

    from emitter.executors import RayUnavailable, _reachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        t0 = time.monotonic()
        with pytest.raises(RayUnavailable, match="ray start --head") as e:
            _reachable(address)
        assert e.value.exit_code == 2 and time.monotonic() - t0 < 5
