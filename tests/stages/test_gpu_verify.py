"""GPU verification (PyCUDA): emit + build + verify the example configs, and prove verify catches wrong kernels
by planting bugs in rendered instances (wrong leading dimension, swapped layout, dropped beta term, wrong
activation, off-by-one in a bound), rebuilding them and asserting each is FAILED.

Skipped cleanly without PyCUDA, a GPU, nvcc or the CUTLASS headers. On the device machine:
scripts/gpu_suite.sh (it sets EMITTER_GPU_DIR to share one emitted+built tree and EMITTER_GPU_REPORTS for
the JSON / JUnit reports).

On a Hopper GPU the sm80 (CUTLASS 2.x) instances are built for sm_90 (their sm_80 cubins cannot load
there); the .cu is unchanged.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from emitter.runtime.pycuda_backend import pycuda_available

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "gemm").glob("*.yaml"))
ARCH_2X = ("sm75", "sm80", "sm86", "sm89")

# Verify-only extras beside configs/gemm: batched, split-K (serial; stream-K on sm90a), column bias, clamp,
# sigmoid, nt layout, swap_ab with a row bias and batches, sm90a scheduler arguments (nondeterministic split-K
# reduction, raster, swizzle), an fp8 promotion interval, emitter's overlapped fp8 promotion - modes the
# example configs do not use.
EXTRA_SPEC = """\
kernels:
  - arch: sm80
    dtype: {a: f16, b: f16, c: f16, d: f16, accumulator: f32}
    layout: nt
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    batched: true
    epilogue: {activation: clamp}
  - arch: sm80
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    split_k: serial
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x128x64
    cluster: 1x1x1
    schedule: {kernel: cooperative, tile_scheduler: stream_k}
    batched: true
    split_k: serial
    epilogue: {activation: sigmoid, bias: column}
  # no C operand (void C): D = relu(alpha * A @ B + bias), split-K partials reduced before the late TMA stores
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x128x64
    cluster: 2x1x1
    schedule: {kernel: cooperative}
    split_k: serial
    epilogue: {activation: relu, bias: row, source: false}
  # swap_ab (the host shim swaps A and B): a per-row bias becomes the swapped kernel's per-column bias, and
  # batch strides and leading dimensions swap with the operands
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 64x16x64
    cluster: 2x1x1
    schedule: {kernel: pingpong}
    swap_ab: true
    batched: true
    epilogue: {activation: relu, bias: row}
  # tile scheduler arguments set by the host shim: split-K partials added as they arrive (nondeterministic),
  # tiles handed out along M in strips of 2
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x64x64
    cluster: 1x2x1
    schedule: {kernel: cooperative, reduction: nondeterministic}
    split_k: serial
    raster: along_m
    swizzle: 2
    epilogue: {bias: row}
  # fp8 full accumulation promoting into f32 every 8 wgmma k-steps instead of CUTLASS's 4 (mainloop argument)
  - arch: sm90a
    dtype: {a: e4m3, b: e4m3, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x128x128
    cluster: 1x2x1
    schedule: {kernel: cooperative, promotion_interval: 8}
  # fp8 full accumulation with emitter's overlapped promotion (its own mma(), templates/gemm/sm90a/
  # fp8_overlap.cu.j2), on the stream-K scheduler with serial split-K (partial k-ranges per work unit)
  - arch: sm90a
    dtype: {a: e4m3, b: e4m3, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 128x128x128
    cluster: 1x1x1
    schedule: {kernel: cooperative, promotion: overlap}
    split_k: serial
"""


def _skip_reason() -> str | None:
    if not pycuda_available():
        return "PyCUDA or a CUDA GPU is not available"
    try:
        from emitter.build.nvcc import find_nvcc
        from emitter.cutlass_path import find_cutlass

        find_nvcc()
        find_cutlass()
    except Exception as e:  # noqa: BLE001
        return f"cannot build here: {e}"
    if not CONFIGS:
        return "no configs/gemm/*.yaml"
    return None


_SKIP = _skip_reason()
if _SKIP:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=_SKIP)]


# ---------------------------------------------------------------------------------------------- planted bugs
# (kind, which base instance, [(exact text, replacement)], what the verifier should see)
def _is(entry, arch_2x: bool, activation: str, extra=lambda c: True):
    cfg = entry["config"]
    arch_ok = (cfg["arch"] in ARCH_2X) if arch_2x else cfg["arch"] == "sm90a"
    return (arch_ok and cfg["epilogue"]["activation"] == activation and cfg["layout_a"] == "row"
            and cfg["layout_c"] == "row" and not cfg.get("batched") and cfg.get("split_k", "none") == "none"
            and extra(cfg))


PLANTS = [
    ("wrong_ld", lambda e: _is(e, True, "identity"),
     [("long long const lda = p->lda ? p->lda : lda_min;", "long long const lda = lda_min;")]),
    ("swapped_layout", lambda e: _is(e, True, "identity"),
     [("using LayoutA = cutlass::layout::RowMajor;", "using LayoutA = cutlass::layout::ColumnMajor;")]),
    ("dropped_beta", lambda e: _is(e, True, "identity"),
     [("ElementCompute(p->alpha), ElementCompute(p->beta)", "ElementCompute(p->alpha), ElementCompute(0.0f)")]),
    ("wrong_activation", lambda e: _is(e, True, "relu"),
     [('#include "cutlass/epilogue/thread/linear_combination_relu.h"',
       '#include "cutlass/epilogue/thread/linear_combination_relu.h"\n#include "cutlass/epilogue/thread/linear_combination.h"'),
      ("cutlass::epilogue::thread::LinearCombinationRelu<", "cutlass::epilogue::thread::LinearCombination<")]),
    ("off_by_one_m", lambda e: _is(e, True, "identity"),
     [("cutlass::gemm::GemmCoord(km, kn, p->k)", "cutlass::gemm::GemmCoord(km - 1, kn, p->k)")]),
    ("sm90a_dropped_beta", lambda e: _is(e, False, "identity", lambda c: c["tile_scheduler"] == "persistent"),
     [("args.epilogue.thread.beta = ElementCompute(p->beta);", "args.epilogue.thread.beta = ElementCompute(0.0f);")]),
    ("sm90a_wrong_ld", lambda e: _is(e, False, "identity", lambda c: c["tile_scheduler"] == "persistent"),
     [("cute::get<0>(dA) = lda;", "cute::get<0>(dA) = K;")]),
    ("sm90a_off_by_one_m", lambda e: _is(e, False, "identity", lambda c: c["tile_scheduler"] == "persistent"),
     [("ProblemShape{p->m, p->n, p->k, p->batch_count}", "ProblemShape{p->m - 1, p->n, p->k, p->batch_count}")]),
    ("sm90a_wrong_activation", lambda e: _is(e, False, "relu"),
     [("cutlass::epilogue::thread::ReLu,", "cutlass::epilogue::thread::Identity,")]),
]


def plant_bugs(root: Path, real: list[dict]) -> list[dict]:
    """Copies of rendered instances with one bug each (renamed <name>_bug_<kind>); returns their entries."""
    planted = []
    for kind, pick, edits in PLANTS:
        base = next((e for e in real if pick(e)), None)
        if base is None:
            continue
        text = (root / base["source"]).read_text()
        for old, new in edits:
            assert old in text, f"planting {kind}: the rendered {base['name']}.cu no longer contains {old!r}"
            text = text.replace(old, new, 1)
        name = f"{base['name']}_bug_{kind}"
        text = text.replace(base["name"], name)
        (root / f"{name}.cu").write_text(text)
        planted.append({**base, "name": name, "source": f"{name}.cu", "planted": kind})
    return planted


# ---------------------------------------------------------------------------------------------- the suite
@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    from emitter.build import BuildOptions, build
    from emitter.emit import emit
    from emitter.manifest import load, write

    root = Path(os.environ.get("EMITTER_GPU_DIR") or tmp_path_factory.mktemp("gpu_verify"))
    if not (root / "manifest.json").is_file():
        extra = tmp_path_factory.mktemp("spec") / "verify_extra.yaml"
        extra.write_text(EXTRA_SPEC)
        emit([str(p) for p in CONFIGS] + [str(extra)], root)
    data = load(root)
    real = [e for e in data["instances"] if "planted" not in e]
    # no arch rewrite: 2.x instances build as the user's do (sm_80 SASS + compute_80 PTX in a fatbin), and on a
    # newer GPU the driver JIT-compiles their PTX (issue 26)
    planted = plant_bugs(root, real)
    data["instances"] = real + planted
    write(root, data)
    summary = build(root, options=BuildOptions())
    records = {r.name: r for r in summary.results}
    return root, real, planted, records


def _reports_dir() -> Path | None:
    d = os.environ.get("EMITTER_GPU_REPORTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return None


def _write_reports(run, stem: str) -> None:
    from emitter.verify.report import write_json, write_junit

    d = _reports_dir()
    if d:
        write_json(run, d / f"{stem}.json")
        write_junit(run, d / f"{stem}.xml")


def test_every_emitted_instance_builds(suite):
    root, real, planted, records = suite
    failed = {n: (r.error or "")[:2000] for n, r in records.items() if r.status == "failed"}
    assert not failed, f"instances failed to build: {json.dumps(failed, indent=1)}"


def test_verify_emitted_instances_on_gpu(suite):
    from rich.console import Console

    from emitter.verify.report import instance_status, print_report
    from emitter.verify.runner import VerifyOptions, verify

    root, real, planted, records = suite
    built = [e for e in real if e["name"] in records and records[e["name"]].status != "failed"]
    assert built, "nothing built"
    seed = int(os.environ.get("EMITTER_GPU_SEED", "0")) or None
    run = verify(root, built, None, VerifyOptions(backend="pycuda", seed=seed, launch_timeout_s=60))
    _write_reports(run, "verify_emitted")
    print_report(run, Console(width=200))
    # per arch and dtype: instance x problem counts
    table: dict[str, Counter] = defaultdict(Counter)
    for r in run.results:
        cfg = next(e for e in built if e["name"] == r["instance"])["config"]
        table[f"{cfg['arch']} {cfg['a']}->{cfg['d']}"][r["status"]] += 1
    print(f"\ndevice: {run.device}; seed {run.seed}")
    for key, c in sorted(table.items()):
        print(f"  {key:24s} cases: {sum(c.values()):3d}  passed {c['PASSED']:3d}  failed {c['FAILED']:3d}  "
              f"skipped {c['SKIPPED']:3d}")
    statuses = instance_status(run.results)
    failures = [f"{r['instance']} [{r['problem']}]: {r['reason']}" for r in run.results if r["status"] == "FAILED"]
    assert not failures, "\n".join(failures[:40])
    assert all(s == "PASSED" for s in statuses.values()), statuses


@pytest.mark.parametrize("scheduler", ["swizzle=4,raster=along_n", "swizzle=2,raster=along_m,reduction=nondeterministic",
                                       "promotion_interval=8"])
def test_run_time_scheduler_options_on_gpu(suite, scheduler):
    """emitter_gemm_problem.options on the real shims: every sm90a instance that has the choice is verified with
    it (the others are skipped as not having it, never failed); at least one ran each time."""
    from emitter.kit.scheduler import SchedulerOptions
    from emitter.verify.runner import VerifyOptions, verify

    root, real, planted, records = suite
    built = [e for e in real if e["arch"] == "sm90a" and e["name"] in records and records[e["name"]].status != "failed"]
    opts = SchedulerOptions.parse(scheduler).encode()
    run = verify(root, built, None, VerifyOptions(backend="pycuda", quick=True, launch_timeout_s=60, scheduler=opts))
    _write_reports(run, "verify_scheduler_" + scheduler.replace("=", "").replace(",", "_"))
    failures = [f"{r['instance']} [{r['problem']}]: {r['reason']}" for r in run.results if r["status"] == "FAILED"]
    passed = {r["instance"] for r in run.results if r["status"] == "PASSED"}
    print(f"\n--scheduler {scheduler}: {len(passed)} instances passed, "
          f"{sum(r['status'] == 'PASSED' for r in run.results)} cases")
    assert not failures, "\n".join(failures[:40])
    assert passed


def test_planted_bugs_are_caught(suite):
    from emitter.verify.report import instance_status
    from emitter.verify.runner import VerifyOptions, verify

    root, real, planted, records = suite
    assert len(planted) >= 5, f"only {len(planted)} bugs could be planted: {[p['planted'] for p in planted]}"
    not_built = {p["planted"]: (records[p["name"]].error or "")[:800] for p in planted
                 if records[p["name"]].status == "failed"}
    assert not not_built, f"planted variants must build (the bug is in the math, not the syntax): {not_built}"
    run = verify(root, planted, None, VerifyOptions(backend="pycuda", quick=True, launch_timeout_s=60))
    _write_reports(run, "verify_planted")
    statuses = instance_status(run.results)
    print(f"\nplanted bugs on {run.device}:")
    missed = []
    for p in planted:
        rows = [r for r in run.results if r["instance"] == p["name"]]
        failed = [r for r in rows if r["status"] == "FAILED"]
        first = failed[0]["reason"][:160] if failed else "-"
        print(f"  {p['planted']:24s} {statuses.get(p['name'])}: {len(failed)}/{len(rows)} problems FAILED; e.g. {first}")
        if statuses.get(p["name"]) != "FAILED":
            missed.append(p["planted"])
    assert not missed, f"verify did not catch: {missed}"


def test_split_kernels_leave_their_workspace_ready_for_the_next_launch(suite, tmp_path):
    """emitter's sm90a stream-K scheduler sets each tile lock back to zero (templates/common/sm90_stream_k.cu.j2), so
    the profiler in timing.workspace_reset: settled (the kernel alone) times them without re-zeroing the workspace
    before each launch (the default, library, times initialize()'s memset as the library pays it). On the GPU:
    every split-K / stream-K instance of the suite, on problems with several k-tiles per output tile and at several
    split counts, passes the profiler's check before and after its timed launches (hundreds of launches on the same workspace),
    and every sm90a one is found to leave its zeroed workspace zeroed (no memset kept)."""
    from emitter.profile.config import parse_config_text
    from emitter.profile.runner import plan, run

    root, real, planted, records = suite
    names = [e["name"] for e in real if ("streamk" in e["name"] or "splitk" in e["name"])
             and e["name"] in records and records[e["name"]].status != "failed"]
    assert any("sm90a" in n for n in names), names
    select = "".join(f"\n  - {json.dumps(n)}" for n in names)
    cfg = parse_config_text(f"manifests: [{json.dumps(str(root))}]\nselect:{select}\nproblems:\n"
                            "  - {m: 256, n: 512, k: 4096}\n  - {m: 384, n: 256, k: 8192}\n"
                            "timing: {warmup: 3, iterations: 50, repeats: 2, workspace_reset: settled}\n"
                            "baselines: []\n", "split.yaml")
    outcome = run(cfg, plan(cfg), tmp_path, [0], backend="pycuda", isolate=False)
    kernels = [m for m in outcome.measurements if m.kind == "kernel" and m.status != "not_applicable"]
    bad = [f"{m.name} {m.problem.key} split {m.split_k}: {m.status} {m.reason}" for m in kernels if not m.ok]
    assert not bad, "\n".join(bad)
    assert all(m.check["passed"] and m.check["after_timing"]["passed"] for m in kernels)
    sm90 = [m for m in kernels if "sm90a" in m.name and m.extra["launch"]["workspace_bytes"] > 0]
    assert any(m.split_k > 1 for m in sm90), "no sm90a split-K measurement: nothing was reduced across splits"
    kept = [f"{m.name} {m.problem.key} split {m.split_k}" for m in sm90
            if not m.extra["launch"].get("workspace_reset", "").startswith("none")]
    assert not kept, "re-zeroed before each launch:\n" + "\n".join(kept)
    print(f"\n{len(kernels)} split / stream-K measurements ok ({len(sm90)} sm90a with a workspace, none re-zeroed); "
          f"{sum(m.extra['workspace_reset_bytes'] > 0 for m in kernels)} kept a memset")
