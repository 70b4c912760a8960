"""Run a built attention instance on torch tensors, and the float64 torch reference it is checked against.

A small runner for the GPU tests of the sm90a kernels (tests/attention/test_attention_sm90a_gpu.py) and the attention
benchmark (benchmarks/attention_bench.py): the instance's cubin and host shim come from its build record
(<root>/build/<name>/record.json), the shim fills the Params (TMA descriptors) for a problem made from the
tensors' shapes and strides, and emitter/kit/launcher.py launches the kernel with the Params by value on
torch's current stream. torch owns the context (the primary context, current after any torch CUDA call).

Tensors are logical [batch, seq, heads, dim] (q, o: heads_q; k, v: heads_kv), any strides with the head dim
contiguous: a BHSD buffer is passed as its .transpose(1, 2) view. LSE is [batch, heads_q, seq_q] float32.
The reference is written independently of the kernels: float64, explicit masks, KV heads repeated.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path
from typing import Any

from emitter.families.attention.abi import AttentionShim, EmitterAttentionProblem
from emitter.kit.launcher import DriverKernel, PackedParams

STATUS = {0: "ok", 1: "cannot implement", 2: "invalid argument", 3: "buffer too small", 4: "CUDA error",
          5: "internal error"}


class CannotRun(Exception):
    """The shim refused the problem: `status` (EMITTER_*), `reason` (the shim's emitter_<name>_reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{STATUS.get(status, status)}: {reason}")
        self.status = status
        self.reason = reason


def manifest_configs(root: str | Path) -> dict[str, dict[str, Any]]:
    """name -> config of every attention instance in <root>/manifest.json."""
    data = json.loads((Path(root) / "manifest.json").read_text())
    return {e["name"]: e["config"] for e in data["instances"] if e.get("family") == "attention"}


class AttentionKernel:
    """One built attention instance: load once, run many problems."""

    def __init__(self, root: str | Path, name: str) -> None:
        root = Path(root)
        record = json.loads((root / "build" / name / "record.json").read_text())
        if record.get("status") not in ("ok", "cached"):
            raise RuntimeError(f"{name} is not built: {record.get('status')} {record.get('error')}")
        self.name = name
        self.record = record
        self.shim = AttentionShim(root / record["artifacts"]["host"], name)
        self.kernel = DriverKernel(root / record["artifacts"]["cubin"], f"emitter_{name}_kernel")
        reason = getattr(self.shim.lib, f"emitter_{name}_reason", None)
        if reason is not None:
            reason.restype = ctypes.c_char_p
            reason.argtypes = []
        self._reason = reason

    def reason(self) -> str:
        return (self._reason() or b"").decode() if self._reason is not None else ""

    @staticmethod
    def problem(q, k, v, o, lse=None, scale: float = 0.0) -> EmitterAttentionProblem:
        b, sq, hq, d = q.shape
        _, sk, hkv, dk = k.shape
        p = EmitterAttentionProblem()
        p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k = b, hq, hkv, sq, sk
        p.head_dim, p.head_dim_v = d, v.shape[3]
        p.scale = float(scale)
        for field, t in (("stride_q", q), ("stride_k", k), ("stride_v", v), ("stride_o", o)):
            if t.stride(3) != 1:
                raise ValueError(f"{field[7:]}: the head dim must be contiguous")
            arr = getattr(p, field)
            arr[0], arr[1], arr[2] = t.stride(0), t.stride(1), t.stride(2)
        p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        if lse is not None:
            if lse.stride(2) != 1:
                raise ValueError("lse: the seq dim must be contiguous")
            p.stride_lse[0], p.stride_lse[1] = lse.stride(0), lse.stride(1)
            p.lse = lse.data_ptr()
        return p

    @staticmethod
    def problem_varlen(q, k, v, o, cu_seqlens_q, cu_seqlens_k, lse=None, scale: float = 0.0) -> EmitterAttentionProblem:
        """Packed sequences: q, o [total_q, heads_q, dim]; k, v [total_k, heads_kv, dim]; cu_seqlens int32 on the
        device (batch + 1 entries from 0); lse [heads_q, total_q] float32."""
        cq = [int(x) for x in cu_seqlens_q.tolist()]
        ck = [int(x) for x in cu_seqlens_k.tolist()]
        p = EmitterAttentionProblem()
        p.batch, p.heads_q, p.heads_kv = len(cq) - 1, q.shape[1], k.shape[1]
        p.seq_q = max(b - a for a, b in zip(cq, cq[1:]))
        p.seq_k = max(b - a for a, b in zip(ck, ck[1:]))
        p.total_q, p.total_k = q.shape[0], k.shape[0]
        p.head_dim, p.head_dim_v = q.shape[2], v.shape[2]
        p.scale = float(scale)
        for field, t in (("stride_q", q), ("stride_k", k), ("stride_v", v), ("stride_o", o)):
            if t.stride(2) != 1:
                raise ValueError(f"{field[7:]}: the head dim must be contiguous")
            arr = getattr(p, field)
            arr[0], arr[1], arr[2] = 0, t.stride(0), t.stride(1)
        p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        p.cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        if lse is not None:
            p.stride_lse[0], p.stride_lse[1] = 0, lse.stride(0)
            p.lse = lse.data_ptr()
        return p

    def prepare(self, q, k, v, o, lse=None, scale: float = 0.0, stream: int | None = None, *,
                cu_seqlens_q=None, cu_seqlens_k=None):
        """Params for this problem (initialize once): returns launch(), which runs the kernel on `stream`
        (default: torch's current stream) each time it is called. With cu_seqlens: packed varlen tensors."""
        import torch

        if cu_seqlens_q is not None:
            p = self.problem_varlen(q, k, v, o, cu_seqlens_q, cu_seqlens_k, lse, scale)
        else:
            p = self.problem(q, k, v, o, lse, scale)
        status, sizes = self.shim.query(p)
        if status != 0:
            raise CannotRun(status, self.reason())
        # split_kv instances: the shares' partial results and counters (the shim zeroes the counters on `stream`)
        workspace = (torch.empty(int(sizes.workspace_bytes), dtype=torch.uint8, device=q.device)
                     if int(sizes.workspace_bytes) > 0 else None)
        handle = torch.cuda.current_stream().cuda_stream if stream is None else stream
        status, params, launch = self.shim.initialize(p, None if workspace is None else workspace.data_ptr(), handle,
                                                      1 << 16)
        if status != 0:
            raise CannotRun(status, self.reason())
        packed = PackedParams(params)
        grid, block, shared = tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes)
        keep = (q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, workspace)

        def run() -> None:
            _ = keep
            self.kernel.launch(grid, block, shared, handle, packed)
        run.info = {"grid": grid, "block": block, "shared_bytes": shared, "params_bytes": len(params),
                    "params_align": int(launch.params_align), "workspace_bytes": int(sizes.workspace_bytes)}
        run.workspace = workspace
        return run

    def __call__(self, q, k, v, o, lse=None, scale: float = 0.0, *, cu_seqlens_q=None, cu_seqlens_k=None) -> None:
        self.prepare(q, k, v, o, lse, scale, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)()


def reference(q, k, v, *, mask: str = "none", scale: float = 0.0):
    """(O, LSE) in float64 on q's device: O [b, sq, hq, dv], LSE [b, hq, sq]; a query row that sees no key
    has O = 0 and LSE = -inf. mask: none | causal_top_left | causal_bottom_right."""
    import torch

    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    s = scale if scale else 1.0 / math.sqrt(d)
    qd = q.double().permute(0, 2, 1, 3)                                  # b, hq, sq, d
    kd = k.double().permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # b, hq, sk, d
    vd = v.double().permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    scores = torch.matmul(qd, kd.transpose(-1, -2)) * s
    if mask != "none":
        i = torch.arange(sq, device=q.device).view(sq, 1)
        j = torch.arange(sk, device=q.device).view(1, sk)
        shift = (sk - sq) if mask == "causal_bottom_right" else 0
        scores = scores.masked_fill(j > i + shift, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    safe = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - safe)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, vd) / torch.where(total > 0, total, torch.ones_like(total))
    lse = torch.where(total > 0, torch.log(total) + safe, torch.full_like(total, float("-inf"))).squeeze(-1)
    return out.permute(0, 2, 1, 3).contiguous(), lse


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, mask: str = "none", scale: float = 0.0):
    """(O [total_q, hq, dv], LSE [hq, total_q]) in float64, sequence by sequence through reference()."""
    import torch

    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        o_b, l_b = reference(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                             mask=mask, scale=scale)
        out[cq[b]:cq[b + 1]] = o_b[0]
        lse[:, cq[b]:cq[b + 1]] = l_b[0]
    return out, lse


def compare(got, want, *, tol: float) -> dict[str, Any]:
    """Relative Frobenius error and the worst element; NaN or an unwritten (poisoned) element never passes."""
    import torch

    g = got.double()
    finite_want = torch.isfinite(want)
    nonfinite = int((~torch.isfinite(g) & finite_want).sum())
    mismatch_inf = int((torch.isinf(want) & (g != want)).sum())
    diff = torch.where(finite_want, g - want, torch.zeros_like(g))
    diff = torch.nan_to_num(diff, nan=float("inf"))
    denom = float(torch.linalg.vector_norm(torch.where(finite_want, want, torch.zeros_like(want)))) or 1.0
    rel = float(torch.linalg.vector_norm(diff)) / denom
    worst = int(torch.argmax(diff.abs()))
    ok = nonfinite == 0 and mismatch_inf == 0 and rel <= tol
    return {"passed": ok, "rel_err": rel, "tol": tol, "nonfinite": nonfinite, "inf_mismatch": mismatch_inf,
            "max_abs_err": float(diff.abs().max()), "worst_index": worst}


# ---------------------------------------------------------------------------------- any length (gapped rows)
# Each sequence sits in a buffer GAP rows longer than itself: O's and LSE's extra rows hold poison (NaN), so a
# kernel that stores a row past seq_q leaves a mark there; K's and V's extra rows hold finite data, so a kernel
# that reads a key past seq_k sees one more key (LSE too high), not a NaN.
GAP = 3
PLANTS = ("rows_past_end", "last_row_dropped", "key_past_end")   # predicates off by one, planted at launch


def gapped_tensors(b: int, sq: int, sk: int, hq: int, hkv: int, d: int, *, dtype, layout: str = "bshd",
                   lse: bool = True, gap: int = GAP, seed: int = 0, magnitude: float = 1.0,
                   device: str = "cuda") -> dict[str, Any]:
    """Storage for one problem with `gap` spare rows after each (batch, head)'s sequence: {"q", "k", "v", "o"}
    [b, s + gap, h, d] (bshd) or [b, h, s + gap, d] (bhsd), "lse" [b, hq, sq + gap] (None without LSE). O and
    LSE are poisoned (NaN) everywhere; take views of any length with rows_view()."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def buf(s: int, h: int, scale: float | None) -> Any:
        shape = (b, s + gap, h, d) if layout == "bshd" else (b, h, s + gap, d)
        if scale is None:
            return torch.full(shape, float("nan"), device=device, dtype=dtype)
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    out = {"q": buf(sq, hq, magnitude), "k": buf(sk, hkv, magnitude), "v": buf(sk, hkv, 1.0), "o": buf(sq, hq, None),
           "lse": torch.full((b, hq, sq + gap), float("nan"), device=device, dtype=torch.float32) if lse else None,
           "layout": layout, "sq": sq, "sk": sk, "device": device}
    return out


def rows_view(t: dict[str, Any], name: str, rows: int) -> Any:
    """The logical view of the first `rows` rows of buffer `name`: [b, rows, h, d] (lse: [b, hq, rows])."""
    base = t[name]
    if base is None:
        return None
    if name == "lse":
        return base[:, :, :rows]
    return base[:, :rows] if t["layout"] == "bshd" else base[:, :, :rows].transpose(1, 2)


def run_gapped(kern: Any, t: dict[str, Any], *, scale: float = 0.0, plant: str | None = None) -> None:
    """Launch kern(q, k, v, o, lse, scale) (an AttentionKernel) on the gapped storage with the true lengths,
    or with a planted off-by-one (PLANTS): the kernel told seq_q + 1 (O / LSE stores one row past the end: the
    gap's poison overwritten), seq_q - 1 (the last row never stored) or seq_k + 1 (the key-tail bound one
    late: a key past the end visible)."""
    import torch

    sq, sk = t["sq"], t["sk"]
    if plant not in (None,) + PLANTS:
        raise ValueError(f"unknown plant {plant!r}: one of {', '.join(PLANTS)}")
    tq = sq + 1 if plant == "rows_past_end" else sq - 1 if plant == "last_row_dropped" else sq
    tk = sk + 1 if plant == "key_past_end" else sk
    if tq < 1:
        raise ValueError("last_row_dropped needs seq_q >= 2")
    kern(rows_view(t, "q", tq), rows_view(t, "k", tk), rows_view(t, "v", tk), rows_view(t, "o", tq),
         rows_view(t, "lse", tq), scale)
    if t["device"] != "cpu":
        torch.cuda.synchronize()


def _bhsd_rows(x: Any, layout: str) -> Any:
    """A [b, s, h, d] (bshd storage) or [b, h, s, d] (bhsd storage) buffer as numpy [b, h, s, d] float64."""
    a = x.double().cpu().numpy()
    return a.transpose(0, 2, 1, 3) if layout == "bshd" else a


def check_gapped(t: dict[str, Any], mask: str, dtype: str, *, scale: float = 0.0) -> dict[str, Any]:
    """The verdict of a run_gapped() launch against the float64 reference of the true lengths (row_verdict)."""
    want_o, want_lse = reference(rows_view(t, "q", t["sq"]), rows_view(t, "k", t["sk"]), rows_view(t, "v", t["sk"]),
                                 mask=mask, scale=scale)
    lse = t["lse"]
    return row_verdict(_bhsd_rows(t["o"], t["layout"]), None if lse is None else lse.double().cpu().numpy(),
                       want_o.permute(0, 2, 1, 3).cpu().numpy(), want_lse.cpu().numpy(), dtype)


def row_verdict(o_rows, lse_rows, want_o, want_lse, dtype: str) -> dict[str, Any]:
    """Row by row, numpy: o_rows [b, h, sq + gap, d] and lse_rows [b, h, sq + gap] (None: no LSE) as the
    kernel left them (NaN = never written), want_o [b, h, sq, d] / want_lse [b, h, sq] the reference. Counts
    (b, h, row) rows: stray_rows (a row past seq_q written), unwritten_rows (a row below seq_q with an element
    still NaN), empty_row_errors (a row that sees no key and is not O = 0, LSE = -inf), lse_high_rows /
    lse_low_rows (LSE above / below the reference beyond tolerance: an extra key raises it), lse_inf_mismatch,
    o_bad_rows (O off by more than the dtype's tolerance x max |O|). status PASSED only with every count 0."""
    import numpy as np

    from emitter.dtypes import DType
    from emitter.families.attention.tolerances import lse_tolerance, o_tolerance

    sq = want_o.shape[2]
    o_in, o_gap = o_rows[:, :, :sq], o_rows[:, :, sq:]
    stray = ~np.isnan(o_gap).all(axis=3)
    unwritten = np.isnan(o_in).any(axis=3)
    scale = float(np.abs(want_o).max()) if want_o.size else 0.0
    scale = scale if scale > 0 else 1.0
    tol = o_tolerance(DType[dtype])
    with np.errstate(invalid="ignore"):
        err = np.abs(np.where(np.isnan(o_in), 0.0, o_in) - want_o)
    o_bad = (err > tol * scale).any(axis=3) | ~np.isfinite(o_in).all(axis=3)
    empty = np.isneginf(want_lse)
    empty_bad = empty & ((o_in != 0).any(axis=3) | np.isnan(o_in).any(axis=3))
    high = low = inf_mis = np.zeros_like(unwritten)
    lse_max = 0.0
    if lse_rows is not None:
        l_in, l_gap = lse_rows[:, :, :sq], lse_rows[:, :, sq:]
        stray = stray | ~np.isnan(l_gap)
        unwritten = unwritten | np.isnan(l_in)
        inf_mis = (np.isneginf(l_in) != empty) & ~np.isnan(l_in)
        both = np.isfinite(l_in) & ~empty
        with np.errstate(invalid="ignore"):
            lerr = np.where(both, np.abs(l_in - want_lse), 0.0)
            lbad = lerr > lse_tolerance(np.where(empty, 0.0, np.abs(want_lse)))
            high, low = lbad & (l_in > want_lse), lbad & (l_in < want_lse)
        lse_max = float(lerr.max()) if lerr.size else 0.0
        empty_bad = empty_bad | (empty & ~np.isneginf(l_in))
    counts = {"stray_rows": int(stray.sum()), "unwritten_rows": int(unwritten.sum()),
              "empty_row_errors": int(empty_bad.sum()), "lse_high_rows": int(high.sum()),
              "lse_low_rows": int(low.sum()), "lse_inf_mismatch": int(inf_mis.sum()),
              "o_bad_rows": int((o_bad & ~unwritten).sum())}
    words = {"stray_rows": "rows past seq_q written", "unwritten_rows": "rows below seq_q not written",
             "empty_row_errors": "rows without keys not O = 0 / LSE = -inf", "lse_high_rows": "LSE too high",
             "lse_low_rows": "LSE too low", "lse_inf_mismatch": "LSE -inf where the reference is finite or back",
             "o_bad_rows": f"O off by more than {tol:g} x max|O|"}
    reasons = [f"{words[k]}: {v}" for k, v in counts.items() if v]
    return {"status": "FAILED" if reasons else "PASSED", "reason": "; ".join(reasons),
            "o_max_err": float(err.max() / scale) if err.size else 0.0, "lse_max_err": lse_max,
            "first_stray_row": int(np.argwhere(stray)[0][2]) + sq if stray.any() else None, **counts}


# Bugs planted in the rendered source of an instance (its own predicates off by one, a combine that drops a
# share), built beside the real ones by the GPU tests: (kind, which configs, [(exact text, replacement)]). Each
# must be caught for its reason (expected_reason).
COMPILED_PLANTS = (
    # the LSE store's row predicate one row late: row seq_q written
    ("lse_row_past_end", lambda c: c["lse"] and not c["varlen"] and c["schedule"] != "split_kv",
     [("* get<0>(tile_shape) < seqlen_q) {", "* get<0>(tile_shape) <= seqlen_q) {")]),
    # the O descriptor one row longer than the sequence: TMA stores row seq_q
    ("o_row_past_end", lambda c: not c["varlen"] and c["schedule"] != "split_kv",
     [("return Params{UpstreamEpilogue::to_underlying_arguments(problem_size, args, workspace),",
       "return Params{UpstreamEpilogue::to_underlying_arguments(cute::make_tuple(get<0>(problem_size), "
       "get<1>(problem_size), get<2>(problem_size) + 1, get<3>(problem_size), get<4>(problem_size)), args, workspace),")]),
    # the key tail one key late: key seq_k (zero-filled by TMA) visible, where causality does not hide it
    ("key_tail_one_late", lambda c: c["key_tail"] and c["lse"] and not c["varlen"] and c["schedule"] != "split_kv"
     and c["mask"] != "causal_bottom_right",
     [("masked = masked || k >= seq_k;", "masked = masked || k > seq_k;")]),
    # the split-KV combine without the first share
    ("split_drops_share", lambda c: c["schedule"] == "split_kv" and c["lse"],
     [("          for (int s = 0; s < splits; ++s) {\n            const float w",
       "          for (int s = 1; s < splits; ++s) {\n            const float w")]),
    # packed heads: each row's O stored as the next query head of its group (a permutation of the group's heads:
    # every row written, LSE right, O wrong)
    ("packed_wrong_head", lambda c: c["schedule"] == "split_kv",
     [("int64_t(r % pack) * params.stride_o_group;", "int64_t((r + 1) % pack) * params.stride_o_group;")]),
)


def expected_reason(plant: str, verdict: dict[str, Any], *, rows: int, lse: bool = True) -> bool:
    """A planted bug is caught for its reason: rows_past_end / lse_row_past_end / o_row_past_end -> exactly the
    row seq_q of each of the `rows` (batch, head) pairs stored; last_row_dropped -> exactly those rows' last
    row missing; key_past_end / key_tail_one_late -> with LSE: LSE too high somewhere and never too low (an
    extra visible key only adds probability mass); without: O off on some rows, every row written and none past
    the end; split_drops_share -> LSE too low somewhere and never too high (a share's mass missing);
    packed_wrong_head -> O off on some rows, every row written, none past the end, LSE right."""
    if plant in ("rows_past_end", "lse_row_past_end", "o_row_past_end"):
        return verdict["stray_rows"] == rows and verdict["first_stray_row"] is not None
    if plant == "split_drops_share":
        return verdict["lse_low_rows"] > 0 and verdict["lse_high_rows"] == 0 and verdict["stray_rows"] == 0
    if plant == "packed_wrong_head":
        return (verdict["o_bad_rows"] > 0 and verdict["unwritten_rows"] == 0 and verdict["stray_rows"] == 0
                and verdict["lse_low_rows"] == 0 and verdict["lse_high_rows"] == 0)
    if plant == "key_tail_one_late":
        plant = "key_past_end"
    if plant == "last_row_dropped":
        return verdict["unwritten_rows"] == rows
    if plant == "key_past_end":
        if lse:
            return verdict["lse_high_rows"] > 0 and verdict["lse_low_rows"] == 0
        return verdict["o_bad_rows"] > 0 and verdict["stray_rows"] == 0 and verdict["unwritten_rows"] == 0
    raise ValueError(plant)


def time_ms(run, *, warmup: int = 5, iters: int = 30) -> float:
    """Median milliseconds of run() over `iters` launches, CUDA events around each on torch's stream."""
    import torch

    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        z.record()
        z.synchronize()
        times.append(a.elapsed_time(z))
    times.sort()
    return times[len(times) // 2]


__all__ = ["AttentionKernel", "CannotRun", "reference", "reference_varlen", "compare", "manifest_configs", "GAP",
           "PLANTS", "COMPILED_PLANTS", "gapped_tensors", "rows_view", "run_gapped", "check_gapped", "row_verdict",
           "expected_reason", "time_ms"]
