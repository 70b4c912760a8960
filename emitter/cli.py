"""emitter command line: init, emit, list, build, cache, verify, profile, library.

One place maps errors to exit codes: an EmitterError prints its message on stderr (no traceback) and
exits with its code (2 for bad input)."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path

import click

from emitter.errors import EmitterError
from emitter.selection import selection_options
from emitter.version import __version__


class _Group(click.Group):
    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except EmitterError as e:
            click.echo(e.render(), err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:   # a bug, or an environment failure nobody turned into an EmitterError
            from emitter.errors import report_internal_error

            click.echo(report_internal_error(e), err=True)
            ctx.exit(70)   # EX_SOFTWARE


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="emitter")
def main() -> None:
    """Turn YAML kernel specs into CUTLASS kernel instances; build, verify and profile them."""


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", "out", default="generated/demo", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="output directory (manifest + .cu)")
@click.option("-q", "--quiet", is_flag=True, help="print only the summary line")
@click.option("--max-instances", type=click.IntRange(min=1), default=None,
              help="cap on the candidates the specs may sweep [default: 100000]")
@click.option("--keep-stale", is_flag=True,
              help="keep (and list) .cu files of an earlier emit into OUT that the new manifest drops [default: remove]")
def emit(specs: tuple[Path, ...], out: Path, quiet: bool, max_instances: int | None, keep_stale: bool) -> None:
    """Expand SPECS, validate every instance, and write one .cu per instance plus manifest.json."""
    from emitter.api import emit_specs

    result = emit_specs(list(specs), out, max_instances=max_instances, keep_stale=keep_stale)
    for src in result.stale if keep_stale else ():
        click.echo(f"  stale (kept, not in the manifest): {out / src}", err=True)
    if not quiet:
        rules = Counter(r.rule for r in result.rejected)
        for rule, count in sorted(rules.items()):
            click.echo(f"  rejected {count:5d} x {rule}")
        for f in result.failed:
            click.echo(f"  FAILED to render {f['name']}: {f['error']}", err=True)
    click.echo(f"emitted {len(result.instances)} instances ({result.written} written, "
               f"{len(result.instances) - result.written} unchanged), rejected {len(result.rejected)}"
               + (f", {result.duplicates} duplicates merged" if result.duplicates else "")
               + (f", {len(result.failed)} FAILED to render" if result.failed else "")
               + (f", {len(result.stale)} stale .cu {'kept' if keep_stale else 'removed'}" if result.stale else "")
               + f" -> {out / 'manifest.json'}")
    if result.failed:
        sys.exit(1)


@main.command(name="list")
@click.argument("out", type=click.Path(path_type=Path), default="generated/demo")
@selection_options
@click.option("--rejected/--no-rejected", default=None,
              help="also list rejected configurations [default: yes, unless --select/--exclude is given]")
@click.option("--json", "as_json", is_flag=True, help="print the manifest entries as JSON")
def list_cmd(out: Path, select: tuple[str, ...], exclude: tuple[str, ...], rejected: bool | None, as_json: bool) -> None:
    """List what a manifest holds: emitted instances, and rejected configurations with the reason.

    With --select/--exclude, only the instances a build, verify or profile with the same patterns would
    take (a preview of the selection)."""
    import json

    from emitter.families.registry import entry_family
    from emitter.manifest import load
    from emitter.selection import select as select_entries

    data = load(out)
    selected = select or exclude
    instances = select_entries(data["instances"], select, exclude) if selected else data["instances"]
    if rejected is None:
        rejected = not selected
    if as_json:
        click.echo(json.dumps({"instances": instances, "rejected": data["rejected"] if rejected else []}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    title = (f"{len(instances)} of {len(data['instances'])} instances in {out} selected" if selected
             else f"{len(instances)} instances in {out}")
    families = sorted({entry_family(inst) for inst in instances})
    table = Table(title=title + (f" ({', '.join(families)})" if families else ""))
    table.add_column("name (and the config keys that differ)", overflow="fold")
    for col in ("arch", "tile", "stages"):
        table.add_column(col, no_wrap=True)
    varying = _varying_keys(instances)
    for inst in instances:
        cfg = inst["config"]
        details = _details_text(cfg, varying.get(entry_family(inst), ()))
        table.add_row(Text(inst["name"]) + (Text("\n  " + details, style="dim") if details else Text()),
                      str(inst["arch"]), _tile_text(cfg), _value_text(cfg.get("stages")) or "auto")
    console.print(table)
    if rejected and data["rejected"]:
        rt = Table(title=f"{len(data['rejected'])} rejected")
        for col in ("family", "arch", "dtypes", "tile", "rule", "reason"):
            rt.add_column(col, overflow="fold")
        for rej in data["rejected"]:
            cfg = rej["config"]
            rt.add_row(entry_family(rej), str(rej["arch"]), _dtypes_text(cfg), _tile_text(cfg),
                       str(rej["rule"]), str(rej["reason"]))
        console.print(rt)


# `emitter list` reads any family's config (a JSON object the family wrote): columns from keys that most
# families have (tile, stages, dtypes), and the keys whose values differ between the listed instances of a family
_LIST_SHOWN = {"tile", "stages", "arch"}


def _value_text(v: object) -> str:
    """A manifest value as short text: lists of scalars joined with x (tiles), objects as k=v, None as ''."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, float, str)) and not isinstance(x, bool) for x in v):
            return "x".join(str(x) for x in v)
        return "[" + ", ".join(_value_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_value_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def _tile_text(cfg: dict) -> str:
    """The CTA tile: `tile` (gemm, conv), else the family's tile_* keys in order (attention: tile_q x tile_kv)."""
    if cfg.get("tile") is not None:
        return _value_text(cfg["tile"])
    parts = [_value_text(v) for k, v in cfg.items() if k.startswith("tile_") and v is not None]
    return "x".join(parts) if parts else "-"


def _dtypes_text(cfg: dict) -> str:
    if all(k in cfg for k in ("a", "b", "d")):
        return f"{_value_text(cfg['a'])}/{_value_text(cfg['b'])}->{_value_text(cfg['d'])}"
    for key in ("dtype", "a"):
        if key in cfg:
            return _value_text(cfg[key])
    return "-"


def _varying_keys(entries: list) -> dict:
    """family -> config keys (beyond the columns) whose values differ between that family's entries."""
    from emitter.families.registry import entry_family

    seen: dict = {}
    for e in entries:
        fam = seen.setdefault(entry_family(e), {})
        for k, v in e["config"].items():
            if k not in _LIST_SHOWN and not k.startswith("tile_"):
                fam.setdefault(k, set()).add(_value_text(v))
    return {f: tuple(k for k, vals in keys.items() if len(vals) > 1) for f, keys in seen.items()}


def _details_text(cfg: dict, keys: tuple) -> str:
    return " ".join(f"{k}={_value_text(cfg.get(k)) or '-'}" for k in keys)


@main.command(name="init")
@click.argument("directory", type=click.Path(path_type=Path), default=".")
@click.option("--gpu", type=click.Choice(["auto", "sm80", "sm90a"]), default="auto", show_default=True,
              help="the GPU to write specs for: auto asks nvidia-smi (sm80 when it finds none)")
def init_cmd(directory: Path, gpu: str) -> None:
    """Write a starter project into DIRECTORY: specs.yaml (kernels for the GPU), profile.yaml, README.md.

    Never overwrites: if any of the three exists, nothing is written."""
    from emitter.api import init_project

    r = init_project(directory, gpu=gpu)
    click.echo(f"{r.reason}")
    for p in r.written:
        click.echo(f"  wrote {p}")
    where = "" if directory.resolve() == Path.cwd().resolve() else f"cd {directory} && "
    click.echo(f"next: {where}emitter emit specs.yaml -o generated && emitter build generated"
               f"   (then on a GPU: emitter verify generated --quick; see README.md)")


def _register_optional(module: str) -> None:
    """Commands live with their stage (emitter/build, emitter/verify, emitter/profile)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("emitter"):
            return
        raise
    mod.register(main)


for _m in ("emitter.build.cli", "emitter.verify.cli", "emitter.profile.cli", "emitter.library.cli"):
    _register_optional(_m)
