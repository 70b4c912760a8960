"""GEMM's part of an exported library (`emitter library`): its kernel and tuning tables, C API, dispatch and
Python functions. The library stage asks every library for GEMM's part (an empty kernel table when the export holds
no GEMM kernel: its C API stays in every library, so code written against one library links against any).

    library_pieces(entries, roots, ctx) -> LibraryPieces
      entries   GEMM's selected manifest entries; roots[name] its manifest directory
      ctx       the library's template context, plus `tuning_tables` (the tables of GEMM's format among --tuning)
                and `allow_unmeasured_tuning`

It returns, beside the slots every family fills (emitter/kit/library.py): `globals` (the kernel and tuning records
and the C struct fields the shared templates read: header, C API, table, loader, CMake, README), `exports` (its C
functions, which its own loader text declares), `manifest` (the manifest's kernels / tuning / dispatch sections),
`notes` and, in `context`, the tuning entries it could not use (`dropped_tuning`).

Files: src/<lib>_dispatch.h (selection code; Python mirror in library_dispatch.py), src/<lib>_kernels.{h,cpp}
(per-kernel entry points), src/instances/<name>.cu + .launch.cu, tools/<lib>_dispatch_probe.cpp, from
templates/gemm/library/.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from emitter.families.gemm import library_abi as abi
from emitter.families.gemm.library_dispatch import (KernelRecord, MeasuredRecord, Query, TuningRecord, candidate_order,
                                                    kernel_records, log2_fixed, measured_records, tuning_records)
from emitter.families.gemm.library_tuning import (MeasuredEntry, TuningEntry, check_options, check_split_k, load_all,
                                                  load_measurements)
from emitter.kit.library import ACTIVATIONS, DTYPES, LibraryError, LibraryPieces
from emitter.kit.scheduler import SchedulerOptions

FAMILY = "gemm"
# GEMM's C functions (without the `<lib>_` prefix), after the three every library has (status_string, last_error,
# version): the linker map exports them, the loader text declares them
C_FUNCTIONS = ("gemm_problem_init", "gemm_workspace_size", "gemm_can_implement", "gemm_select", "gemm",
               "kernel_count", "kernel_name", "kernel_index", "get_kernel_info")

DISPATCH_RULE = ("exact operation match and arch; tuned kernels first by nearest profiled shape (sum of |log2| "
                 "differences over m, n, k, batch); then fallback_rank; first that can implement runs; "
                 "then the same for the transposed problem; a tuned split-K kernel runs with its record's "
                 "split_k (clamped to k / tile_k) unless the caller asks for split_k_slices > 1, and with its "
                 "record's run-time scheduler options (options) where they cost no tile padding at the problem; "
                 "between profiled shapes (no exact record), with the profile's per-kernel times (measured), every "
                 "kernel measured at the nearest profiled shape first, by its time there scaled by FLOPs and by the "
                 "wave quantization of its tile grid on the GPU's SMs; fp8 "
                 "fast-accumulation kernels (fast_accum) are candidates only when the caller sets "
                 "problem.fast_accum = 1, and then come before full-precision ones at equal distance or rank")


def _op_mismatch(entry: TuningEntry, cfg: dict[str, Any]) -> str | None:
    if not entry.op:
        return None
    ep = cfg.get("epilogue") or {}
    want = {"a": cfg["a"], "b": cfg["b"], "c": cfg["c"], "d": cfg["d"], "layout_a": cfg["layout_a"],
            "layout_b": cfg["layout_b"], "layout_c": cfg["layout_c"], "accumulator": cfg["accumulator"],
            "activation": ep.get("activation", "identity"), "bias": ep.get("bias", "none"),
            "fast_accum": bool(cfg.get("fp8_fast_accum", False))}
    diff = [f"{k}={entry.op[k]!r} (kernel: {v!r})" for k, v in want.items() if k in entry.op and entry.op[k] != v]
    return ", ".join(diff) if diff else None


def resolve_tuning(kernels: Sequence[KernelRecord], entries: Sequence[TuningEntry]
                   ) -> tuple[list[TuningRecord], list[dict[str, Any]], list[str]]:
    """Tuning entries -> tuning records over `kernels`; entries not used come back with the reason."""
    by_name = {k.name: k for k in kernels}
    dropped: list[dict[str, Any]] = []
    notes: list[str] = []
    groups: dict[tuple, list[TuningEntry]] = defaultdict(list)
    for e in entries:
        k = by_name.get(e.kernel)
        if k is None:
            dropped.append({"kernel": e.kernel, "problem": list(e.shape), "source": e.source, "position": e.position,
                            "missing_kernel": True,
                            "reason": "kernel not in this library (not in the manifests, or left out by --select/--exclude/--arch "
                                      "or a failed build)"})
            continue
        check_split_k(e, k.split_k)
        check_options(e, k.arch, k.config)
        bad = _op_mismatch(e, k.config)
        if not bad and e.batch > 1 and not k.batched:
            bad = f"batch {e.batch}, but the kernel is not batched"
        if not bad and e.gpu_cc and not k.runs_on(e.gpu_cc):
            bad = f"the table was measured on sm_{e.gpu_cc}, where this {k.arch} kernel cannot run"
        if bad:
            dropped.append({"kernel": e.kernel, "problem": list(e.shape), "source": e.source,
                            "reason": f"the entry does not fit the kernel: {bad}"})
            continue
        groups[(k.op, e.shape, e.gpu_cc)].append(e)
    pairs = []
    for (op, shape, gpu_cc), es in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], by_name[kv[1][0].kernel].index)):
        label = lambda e: ((e.kernel if e.split_k == 1 else f"{e.kernel}@splitk{e.split_k}")  # noqa: E731
                           + (f"@{SchedulerOptions.decode(e.options).label().replace(' ', '_')}" if e.options else ""))
        names = sorted({label(e) for e in es})
        chosen = es[-1]
        if len(names) > 1:
            timed = [e for e in es if e.median_ms is not None]
            if len(timed) == len(es):
                chosen = min(timed, key=lambda e: (e.median_ms, e.kernel, e.split_k, e.options))
                why = "the smallest median_ms"
            else:
                why = "the last one given"
            notes.append(f"tuning: {len(names)} kernels claim {'x'.join(map(str, shape))} for one operation"
                         f"{f' on sm_{gpu_cc}' if gpu_cc else ''} "
                         f"({', '.join(names)}); using {label(chosen)} ({why})")
            for e in es:
                if label(e) != label(chosen):
                    dropped.append({"kernel": e.kernel, "split_k": e.split_k, "problem": list(e.shape), "source": e.source,
                                    "reason": f"conflict: {label(chosen)} was chosen for this shape ({why})"})
        k = by_name[chosen.kernel]
        pairs.append((k.index, *shape, gpu_cc, chosen.split_k, chosen.options))
    return tuning_records(pairs), dropped, notes


def resolve_measured(kernels: Sequence[KernelRecord], entries: Sequence[MeasuredEntry]) -> tuple[list[MeasuredRecord], int]:
    """Measured entries -> measured records over `kernels` (the fastest of repeats of one kernel, shape, split-K
    count and options); entries whose kernel is not in the library, or that do not fit it, are left out
    (counted: the profile times every manifest kernel, the export may hold a subset)."""
    from emitter.families.gemm.options import unsupported_config

    by_name = {k.name: k for k in kernels}
    best: dict[tuple, tuple[int, int]] = {}
    skipped = 0
    for e in entries:
        k = by_name.get(e.kernel)
        if (k is None or (e.split_k > 1 and not k.split_k) or (e.batch > 1 and not k.batched)
                or (e.gpu_cc and not k.runs_on(e.gpu_cc)) or unsupported_config(k.arch, k.config, e.options)
                or _op_mismatch(TuningEntry("", 0, e.kernel, e.m, e.n, e.k, e.batch, op=e.op), k.config)):
            skipped += 1
            continue
        key = (k.index, *e.shape, e.gpu_cc, e.split_k, e.options)
        got = (max(int(round(e.median_ms * 1e9)), 1), e.sms)
        best[key] = min(best.get(key, got), got)
    return measured_records((*key, ps, sms) for key, (ps, sms) in best.items()), skipped


def check_tuning_invariant(kernels: Sequence[KernelRecord], tuning: Sequence[TuningRecord]) -> None:
    """At a profiled shape the library must try that shape's winner first (distance 0, no conflicts)."""
    for t in tuning:
        k = kernels[t.kernel]
        q = Query(op=k.op, m=t.m, n=t.n, k=t.k, batch=t.batch, split_k=1, cc=t.gpu_cc or k.cc)
        order = candidate_order(kernels, tuning, q)
        if not order or order[0].kernel != t.kernel:
            got = kernels[order[0].kernel].name if order else "nothing"
            raise LibraryError(f"internal error: at its own profiled shape {t.m}x{t.n}x{t.k} the dispatch picks {got}, "
                               f"not the tuned {k.name}")


def ops_summary(kernels: Sequence[KernelRecord]) -> str:
    names = {v: k for k, v in DTYPES.items()}
    acts = {v: k for k, v in ACTIVATIONS.items()}
    lay = {1: "row", 2: "col"}
    bias = {0: "", 1: " +bias/row", 2: " +bias/column"}
    seen: list[str] = []
    for k in kernels:
        o = k.op
        s = (f"{names[o.a]} x {names[o.b]} + {names[o.c]} -> {names[o.d]} {lay[o.la]}/{lay[o.lb]}/{lay[o.lc]} "
             f"{acts[o.act]}{bias[o.bias]}{' fast-accum (opt-in)' if o.fast_accum else ''} on {k.arch}")
        if s not in seen:
            seen.append(s)
    text = "; ".join(seen[:8]) + ("; ..." if len(seen) > 8 else "")
    return text.replace("%", "").replace('"', "").replace("\\", "")


def _render(template: str, **ctx: Any) -> str:
    from emitter.render import environment

    return environment().get_template(f"gemm/library/{template}").render(**ctx)


def _places(template: str, ctx: dict[str, Any]) -> dict[str, str]:
    """Each block of templates/gemm/library/<template>, rendered: the text for the shared template's place of
    that name."""
    from emitter.render import environment

    t = environment().get_template(f"gemm/library/{template}")
    context = t.new_context(ctx)
    return {name: "".join(block(context)) for name, block in t.blocks.items()}


def library_pieces(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any]) -> LibraryPieces:
    try:
        kernels = kernel_records(entries)
    except ValueError as e:
        raise LibraryError(str(e)) from None
    sources: dict[str, str] = {}
    for e in entries:
        root = roots[e["name"]].resolve()
        src = (root / e["source"]).resolve()
        if root not in src.parents:
            raise LibraryError(f"{root / 'manifest.json'}: source {e['source']!r} of {e['name']} lies outside the manifest directory")
        try:
            sources[e["name"]] = src.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise LibraryError(f"{src}: missing (listed in {root / 'manifest.json'}); run `emitter emit` again") from None

    t_entries = load_all(ctx.get("tuning_tables", ()), allow_unmeasured=bool(ctx.get("allow_unmeasured_tuning")))
    tuning, dropped, notes = resolve_tuning(kernels, t_entries)
    check_tuning_invariant(kernels, tuning)
    m_entries, m_notes = load_measurements(ctx.get("tuning_tables", ()),
                                           allow_unmeasured=bool(ctx.get("allow_unmeasured_tuning")))
    measured, m_skipped = resolve_measured(kernels, m_entries)
    notes = [*notes, *m_notes] + ([f"tuning: {m_skipped} profile timings left out (kernel not in this library or "
                                   "not fitting it)"] if m_skipped else [])

    glob: dict[str, Any] = dict(
        kernels=kernels, tuning=tuning, measured=measured, sizes=abi.sizes(), ops_summary=ops_summary(kernels),
        activation_clamp=ACTIVATIONS["clamp"], problem_fields=abi.PROBLEM_FIELDS,
        selection_fields=abi.SELECTION_FIELDS, kernel_info_fields=abi.KERNEL_INFO_FIELDS)
    full = {**ctx, **glob}
    lib = ctx["lib"]
    files: dict[str, str] = {
        f"src/{lib}_dispatch.h": _render("dispatch.h.j2", **full),
        f"src/{lib}_kernels.h": _render("kernels.h.j2", **full),
        f"src/{lib}_kernels.cpp": _render("kernels.cpp.j2", **full),
        f"tools/{lib}_dispatch_probe.cpp": _render("dispatch_probe.cpp.j2", **full),
    }
    places: dict[str, str] = {}
    for template in ("header.h.j2", "api.cpp.j2", "table.cpp.j2", "loader.py.j2", "README.md.j2"):
        places.update(_places(template, full))
    for k in kernels:
        files[f"src/instances/{k.name}.cu"] = sources[k.name]
        files[f"src/instances/{k.name}.launch.cu"] = _render("launch.cu.j2", k=k, **full)

    by_index = {k.index: k for k in kernels}
    groups: dict[Any, list[KernelRecord]] = defaultdict(list)
    for k in kernels:
        groups[k.op].append(k)
    manifest = {
        "kernels": [{"index": k.index, "name": k.name, "arch": k.arch, "fallback_rank": k.fallback_rank,
                     "fast_accum": k.fast_accum,
                     "source": f"src/instances/{k.name}.cu", "tuned_shapes": sum(1 for t in tuning if t.kernel == k.index),
                     "config": k.config} for k in kernels],
        "tuning": [{"index": t.index, "kernel": by_index[t.kernel].name, "problem": {"m": t.m, "n": t.n, "k": t.k, "batch": t.batch},
                    "gpu_cc": t.gpu_cc or None, "split_k": t.split_k, "options": t.options,
                    "log2_fixed": [log2_fixed(x) for x in (t.m, t.n, t.k, t.batch)]} for t in tuning],
        "measured": [{"index": r.index, "kernel": by_index[r.kernel].name,
                      "problem": {"m": r.m, "n": r.n, "k": r.k, "batch": r.batch}, "gpu_cc": r.gpu_cc or None,
                      "split_k": r.split_k, "options": r.options, "time_ps": r.time_ps, "sms": r.sms} for r in measured],
        "dispatch": {
            "rule": DISPATCH_RULE,
            "fallback_order": [[k.name for k in sorted(ks, key=lambda k: k.fallback_rank)] for ks in groups.values()],
        },
    }
    return LibraryPieces(family=FAMILY, files=files, globals=glob, places=places, exports=C_FUNCTIONS, manifest=manifest,
                         notes=tuple(notes), kernels=len(kernels),
                         context={"tuning": len(tuning), "measured": len(measured), **({"dropped_tuning": dropped} if dropped else {})})
