"""GEMM's side of `emitter profile`, without a GPU: its problem sets and shipped shape configs, op keys (fp8 fast
accumulation its own op) and the cuBLASLt baseline's mode, run-time scheduler sweeps over GEMM kernels, the
sampled host check, the launch's workspace reset, and split-K candidates and tuning records. The profile stage's
own behaviour is in tests/stages/test_profile.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from emitter.families.gemm.profile import LLM_M, LLM_NK, Op, Problem
from emitter.profile import report as rep
from emitter.profile.config import ProfileConfig, load_config, parse_config_text
from emitter.profile.records import Measurement
from emitter.profile.runner import plan, run
from emitter.profile.selection import choose, choose_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_helpers import OP, _fake_config, cfg_text, manifest_dir, meas  # noqa: E402,F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ problem sets and shipped configs
def test_named_sets_square_and_llm():
    c = cfg_text("manifests: [x]\nproblems: [{set: square}, {set: llm}]\n")
    squares = [p for p in c.problems if p.m == p.n == p.k]
    assert [p.m for p in squares[:5]] == [1024, 2048, 4096, 8192, 16384]
    llm = c.problems[5:]
    assert len(LLM_M) * len(LLM_NK) == 30
    assert len(llm) == 29          # 8192^3 is in both sets: listed once, where it first appears
    assert Problem(16, 128256, 4096) in llm and Problem(8192, 4096, 14336) in llm


def test_ranges_lists_products_and_dedupe():
    c = cfg_text("""
        manifests: generated/demo
        problems:
          - square: {from: 1024, to: 8192, mul: 2}
          - {m: [16, 32], n: {from: 128, to: 384, step: 128}, k: 64, batch: [1, 2]}
          - {m: 1024, n: 1024, k: 1024}        # a repeat: dropped
          - llm                                # shorthand for {set: llm}
    """)
    assert c.manifests == ("generated/demo",)
    assert c.problems[:4] == tuple(Problem(s, s, s) for s in (1024, 2048, 4096, 8192))
    grid = c.problems[4:4 + 12]
    assert len(grid) == 2 * 3 * 2 and Problem(32, 384, 64, 2) in grid
    assert len(c.problems) == 4 + 12 + 29       # 8192^3 came with the squares


def test_shipped_configs_parse():
    for path in sorted((ROOT / "configs" / "profile").glob("*.yaml")):
        c = load_config(path)
        assert c.problems and c.manifests == ("generated/demo",)
    assert len(load_config(ROOT / "configs/profile/llm_shapes.yaml").problems) == 30
    assert len(load_config(ROOT / "configs/profile/square.yaml").problems) == 5
    for name in ("llm_shapes", "square"):      # the sweep of docs/performance.md: 9 variants, top 3
        c = load_config(ROOT / f"configs/profile/{name}.yaml")
        assert len(c.scheduler) == 9 and c.scheduler[0] == 0 and c.scheduler_top == 3


# ------------------------------------------------------------------------------------------ op keys and baselines
def test_fp8_fast_accum_is_its_own_op():
    """Fast-accumulation kernels compute with other numerics: their op key differs (suffix only when set),
    so they are ranked among themselves and against cuBLASLt's fast-accumulation mode."""
    plain = Op("e4m3", "e4m3", "bf16", "bf16", "row", "col", "row")
    fast = Op("e4m3", "e4m3", "bf16", "bf16", "row", "col", "row", fast_accum=True)
    assert plain.key == "e4m3e4m3_bf16bf16_accf32_tnt" and fast.key == plain.key + "_fastacc"
    assert Op(**{**plain.__dict__, "bias": "row"}).key.endswith("_biasrow")
    assert Op(**{**fast.__dict__, "bias": "row"}).key.endswith("_biasrow_fastacc")
    for op in (plain, fast):
        assert Op.from_json(json.loads(json.dumps(op.to_json()))) == op
    assert fast.to_json()["fast_accum"] is True
    old_record = {k: v for k, v in plain.to_json().items() if k != "fast_accum"}   # records from before
    assert Op.from_json(old_record) == plain
    cfg = {"a": "e4m3", "b": "e4m3", "c": "bf16", "d": "bf16", "layout_a": "row", "layout_b": "col",
           "layout_c": "row", "accumulator": "f32", "epilogue": {"activation": "identity", "bias": "none"}}
    assert Op.from_config(cfg) == plain and Op.from_config({**cfg, "fp8_fast_accum": False}) == plain
    assert Op.from_config({**cfg, "fp8_fast_accum": True}) == fast
    ms = [meas("k_plain", 1.0, op=plain), meas("k_fast", 0.8, op=fast)]
    got = {k[0]: c.winner.name for k, c in choose_all(ms).items()}
    assert got == {plain.key: "k_plain", fast.key: "k_fast"}


def test_fp8_baseline_uses_fast_accum_like_the_op():
    """torch._scaled_mm's use_fast_accum follows the op (without torch: the choice and the provider text)."""
    from types import SimpleNamespace as NS

    from emitter.families.gemm.baselines import scaled_mm_provider, use_fast_accum
    from emitter.families.gemm.workload import op_config

    plain = Op("e4m3", "e4m3", "bf16", "bf16", "row", "col", "row")
    fast = Op("e4m3", "e4m3", "bf16", "bf16", "row", "col", "row", fast_accum=True)
    # what ProblemData carries: the op and the GemmConfig workload.op_config builds from it
    assert use_fast_accum(NS(op=fast, cfg=op_config(fast))) is True
    assert use_fast_accum(NS(op=plain, cfg=op_config(plain))) is False
    assert use_fast_accum(NS(op=plain, cfg=NS(fast_accum=True))) is True      # a GemmConfig that says so
    assert use_fast_accum(NS(op=NS(), cfg=NS())) is False                     # neither knows: full precision
    assert "use_fast_accum=True" in scaled_mm_provider(True, "2.11.0")
    assert "use_fast_accum=False" in scaled_mm_provider(False, "2.11.0")
    # the first comma-separated part names the call (used in "refused this problem" messages)
    assert scaled_mm_provider(True, "2.11.0").split(",")[0] == "torch._scaled_mm (cuBLASLt) use_fast_accum=True"


# ------------------------------------------------------------------------------------------ scheduler sweeps (fake backend)
def test_scheduler_options_are_swept_per_kernel_and_reach_the_tuning_table(manifest_dir, tmp_path):
    """`scheduler:` adds run-time option variants beside each kernel's compiled-in choices: swizzle for every
    sm90a kernel, a nondeterministic reduction only where there is a stream-K reduction, a promotion interval
    only on the fp8 full-accumulation kernels; each variant is its own measurement, and a winning variant's
    options go into tuning.json."""
    from emitter.profile.selection import tuning_table
    from emitter.kit.scheduler import SchedulerOptions as S

    from emitter.emit import emit

    # the tuned fp8 set promotes with emitter's overlap (one interval); one kernel with CUTLASS's mainloop too
    serial = tmp_path / "serial"
    spec = tmp_path / "serial.yaml"
    spec.write_text("arch: sm90a\ndtype: {a: e4m3, b: e4m3, c: bf16, d: bf16, accumulator: f32}\nlayout: tn\n"
                    "tile: 128x128x128\ncluster: 1x1x1\nschedule: {kernel: cooperative}\n")
    emit([spec], serial)
    cfg = _fake_config(manifest_dir, "scheduler: {swizzle: 4, reduction: [deterministic, nondeterministic], "
                                     "promotion_interval: [null, 8]}\n")
    cfg = cfg.replace(manifests=(str(manifest_dir), str(serial)))
    assert cfg.scheduler[0] == 0 and len(cfg.scheduler) == 5
    pl = plan(cfg, select=("split_k=none",))   # decode (swap_ab) fp8 kernels promote the CUTLASS way
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", isolate=False)
    got: dict[str, set[str]] = {}
    for m in outcome.measurements:
        if m.kind == "kernel" and m.problem.m == 1024:
            assert m.ok, (m.label, m.reason)
            got.setdefault(m.name, set()).add(m.options_label)
    streamk = [n for n in got if "_streamk_" in n]
    fp8_full = [n for n in got if n.startswith("gemm_sm90a_e4m3") and "fastacc" not in n]
    assert streamk and fp8_full and any("_promoovl_" not in n for n in fp8_full)
    for n, labels in got.items():
        want = {"", "swz4 det"}
        if n in streamk:
            want.add("swz4 nondet")
        if n in fp8_full and "_promoovl_" not in n:   # the overlapped promotion runs at its own interval only
            want.add("swz4 det promo8")
        assert labels == want, (n, labels)
    r = rep.build(outcome.measurements, outcome.envs, cfg)
    table = tuning_table(r.choices, r.figures, {}, 0.01)
    assert {e["options"] for e in table["entries"]} <= set(cfg.scheduler)
    assert all(e["scheduler"] == S.decode(e["options"]).label() for e in table["entries"])
    csv_text = rep.to_csv(r)
    assert "swz4 det promo8" in csv_text and "scheduler" in csv_text.splitlines()[0].split(",")


def test_scheduler_top_times_the_variants_on_the_fastest_kernels_only(manifest_dir, tmp_path):
    """`scheduler: {..., top: K}`: every kernel is timed at its compiled-in choices (each split-K count); the
    other variants only on the K kernels of each (op, problem) with the smallest median there, at that
    kernel's best split count. The variants then compete in the selection like any other measurement."""
    from emitter.families.gemm.config import GemmConfig
    from emitter.families.gemm.options import distinct, unsupported

    cfg = _fake_config(manifest_dir, "scheduler: {swizzle: [null, 2, 4], top: 2}\n")
    assert cfg.scheduler_top == 2 and len(cfg.scheduler) == 3
    assert ProfileConfig.from_json(json.loads(json.dumps(cfg.to_json()))).scheduler_top == 2
    pl = plan(cfg)
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", isolate=False)
    kernels = [m for m in outcome.measurements if m.kind == "kernel"]
    assert all(m.ok for m in kernels)
    groups: dict[tuple[str, str], list] = {}
    for m in kernels:
        groups.setdefault((m.op.key, m.problem.key), []).append(m)
    assert len(groups) == 6
    total = 0
    for key, ms in groups.items():
        base = [m for m in ms if m.options == 0]
        assert {m.name for m in base} == {m.name for m in ms}          # every kernel had its first pass
        best: dict[str, tuple[float, int]] = {}
        for m in base:
            if m.stats.median_ms < best.get(m.name, (float("inf"), 0))[0]:
                best[m.name] = (m.stats.median_ms, m.split_k)
        want = sorted(best, key=lambda n: (best[n][0], n))[:2]
        swept = [m for m in ms if m.options]
        assert {m.name for m in swept} <= set(want), key
        for m in swept:
            assert m.split_k == best[m.name][1]
        # every variant that is not the same launch as an earlier one (options.distinct)
        by_name = {i["entry"]["name"]: i["entry"] for i in pl.instances}
        p = ms[0].problem
        expect = set()
        for n in want:
            gc = GemmConfig.from_entry(by_name[n])
            expect |= {(n, o) for o in distinct(gc, p.m, p.n, [o for o in cfg.scheduler
                                                             if not unsupported(gc, o)])[1:]}
        assert {(m.name, m.options) for m in swept} == expect, key
        total += len(expect)
    assert total >= 12              # 1024^3: both other swizzles are their own launch on most kernels
    # the same sweep without `top` times every variant on every kernel
    full = run(cfg.replace(scheduler_top=0), pl, tmp_path / "full", [0], backend="fake", isolate=False)
    assert sum(m.kind == "kernel" for m in full.measurements) > len(kernels)


def test_a_sweep_times_each_launch_once(manifest_dir, tmp_path):
    """Variants that CUTLASS's persistent scheduler resolves alike (a swizzle the tile grid caps, a raster equal
    to what `heuristic` picks) are one launch: timed once, the first of them in sweep order; the stream-K
    scheduler is not modelled, so its kernels get every variant."""
    from emitter.families.gemm.config import GemmConfig
    from emitter.families.gemm.options import launch_key

    cfg = parse_config_text(f"manifests: [{manifest_dir}]\nproblems: [{{m: 128, n: 4096, k: 512}}]\n"
                            "timing: {iterations: 5, repeats: 1}\n"
                            "scheduler: {swizzle: [null, 4, 8], raster: [null, along_m, along_n]}\n", "p.yaml")
    pl = plan(cfg, select=("split_k=none",))
    outcome = run(cfg, pl, tmp_path, [0], backend="fake", isolate=False)
    by_name = {i["entry"]["name"]: GemmConfig.from_entry(i["entry"]) for i in pl.instances}
    timed: dict[str, list[int]] = {}
    for m in outcome.measurements:
        if m.kind == "kernel":
            timed.setdefault(m.name, []).append(m.options)
    streamk = [n for n in timed if not by_name[n].persistent]
    assert streamk and all(len(timed[n]) == 9 for n in streamk)
    persistent = [n for n in timed if by_name[n].persistent]
    assert persistent and all(timed[n][0] == 0 for n in persistent)
    for n in persistent:
        keys = [launch_key(by_name[n], 128, 4096, o) for o in timed[n]]
        assert len(keys) == len(set(keys)) and len(keys) < 9, (n, keys)


# ------------------------------------------------------------------------------------------ host check
class _HostArena:
    """Stands in for the device arena: 'pointers' index numpy storage arrays."""

    def __init__(self) -> None:
        self.bufs: dict[int, np.ndarray] = {}

    def put(self, arr: np.ndarray) -> int:
        ptr = 4096 * (len(self.bufs) + 1)
        self.bufs[ptr] = arr
        return ptr

    def to_host(self, ptr: int, dtype, count: int) -> np.ndarray:
        return self.bufs[ptr][:count].astype(dtype, copy=True)


@pytest.mark.parametrize("layout_a,layout_b,beta", [("row", "col", 0.0), ("col", "row", 0.5)])
def test_sampled_host_check_passes_right_and_catches_wrong(layout_a, layout_b, beta):
    from emitter.families.gemm.profile_check import check_host
    from emitter.families.gemm.workload import OperandSet, ProblemData, gemm_problem, layouts, op_config
    from emitter.kit.hostdata import decode, encode, poison_value

    op = Op("bf16", "bf16", "bf16", "bf16", layout_a, layout_b, "row")
    p = Problem(96, 300, 64)
    cfg = op_config(op)
    lay = layouts(cfg, gemm_problem(p, 1.0, beta))
    rng = np.random.default_rng(0)
    arena = _HostArena()
    A = encode(rng.uniform(-1, 1, lay.A.elements()), cfg.a)
    B = encode(rng.uniform(-1, 1, lay.B.elements()), cfg.b)
    C = encode(rng.uniform(-1, 1, lay.C.elements()), cfg.c)
    ref = np.matmul(decode(lay.A.gather(A), cfg.a), decode(lay.B.gather(B), cfg.b)) + beta * decode(lay.C.gather(C), cfg.c)
    D = np.full(lay.D.elements(), poison_value(cfg.d))
    lay.D.scatter(D, encode(ref, cfg.d))
    s = OperandSet(arena.put(A), arena.put(B), arena.put(C) if beta else 0, arena.put(D), 0)
    data = ProblemData(op, p, 1.0, beta, [s], cfg, lay, arena)
    good = check_host(data, cfg)
    assert good["passed"] and good["rel_err"] < 5e-3, good
    D[-1] = poison_value(cfg.d)                     # one element never written (the last one)
    bad = check_host(data, cfg)
    assert not bad["passed"] and bad["unwritten"] == 1
    lay.D.scatter(D, encode(ref * 1.1, cfg.d))     # 10% off everywhere
    wrong = check_host(data, cfg)
    assert not wrong["passed"] and "rel err" in wrong["reason"]



# ------------------------------------------------------------------------------------------ launch workspace
@pytest.mark.parametrize("resets_locks", [True, False])
def test_launches_skip_the_workspace_memset_only_where_a_launch_leaves_it_zeroed(resets_locks):
    """KernelLaunch._settle_workspaces on a simulated device: a kernel that sets its tile locks back to zero (emitter's
    sm90a stream-K scheduler) is timed without the per-launch memset; one that leaves them counted up keeps it, and
    its workspace is zeroed again before the first timed launch. A workspace too large to read back keeps it."""
    import numpy as np

    from emitter.families.gemm.workload import _WS_SCAN_LIMIT, KernelLaunch

    memory = {100: np.zeros(64, np.uint8), 200: np.zeros(64, np.uint8)}   # two sets' workspaces, as initialize() left them
    launched: list = []

    class Drv:
        @staticmethod
        def memcpy_dtoh(host, ptr):
            host[:] = memory[ptr][: host.size]

        @staticmethod
        def memset_d8(ptr, value, count):
            memory[ptr][:count] = value

    class Fn:
        @staticmethod
        def launch(grid, block, shared, stream, packed):
            ws = packed                       # the stand-in Params: the set's workspace pointer
            memory[ws][:8] += 3               # the tile locks count up while the kernel runs
            if resets_locks:
                memory[ws][:8] = 0            # ... and the last unit of each tile sets its lock back to zero
            launched.append(ws)

    class Stream:
        handle = 7

        def synchronize(self):
            pass

    kl = KernelLaunch.__new__(KernelLaunch)
    kl.drv, kl.fn, kl.stream, kl._handle, kl.info, kl.workspace_bytes = Drv, Fn, Stream(), 7, {}, 64
    kl.launches = [((1, 1, 1), (384, 1, 1), 100, 0), ((1, 1, 1), (384, 1, 1), 200, 0), ((1, 1, 1), (384, 1, 1), 0, 0)]
    kl.resets = [(100, 16), (200, 16), None]
    kl._settle_workspaces()
    assert launched == [100, 200]                                   # one trial launch per set that has a reset
    assert all(not memory[p][:16].any() for p in memory)            # each set as initialize() left it
    if resets_locks:
        assert kl.resets == [None, None, None]
        assert kl.info["workspace_reset"].startswith("none")
    else:
        assert kl.resets == [(100, 16), (200, 16), None]
        assert kl.info["workspace_reset"] == "memset before each launch"
    big = KernelLaunch.__new__(KernelLaunch)
    big.drv, big.fn, big.stream, big._handle, big.info = Drv, Fn, Stream(), 7, {}
    big.workspace_bytes = _WS_SCAN_LIMIT + 1
    big.launches, big.resets = [((1, 1, 1), (384, 1, 1), 100, 0)], [(100, _WS_SCAN_LIMIT + 1)]
    launched.clear()
    big._settle_workspaces()
    assert launched == [] and big.resets == [(100, _WS_SCAN_LIMIT + 1)]
    assert big.info["workspace_reset"] == "memset before each launch"

# ------------------------------------------------------------------------------------------ split-K sweep
def test_split_k_candidates_fill_the_gpu_and_stop_at_two_waves():
    from emitter.families.gemm.profile import split_k_candidates

    # decode: 32 output tiles of 128x128 on 132 SMs -> split up to 8 (256 units <= 2 waves)
    assert split_k_candidates((128, 128, 64), 16, 4096, 4096, 1, 132) == [1, 2, 3, 4, 6, 8]
    # a full wave of output tiles: no split
    assert split_k_candidates((128, 256, 64), 8192, 8192, 8192, 1, 132) == [1]
    # short K: each slice keeps at least 4 k-blocks of 64 -> K=1024 allows 4 slices
    assert split_k_candidates((128, 128, 64), 16, 4096, 1024, 1, 132) == [1, 2, 3, 4]
    # batch counts as tiles
    assert split_k_candidates((128, 128, 64), 128, 4096, 4096, 8, 132) == [1]


def test_split_k_variants_are_ranked_by_label_and_tuned_with_their_slices():
    from emitter.profile.selection import tuning_table

    q = Problem(16, 4096, 4096)
    a1 = meas("k", 0.030, problem=q, seed=1)
    a4 = meas("k", 0.012, problem=q, seed=2)
    a4.split_k = 4
    b = meas("other", 0.020, problem=q, seed=3)
    assert a4.label == "k@splitk4" and a1.label == "k"
    ch = choose([a1, a4, b])
    assert ch.winner is a4 and ch.ties == ("k@splitk4",)
    table = tuning_table({(OP.key, (16, 4096, 4096, 1)): ch}, {}, {}, 0.01)
    e = table["entries"][0]
    assert e["kernel"] == "k" and e["split_k"] == 4 and e["fastest"] == "k@splitk4"
    back = Measurement.from_json(a4.to_json())
    assert back.split_k == 4 and back.label == "k@splitk4"
