"""`emitter verify`: the click command (the lead wires it in via emitter.cli's optional registration)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from emitter.errors import SpecError


def _selection_options(f):
    try:
        from emitter.selection import selection_options

        return selection_options(f)
    except ImportError:  # pragma: no cover - selection lands separately
        f = click.option("--exclude", "exclude", multiple=True, metavar="PATTERN")(f)
        return click.option("--select", "select", multiple=True, metavar="PATTERN")(f)


class FamilyHelpOption(click.Option):
    """An option whose help text the families write (their runtime modules' PROBLEM_HELP / DATA_HELP), joined when
    help is shown: loading the runtime modules imports numpy and ctypes machinery, which `emitter --help` and
    every run that prints no help must not pay."""

    def __init__(self, *args, family_help, **kwargs) -> None:
        self._family_help = family_help
        self._help: str | None = None
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str | None:       # type: ignore[override]
        return self._family_help() if self._help is None else self._help

    @help.setter
    def help(self, value: str | None) -> None:
        self._help = value


def _family_texts(attr: str) -> dict[str, str]:
    """Family name -> its runtime module's `attr` (non-empty ones), in registry order; families whose runtime
    module does not load here are left out, as in _runnable."""
    from emitter.families.registry import FAMILIES, runtime_family

    out = {}
    for name in FAMILIES:
        try:
            text = getattr(runtime_family(name, need=()), attr)
        except Exception:  # noqa: BLE001 - a family whose hooks do not import here (in progress, broken)
            continue
        if text:
            out[name] = text
    return out


def problem_help() -> str:
    """--problem: the default family's syntax (a manifest entry without `family` is the default's), then the
    others' in registry order."""
    from emitter.families.registry import DEFAULT_FAMILY

    texts = _family_texts("PROBLEM_HELP")
    lead = texts.pop(DEFAULT_FAMILY, None)
    out = "a problem (repeatable)" + (f": {lead}" if lead else "") + "; each family parses its own"
    return out + (f" ({'; '.join(texts.values())})" if texts else "")


def data_help() -> str:
    """--data: each family's input kinds in registry order."""
    texts = _family_texts("DATA_HELP")
    return "input data kind of the family" + (f" ({'; '.join(texts.values())})" if texts else "") + \
        ", or both = every kind"


def problem_flags(f):
    """The problem flags `emitter verify` and `emitter profile` share: --problem (repeatable; each kernel
    family parses the strings it understands, GEMM: MxNxK[xBATCH] or m=..,n=..,k=..[,beta=..]), --problems
    FILE.yaml, and the size flags --m/--n/--k/--batch (comma lists make a product)."""
    f = click.option("--batch", "batch", metavar="INT[,INT]", help="batch count (batched instances)")(f)
    f = click.option("--k", "k", metavar="INT[,INT]", help="problem K")(f)
    f = click.option("--n", "n", metavar="INT[,INT]", help="problem N")(f)
    f = click.option("--m", "m", metavar="INT[,INT]",
                     help="problem M (with --n and --k; comma lists make a product)")(f)
    f = click.option("--problems", "problems_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="YAML file of problems (`problems: [{m: 1000, n: 517, k: 129, beta: 0.5}]`)")(f)
    return click.option("--problem", "problem_texts", multiple=True, metavar="PROBLEM", cls=FamilyHelpOption,
                        family_help=problem_help)(f)


def user_problems(problem_texts, problems_file, m, n, k, batch, split_k=None, alpha=None, beta=None, data="both",
                  families=None):
    """The VerifyProblems the problem flags give (empty: none given), parsed by the families in `families`."""
    from emitter.verify.problems import load_problem_file, problems_from_options, problems_from_strings

    sizes = any(v is not None for v in (m, n, k))
    if problems_file is not None and (sizes or problem_texts):
        raise SpecError("give problems either with --problems or with --problem / --m/--n/--k, not both",
                        file="<command line>", fix="drop one of them")
    if problems_file is not None:
        return load_problem_file(problems_file, families)
    out = problems_from_strings(problem_texts, data, families) if problem_texts else []
    return out + problems_from_options(m, n, k, batch, split_k, alpha, beta, data, families)


def replay_command(out, select, exclude, problem_texts, problems_file, m, n, k, batch, split_k, alpha, beta, data,
                   quick, scheduler, backend, fake_faults, no_isolation) -> str:
    """The `emitter verify` command line that repeats a run ({seed} stands for the seed it drew)."""
    import shlex

    args = ["emitter", "verify", str(out)]
    for flag, values in (("--select", select), ("--exclude", exclude), ("--problem", problem_texts)):
        for v in values or ():
            args += [flag, v]
    for flag, v in (("--problems", problems_file), ("--m", m), ("--n", n), ("--k", k), ("--batch", batch),
                    ("--split-k", split_k), ("--alpha", alpha), ("--beta", beta), ("--scheduler", scheduler),
                    ("--fake-faults", fake_faults)):
        if v is not None:
            args += [flag, str(v)]
    if data != "both":
        args += ["--data", data]
    if quick:
        args.append("--quick")
    if backend != "pycuda":
        args += ["--backend", backend]
    if no_isolation:
        args.append("--no-isolation")
    return " ".join(shlex.quote(a) for a in args) + " --seed {seed}"


def _select(entries, select, exclude):
    from emitter.selection import select as sel

    return sel(entries, select, exclude)


@click.command(name="verify")
@click.argument("out", type=click.Path(path_type=Path), default="generated/demo")
@_selection_options
@problem_flags
@click.option("--split-k", "split_k", metavar="INT[,INT]", help="split-K slices (split-K instances)")
@click.option("--alpha", "alpha", metavar="F[,F]", help="alpha (default 1)")
@click.option("--beta", "beta", metavar="F[,F]", help="beta (default 0)")
@click.option("--data", default="both", show_default=True, metavar="KIND", cls=FamilyHelpOption, family_help=data_help)
@click.option("--quick", is_flag=True, help="default set without the 4096^3 and long-K problems")
@click.option("--scheduler", "scheduler", default=None, metavar="KEY=VALUE[,...]",
              help="run-time scheduler options on every problem (sm90a): swizzle=1|2|4|8, raster=heuristic|"
                   "along_m|along_n, reduction=deterministic|nondeterministic, promotion_interval=N; instances "
                   "without such a choice are skipped")
@click.option("--seed", type=int, default=None, help="base seed (default: fresh; the report prints it for replay)")
@click.option("--backend", type=click.Choice(["pycuda", "fake"]), default="pycuda", show_default=True,
              help="pycuda: the GPU; fake: numpy stand-in that needs no GPU (tests the verifier, not kernels)")
@click.option("--fake-faults", "fake_faults", default=None, hidden=True,
              help="JSON list of faults to plant in the fake backend (testing)")
@click.option("--timeout", "timeout", type=float, default=60.0, show_default=True,
              help="seconds one kernel launch may take before its worker is killed and the case FAILED")
@click.option("--no-isolation", is_flag=True, help="run kernels in this process (a CUDA fault then ends the run)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON results (default <out>/verify/results.json)")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JUnit XML (default <out>/verify/junit.xml)")
@click.option("-q", "--quiet", is_flag=True, help="no per-case progress lines")
def verify_cmd(out: Path, select, exclude, problem_texts, problems_file, m, n, k, batch, split_k, alpha, beta, data,
               quick, scheduler, seed, backend, fake_faults, timeout, no_isolation, json_path, junit_path,
               quiet) -> None:
    """Launch every built instance in OUT on its problems and check it against a reference.

    Exit code: 0 when nothing FAILED, 1 when any case FAILED, 2 for bad input."""
    from rich.console import Console
    from rich.markup import escape

    from emitter.families.registry import entry_family
    from emitter.manifest import load, manifest_path
    from emitter.verify.report import exit_code, print_report, write_json, write_junit
    from emitter.verify.runner import VerifyOptions, verify

    data_json = load(out)
    root = manifest_path(out).parent
    entries = _select(data_json["instances"], select, exclude)
    families = sorted({entry_family(e) for e in entries} & _runnable())
    _check_data(data, families)
    user = user_problems(problem_texts, problems_file, m, n, k, batch, split_k, alpha, beta, data,
                         families=families or None)
    from emitter.kit.scheduler import OptionsError, SchedulerOptions
    try:
        sched = SchedulerOptions.parse(scheduler or "").encode()
    except OptionsError as e:
        raise SpecError(f"--scheduler: {e}", file="<command line>", value=scheduler) from None
    options = {}
    if fake_faults:
        if backend != "fake":
            raise SpecError("--fake-faults needs --backend fake", file="<command line>")
        try:
            options = {"faults": json.loads(fake_faults)}
        except json.JSONDecodeError as e:
            raise SpecError(f"--fake-faults is not JSON: {e.msg}", file="<command line>", value=fake_faults) from None
    console = Console(stderr=False)
    if not entries:
        console.print(f"verify: no instances selected in {root}")
        sys.exit(1 if data_json["instances"] else 0)

    def progress(r):
        if quiet:
            return
        st = {"PASSED": "[green]PASSED[/]", "FAILED": "[bold red]FAILED[/]", "SKIPPED": "[yellow]SKIPPED[/]"}[r["status"]]
        err = ""
        if r.get("check") == "exact" and r["status"] == "PASSED":
            err = " exact"
        elif r.get("rel_err") is not None and r.get("tol"):
            err = f" rel {r['rel_err']:.2e} (tol {r['tol']:g})"
        t = f" {r['time_ms']:.3f} ms" if r.get("time_ms") else ""
        why = f": {r['reason']}" if r["status"] != "PASSED" and r.get("reason") else ""
        console.print(f"{st} " + escape(f"{r['instance']} [{r['problem']}]{err}{t}{why}"), highlight=False, soft_wrap=True)

    run = verify(root, entries, user or None,
                 VerifyOptions(backend=backend, backend_options=options, isolation=not no_isolation,
                               launch_timeout_s=timeout, seed=seed, quick=quick, data=data, scheduler=sched,
                               replay=replay_command(out, select, exclude, problem_texts, problems_file, m, n, k,
                                                     batch, split_k, alpha, beta, data, quick, scheduler, backend,
                                                     fake_faults, no_isolation)),
                 progress=progress)
    print_report(run, console)
    jp = write_json(run, json_path or root / "verify" / "results.json")
    jx = write_junit(run, junit_path or root / "verify" / "junit.xml")
    console.print(f"reports: {jp}  {jx}", highlight=False)
    sys.exit(exit_code(run))


def _check_data(data: str, families: list[str]) -> None:
    """--data must name an input kind of one of the selected families (or both)."""
    from emitter.families.registry import runtime_family

    kinds = sorted({k for f in families for k in runtime_family(f).DATA_KINDS})
    if data != "both" and data not in kinds:
        raise SpecError("--data names no input kind of the selected instances' families", file="<command line>",
                        key_path="--data", value=data, allowed=["both", *kinds], fix="--data int or --data normal")


def _runnable() -> set[str]:
    """Families whose run-time hooks import here."""
    from emitter.families.registry import runtime_family
    from emitter.families.registry import FAMILIES

    out = set()
    for name in FAMILIES:
        try:
            runtime_family(name)
        except Exception:  # noqa: BLE001 - a family whose hooks do not import here (in progress, broken)
            continue
        out.add(name)
    return out


def register(cli_group: click.Group) -> None:
    cli_group.add_command(verify_cmd, name="verify")
