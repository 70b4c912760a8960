"""`emitter build` and `emitter cache`; the lead's emitter/cli.py calls register(main)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from emitter.api import build_instances
from emitter.build.builder import BuildSummary, InstanceResult, Reporter
from emitter.build.cache import Cache, CacheError, cache_root
from emitter.selection import selection_options

_TABLE_ALL_UP_TO = 60        # above this many instances the table lists only failures and warnings


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'20G', '500M', '1.5GiB', '1000000' -> bytes (K/M/G/T alone are binary units)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text or "")
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or len(m.group(1)) > 20:
        raise CacheError(f"--max-size {text!r} is not a size\n  allowed: a number with an optional unit "
                         f"(B, K, M, G, T, KB, MB, GB, KiB, MiB, GiB), e.g. 20G\n  fix: write e.g. --max-size 20G")
    return int(float(m.group(1)) * _UNITS[unit])


def _smem(res: dict) -> str:
    """Shared memory per CTA: ptxas's static bytes + the launch's dynamic bytes (the shim's query), e.g.
    `64.0 KiB` (all of a CUTLASS kernel's SharedStorage is dynamic); `+?` where the dynamic part is unknown."""
    static, dynamic = int(res.get("shared_bytes") or 0), res.get("dynamic_shared_bytes")
    if dynamic is None:
        return f"{static}+?" if "dynamic_shared_bytes" in res else str(static)
    total = static + int(dynamic)
    return f"{total / 1024:.1f} KiB" if total >= 1024 else str(total)


def _res(r: InstanceResult) -> tuple[str, str, str]:
    res = r.record.get("resources") or {}
    if r.status == "failed" and not res.get("registers"):
        return "", "", ""
    return str(res.get("registers", "")), _smem(res), str(res.get("spill_bytes", ""))


class PlainReporter(Reporter):
    """One line per finished instance: for CI logs and pipes."""

    def __init__(self) -> None:
        self.total = 0
        self.n = 0

    def start(self, total: int, jobs: int, to_compile: int) -> None:
        self.total = total
        click.echo(f"build: {total} instances, {total - to_compile} reused, {to_compile} to compile, -j {jobs}")

    def started(self, name: str) -> None:
        click.echo(f"  compiling {name}")

    def done(self, r: InstanceResult) -> None:
        self.n += 1
        regs, _smem_static, spill = _res(r)   # shared memory: in the summary table, once the shim was asked
        extra = f"  regs={regs} spill={spill}" if regs else ""
        n = len(r.warnings)
        warn = f"  ({n} warning{'s' if n != 1 else ''})" if n else ""
        click.echo(f"[{self.n:>{len(str(self.total))}}/{self.total}] {r.status:<6} {r.wall_s:7.1f}s  {r.name}{extra}{warn}")

    def note(self, message: str) -> None:
        click.echo(f"note: {message}", err=True)


class RichReporter(Reporter):
    """A progress bar with ETA on a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold]build[/]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[last]}", style="dim"), console=self.console,
                                 transient=True)
        self.task = None

    def start(self, total: int, jobs: int, to_compile: int) -> None:
        self.console.print(f"build: {total} instances, {total - to_compile} reused, {to_compile} to compile, -j {jobs}")
        self.progress.start()
        self.task = self.progress.add_task("build", total=total, last="")

    def started(self, name: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, last=f"compiling {name}")

    def done(self, r: InstanceResult) -> None:
        if r.status == "failed":
            self.progress.console.print(f"[red]failed[/] {r.name}")
        if self.task is not None:
            self.progress.update(self.task, advance=1, last=f"{r.status} {r.name}")

    def note(self, message: str) -> None:
        self.console.print(f"[yellow]note:[/] {message}")

    def stop(self) -> None:
        self.progress.stop()


def print_summary(summary: BuildSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    results = summary.results
    console = Console(highlight=False)
    if not console.is_terminal:     # CI logs: wide enough that instance names stay on one line
        longest = max((len(r.name) for r in results), default=0)
        console = Console(highlight=False, width=max(100, longest + 60))
    shown = results if len(results) <= _TABLE_ALL_UP_TO else [r for r in results if r.status == "failed" or r.warnings]
    if shown:
        table = Table(title=f"build of {summary.out}" + ("" if shown is results else " (failures and warnings)"))
        for col, kw in (("status", {}), ("instance", {"overflow": "fold"}), ("wall s", {"justify": "right"}),
                        ("regs", {"justify": "right"}), ("smem", {"justify": "right"}),
                        ("spill", {"justify": "right"}), ("warnings", {"justify": "right"})):
            table.add_column(col, **kw)
        style = {"ok": "green", "cached": "cyan", "failed": "bold red"}
        for r in shown:
            table.add_row(f"[{style[r.status]}]{r.status}[/]", r.name, f"{r.wall_s:.1f}", *_res(r),
                          str(len(r.warnings)) if r.warnings else "")
        console.print(table)
    for r in results:
        for w in r.warnings:
            if w.startswith("spills:"):
                console.print(f"[yellow]warning[/] {r.name}: {w}", soft_wrap=True)
    for r in summary.failed:
        console.print(f"\n[bold red]FAILED[/] {r.name}")
        console.print(f"  source: {r.source}")
        console.print(f"  record: {r.record_path}")
        for line in (r.error or "").splitlines()[:20]:
            console.print(f"  | {line}", markup=False)
        if r.repro:
            console.print("  reproduce:")
        for cmd in r.repro:
            console.print(f"    {cmd}", markup=False, soft_wrap=True)
    n = len(results)
    line = (f"built {n} instance{'s' if n != 1 else ''}: {summary.count('ok')} compiled, {summary.count('cached')} "
            f"cached, {len(summary.failed)} failed in {summary.wall_s:.1f} s (-j {summary.jobs})")
    if summary.skipped:
        line += f"; {summary.skipped} not selected"
    console.print(("[bold red]" if summary.failed else "[bold green]") + line + "[/]")


def _sigterm_to_interrupt(signum, frame):  # pragma: no cover - exercised by hand
    raise KeyboardInterrupt


def register(group: click.Group) -> None:
    @group.command(name="build")
    @click.argument("out", type=click.Path(path_type=Path), default="generated/demo")
    @click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
                  help="nvcc processes at once [default: what cores and free memory hold, ~4 GB per sm90a nvcc]")
    @selection_options
    @click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="compile cache [default: $EMITTER_CACHE_DIR, $XDG_CACHE_HOME/emitter, ~/.cache/emitter]")
    @click.option("--no-cache", is_flag=True, help="compile every selected instance; neither read nor write the cache")
    @click.option("--allow-serialized-wgmma", is_flag=True,
                  help="keep instances whose wgmma ptxas serialized (C7510) instead of failing them")
    @click.option("--host-syntax-only", is_flag=True,
                  help="compile host shims with -fdevice-syntax-only: the shim holds no kernels, so its device pass "
                       "can stop after parsing (3-12% faster shims; experimental: not yet checked on a GPU)")
    @click.option("--executor", type=click.Choice(["thread", "process", "ray"]), default="thread", show_default=True,
                  help="where nvcc runs: a local thread or process pool, or ray (each compile a Ray task on a cluster; "
                       "pip install 'emitter[ray]'; docs/scale-out.md)")
    @click.option("--address", default=None, metavar="auto|ray://HOST:PORT",
                  help="--executor ray: the cluster to join [default: $EMITTER_RAY_ADDRESS, else a local Ray instance]")
    @click.option("--timeout", "timeout_s", type=float, default=None, help="seconds one nvcc run may take")
    @click.option("--progress/--no-progress", default=None,
                  help="progress bar [default: on a terminal]; otherwise one line per instance")
    def build_cmd(out: Path, jobs: int | None, select: tuple[str, ...], exclude: tuple[str, ...], cache_dir: Path | None,
                  no_cache: bool, allow_serialized_wgmma: bool, host_syntax_only: bool, executor: str, timeout_s: float | None,
                  progress: bool | None, address: str | None = None) -> None:
        """Compile the instances of OUT/manifest.json with nvcc: a cubin (device entry) and a host-shim .so per
        instance, in OUT/build/<name>/ with a record.json. Parallel, cached by content; a failing instance
        fails alone and the exit code says whether any did."""
        if progress is None:
            progress = sys.stdout.isatty() and sys.stderr.isatty()
        reporter: Reporter = RichReporter() if progress else PlainReporter()
        try:   # SIGTERM stops the nvcc processes too, like Ctrl-C (only possible from the main thread)
            old = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
        except ValueError:
            old = None
        try:
            summary = build_instances(out, select=select, exclude=exclude, jobs=jobs, cache_dir=cache_dir,
                                      use_cache=not no_cache, allow_serialized_wgmma=allow_serialized_wgmma,
                                      executor=executor, timeout_s=timeout_s, host_syntax_only=host_syntax_only,
                                      reporter=reporter, **({"address": address} if address else {}))
        except OSError as e:     # the manifest directory or the cache cannot take the files (full, read-only)
            from emitter.fsutil import OutputError, os_error_text

            what, fix = os_error_text(e)
            where = f" ({e.filename})" if isinstance(e.filename, str) else ""
            raise OutputError(out, f"the build stopped: {what}{where}", fix) from None
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            if isinstance(reporter, RichReporter):
                reporter.stop()
        print_summary(summary)
        if summary.failed:
            sys.exit(1)

    @group.command(name="cache")
    @click.option("--clear", is_flag=True, help="remove every cache entry")
    @click.option("--max-size", "max_size", default=None, metavar="SIZE",
                  help="evict least recently used entries until the cache holds at most SIZE (e.g. 20G, 500M, 0)")
    @click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="cache location [default: $EMITTER_CACHE_DIR, $XDG_CACHE_HOME/emitter, ~/.cache/emitter]")
    def cache_cmd(clear: bool, max_size: str | None, cache_dir: Path | None) -> None:
        """Show the compile cache's location, entries and size; --clear empties it; --max-size trims it."""
        cache = Cache(cache_root(cache_dir))
        limit = parse_size(max_size) if max_size is not None else None
        if cache.root.exists() and not cache.root.is_dir():
            raise CacheError(f"{cache.root}: the cache path is not a directory\n"
                             f"  fix: pass --cache-dir DIR or set EMITTER_CACHE_DIR to a directory")
        if limit is not None and not clear:
            done = cache.trim(limit)
            click.echo(f"evicted {done['evicted']} least recently used entries ({_size(done['freed'])}); "
                       f"{_size(done['bytes'])} left in {cache.root} (limit {_size(limit)})")
            return
        if clear:
            before = cache.clear()
            click.echo(f"cleared {before['entries']} entries ({_size(before['bytes'])}) from {cache.root}")
            return
        st = cache.stats()
        click.echo(f"cache:   {st['path']}\nentries: {st['entries']}\nsize:    {_size(st['bytes'])}")
