"""The verdict of one attention case: outputs (device storage) against the float64 reference.

Every O element must be written (poison gone) and finite, nothing outside the rows written (padding keeps
its poison); LSE (when on) must be written, never NaN, -inf
exactly where the reference's row sees no key. Errors: O relative to max |ref O|, LSE absolute (tolerances.py).
Besides PASSED/FAILED the verdict says *where* it failed, so a planted bug is caught for its reason:
`failed_heads` (query heads with a failing element), `failed_batches` (sequences), `failed_rows` / `failed_masked_rows` (rows whose keys the
causal mask partly hides) / `failed_full_rows`, `lse_failed`, `lse_high_rows` / `lse_low_rows` (LSE above / below the reference: an extra key
raises it), and the worst element's coordinates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emitter.families.attention.inputs import gather_outputs
from emitter.families.attention.problem import AttentionProblem, visible_keys
from emitter.families.attention.tolerances import lse_tolerance, o_tolerance


def compare(inst, p: AttentionProblem, inputs, outputs: dict[str, np.ndarray], ref: dict[str, list]) -> dict[str, Any]:
    got = gather_outputs(inst, p, outputs)
    tol = o_tolerance(inst.dtype)
    scale = max((float(np.max(np.abs(o))) for o in ref["o"] if o.size), default=0.0)
    scale = scale if scale > 0 else 1.0
    unwritten = nonfinite = mismatches = 0
    lse_unwritten = lse_nan = lse_mismatches = lse_inf_mismatch = 0
    max_abs = 0.0
    lse_max = 0.0
    worst: dict[str, Any] = {}
    failed_heads: set[int] = set()
    failed_rows = failed_masked = failed_full = 0
    failed_batches: list[int] = []
    lse_high = lse_low = 0
    mask = inst.mask.value
    for b, (sq, sk) in enumerate(p.lengths()):
        o, want = got["o"][b], ref["o"][b]
        uw = got["o_unwritten"][b]
        unwritten += int(uw.sum())
        bad_nf = ~np.isfinite(o) & ~uw
        nonfinite += int(bad_nf.sum())
        err = np.where(np.isfinite(o) & ~uw, np.abs(o - want), np.inf)
        bad = err > tol * scale
        row_bad = bad.any(axis=2)                        # [Hq, sq]
        if inst.lse and got["lse"]:
            lse, lwant = got["lse"][b], ref["lse"][b]
            luw = got["lse_unwritten"][b]
            lse_unwritten += int(luw.sum())
            lse_nan += int((np.isnan(lse) & ~luw).sum())
            both_inf = np.isneginf(lse) & np.isneginf(lwant)
            inf_mis = (np.isneginf(lwant) != np.isneginf(lse)) & ~luw
            lse_inf_mismatch += int(inf_mis.sum())
            with np.errstate(invalid="ignore"):
                lerr = np.where(both_inf, 0.0, np.abs(lse - lwant))
            lerr = np.where(np.isnan(lerr) | luw, np.inf, lerr)
            lbad = lerr > lse_tolerance(np.where(np.isfinite(lwant), np.abs(lwant), 0.0))
            with np.errstate(invalid="ignore"):
                lse_high += int((lbad & (lse > lwant)).sum())     # more probability mass than the reference:
                lse_low += int((lbad & (lse < lwant)).sum())      # an extra key, a missing mask
            lse_mismatches += int(lbad.sum())
            finite = lerr[np.isfinite(lerr)]
            if finite.size:
                lse_max = max(lse_max, float(finite.max()))
            if np.isinf(lerr).any():
                lse_max = float("inf")
            row_bad = row_bad | lbad
        mismatches += int(bad.sum())
        finite = err[np.isfinite(err)]
        if finite.size and float(finite.max()) > max_abs:
            max_abs = float(finite.max())
        if np.isinf(err).any():
            max_abs = float("inf")
        if bad.any():
            h, i, d = np.unravel_index(int(np.argmax(np.where(np.isinf(err), np.finfo(np.float64).max, err))), err.shape)
            if not worst or err[h, i, d] > worst.get("_err", -1.0):
                worst = {"batch": b, "head": int(h), "row": int(i), "col": int(d), "got": float(o[h, i, d]),
                         "want": float(want[h, i, d]), "_err": float(err[h, i, d])}
        for h in np.nonzero(row_bad.any(axis=1))[0]:
            failed_heads.add(int(h))
        rows = np.nonzero(row_bad.any(axis=0))[0]
        if rows.size:
            failed_batches.append(b)
        failed_rows += int(rows.size)
        for i in rows:
            if visible_keys(mask, sq, sk, int(i)) < sk:
                failed_masked += 1
            else:
                failed_full += 1
    worst.pop("_err", None)
    rel = max_abs / scale
    stray = got["o_stray"] + got["lse_stray"]
    reasons = []
    if stray:
        reasons.append(f"{got['o_stray']} O and {got['lse_stray']} LSE elements written outside the rows of the "
                       f"problem (stray writes into padding)")
    if unwritten:
        reasons.append(f"{unwritten} output elements never written (still poison)")
    if nonfinite:
        reasons.append(f"{nonfinite} output elements are NaN/inf")
    if mismatches:
        reasons.append(f"O: {mismatches} elements off by more than {tol:g} x max|O| ({scale:.3g}); "
                       f"max error {rel:.3g} x max|O|")
    if inst.lse:
        if lse_unwritten:
            reasons.append(f"LSE: {lse_unwritten} values never written")
        if lse_nan:
            reasons.append(f"LSE: {lse_nan} NaN")
        if lse_inf_mismatch:
            reasons.append(f"LSE: {lse_inf_mismatch} rows -inf in one and finite in the other")
        if lse_mismatches:
            reasons.append(f"LSE: {lse_mismatches} values off (max abs error {lse_max:.3g})")
    failed = bool(reasons)
    return {
        "status": "FAILED" if failed else "PASSED",
        "reason": "; ".join(reasons) if failed else "",
        "check": "tolerance",
        "rel_err": rel,
        "tol": tol,
        "max_abs_err": max_abs,
        "lse_max_abs_err": lse_max if inst.lse else None,
        "worst": worst,
        "unwritten": unwritten + lse_unwritten,
        "nonfinite": nonfinite + lse_nan,
        "mismatches": mismatches + lse_mismatches + lse_inf_mismatch,
        "lse_failed": bool(lse_unwritten or lse_nan or lse_inf_mismatch or lse_mismatches),
        "failed_heads": sorted(failed_heads),
        "failed_rows": failed_rows,
        "failed_masked_rows": failed_masked,
        "failed_full_rows": failed_full,
        "failed_batches": failed_batches,
        "lse_high_rows": lse_high,
        "lse_low_rows": lse_low,
        "stray_writes": stray,
    }


__all__ = ["compare"]
