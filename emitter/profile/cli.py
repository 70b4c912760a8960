"""`emitter profile CONFIG [-o results/]`: time kernels against cuBLAS, pick the best per problem, report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from emitter.selection import selection_options
from emitter.verify.cli import problem_flags

DEFAULT_SET = "square"       # `emitter profile <manifest dir>` without problems


def _family_baselines(families: "list[str] | tuple[str, ...]") -> tuple[str, ...]:
    """The baselines of the manifest's families other than GEMM (a manifest source's default config names
    GEMM's cublas only)."""
    from emitter.families.registry import DEFAULT_FAMILY, runtime_family

    out: list[str] = []
    for fam in families:
        if fam != DEFAULT_FAMILY:
            out += list(getattr(runtime_family(fam, need=()), "BASELINES", ()))
    return tuple(out)


def _problems(values: tuple[str, ...], problems_file=None, m=None, n=None, k=None, batch=None,
              families=None):
    """Profile problems from the shared problem flags (emitter.verify.cli.problem_flags) and the named sets.

    Each --problem string is a named set (square, llm) or a problem the kernel families parse (GEMM: MxNxK,
    MxNxKxBATCH, m=..,n=..,k=..), turned into the profile's unit by the family's profile_problem hook (GEMM
    times sizes only: alpha and beta are the config's, so a problem that sets anything else is refused)."""
    from emitter.errors import SpecError
    from emitter.profile.config import named_set, named_sets, problems_from_text
    from emitter.verify.cli import user_problems
    from emitter.verify.problems import hooks_of

    out = []
    texts = []
    for v in values:
        t = v.strip().lower()
        if t in named_sets():
            out += named_set(t)
        else:
            texts.append(v)
    if texts:
        out += problems_from_text(texts, families)
    if problems_file is not None or any(v is not None for v in (m, n, k, batch)):
        for vp in user_problems((), problems_file, m, n, k, batch, data="both", families=families):
            hook = getattr(hooks_of(vp.problem), "profile_problem", None)
            got = hook(vp.problem) if hook else f"the {vp.family} family has no profile problems"
            if isinstance(got, str):
                raise SpecError(got, file="<command line>", key_path="--problem", value=vp.label,
                                fix="--problem 4096x4096x4096 (or square, llm)")
            out.append(got)
    return tuple(dict.fromkeys(out))


def _manifest_source(config: Path) -> bool:
    """True when CONFIG names a manifest (its directory or manifest.json) rather than a profile YAML."""
    return config.is_dir() or config.name == "manifest.json"


@click.command(name="profile")
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory (default: the config's output.dir, else results/)")
@selection_options
@problem_flags
@click.option("--gpus", default=None, metavar="all|N|i,j", help="GPUs to shard problems over (default: config, all)")
@click.option("--backend", type=click.Choice(["pycuda", "fake"]), default="pycuda", show_default=True,
              help="fake: no GPU; numpy checks and modelled times (CI, demos)")
@click.option("--no-check", is_flag=True, help="skip the correctness check before timing (not recommended)")
@click.option("--no-baseline", is_flag=True, help="do not time cuBLAS")
@click.option("--quick", is_flag=True, help="fewer launches (warm-up 3, 20 iterations, 2 repeats): a smoke run")
@click.option("--workspace-reset", type=click.Choice(["library", "settled"]), default=None,
              help="library: kernels whose shim zeroes a workspace (stream-K / split-K locks) pay that memset "
                   "before every timed launch, as each call into the exported library does; settled: only where a "
                   "launch leaves it non-zero, the kernel alone (default: config's timing.workspace_reset, library)")
@click.option("--all-kernels", is_flag=True, help="print every kernel, not only the best per problem")
@click.option("--no-plots", is_flag=True, help="do not write PNG plots")
@click.option("--replay", type=click.Path(exists=True, path_type=Path), default=None,
              help="re-select and re-report recorded results without running anything: a profile.json, or the "
                   "work/ directory of a run cut short (its workers' logs)")
@click.option("--resume", is_flag=True,
              help="keep the measurements already in -o's work/ (an earlier run of this config, cut short) and "
                   "take only the missing ones")
@click.option("--stall-timeout", type=click.FloatRange(1), default=300.0, show_default=True,
              help="seconds without progress before a worker (a hung kernel) is killed and the kernel marked fault")
@click.option("--options", "options_text", default=None, metavar="TEXT",
              help="time every kernel with these run-time scheduler options only (e.g. 'swizzle=4,raster=along_n'; "
                   "'' = compiled-in), in place of the config's scheduler sweep")
@click.option("--tie-tolerance", type=click.FloatRange(0, 0.5), default=None,
              help="relative floor of the noise used to call kernels tied (default: config, 0.01)")
@click.option("--cost-from", "cost_from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="an earlier run's profile.json: its per-problem wall seconds order the work queue (largest "
                   "first) [default: -o's own profile.json when there is one, else a model of FLOPs x measurements]")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="ray: one Ray GPU actor per GPU of a cluster, in place of local worker processes "
                   "(pip install 'emitter[ray]'; docs/scale-out.md)")
@click.option("--address", default=None, metavar="auto|ray://HOST:PORT",
              help="--executor ray: the cluster to join [default: $EMITTER_RAY_ADDRESS, else a local Ray instance]")
def profile_cmd(config: Path | None, out: Path | None, select: tuple[str, ...], exclude: tuple[str, ...],
                problem_texts: tuple[str, ...], problems_file: Path | None, m: str | None, n: str | None,
                k: str | None, batch: str | None, gpus: str | None, backend: str, no_check: bool, no_baseline: bool,
                quick: bool, all_kernels: bool, no_plots: bool, replay: Path | None, resume: bool, stall_timeout: float, options_text: str | None, tie_tolerance: float | None,
                executor: str = "local", address: str | None = None, workspace_reset: str | None = None,
                cost_from: Path | None = None) -> None:
    """Profile the kernels of CONFIG (a profile YAML, or a manifest directory) against cuBLAS in the same run.

    Each kernel is checked for correctness on each problem, then timed with CUDA events (warm-up, median of
    many launches, inputs rotated past L2). The best kernel per problem is chosen stably (ties within the
    measured noise are reported; the smallest median wins). Writes profile.csv, profile.json, tuning.json
    and plots/ under -o; prints the table.

    \b
    emitter profile configs/profile/llm_shapes.yaml -o results/
    emitter profile generated/demo --problem 4096x4096x4096 --problem llm -o results/
    emitter profile configs/profile/square.yaml --select 'a=bf16' --problem 8192x8192x8192
    emitter profile --replay results/profile.json --all-kernels
    emitter profile --replay results/work -o results     # a run that was killed before it wrote profile.json
    emitter profile configs/profile/llm_shapes.yaml -o results --resume   # finish that run instead
    """
    from emitter.profile import report as rep
    from emitter.profile.config import Timing, load_config
    from emitter.profile.cost import estimate
    from emitter.profile.runner import ProfileError, check_built, plan, resolve_gpus, run, shard_balance

    console = rep.make_console()
    if executor == "ray" and replay is None:     # without Ray: say how to install it before any work
        from emitter.executors import require_ray

        require_ray()
    if replay is not None:
        run_info = None        # a profile.json's `run` (how that run went) stays with its measurements
        if replay.is_dir():
            from emitter.profile.runner import outcome_from_logs

            outcome, cfg = outcome_from_logs(replay)
            if not outcome.measurements:
                raise ProfileError(f"{replay}: the workers recorded no measurement")
            measurements, envs = outcome.measurements, outcome.envs
            console.print(f"replaying {len(measurements)} measurements from the worker logs in {replay}")
        else:
            data = json.loads(replay.read_text(encoding="utf-8"))
            measurements, envs, cfg = rep.from_json(data)
            run_info = data.get("run") if isinstance(data.get("run"), dict) else None
        if tie_tolerance is not None:
            cfg = cfg.replace(tie_tolerance=tie_tolerance)
        report = rep.build(measurements, envs, cfg, run=run_info)
        out_dir = out or replay.parent
        if out_dir.resolve() == replay.parent.resolve() and out is None:
            out_dir = replay.parent / "replay"
        paths = rep.write_all(report, out_dir, plots=cfg.output.plots and not no_plots)
        rep.print_table(report, console, all_kernels)
        for line in rep.summary_lines(report, paths):
            console.print(line)
        return
    if config is None:
        raise click.UsageError("give a profile config (e.g. configs/profile/square.yaml), a manifest directory "
                               "(generated/demo) or --replay RESULTS.json")

    given = bool(problem_texts) or problems_file is not None or any(v is not None for v in (m, n, k, batch))
    if _manifest_source(config):
        from emitter.families.registry import entry_family
        from emitter.manifest import load, manifest_path
        from emitter.profile.config import ProfileConfig, named_set

        mpath = manifest_path(config)
        from emitter.profile.runner import _profilable

        families = sorted(f for f in {entry_family(e) for e in load(config)["instances"]} if _profilable(f) is None)
        families = families or None      # none profilable: every family parses; plan() then says why not
        probs = _problems(problem_texts, problems_file, m, n, k, batch, families) if given else ()
        if not probs:
            probs = tuple(named_set(DEFAULT_SET))
            console.print(f"problems: the {DEFAULT_SET} set (default; choose with --problem)")
        cfg = ProfileConfig(file=str(mpath), manifests=(str(mpath.resolve()),), problems=probs)
        extra = _family_baselines(families or ())     # other families' own baselines (attention: torch SDPA)
        if extra:
            cfg = cfg.replace(baselines=tuple(dict.fromkeys(cfg.baselines + extra)))
    else:
        cfg = load_config(config)
        if given:
            cfg = cfg.replace(problems=_problems(problem_texts, problems_file, m, n, k, batch))
    if no_check:
        cfg = cfg.replace(check=False)
    if no_baseline:
        cfg = cfg.replace(baselines=())
    if quick:
        cfg = cfg.replace(timing=Timing(warmup=3, iterations=20, repeats=2, rotate=cfg.timing.rotate,
                                        blocking_kernel=cfg.timing.blocking_kernel,
                                        workspace_reset=cfg.timing.workspace_reset))
    if workspace_reset is not None:
        from dataclasses import replace as _replace

        cfg = cfg.replace(timing=_replace(cfg.timing, workspace_reset=workspace_reset))
    if options_text is not None:
        from emitter.kit.scheduler import SchedulerOptions

        cfg = cfg.replace(scheduler=(SchedulerOptions.parse(options_text).encode(),))
    if tie_tolerance is not None:
        cfg = cfg.replace(tie_tolerance=tie_tolerance)
    out_dir = out or Path(cfg.output.dir)

    the_plan = plan(cfg, select, exclude)
    for note in the_plan.skipped:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    if backend != "fake":
        missing = check_built(the_plan)
        if len(missing) == len(the_plan.instances):
            raise ProfileError(f"none of the {len(missing)} selected instances is built\n  fix: run `emitter build "
                               f"{Path(the_plan.manifests[0]).parent}` first (with the same --select)")
        if missing:
            console.print(f"[yellow]{len(missing)} selected instances are not built and will be reported as "
                          f"failed[/yellow] (first: {missing[0]})")
    pool = None
    if executor == "ray":    # one Ray GPU actor per GPU, runner.run's shards and fault policy (profile/ray_runner.py)
        from emitter.profile.ray_runner import GpuPool

        pool = GpuPool.connect(cfg, gpus, address, fake=backend == "fake")
        console.print(pool.describe())
    gpu_list = pool.gpus if pool else resolve_gpus(cfg, gpus, backend)
    console.print(f"profiling {len(the_plan.instances)} kernels x {len(the_plan.problems)} problems on "
                  f"{len(gpu_list)} GPU{'s' if len(gpu_list) > 1 else ''} ({backend}); "
                  f"check={'on' if cfg.check else 'OFF'}, baselines={', '.join(cfg.baselines) or 'none'}")
    prior = cost_from
    if prior is None and (out_dir / cfg.output.json).is_file():
        prior = out_dir / cfg.output.json          # the last run into -o: its measured seconds order the queue
    est = estimate(the_plan, cfg, prior)
    for note in est.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    balance = shard_balance(the_plan.problems, len(gpu_list), est)
    console.print(balance or f"estimated work {est.total(the_plan.problems):.0f} s "
                             f"({est.describe(the_plan.problems)})", highlight=False, soft_wrap=True)
    if pool:
        outcome = pool.run(cfg, the_plan, out_dir, gpu_list, backend=backend, stall_timeout_s=stall_timeout,
                           resume=resume, cost=est)
    else:
        outcome = run(cfg, the_plan, out_dir, gpu_list, backend=backend, stall_timeout_s=stall_timeout,
                      resume=resume, cost=est)
    for e in outcome.events:
        console.print(f"[yellow]{e}[/yellow]", highlight=False, soft_wrap=True)
    for f in outcome.fatal:
        console.print(f"[red]{f}[/red]")
    if not outcome.measurements:
        raise ProfileError("nothing was measured" + (": " + "; ".join(outcome.fatal) if outcome.fatal else ""))
    report = rep.build(outcome.measurements, outcome.envs, cfg, run=outcome.run)
    paths = rep.write_all(report, out_dir, plots=cfg.output.plots and not no_plots)
    rep.print_table(report, console, all_kernels)
    if outcome.restarts:
        console.print(f"[yellow]{outcome.restarts} worker restart(s) after faults: see the fault rows[/yellow]")
    for line in rep.summary_lines(report, paths):
        console.print(line)


def register(cli_group: click.Group) -> None:
    cli_group.add_command(profile_cmd)
