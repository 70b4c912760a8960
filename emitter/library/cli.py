"""`emitter library`: the lead's emitter/cli.py calls register(main)."""

from __future__ import annotations

from pathlib import Path

import click

from emitter.selection import selection_options


def register(group: click.Group) -> None:
    group.add_command(library)


@click.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", "name", required=True, help="library name: C prefix, CMake target and Python module (e.g. mykernels)")
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory (default: dist/<name>)")
@click.option("--tuning", "tuning", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="tuning table from `emitter profile` (repeatable); without one, dispatch uses the fallback order")
@selection_options
@click.option("--arch", "archs", multiple=True, metavar="ARCH", help="only instances of this arch (repeatable): sm80, sm90a, ...")
@click.option("--vendor-cutlass", is_flag=True, help="copy the CUTLASS headers into third_party/ (a tree that builds anywhere)")
@click.option("--lib-version", default="1.0.0", show_default=True, help="the CMake project version")
@click.option("--force", is_flag=True, help="write into an existing directory that is not an exported library")
@click.option("--allow-unmeasured-tuning", is_flag=True,
              help="accept tuning tables not measured on a real GPU (emitter profile --backend fake): tests, demos")
def library(manifests: tuple[Path, ...], name: str, out: Path | None, tuning: tuple[Path, ...], select: tuple[str, ...],
            exclude: tuple[str, ...], archs: tuple[str, ...], vendor_cutlass: bool, lib_version: str, force: bool,
            allow_unmeasured_tuning: bool) -> None:
    """Export MANIFESTS' instances (what `emitter emit` wrote) as a CMake kernel library with a C API, dispatch by
    problem shape from a tuning table, and a Python loader.

    \b
      emitter library generated/demo --tuning results/tuning.json --name mykernels -o dist/mykernels
      cmake -S dist/mykernels -B build && cmake --build build -j && cmake --install build --prefix /opt/mykernels
    """
    from emitter.api import export_library
    from emitter.families.registry import DEFAULT_FAMILY

    out = out or Path("dist") / name
    r = export_library(manifests, name, out, tuning=tuning, select=select, exclude=exclude, archs=archs,
                       vendor_cutlass=vendor_cutlass, force=force, lib_version=lib_version,
                       **({"allow_unmeasured_tuning": True} if allow_unmeasured_tuning else {}))
    by_arch: dict[str, int] = {}
    for k in r.kernels:
        by_arch[k.arch] = by_arch.get(k.arch, 0) + 1
    for s in r.skipped:
        click.echo(f"  left out {s['name']}: {s['reason']}")
    if r.dropped_tuning:
        click.echo(f"  {len(r.dropped_tuning)} tuning entries not used:")
        for d in r.dropped_tuning[:10]:
            split = f" split-K {d['split_k']}" if d.get("split_k", 1) > 1 else ""
            click.echo(f"    {d['kernel']}{split} @ {'x'.join(map(str, d['problem']))}: {d['reason']}")
        if len(r.dropped_tuning) > 10:
            click.echo(f"    ... (all in {out / 'manifest.json'}: left_out.tuning_entries)")
    # a tuning entry whose kernel the export does not hold: its shape dispatches to the nearest other record
    missing = [d for d in r.dropped_tuning if d.get("missing_kernel")]
    for d in missing:
        click.echo(f"warning: tuning entry {d['source']}: entries[{d.get('position')}] "
                   f"({'x'.join(map(str, d['problem']))}) names kernel {d['kernel']}, which is not in this export: "
                   "not used", err=True)
    for n in r.notes:
        click.echo(f"note: {n}", err=True)
    arches = ", ".join(f"{n} {a}" for a, n in sorted(by_arch.items()))
    split = sum(1 for t in r.tuning if t.split_k > 1)
    sched = sum(1 for t in r.tuning if t.options)
    fast = sum(1 for k in r.kernels if k.fast_accum)
    tuned = getattr(r, "family_tuned", {})
    families = "".join(f", {n} {f} kernels" + (f" ({tuned[f]} tuned problems)" if tuned.get(f) else "")
                       for f, n in getattr(r, "families", {}).items())
    own = (f"{len(r.kernels)} {DEFAULT_FAMILY.upper() + ' kernels' if families else 'kernels'} ({arches}"
           + (f"; {fast} fp8 fast-accum, dispatched only to callers that set fast_accum" if fast else "") + ")")
    kinds = own + families if r.kernels else families.removeprefix(", ")     # other families only: just theirs
    click.echo(f"library {name}: {kinds}, {len(r.tuning)} tuned shapes"
               + (f" ({split} run split-K)" if split else "")
               + (f" ({sched} with run-time scheduler options)" if sched else "")
               + (f", {len(missing)} tuning entries name kernels not in the export" if missing else "") + "; "
               f"{len(r.written)} files written, {r.unchanged} unchanged"
               + (f", {len(r.removed)} removed" if r.removed else "") + f" -> {out}")
    click.echo(f"  build: cmake -S {out} -B {out}/build && cmake --build {out}/build -j && "
               f"cmake --install {out}/build --prefix <prefix>")
