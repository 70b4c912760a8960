"""The profiler pays the workspace cost the exported library pays (issue 26, item 6).

The library runs an instance's host shim initialize() on every call, and a stream-K / split-K shim zeroes its tile
locks there (a memset on the stream before the launch). timing.workspace_reset: library (the default) times that
memset before every timed launch; settled drops it where a launch leaves the locks zeroed (the kernel alone).
CPU tests drive KernelLaunch / ConvLaunch through a simulated PyCUDA driver and host shim; the GPU test at the end
profiles a real stream-K instance in both modes.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emitter.errors import SpecError
from emitter.profile.config import ProfileConfig, parse_config_text
from tests._helpers import CONV_SM80_WGRAD_SPLITK_ENTRY

ROOT = Path(__file__).resolve().parents[2]
BASE = "manifests: [generated/demo]\nproblems:\n  - {m: 128, n: 256, k: 512}\n"


def cfg(timing: str = "") -> ProfileConfig:
    return parse_config_text(BASE + timing, "p.yaml")


# ------------------------------------------------------------------------------------------ config
def test_workspace_reset_defaults_to_library_and_parses_settled():
    assert cfg().timing.workspace_reset == "library"
    assert cfg("timing: {iterations: 20}\n").timing.workspace_reset == "library"
    assert cfg("timing: {workspace_reset: settled}\n").timing.workspace_reset == "settled"
    assert cfg("timing: {workspace_reset: Library}\n").timing.workspace_reset == "library"
    c = cfg("timing:\n  repeats: 2\n  workspace_reset: settled\n")
    assert ProfileConfig.from_json(json.loads(json.dumps(c.to_json()))).timing.workspace_reset == "settled"


@pytest.mark.parametrize("value", ["always", "true", "1", "[library]"])
def test_workspace_reset_rejects_other_values_with_line_key_allowed_and_fix(value):
    text = BASE + f"timing:\n  repeats: 2\n  workspace_reset: {value}\n"
    with pytest.raises(SpecError) as e:
        parse_config_text(text, "p.yaml")
    err = e.value
    assert err.file == "p.yaml" and err.line == 6 and err.key_path == "timing.workspace_reset"
    assert list(err.allowed) == ["library", "settled"] and "settled" in err.fix and err.exit_code == 2
    assert "workspace_reset takes 'library' or 'settled'" in str(err)


def test_a_bad_cli_flag_value_is_a_usage_error(tmp_path):
    """--workspace-reset takes library or settled; anything else is a usage error (exit 2), not a traceback."""
    from emitter.cli import main

    r = CliRunner().invoke(main, ["profile", str(tmp_path), "--workspace-reset", "always"])
    assert r.exit_code == 2 and "always" in r.output and "library" in r.output and "settled" in r.output


# ------------------------------------------------------------------------------------------ fake device
class _Device:
    """A simulated PyCUDA driver: one byte array of device memory and the order of what reached the stream."""

    def __init__(self) -> None:
        self.mem = np.zeros(1 << 16, np.uint8)
        self.next = 4096
        self.log: list[tuple] = []
        self.module = types.ModuleType("pycuda.driver")
        dev = self

        class Error(Exception):
            pass

        class Alloc:
            def __init__(self, ptr: int) -> None:
                self.ptr = ptr

            def __int__(self) -> int:
                return self.ptr

            def free(self) -> None:
                pass

        def mem_alloc(n: int) -> Alloc:
            ptr, dev.next = dev.next, dev.next + ((n + 255) // 256) * 256
            dev.mem[ptr:ptr + n] = 0x3C        # fresh memory holds garbage
            return Alloc(ptr)

        def memset_d8(ptr: int, value: int, n: int) -> None:
            dev.mem[ptr:ptr + n] = value

        def memset_d8_async(ptr: int, value: int, n: int, stream) -> None:
            dev.log.append(("memset", ptr, n))
            dev.mem[ptr:ptr + n] = value

        def memcpy_dtoh(host, ptr: int) -> None:
            host[:] = dev.mem[ptr:ptr + host.size]

        self.module.Error = Error
        self.module.mem_alloc = mem_alloc
        self.module.memset_d8 = memset_d8
        self.module.memset_d8_async = memset_d8_async
        self.module.memcpy_dtoh = memcpy_dtoh

    def install(self, monkeypatch) -> None:
        pkg = types.ModuleType("pycuda")
        pkg.driver = self.module
        monkeypatch.setitem(sys.modules, "pycuda", pkg)
        monkeypatch.setitem(sys.modules, "pycuda.driver", self.module)


LOCKS = (16, 48)     # the bytes of a 64-byte workspace initialize() zeroes (reduction space first, then the locks)


class _Shim:
    """A stream-K host shim: a 64-byte workspace whose lock bytes initialize() zeroes; Params: the workspace."""

    def __init__(self, dev: _Device, workspace_bytes: int = 64) -> None:
        self.dev, self.workspace_bytes = dev, workspace_bytes

    def _launch(self):
        from emitter.kit.shim import EmitterLaunch

        out = EmitterLaunch()
        out.grid[:] = [4, 1, 1]
        out.block[:] = [384, 1, 1]
        out.params_bytes, out.params_align, out.workspace_bytes = 8, 8, self.workspace_bytes
        return out

    def query(self, prob):
        return 0, self._launch()

    def initialize(self, prob, ws, stream, capacity):
        if self.workspace_bytes:
            lo, hi = LOCKS
            self.dev.mem[ws + lo:ws + hi] = 0           # GemmKernel::initialize_workspace on the stream
        return 0, int(ws).to_bytes(8, "little"), self._launch()


class _Fn:
    def __init__(self, dev: _Device, resets_locks: bool) -> None:
        self.dev, self.resets_locks = dev, resets_locks

    def allow_shared(self, n):
        pass

    def launch(self, grid, block, shared, stream, packed):
        ws = int.from_bytes(packed.data(), "little")
        lo, hi = LOCKS
        if ws:
            self.dev.mem[ws + lo:ws + hi] += 3              # the tile locks count up while the kernel runs
            if self.resets_locks:
                self.dev.mem[ws + lo:ws + hi] = 0           # emitter's scheduler sets them back to zero
        self.dev.log.append(("launch", ws))


class _Stream:
    handle = 7

    def synchronize(self):
        pass


@pytest.fixture(scope="module")
def streamk_entry(tmp_path_factory):
    from emitter.emit import emit
    from emitter.manifest import load

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], out)
    return next(e for e in load(out)["instances"] if "streamk" in e["name"])


def _gemm_launch(monkeypatch, entry, mode, resets_locks=True, workspace_bytes=64, sets=3):
    from emitter.families.gemm import workload as wl
    from emitter.families.gemm.profile import Problem
    from emitter.families.gemm.profile import Op

    dev = _Device()
    dev.install(monkeypatch)
    op = Op.from_config(entry["config"])
    data = wl.ProblemData(op, Problem(256, 512, 8192), 1.0, 0.0,
                          [wl.OperandSet(A=1 << 20, B=2 << 20, C=0, D=3 << 20, bias=0) for _ in range(sets)],
                          wl.op_config(op), None, arena=None)
    kernel = types.SimpleNamespace(name=entry["name"], config=wl.op_config(op),
                                   handle={"shim": _Shim(dev, workspace_bytes), "fn": _Fn(dev, resets_locks)})
    return dev, wl.KernelLaunch(kernel, data, _Stream(), split_k=2, workspace_reset=mode)


def test_library_mode_issues_initializes_memset_on_the_stream_before_every_timed_launch(monkeypatch, streamk_entry):
    dev, kl = _gemm_launch(monkeypatch, streamk_entry, "library")
    assert dev.log == []                                    # nothing launched while preparing
    wss = [r[0] - LOCKS[0] for r in kl.resets]
    assert len(set(wss)) == 3 and all(r[1] == LOCKS[1] - LOCKS[0] for r in kl.resets)   # the bytes initialize() zeroed
    for i in range(7):
        kl(i)
    want = []
    for i in range(7):
        ws = wss[i % 3]
        want += [("memset", ws + LOCKS[0], LOCKS[1] - LOCKS[0]), ("launch", ws)]
    assert dev.log == want
    assert kl.info["workspace_reset_mode"] == "library"
    assert kl.info["workspace_reset"] == "memset before each launch (as the library's initialize())"


def test_settled_mode_drops_the_memset_where_a_launch_leaves_the_locks_zeroed(monkeypatch, streamk_entry):
    dev, kl = _gemm_launch(monkeypatch, streamk_entry, "settled", resets_locks=True)
    assert [e[0] for e in dev.log] == ["launch"] * 3        # one trial launch per set, read back
    dev.log.clear()
    for i in range(6):
        kl(i)
    assert [e[0] for e in dev.log] == ["launch"] * 6 and kl.resets == [None] * 3
    assert kl.info["workspace_reset_mode"] == "settled"
    assert kl.info["workspace_reset"].startswith("none: each launch leaves")


def test_settled_mode_keeps_the_memset_where_a_launch_leaves_the_locks_counted_up(monkeypatch, streamk_entry):
    dev, kl = _gemm_launch(monkeypatch, streamk_entry, "settled", resets_locks=False)
    ws0 = kl.resets[0][0]
    assert not dev.mem[ws0:ws0 + kl.resets[0][1]].any()       # zeroed again for the first timed launch
    dev.log.clear()
    kl(0)
    assert [e[0] for e in dev.log] == ["memset", "launch"]
    assert kl.info["workspace_reset"] == "memset before each launch"


def test_no_workspace_means_no_memset_in_either_mode(monkeypatch, streamk_entry):
    for mode in ("library", "settled"):
        dev, kl = _gemm_launch(monkeypatch, streamk_entry, mode, workspace_bytes=0)
        kl(0)
        kl(1)
        assert [e[0] for e in dev.log] == ["launch", "launch"] and kl.resets == [None] * 3
        assert kl.info["workspace_reset_mode"] == mode and "workspace_reset" not in kl.info


def test_a_bad_mode_is_refused_before_anything_is_allocated(monkeypatch, streamk_entry):
    with pytest.raises(ValueError, match="library, settled"):
        _gemm_launch(monkeypatch, streamk_entry, "sometimes")


def test_conv_launch_resets_its_semaphores_before_each_launch_in_library_mode(monkeypatch):
    """ConvLaunch: the sm80 serial split-K shim memsets its semaphores in initialize(), on every library call."""
    from emitter.families.conv import profile as cp
    from emitter.kit import workspace as wsr

    dev = _Device()
    cl = cp.ConvLaunch.__new__(cp.ConvLaunch)
    cl.drv, cl.stream, cl._handle, cl.fn = dev.module, _Stream(), 7, _Fn(dev, resets_locks=True)
    from emitter.kit.launcher import PackedParams

    cl.launches = [((1, 1, 1), (128, 1, 1), PackedParams((4096 * (j + 1)).to_bytes(8, "little")), 0) for j in range(2)]
    cl.resets = [(4096 + 16, 32), (8192 + 16, 32)]
    cl(0)
    cl(1)
    assert dev.log == [("memset", 4112, 32), ("launch", 4096), ("memset", 8208, 32), ("launch", 8192)]
    # settled: one launch per set leaves the semaphores zeroed -> no memset
    kept = wsr.settle(dev.module, cl.fn, cl.stream, 7, cl.launches, cl.resets)
    assert kept == 0 and cl.resets == [None, None]
    seen = {}
    monkeypatch.setattr(cp, "ConvLaunch", lambda kernel, data, stream, split_k, options, mode: seen.update(
        split_k=split_k, options=options, mode=mode))
    cp.kernel_launch(None, None, None, split_k=3, options=0, workspace_reset="settled")
    assert seen == {"split_k": 3, "options": 0, "mode": "settled"}
    cp.kernel_launch(None, None, None, split_k=1)
    assert seen["mode"] == "library"


# ------------------------------------------------------------------------------------------ the worker and records
def test_the_worker_passes_the_mode_to_the_launch_and_records_it(monkeypatch):
    import emitter.families.gemm.profile_check as chk
    import emitter.families.gemm.workload as wl
    from emitter.families.registry import runtime_family
    from emitter.families.gemm.profile import Problem
    from emitter.profile.records import Measurement
    from emitter.families.gemm.profile import Op
    from emitter.profile.stats import TimingStats
    from emitter.profile.timing import Measured
    from emitter.profile.worker import GpuEngine

    seen = {}

    class Launch:
        info = {"grid": [1, 1, 1], "workspace_reset_mode": "settled"}
        resets = [None]

        def __init__(self, kernel, data, stream, split_k=1, options=0, workspace_reset="library"):
            seen["mode"] = workspace_reset

        def __call__(self, i):
            pass

        def free(self):
            pass

    monkeypatch.setattr(wl, "KernelLaunch", Launch)
    monkeypatch.setattr(chk, "poison_d", lambda data, i=0: None)
    ok = {"passed": True, "reason": None, "rel_err": 0.0, "nonfinite": 0, "unwritten": 0, "mismatches": 0}
    monkeypatch.setattr(chk, "check", lambda data, cfg, use_torch, split_k=1: dict(ok))

    class Timer:
        def measure(self, launch, sets):
            return Measured(TimingStats.from_samples([[1.0, 1.1]]), 2, 10, 9.0, 0.0)

    eng = GpuEngine.__new__(GpuEngine)
    eng.config = cfg("timing: {workspace_reset: settled}\n")
    eng.timer, eng.stream, eng.use_torch = Timer(), _Stream(), True
    eng.extra = lambda data: {}
    kernel = types.SimpleNamespace(config=None, name="k", hooks=runtime_family("gemm"))
    op = Op(a="bf16", b="bf16", c="bf16", d="bf16", layout_a="row", layout_b="col", layout_c="row")
    m = eng.kernel(kernel, types.SimpleNamespace(sets=[0]), Measurement("kernel", "k", "emitter", op, Problem(1, 2, 3)))
    assert seen["mode"] == "settled" and m.extra["workspace_reset_mode"] == "settled"
    assert m.extra["workspace_reset_bytes"] == 0


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory):
    from emitter.emit import emit

    out = tmp_path_factory.mktemp("gen")
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], out)
    return out


@pytest.mark.parametrize("flags,want", [([], "library"), (["--workspace-reset", "settled"], "settled"),
                                        (["--quick", "--workspace-reset", "settled"], "settled")])
def test_profile_json_and_tuning_json_say_which_mode_was_timed(manifest_dir, tmp_path, flags, want):
    from emitter.cli import main

    out = tmp_path / "res"
    r = CliRunner().invoke(main, ["profile", str(manifest_dir), "--backend", "fake", "--problem", "128x256x512",
                                  "-o", str(out), "--no-plots", *flags])
    assert r.exit_code == 0, r.output
    prof = json.loads((out / "profile.json").read_text())
    assert prof["config"]["timing"]["workspace_reset"] == want
    kernels = [m for m in prof["measurements"] if m["kind"] == "kernel" and m.get("stats")]
    assert kernels and all(m["extra"]["workspace_reset_mode"] == want for m in kernels)
    entries = json.loads((out / "tuning.json").read_text())["entries"]
    assert entries and all(e["workspace_reset"] == want for e in entries)


def test_a_yaml_config_reaches_the_records(manifest_dir, tmp_path):
    from emitter.cli import main

    yaml = tmp_path / "p.yaml"
    yaml.write_text(textwrap.dedent(f"""\
        manifests: [{manifest_dir}]
        problems: [{{m: 128, n: 256, k: 512}}]
        timing: {{iterations: 20, repeats: 2, workspace_reset: settled}}
        """))
    r = CliRunner().invoke(main, ["profile", str(yaml), "--backend", "fake", "-o", str(tmp_path / "o"), "--no-plots"])
    assert r.exit_code == 0, r.output
    entries = json.loads((tmp_path / "o" / "tuning.json").read_text())["entries"]
    assert entries and {e["workspace_reset"] for e in entries} == {"settled"}


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.nvcc
def test_library_mode_times_the_stream_k_memset_on_the_gpu(tmp_path):
    """On the GPU: the sm90a stream-K instance of configs/gemm/sm90a_bf16.yaml, built, profiled once per mode on a
    problem its scheduler splits. library: every measurement with a workspace records initialize()'s memset and its
    bytes; settled: none kept (emitter's scheduler leaves the locks zeroed); both pass the check after timing, and
    the timings are printed, not asserted (speed is a benchmark's job: benchmarks/workspace_reset.py)."""
    from emitter.build.builder import build
    from emitter.emit import emit
    from emitter.manifest import load
    from emitter.profile.runner import plan, run

    gen = tmp_path / "gen"
    emit([ROOT / "configs/gemm/sm90a_bf16.yaml"], gen)
    name = next(e["name"] for e in load(gen)["instances"] if "streamk" in e["name"])
    summary = build(gen, select=(name,))
    assert not getattr(summary, "failed", None), summary
    by: dict = {}
    for mode in ("library", "settled"):
        c = parse_config_text(f"manifests: [{json.dumps(str(gen))}]\nselect: [{json.dumps(name)}]\n"
                              "problems: [{m: 256, n: 512, k: 8192}, {m: 128, n: 256, k: 16384}]\n"
                              f"timing: {{warmup: 10, iterations: 200, repeats: 3, workspace_reset: {mode}}}\n"
                              "baselines: []\n", f"{mode}.yaml")
        outcome = run(c, plan(c), tmp_path / mode, [0], backend="pycuda", isolate=False)
        for m in outcome.measurements:
            if m.kind == "kernel" and m.status != "not_applicable":
                assert m.ok and m.check["after_timing"]["passed"], (mode, m.name, m.split_k, m.status, m.reason)
                by.setdefault((m.problem.key, m.split_k), {})[mode] = m
    rows = []
    for key, pair in sorted(by.items()):
        lib, alone = pair["library"], pair["settled"]
        assert lib.extra["workspace_reset_mode"] == "library" and alone.extra["workspace_reset_mode"] == "settled"
        if lib.extra["launch"]["workspace_bytes"] > 0:
            assert lib.extra["workspace_reset_bytes"] > 0, key
            assert lib.extra["launch"]["workspace_reset"].startswith("memset before each launch"), key
            assert alone.extra["workspace_reset_bytes"] == 0, key
            rows.append((key, lib.stats.median_ms * 1e3, alone.stats.median_ms * 1e3,
                         lib.extra["workspace_reset_bytes"]))
    assert rows, "no measurement with a workspace: the problems were not split"
    for (prob, split), a, b, nbytes in rows:
        print(f"\n{prob} split {split}: library {a:.2f} us, settled {b:.2f} us, memset {a - b:+.2f} us ({nbytes} B)")


def test_a_record_from_before_the_setting_reads_back_as_settled():
    """profile.json / job configs written before timing.workspace_reset timed the kernel alone."""
    d = cfg().to_json()
    del d["timing"]["workspace_reset"]
    assert ProfileConfig.from_json(d).timing.workspace_reset == "settled"
    assert ProfileConfig.from_json(cfg().to_json()).timing.workspace_reset == "library"


CONV_SPEC = "kernels:\n" + CONV_SM80_WGRAD_SPLITK_ENTRY


@pytest.fixture(scope="module")
def conv_entry(tmp_path_factory):
    from emitter.emit import emit
    from emitter.manifest import load

    out = tmp_path_factory.mktemp("conv")
    (out / "spec.yaml").write_text(CONV_SPEC)
    emit([out / "spec.yaml"], out / "k")
    (entry,) = load(out / "k")["instances"]
    return entry


@pytest.mark.parametrize("mode", ["library", "settled"])
def test_conv_launch_times_the_sm80_semaphore_memset_in_library_mode(monkeypatch, conv_entry, mode):
    """ConvLaunch end to end on the simulated driver: an sm80 serial split-K wgrad shim zeroes its semaphores in
    initialize() (the library does so on every call); library mode repeats that memset before each timed launch,
    settled mode drops it since each launch leaves the semaphores at zero."""
    from emitter.families.conv import profile as cp
    from emitter.families.conv import runtime as hooks
    from emitter.profile.config import problems_from_text

    dev = _Device()
    dev.install(monkeypatch)
    cc = hooks.config_from_entry(conv_entry)
    (problem,) = problems_from_text(["n=8,h=28,w=28,c=64,k=64,r=3,s=3,pad=1"], families=["conv"])
    data = cp.ConvProfileData(hooks.profile_op(cc), problem, 1.0, 0.0,
                              [cp.ConvSet(x=1 << 20, w=2 << 20, y=3 << 20) for _ in range(2)], arena=None)
    shim = _Shim(dev)
    kernel = types.SimpleNamespace(name="k", config=cc,
                                   handle={"shim": shim, "fn": _Fn(dev, resets_locks=True)})
    launch = cp.kernel_launch(kernel, data, _Stream(), split_k=2, options=0, workspace_reset=mode)
    dev.log.clear()
    launch(0)
    launch(1)
    kinds = [e[0] for e in dev.log]
    assert kinds == (["memset", "launch"] * 2 if mode == "library" else ["launch"] * 2)
    assert launch.info["workspace_reset_mode"] == mode
    assert launch.info["workspace_reset"].startswith("memset" if mode == "library" else "none: each launch")
