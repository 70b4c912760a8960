"""The Python API: every stage as a call that returns the typed record the CLI prints.

    import emitter

    spec = {"arch": "sm80", "dtype": "f16", "layout": "tn", "tile": "128x128x32", "warp": "64x64x32", "stages": 4}
    emitted = emitter.emit_specs(spec, out="gen")          # EmitResult: .instances, .rejected, .manifest
    built = emitter.build_instances("gen", jobs=2)         # BuildSummary: .results (status, resources), .failed
    checked = emitter.verify_instances("gen", quick=True)  # VerifyRun: .results (PASSED/FAILED/SKIPPED), .failed
    timed = emitter.profile_instances("gen", problems=["4096x4096x4096"], out="results")  # Report: .choices
    lib = emitter.export_library("gen", name="mykernels", out="dist/mykernels")  # ExportResult: .kernels

The short names (emitter.emit, .build, .verify, .profile) are the stages' own modules and packages, so the
calls are named verb + object; a module shadowed by a function would break `import emitter.build.builder`.

Specs come as spec files (a path), YAML text (`emitter.YamlText(text)`), or Python data (a mapping or a
list, as a spec file would hold it); every form goes through the same validation, and an error names the
key path (`kernels[0].tile`) and a pseudo file name (`<dict>`, `<string>`). Bad input raises an
emitter.EmitterError subclass (SpecError for specs) whose `render()` is the CLI's message.

The CLI commands emit, list, build and library are thin layers over these calls; verify and profile
call the same stage functions their commands call (emitter.verify.runner.verify, emitter.profile.runner).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Union

from emitter.errors import SpecError
from emitter.spec.loader import Document, parse_text

__all__ = ["YamlText", "SpecInput", "load_specs", "resolve_specs", "emit_specs", "build_instances",
           "verify_instances", "profile_instances", "export_library", "init_project"]


class YamlText(str):
    """A spec given as YAML text rather than a file name: `emitter.emit_specs(YamlText(text), out=...)`.

    `name` is the pseudo file name errors and the manifest use (default `<string>`)."""

    name: str

    def __new__(cls, text: str, name: str = "<string>") -> "YamlText":
        obj = super().__new__(cls, text)
        obj.name = name
        return obj


SpecInput = Union[str, os.PathLike, YamlText, Mapping, list, Document]
Specs = Union[SpecInput, Sequence[SpecInput]]


def _plain(value: Any, file: str, path: tuple, count: list[int] | None = None) -> Any:
    """A copy of Python spec data as the YAML loader would produce it (lists, str keys), or a SpecError.

    Bounded as the YAML loader is (emitter.spec.loader: MAX_DEPTH levels, MAX_NODES values), which also
    turns a structure that contains itself into an error instead of a RecursionError."""
    from emitter.spec.loader import MAX_DEPTH, MAX_NODES, format_path

    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_NODES:
        raise SpecError(f"the spec holds more than {MAX_NODES:,} values", file=file, key_path=format_path(path),
                        fix="split it, or sweep with lists instead of spelling out every combination")
    if len(path) > MAX_DEPTH:
        raise SpecError(f"the spec nests deeper than {MAX_DEPTH} levels (does it contain itself?)", file=file,
                        key_path=format_path(path[:8]) + "...")
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SpecError("keys must be strings", file=file, key_path=format_path(path), value=k)
            out[k] = _plain(v, file, path + (k,), count)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, file, path + (i,), count) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise SpecError(f"a spec value must be a string, number, boolean, list or mapping, not {type(value).__name__}",
                    file=file, key_path=format_path(path), value=repr(value))


def _text_of(data: Any) -> str:
    """The Document's text for Python data: its repr, unless an int in it is too long for Python to print (the
    spec parsers then refuse that value with its key; repr would raise ValueError before they run)."""
    try:
        return repr(data)
    except ValueError:
        return "<Python data holding an integer too long to print>"


def _is_single(specs: Any) -> bool:
    """One spec input, or a sequence of them? A list of mappings is one spec file's list of specs."""
    if isinstance(specs, (str, os.PathLike, Mapping, Document)):
        return True
    if isinstance(specs, (list, tuple)):
        return bool(specs) and all(isinstance(s, Mapping) for s in specs)
    return False


def load_specs(specs: Specs) -> list[Document | Path]:
    """Spec inputs as what emit's loader reads: a Path for a file, a Document for text and Python data."""
    items = [specs] if _is_single(specs) else list(specs)
    if not items:
        raise SpecError("no spec given", file="<api>", fix="pass a spec file, YamlText(...) or a dict")
    out: list[Document | Path] = []
    counts: dict[str, int] = {}

    def pseudo(base: str) -> str:
        counts[base] = counts.get(base, 0) + 1
        return base if counts[base] == 1 else f"{base[:-1]} {counts[base]}>"

    for s in items:
        if isinstance(s, Document):
            out.append(s)
        elif isinstance(s, YamlText):
            from emitter.spec.loader import MAX_FILE_BYTES

            name = pseudo(s.name)
            if len(s) > MAX_FILE_BYTES:
                raise SpecError(f"the spec text is longer than {MAX_FILE_BYTES >> 20} MiB", file=name,
                                fix="a spec is a page or two: sweep with lists")
            out.append(parse_text(str(s), name))
        elif isinstance(s, (Mapping, list, tuple)):
            name = pseudo("<dict>")
            out.append(Document(file=name, data=_plain(s, name, ()), text=_text_of(s)))
        elif isinstance(s, (str, os.PathLike)):
            out.append(Path(s))
        else:
            raise SpecError(f"cannot read a spec from a {type(s).__name__}", file="<api>", value=repr(s),
                            fix="pass a path, emitter.YamlText(text), a dict or a list of dicts")
    return out


def resolve_specs(specs: Specs) -> tuple[list[Any], list[Any]]:
    """Expand and validate specs without writing anything: (instances, rejections).

    Each instance has `.name` and `.instance` (the resolved, frozen record); each rejection `.rule`, `.reason`."""
    from emitter.emit import resolve_specs as run_resolve

    resolved, rejected, _specs, _dups = run_resolve(load_specs(specs))
    return resolved, rejected


def emit_specs(specs: Specs, out: str | os.PathLike = "generated/demo", *, jobs: int | None = None,
               max_instances: int | None = None, keep_stale: bool = False):
    """Emit every instance of `specs` into `out` (one .cu each + manifest.json). Returns emitter.emit.EmitResult.

    max_instances: cap on the candidates the specs may sweep; keep_stale: keep .cu files of an earlier emit
    into `out` that the new manifest drops (listed in `.stale`)."""
    from emitter.emit import emit as run_emit

    return run_emit(load_specs(specs), Path(out), jobs=jobs, max_instances=max_instances, keep_stale=keep_stale)


def build_instances(out: str | os.PathLike = "generated/demo", *, select: Sequence[str] = (), exclude: Sequence[str] = (),
          jobs: int | None = None, cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
          timeout_s: float | None = None, allow_serialized_wgmma: bool = False, host_syntax_only: bool = False,
          executor: str = "thread", reporter: Any = None, address: str | None = None):
    """Compile the manifest's instances (nvcc, parallel, cached). Returns emitter.build.builder.BuildSummary.
    executor: "thread" (default), "process", or "ray" (nvcc runs as Ray tasks; address: "auto",
    "ray://host:port", None for a local Ray instance; `pip install 'emitter[ray]'`).

    A failing instance fails alone: see `.failed` (each with `.error` and `.repro`, the nvcc command).
    Each built record's resources gain `dynamic_shared_bytes`, from the shim's launch query
    (emitter/build/launch_probe.py; None with `dynamic_shared_reason` where it cannot be asked here)."""
    from emitter.build.builder import BuildOptions, build as run_build

    opts = BuildOptions(jobs=jobs, cache_dir=cache_dir, use_cache=use_cache, timeout_s=timeout_s,
                        allow_serialized_wgmma=allow_serialized_wgmma, host_syntax_only=host_syntax_only,
                        executor=executor, address=address)
    summary = run_build(Path(out), tuple(select), tuple(exclude), opts, reporter)
    _add_dynamic_shared(summary)
    return summary


def _add_dynamic_shared(summary: Any) -> None:
    """resources.dynamic_shared_bytes in each built record (on disk and in the summary), asked once."""
    import json

    from emitter.build.launch_probe import probe_in_child

    todo = [r for r in summary.results if r.status in ("ok", "cached") and (r.record.get("artifacts") or {}).get("host")
            and "dynamic_shared_bytes" not in (r.record.get("resources") or {})]
    if not todo:
        return
    from emitter.manifest import load, manifest_path

    root = manifest_path(Path(summary.out)).parent
    entries = {e["name"]: e for e in load(root)["instances"]}
    found = probe_in_child(root, [(entries[r.name], r.record) for r in todo if r.name in entries])
    for r in todo:
        got = found.get(r.name) or {"dynamic_shared_bytes": None, "reason": "the probe process failed"}
        res = r.record.setdefault("resources", {})
        res["dynamic_shared_bytes"] = got["dynamic_shared_bytes"]
        if got.get("reason"):
            res["dynamic_shared_reason"] = got["reason"]
        try:
            path = Path(r.record_path)
            on_disk = json.loads(path.read_text())
            on_disk.setdefault("resources", {}).update({k: v for k, v in res.items() if k.startswith("dynamic_")})
            from emitter.fsutil import atomic_write_json

            atomic_write_json(path, on_disk)
        except (OSError, ValueError):
            pass


def _parse_problem(p: Any) -> tuple[int, int, int, int]:
    if isinstance(p, str):
        parts = p.lower().split("x")
        if len(parts) in (3, 4) and all(x.strip().isdigit() for x in parts):
            v = [int(x) for x in parts]
            return v[0], v[1], v[2], v[3] if len(v) == 4 else 1
    elif isinstance(p, (tuple, list)) and len(p) in (3, 4) and all(isinstance(x, int) and not isinstance(x, bool)
                                                                    for x in p):
        return p[0], p[1], p[2], p[3] if len(p) == 4 else 1
    raise SpecError("a problem is 'MxNxK', 'MxNxKxBATCH' or a tuple (m, n, k[, batch])", file="<api>",
                    key_path="problems", value=repr(p))


def verify_instances(out: str | os.PathLike = "generated/demo", *, select: Sequence[str] = (), exclude: Sequence[str] = (),
           problems: Sequence[Any] | None = None, quick: bool = False, data: str = "both", alpha: float | None = None,
           beta: float | None = None, scheduler: str | None = None, seed: int | None = None, backend: str = "pycuda",
           backend_options: Mapping[str, Any] | None = None, isolation: bool = True, launch_timeout_s: float = 60.0,
           progress: Callable[[dict[str, Any]], None] | None = None, write_reports: bool = True):
    """Launch the built instances on their problems and check them against a reference.

    problems: None for each instance's default set, else 'MxNxK' strings / (m, n, k[, batch]) tuples /
    emitter.verify.problems.VerifyProblem. Returns emitter.verify.runner.VerifyRun (`.results`: one dict per
    case with status PASSED/FAILED/SKIPPED; `.failed`). write_reports: <out>/verify/results.json + junit.xml,
    as the CLI writes them. backend="fake" runs without a GPU (a numpy model of the kernels)."""
    from emitter.manifest import load, manifest_path
    from emitter.kit.scheduler import OptionsError, SchedulerOptions
    from emitter.selection import select as select_entries
    from emitter.verify.problems import VerifyProblem, problems_from_options
    from emitter.verify.runner import VerifyOptions, verify as run_verify

    manifest = load(Path(out))
    root = manifest_path(Path(out)).parent
    entries = select_entries(manifest["instances"], tuple(select), tuple(exclude))
    user: list[Any] = []
    for p in problems or ():
        if isinstance(p, VerifyProblem):
            user.append(p)
            continue
        m, n, k, b = _parse_problem(p)
        user += problems_from_options(str(m), str(n), str(k), str(b) if b > 1 else None, None,
                                      None if alpha is None else str(alpha), None if beta is None else str(beta), data)
    try:
        sched = SchedulerOptions.parse(scheduler or "").encode()
    except OptionsError as e:
        raise SpecError(f"scheduler: {e}", file="<api>", value=scheduler) from None
    run = run_verify(root, entries, user or None,
                     VerifyOptions(backend=backend, backend_options=dict(backend_options or {}), isolation=isolation,
                                   launch_timeout_s=launch_timeout_s, seed=seed, quick=quick, data=data,
                                   scheduler=sched),
                     progress=progress)
    if write_reports:
        from emitter.verify.report import write_json, write_junit

        write_json(run, root / "verify" / "results.json")
        write_junit(run, root / "verify" / "junit.xml")
    return run


def profile_instances(source: str | os.PathLike | Any, *, problems: Sequence[Any] | None = None,
            out: str | os.PathLike | None = None, select: Sequence[str] = (), exclude: Sequence[str] = (),
            backend: str = "pycuda", gpus: str | None = None, check: bool | None = None,
            baselines: Sequence[str] | None = None, quick: bool = False, plots: bool = False,
            backend_options: Mapping[str, Any] | None = None):
    """Time kernels against cuBLAS; returns emitter.profile.report.Report (`.choices`: the best kernel per
    problem, `.measurements`) and writes profile.csv / profile.json / tuning.json under `out` (when given).

    source: a profile config (a YAML path, or an emitter.profile.config.ProfileConfig), or a manifest
    directory (what `emit` wrote; then `problems` is required). problems: 'MxNxK' strings, (m, n, k) tuples,
    or 'square' / 'llm' (the named sets); they replace a config's own."""
    from emitter.profile import report as rep
    from emitter.profile.config import ProfileConfig, Timing, load_config, named_set, named_sets, problem_from_json
    from emitter.profile.runner import ProfileError, check_built, plan, resolve_gpus, run

    probs: list[Any] = []
    for p in problems or ():
        if isinstance(p, str) and p.strip().lower() in named_sets():
            probs += named_set(p.strip().lower())
        elif hasattr(p, "as_dict") and hasattr(p, "FAMILY"):     # a profile problem already (GEMM: m, n, k, batch)
            probs.append(p)
        else:
            probs.append(problem_from_json(dict(zip(("m", "n", "k", "batch"), _parse_problem(p)))))
    if isinstance(source, ProfileConfig):
        cfg = source
    elif Path(source).is_dir():
        if not probs:
            raise SpecError("profiling a manifest directory needs problems", file="<api>", key_path="problems",
                            fix="pass problems=['4096x4096x4096'] (or 'square' / 'llm'), or a profile config")
        cfg = ProfileConfig(file="<api>", manifests=(str(Path(source).resolve()),), problems=tuple(probs))
    else:
        cfg = load_config(source)
    if probs:
        cfg = cfg.replace(problems=tuple(dict.fromkeys(probs)))
    if check is not None:
        cfg = cfg.replace(check=check)
    if baselines is not None:
        cfg = cfg.replace(baselines=tuple(baselines))
    if quick:
        cfg = cfg.replace(timing=Timing(warmup=3, iterations=20, repeats=2, rotate=cfg.timing.rotate,
                                        blocking_kernel=cfg.timing.blocking_kernel,
                                        workspace_reset=cfg.timing.workspace_reset))
    out_dir = Path(out) if out is not None else Path(cfg.output.dir)
    the_plan = plan(cfg, tuple(select), tuple(exclude))
    if backend != "fake" and len(check_built(the_plan)) == len(the_plan.instances):
        raise ProfileError(f"none of the {len(the_plan.instances)} selected instances is built\n"
                           f"  fix: emitter.build_instances({str(Path(the_plan.manifests[0]).parent)!r}) first")
    extra = dict(backend_options or {})
    outcome = run(cfg, the_plan, out_dir, resolve_gpus(cfg, gpus, backend), backend=backend, **extra)
    if not outcome.measurements:
        raise ProfileError("nothing was measured" + (": " + "; ".join(outcome.fatal) if outcome.fatal else ""))
    report = rep.build(outcome.measurements, outcome.envs, cfg, run=outcome.run)
    if out is not None:
        rep.write_all(report, out_dir, plots=plots and cfg.output.plots)
    return report


def export_library(manifests: str | os.PathLike | Sequence[str | os.PathLike], name: str,
                   out: str | os.PathLike | None = None, *, tuning: Sequence[str | os.PathLike] = (),
                   select: Sequence[str] = (), exclude: Sequence[str] = (), archs: Sequence[str] = (),
                   vendor_cutlass: bool = False, force: bool = False, lib_version: str = "1.0.0",
                   allow_unmeasured_tuning: bool = False):
    """Export manifests' instances as a CMake kernel library (C API, shape dispatch, Python loader).

    Returns emitter.library.export.ExportResult (`.kernels`, `.tuning`, `.skipped`, `.written`)."""
    from emitter.library.export import export_library as run_export

    dirs = [manifests] if isinstance(manifests, (str, os.PathLike)) else list(manifests)
    return run_export([Path(d) for d in dirs], name, Path(out) if out is not None else Path("dist") / name,
                      tuning=[Path(t) for t in tuning], select=select, exclude=exclude, archs=archs,
                      vendor_cutlass=vendor_cutlass, force=force, lib_version=lib_version,
                      allow_unmeasured_tuning=allow_unmeasured_tuning)


def init_project(directory: str | os.PathLike = ".", *, gpu: str = "auto"):
    """Write a starter project into `directory` (specs for the GPU, a profile config, a README of next steps).

    gpu: sm80, sm90a, or auto (nvidia-smi's compute capability; sm80 when no GPU is found). Refuses to
    overwrite any existing file (nothing is written then). Returns emitter.starter.StarterResult."""
    from emitter.starter import write_starter

    return write_starter(Path(directory), gpu)

