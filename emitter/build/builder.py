"""Build a manifest's instances: plan (cache keys), reuse what is cached, compile the rest in parallel.

Per instance two nvcc runs, scheduled independently so they overlap: the device entry to a cubin
(-DEMITTER_DEVICE -cubin, with the ptxas resource report) and the host shim to a shared library.
An instance is then, in order of cost:
  up to date  build/<name>/record.json already names this cache key and its artifacts are in place;
  cached      the cache holds the key (its files verified by sha256): artifacts are copied into build/<name>/
              (copies, not hard links: a later change to one cannot reach the other);
  compiled    nvcc runs under a per-key lock (a concurrent build of the same key waits, then hits), the
              result enters the cache atomically, then is installed like a cached one.
Installing removes the old record first and writes the new one last, so a build killed in between
leaves no record that vouches for mismatched artifacts; the record holds each artifact's sha256, and "up
to date" checks it. Failures are results: they are recorded and the build goes on.

Nothing in a manifest is trusted (emitter.manifest.validate: names are C identifiers, sources relative
paths), and before anything is read or written every source, build/ and build/<name>/ is checked to
resolve inside the manifest's directory (emitter.fsutil.resolve_inside): a symlink that leads out is
refused with PathEscape, so a build never reads, writes or deletes outside that directory and the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from emitter import manifest as manifest_mod
from emitter.build import ptxas
from emitter.build.cache import CACHE_FORMAT, Cache, KeyLock, cache_root, make_tmp, prune_tmp, sha256_file
from emitter.build.executor import NvccResult, NvccTask, make_executor, run_nvcc, terminate_running
from emitter.build.nvcc import (Commands, commands, device_image_kind, find_nvcc, host_compiler_version, memory_per_job,
                                nvcc_version)
from emitter.build.resources import default_jobs, mem_available, memory_budget
from emitter.cutlass_path import find_cutlass, headers_digest
from emitter.errors import EmitterError
from emitter.fsutil import PathEscape, atomic_write_json, atomic_write_text, resolve_inside
from emitter.selection import select as select_entries

RECORD_SCHEMA_VERSION = 1
RECORD_NAME = "record.json"
LOG_NAME = "build.log"
KINDS = ("cubin", "host")          # artifact kinds; the device run makes the cubin, the host run the .so
_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
_POLL_S = 0.25


@dataclass
class BuildOptions:
    jobs: int | None = None                  # None: sized to cores and memory
    cache_dir: str | os.PathLike[str] | None = None
    use_cache: bool = True                   # False: compile everything, touch no cache
    allow_serialized_wgmma: bool = False
    executor: str = "thread"                 # thread | process (see executor.py) | ray (see ray_executor.py)
    address: str | None = None               # executor ray: "auto", "ray://host:port"; None: a local Ray instance
    timeout_s: float | None = None           # per nvcc run
    extra_flags: tuple[str, ...] = ()
    host_syntax_only: bool = False           # see nvcc.commands


@dataclass
class InstanceResult:
    name: str
    arch: str
    source: Path                             # the .cu, absolute
    status: str                              # ok | cached | failed
    wall_s: float
    record: dict[str, Any]
    record_path: Path
    repro: list[str] = field(default_factory=list)   # shell lines reproducing a failure

    @property
    def error(self) -> str | None:
        return self.record.get("error")

    @property
    def warnings(self) -> list[str]:
        return self.record.get("warnings") or []


@dataclass
class BuildSummary:
    out: Path
    results: list[InstanceResult]
    jobs: int
    wall_s: float
    cache: Path | None
    skipped: int = 0                          # instances not selected

    @property
    def failed(self) -> list[InstanceResult]:
        return [r for r in self.results if r.status == "failed"]

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def ok(self) -> bool:
        return not self.failed


class Reporter:
    """Progress callbacks (the CLI supplies a rich or a plain one)."""

    def start(self, total: int, jobs: int, to_compile: int) -> None: ...
    def started(self, name: str) -> None: ...
    def done(self, result: InstanceResult) -> None: ...
    def note(self, message: str) -> None: ...


# --------------------------------------------------------------------------------------------- plan
@dataclass
class _Plan:
    entry: dict[str, Any]
    root: Path
    name: str
    arch: str
    src_rel: str
    cmds: Commands
    key: str
    source_error: str | None = None
    # run state
    lock: KeyLock | None = None
    work: Path | None = None
    started_at: float = 0.0
    results: dict[str, NvccResult] = field(default_factory=dict)
    pending_kinds: list[str] = field(default_factory=list)
    running: int = 0
    failed_early: bool = False

    @property
    def src(self) -> Path:
        return self.root / self.src_rel

    @property
    def build_dir(self) -> Path:
        return self.root / "build" / self.name

    def rel_artifact(self, kind: str) -> str:
        if kind == "cubin":   # the device image: a .fatbin (SASS + PTX) or .cubin, nvcc.device_image_kind
            return f"build/{self.name}/{self.name}.{device_image_kind(self.arch) if self.cmds.device else 'cubin'}"
        return f"build/{self.name}/lib{self.name}.so"

    def record_commands(self) -> list[list[str]]:
        return [Commands.fill(self.cmds.device, self.src_rel, self.rel_artifact("cubin")),
                Commands.fill(self.cmds.host, self.src_rel, self.rel_artifact("host"))]

    def work_file(self, kind: str) -> Path:
        assert self.work is not None
        return self.work / ("device.cubin" if kind == "cubin" else "host.so")

    def task(self, kind: str, timeout_s: float | None) -> NvccTask:
        template = self.cmds.device if kind == "cubin" else self.cmds.host
        argv = Commands.fill(template, self.src_rel, str(self.work_file(kind)))
        assert self.work is not None
        return NvccTask(tuple(argv), str(self.root), str(self.work / f"tmp-{kind}"), timeout_s)

    def memory(self, kind: str) -> int:
        # the host pass of an instance peaks at about a third of its device pass (1.3 vs 3.3 GB, sm90a)
        need = memory_per_job(self.arch)
        return need if kind == "cubin" else need // 2


@dataclass
class _Toolchain:
    nvcc: str
    nvcc_version: str
    host_cxx: str
    include_flags: list[str]
    cutlass_origin: str
    cutlass_digest: str
    extra_flags: tuple[str, ...]
    host_syntax_only: bool = False

    def key_base(self) -> str:
        env = {k: os.environ.get(k, "") for k in _ENV_FLAGS}
        return json.dumps({"format": CACHE_FORMAT, "nvcc": self.nvcc_version, "host_cxx": self.host_cxx,
                           "cutlass": self.cutlass_digest, "env": env}, sort_keys=True)


def toolchain(extra_flags: tuple[str, ...] = (), host_syntax_only: bool = False) -> _Toolchain:
    nvcc = find_nvcc()
    headers = find_cutlass()
    return _Toolchain(nvcc, nvcc_version(nvcc), host_compiler_version(nvcc), headers.include_flags(),
                      headers.origin, headers_digest(headers), tuple(extra_flags), host_syntax_only)


# templates/common/banner.j2: "// generated by emitter <version> from <spec path>, spec hash <sha> — ...", a comment
_PROVENANCE = re.compile(rb"^// generated by emitter [^\n]*\n", re.MULTILINE)


def cache_key(source: bytes, arch: str, tc: _Toolchain) -> str:
    """sha256 over the rendered source, nvcc version, host compiler, CUTLASS headers, flags and arch.

    Paths are left out (commands with placeholders for the compiler, include dirs, source and output, and the
    banner's provenance line, which names the spec file as it was given: an absolute path differs between
    checkouts), so the same instance emitted into another directory, or built from another checkout, is a hit."""
    source = _PROVENANCE.sub(b"", source, count=1)
    shape = commands("nvcc", arch, ["-I{cutlass}/include", "-I{cutlass}/tools/util/include"], tc.extra_flags,
                     tc.host_syntax_only)
    h = hashlib.sha256()
    for part in (tc.key_base(), arch, json.dumps([shape.device, shape.host]), hashlib.sha256(source).hexdigest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def family_include_flags(entry: dict[str, Any]) -> list[str]:
    """-I flags a family adds for its instances: the family package's optional `include_dirs(arch)` (attention sm80:
    an empty <curand_kernel.h> stand-in). GEMM has none, so its commands and cache keys are unchanged."""
    from emitter.families.registry import entry_family, family_module

    try:
        hook = getattr(family_module(entry_family(entry), need=()), "include_dirs", None)
    except (EmitterError, ImportError):
        return []
    return [f"-I{d}" for d in hook(entry.get("arch", ""))] if hook is not None else []


def plan(root: Path, entries: Iterable[dict[str, Any]], tc: _Toolchain) -> list[_Plan]:
    plans = []
    for e in entries:
        name, arch, src_rel = e["name"], e["arch"], e["source"]
        key, err = "", None
        try:
            cmds = commands(tc.nvcc, arch, tc.include_flags + family_include_flags(e), tc.extra_flags,
                            tc.host_syntax_only)
        except EmitterError as ex:       # an arch this emitter cannot build: that instance fails alone
            cmds, err = Commands((), ()), ex.render()
        if err is None:
            try:
                key = cache_key((root / src_rel).read_bytes(), arch, tc)
            except OSError as ex:
                err = f"cannot read the source {root / src_rel}: {ex.strerror}; re-run `emitter emit`"
        plans.append(_Plan(e, root, name, arch, src_rel, cmds, key, err))
    return plans


# ---------------------------------------------------------------------------------------- records
def _record(p: _Plan, status: str, wall_s: float, *, warnings: list[str], resources: dict[str, int] | None,
            error: str | None, installed: bool, extra: dict[str, Any]) -> dict[str, Any]:
    rec = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "name": p.name,
        "status": status,
        "wall_s": round(wall_s, 3),
        "commands": p.record_commands(),
        "warnings": warnings,
        "resources": resources or {"registers": 0, "shared_bytes": 0, "spill_bytes": 0, "stack_bytes": 0},
        "artifacts": {k: (p.rel_artifact(k) if installed else None) for k in KINDS},
        "error": error,
        "cache_key": p.key,
        "arch": p.arch,
        "source": p.src_rel,
        "cwd": ".",                                  # commands run from the manifest directory
        "log": f"build/{p.name}/{LOG_NAME}",
    }
    rec.update(extra)
    return rec


def read_record(root: Path, name: str) -> dict[str, Any] | None:
    try:
        path = root / "build" / name / RECORD_NAME
        if not path.is_file() or path.stat().st_size > (16 << 20):
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _combined_log(logs: dict[str, str]) -> str:
    parts = []
    for kind in KINDS:
        if kind in logs:
            parts.append(f"==== nvcc ({'device cubin' if kind == 'cubin' else 'host shim'}) ====\n{logs[kind].rstrip()}\n")
    return "\n".join(parts)


def _analyse(p: _Plan, device_log: str, allow_serialized: bool
             ) -> tuple[list[str], dict[str, int], str | None, bool]:
    """(warnings, resources, error, serialized) from the device compile's ptxas report."""
    rep = ptxas.parse(device_log)
    warnings = list(rep.warnings)
    for f in rep.spilling:
        warnings.append(f"spills: {f.name} stores {f.spill_stores} bytes and loads {f.spill_loads} bytes "
                        f"to local memory (registers {f.registers})")
    error = None
    if rep.serialized_wgmma and not allow_serialized:
        error = (f"ptxas: wgmma.mma_async instructions are serialized (C7510): the kernel would run far below "
                 f"its speed.\n  {rep.serialized_wgmma[0]}\n  fix: build with -DNDEBUG and without device "
                 f"asserts/extern calls in the mainloop, pick a tile that fits the registers, or pass "
                 f"--allow-serialized-wgmma to keep it anyway")
    return warnings, rep.resources(f"emitter_{p.name}_kernel"), error, bool(rep.serialized_wgmma)


def _first_error_lines(log: str, limit: int = 20) -> str:
    lines = [l for l in log.splitlines() if l.strip()]
    picked = [l for l in lines if "error" in l.lower()]
    return "\n".join((picked or lines[-limit:])[:limit])


def _copy_in(src: Path, dst_dir: Path, final: Path) -> None:
    """Copy a cache file into the build directory (atomically; no temporary left behind on any failure).

    A copy, not a hard link: with links, corrupting the build's file corrupted the cache entry too, and
    renaming a link over another link of the same file leaves the temporary name in place (POSIX rename)."""
    tmp = dst_dir / f".{final.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _final_path(p: _Plan, kind: str) -> Path:
    return p.root / p.rel_artifact(kind)


def _remove_record(p: _Plan) -> None:
    try:
        (p.build_dir / RECORD_NAME).unlink()
    except FileNotFoundError:
        pass


def _install(p: _Plan, files: dict[str, Path], record: dict[str, Any], log: str) -> None:
    """Record out, artifacts in (each by an atomic rename), log, record in."""
    p.build_dir.mkdir(parents=True, exist_ok=True)
    _remove_record(p)
    for kind, src in files.items():
        _copy_in(src, p.build_dir, _final_path(p, kind))
    record["artifact_bytes"] = {k: _final_path(p, k).stat().st_size for k in files}
    record["artifact_sha256"] = {k: sha256_file(_final_path(p, k)) for k in files}
    atomic_write_text(p.build_dir / LOG_NAME, log)
    atomic_write_json(p.build_dir / RECORD_NAME, record)


def _install_failure(p: _Plan, record: dict[str, Any], log: str) -> None:
    p.build_dir.mkdir(parents=True, exist_ok=True)
    _remove_record(p)
    for kind in KINDS:                       # stale artifacts must not outlive a failed rebuild
        try:
            _final_path(p, kind).unlink()
        except FileNotFoundError:
            pass
    atomic_write_text(p.build_dir / LOG_NAME, log)
    atomic_write_json(p.build_dir / RECORD_NAME, record)


def _up_to_date(p: _Plan, allow_serialized: bool) -> dict[str, Any] | None:
    rec = read_record(p.root, p.name)
    if not rec or rec.get("cache_key") != p.key or rec.get("status") not in ("ok", "cached"):
        return None
    if rec.get("serialized_wgmma") and not allow_serialized:
        return None
    sizes = rec.get("artifact_bytes") or {}
    hashes = rec.get("artifact_sha256")
    if not isinstance(sizes, dict) or not isinstance(hashes, dict):
        return None                         # an older record, or edited: reinstall from the cache
    for kind in KINDS:
        try:
            path = _final_path(p, kind)
            if path.is_symlink() or path.stat().st_size != sizes.get(kind) or sha256_file(path) != hashes.get(kind):
                return None                 # a changed artifact (even of the same size) is not up to date
        except OSError:
            return None
    return rec


# ------------------------------------------------------------------------------------------- build
class _Run:
    def __init__(self, root: Path, plans: list[_Plan], opts: BuildOptions, reporter: Reporter, jobs: int,
                 budget: int | None, cache: Cache | None):
        self.root, self.plans, self.opts, self.rep = root, plans, opts, reporter
        self.jobs, self.budget, self.cache = jobs, budget, cache
        self.results: dict[str, InstanceResult] = {}
        self.running: dict[Future, tuple[_Plan, str]] = {}
        self.mem_in_use = 0
        self.scratch = root / "build" / ".tmp"
        self.reporting = False        # results found before the reporter starts are reported at its start

    # -- results ---------------------------------------------------------------------------------
    def _finish(self, p: _Plan, rec: dict[str, Any], wall: float) -> None:
        repro = []
        if rec["status"] == "failed":
            cmds = rec["commands"]
            failed_kinds = [k for k in KINDS if k in p.results and p.results[k].returncode != 0] or ["cubin"]
            for k in failed_kinds:
                repro.append(f"cd {shlex.quote(str(p.root))} && {shlex.join(cmds[KINDS.index(k)])}")
        res = InstanceResult(p.name, p.arch, p.src, rec["status"], wall, rec, p.build_dir / RECORD_NAME, repro)
        self.results[p.name] = res
        if self.reporting:
            self.rep.done(res)

    def _fail_without_compile(self, p: _Plan, error: str) -> None:
        rec = _record(p, "failed", 0.0, warnings=[], resources=None, error=error, installed=False, extra={})
        try:
            _install_failure(p, rec, error + "\n")
        except OSError:
            pass
        self._finish(p, rec, 0.0)

    def _from_entry(self, p: _Plan, files: dict[str, Path], meta: dict[str, Any], status: str, t0: float) -> None:
        logs = meta.get("logs") or {}
        warnings, resources, error, serialized = _analyse(p, logs.get("cubin", ""), self.opts.allow_serialized_wgmma)
        extra = {"compile_wall_s": meta.get("compile_wall_s"), "nvcc_version": meta.get("nvcc_version"),
                 "cutlass": meta.get("cutlass"), "serialized_wgmma": serialized}
        log = _combined_log(logs)
        if not error:
            rec = _record(p, status, time.perf_counter() - t0, warnings=warnings, resources=resources, error=None,
                          installed=True, extra=extra)
            try:
                _install(p, files, rec, log)
            except OSError as e:
                error = f"could not install the artifacts into {p.build_dir}: {e}"
        if error:
            rec = _record(p, "failed", time.perf_counter() - t0, warnings=warnings, resources=resources,
                          error=error, installed=False, extra=extra)
            _install_failure(p, rec, log)
        self._finish(p, rec, time.perf_counter() - t0)

    def _try_cached(self, p: _Plan) -> bool:
        if self.cache is None:
            return False
        t0 = time.perf_counter()
        entry = self.cache.lookup(p.key)
        if entry is None:
            return False
        self._from_entry(p, {k: entry.file(k) for k in KINDS}, entry.meta, "cached", t0)
        return True

    # -- compiling -------------------------------------------------------------------------------
    def _start(self, p: _Plan) -> bool:
        """Take the key's lock and queue both compiles; False if another build holds the key."""
        if self.cache is not None:
            lock = self.cache.lock(p.key)
            if not lock.try_acquire():
                return False
            p.lock = lock
            if self._try_cached(p):                 # the other builder finished it meanwhile
                self._release(p)
                return True
            p.work = self.cache.new_work_dir()
        else:
            p.work = make_tmp(self.scratch)
        p.started_at = time.perf_counter()
        p.pending_kinds = list(KINDS)
        self.rep.started(p.name)
        return True

    def _release(self, p: _Plan) -> None:
        if p.lock is not None:
            p.lock.release()
            p.lock = None
        if p.work is not None:
            shutil.rmtree(p.work, ignore_errors=True)
            p.work = None

    def _complete(self, p: _Plan) -> None:
        wall = time.perf_counter() - p.started_at
        logs = {k: r.output for k, r in p.results.items()}
        failed = [k for k in KINDS if k not in p.results or p.results[k].returncode != 0]
        try:
            if failed:
                first = next(k for k in KINDS if k in p.results and p.results[k].returncode != 0)
                r = p.results[first]
                what = "device cubin" if first == "cubin" else "host shim"
                error = (f"nvcc ({what}) exited with {r.returncode}:\n{_first_error_lines(r.output)}")
                rep = ptxas.parse(logs.get("cubin", ""))
                rec = _record(p, "failed", wall, warnings=rep.warnings, resources=None, error=error,
                              installed=False, extra={"compile_wall_s": {k: round(v.wall_s, 3) for k, v in p.results.items()}})
                _install_failure(p, rec, _combined_log(logs))
                self._finish(p, rec, wall)
                return
            meta = {"name": p.name, "arch": p.arch, "logs": logs,
                    "compile_wall_s": {k: round(v.wall_s, 3) for k, v in p.results.items()},
                    "nvcc_version": self._tc_version, "cutlass": self._tc_cutlass}
            files = {k: p.work_file(k) for k in KINDS}
            missing = [str(f) for f in files.values() if not f.is_file()]
            try:
                if missing:
                    raise OSError(f"nvcc succeeded but wrote no {', '.join(missing)}")
                if self.cache is not None:
                    entry = self.cache.commit(p.key, p.work, files, meta)
                    files = {k: entry.file(k) for k in KINDS}
            except OSError as e:     # a full disk, say: this instance fails, the build goes on
                rec = _record(p, "failed", wall, warnings=[], resources=None, error=f"emitter: {e}",
                              installed=False, extra={"compile_wall_s": meta["compile_wall_s"]})
                _install_failure(p, rec, _combined_log(logs))
                self._finish(p, rec, wall)
                return
            self._from_entry(p, files, meta, "ok", p.started_at)
        finally:
            self._release(p)

    def _fits(self, need: int) -> bool:
        if len(self.running) >= self.jobs:
            return False
        if self.budget is None or not self.running:
            return True
        return self.mem_in_use + need <= self.budget

    def run(self, executor, tc: _Toolchain) -> list[InstanceResult]:
        m = re.search(r"release [\d.]+, (V[\d.]+)", tc.nvcc_version)
        self._tc_version = m.group(1) if m else (tc.nvcc_version.splitlines() or [""])[-1]
        self._tc_cutlass = tc.cutlass_origin
        queue: deque[_Plan] = deque()
        for p in self.plans:
            if p.source_error:
                self._fail_without_compile(p, p.source_error)
            elif not self.opts.use_cache:
                queue.append(p)
            elif (rec := _up_to_date(p, self.opts.allow_serialized_wgmma)) is not None:
                t0 = time.perf_counter()
                if rec["status"] != "cached":
                    rec = dict(rec, status="cached", wall_s=0.0)
                    atomic_write_json(p.build_dir / RECORD_NAME, rec)
                self._finish(p, rec, time.perf_counter() - t0)
            elif not self._try_cached(p):
                queue.append(p)
        self.rep.start(len(self.plans), self.jobs, len(queue))
        self.reporting = True
        for res in list(self.results.values()):
            self.rep.done(res)
        active: list[_Plan] = []          # locked, with compiles queued or running
        waiting: list[_Plan] = []         # another build holds their key
        next_wait_check = 0.0
        while queue or active or waiting:
            # 1. launch queued compiles of started instances, then start new instances
            progressed = True
            while progressed:
                progressed = False
                for p in active:
                    while p.pending_kinds and not p.failed_early and self._fits(p.memory(p.pending_kinds[0])):
                        kind = p.pending_kinds.pop(0)
                        fut = executor.submit(run_nvcc, p.task(kind, self.opts.timeout_s))
                        self.running[fut] = (p, kind)
                        self.mem_in_use += p.memory(kind)
                        p.running += 1
                        progressed = True
                if queue and self._fits(queue[0].memory("cubin")) and not any(p.pending_kinds for p in active):
                    p = queue.popleft()
                    if self._start(p):
                        if p.pending_kinds:
                            active.append(p)
                    else:
                        waiting.append(p)
                    progressed = True
            # 2. instances another build is compiling: hit when it lands, or take over if it gave up
            if waiting and time.monotonic() >= next_wait_check:
                next_wait_check = time.monotonic() + 1.0
                for p in list(waiting):
                    if self._try_cached(p):
                        waiting.remove(p)
                    elif self._fits(p.memory("cubin")) and self._start(p):
                        waiting.remove(p)
                        if p.pending_kinds:
                            active.append(p)
            if not self.running:
                if waiting and not queue and not any(p.pending_kinds for p in active):
                    time.sleep(_POLL_S)
                continue
            done, _ = wait(list(self.running), timeout=_POLL_S if waiting else None, return_when=FIRST_COMPLETED)
            for fut in done:
                p, kind = self.running.pop(fut)
                self.mem_in_use -= p.memory(kind)
                p.running -= 1
                try:
                    p.results[kind] = fut.result()
                except Exception as ex:       # the executor itself failed (e.g. a worker died)
                    p.results[kind] = NvccResult(-1, f"emitter: the executor failed to run nvcc: {ex!r}", 0.0)
                if p.results[kind].returncode != 0:
                    p.failed_early = True     # its other compile is not worth starting
                if p.running == 0 and (not p.pending_kinds or p.failed_early):
                    active.remove(p)
                    self._complete(p)
        return list(self.results.values())

    def abort(self) -> None:
        terminate_running()
        for p in self.plans:
            self._release(p)


def check_contained(root: Path, entries: Iterable[dict[str, Any]]) -> None:
    """Every path the build will read or write for `entries` resolves inside `root`; else PathEscape (exit 2).

    Sources must be regular files inside; build/ and build/<name>/ (and what is already in it) must not be
    symlinks that lead out. Names and sources were already checked by manifest.validate."""
    for d in [root / "build", root / "build" / ".tmp"]:
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            raise PathEscape(f"{root}: {d.relative_to(root)} is a symlink or not a directory; the build writes there, "
                             f"so it is refused (remove it)")
    for e in entries:
        name = e["name"]
        src = resolve_inside(root, e["source"], f"instance {name}'s source")
        if src.exists() and not src.is_file():
            raise PathEscape(f"{root}: instance {name}'s source {e['source']!r} is not a regular file; refused")
        bdir = root / "build" / name
        if bdir.is_symlink() or (bdir.exists() and not bdir.is_dir()):
            raise PathEscape(f"{root}: build/{name} is a symlink or not a directory; refused (remove it)")
        if bdir.is_dir():
            for child in bdir.iterdir():
                if child.is_symlink():
                    raise PathEscape(f"{root}: build/{name}/{child.name} is a symlink; the build replaces its files, "
                                     f"so it is refused (remove it)")


def build(out: str | os.PathLike[str], select: Iterable[str] = (), exclude: Iterable[str] = (),
          options: BuildOptions | None = None, reporter: Reporter | None = None) -> BuildSummary:
    """Build the selected instances of `<out>/manifest.json`; never raises for a failing instance."""
    opts = options or BuildOptions()
    rep = reporter or Reporter()
    t0 = time.perf_counter()
    mpath = manifest_mod.manifest_path(out)
    data = manifest_mod.load(mpath)
    root = mpath.parent.resolve()
    entries = select_entries(data["instances"], tuple(select), tuple(exclude))
    check_contained(root, entries)
    tc = toolchain(opts.extra_flags, opts.host_syntax_only)
    plans = plan(root, entries, tc)
    plans.sort(key=lambda p: -memory_per_job(p.arch))   # the long sm90a compiles first: better packing
    archs = {p.arch for p in plans}
    if opts.jobs:
        jobs, budget = opts.jobs, None
        safe = default_jobs(archs)
        if jobs > safe and opts.executor != "ray":
            rep.note(f"-j {jobs} is above what memory holds ({safe} nvcc at ~"
                     f"{max(memory_per_job(a) for a in archs or {'sm80'}) >> 30} GB each); nvcc may swap")
    else:
        jobs = default_jobs(archs)
        budget = memory_budget(mem_available())
    cache = None
    if opts.use_cache:
        cache = Cache(cache_root(opts.cache_dir))
        cache.ensure_writable()
        cache.prune()
    prune_tmp(root / "build" / ".tmp")
    if opts.executor == "ray":   # Ray tasks: the cluster's CPUs bound the compiles in flight, its memory resource the rest
        from emitter.build.ray_executor import RayExecutor

        executor = RayExecutor(opts.address, rep.note)
        jobs, budget = opts.jobs or executor.slots(), None
        rep.note(executor.describe())
    else:
        executor = make_executor(opts.executor, jobs)
    run = _Run(root, plans, opts, rep, jobs, budget, cache)
    try:
        results = run.run(executor, tc)
    except BaseException:
        run.abort()
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)
    order = {e["name"]: i for i, e in enumerate(entries)}
    results.sort(key=lambda r: order[r.name])
    return BuildSummary(root, results, jobs, time.perf_counter() - t0, cache.root if cache else None,
                        skipped=len(data["instances"]) - len(entries))
