"""A family-local GPU path for conv instances: load the cubin + host shim a build wrote, run problems on torch
CUDA tensors, poison the output, compare with a float64 reference, print PASS/FAIL per case.

    python3 -m emitter.families.conv.runner <manifest dir> [--select GLOB] [--quick] [--planted] [--json out.json]

torch owns the CUDA context (its primary context) and the memory; the cubin is loaded into that same current
context with emitter.kit.launcher (cuLaunchKernel's kernelParams array keeps the 128-byte alignment of sm90
conv Params) and the host shim's runtime calls use it too, as the profile baselines share buffers with torch
(emitter/kit/torch_interop.py). Planted bugs (--planted) check that verification catches what a broken kernel
would do: wrong padding, swapped filter axes, stride ignored, one output row short -- each must FAIL, and for its
own reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from emitter.dtypes import DType
from emitter.families.conv import check as _check
from emitter.families.conv import runtime as hooks
from emitter.families.conv.abi import ConvShim, c_problem_from
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.problem import ConvProblem
from emitter.fsutil import resolve_inside
from emitter.kit import hostdata
from emitter.kit.launcher import DriverKernel, PackedParams
from emitter.kit.shim import EMITTER_BUFFER_TOO_SMALL, EMITTER_CANNOT_IMPLEMENT, EMITTER_OK, status_name


class CannotRun(Exception):
    """The shim answered EMITTER_CANNOT_IMPLEMENT (or the problem is not supported)."""


def _torch():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    torch.cuda.init()
    torch.empty(1, device="cuda")        # the runtime makes the primary context current on this thread
    return torch


_TORCH_STORAGE = {"float16": "float16", "float32": "float32", "int8": "int8", "int32": "int32"}


def to_device(torch, storage: np.ndarray | None, dt: DType, device: str = "cuda"):
    """A device tensor holding exactly the storage bytes (bf16's uint16 patterns become bfloat16)."""
    if storage is None:
        return None
    arr = np.ascontiguousarray(storage)
    if dt is DType.bf16:
        return torch.from_numpy(arr.view(np.int16)).to(device).view(torch.bfloat16)
    return torch.from_numpy(arr).to(device)


def to_host(torch, tensor, dt: DType) -> np.ndarray:
    t = tensor.detach()
    if dt is DType.bf16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy().astype(hostdata.storage_dtype(dt), copy=False)


class ConvKernel:
    """One built conv instance, ready to launch on torch tensors."""

    def __init__(self, root: str | Path, entry: Mapping[str, Any]) -> None:
        self.torch = _torch()
        self.root = Path(root)
        self.entry = dict(entry)
        self.cfg: ConvConfig = hooks.config_from_entry(entry, root)
        self.name = self.cfg.name
        rec_path = self.root / "build" / self.name / "record.json"
        record = json.loads(rec_path.read_text())
        if record.get("status") not in ("ok", "cached"):
            raise RuntimeError(f"{self.name}: build {record.get('status')}: {str(record.get('error'))[:300]}")
        arts = record["artifacts"]
        self.shim = ConvShim(resolve_inside(self.root, arts["host"], "host shim"), self.name)
        self.fn = DriverKernel(resolve_inside(self.root, arts["cubin"], "cubin"), f"emitter_{self.name}_kernel")
        self._cache: dict[Any, Any] = {}

    def prepare(self, p: ConvProblem, ptrs: dict[str, int], stream: int = 0):
        """(PackedParams, launch) for problem p on device pointers ptrs; workspace kept alive in self."""
        prob = c_problem_from(p, ptrs)
        status, q = self.shim.query(prob)
        if status == EMITTER_CANNOT_IMPLEMENT:
            raise CannotRun(f"{self.name}: EMITTER_CANNOT_IMPLEMENT for {p.label()}")
        if status != EMITTER_OK:
            raise RuntimeError(f"{self.name}: query returned {status_name(status)}")
        ws = None
        if q.workspace_bytes > 0:
            ws = self.torch.zeros(int(q.workspace_bytes), dtype=self.torch.uint8, device="cuda")
        cap = max(int(q.params_bytes), 64)
        status, params, launch = self.shim.initialize(prob, ws.data_ptr() if ws is not None else 0, stream, cap)
        if status == EMITTER_BUFFER_TOO_SMALL:
            status, params, launch = self.shim.initialize(prob, ws.data_ptr() if ws is not None else 0, stream,
                                                          int(launch.params_bytes))
        if status != EMITTER_OK:
            raise (CannotRun if status == EMITTER_CANNOT_IMPLEMENT else RuntimeError)(
                f"{self.name}: initialize returned {status_name(status)}")
        self._workspace = ws
        self.fn.allow_shared(int(launch.shared_bytes))
        return PackedParams(params), launch

    def launch(self, packed: PackedParams, launch, stream: int = 0) -> None:
        self.fn.launch(tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes), stream, packed)

    def run(self, p: ConvProblem, tensors: dict[str, Any]) -> dict[str, Any]:
        """Launch once on `tensors` (x, w, y, source, bias: torch tensors or None) on torch's current stream."""
        torch = self.torch
        stream = torch.cuda.current_stream().cuda_stream
        ptrs = {k: (v.data_ptr() if v is not None else 0) for k, v in tensors.items()}
        packed, launch = self.prepare(p, ptrs, stream)
        self.launch(packed, launch, stream)
        torch.cuda.synchronize()
        return launch.as_dict()


# ------------------------------------------------------------------------------------------------ verification
PLANTED = ("wrong_padding", "swapped_filter_axes", "stride_ignored", "row_short")
GROUP_PLANTED = ("group_offset",)      # grouped instances: every group handed group 0's input channels


def planted_bugs(cfg: ConvConfig) -> tuple[str, ...]:
    """The planted bugs that apply to an instance: a `kernel: gemm_1x1` instance runs 1x1, stride-1, unpadded
    problems only (padding and stride bugs are refused, and swapping R and S of a 1x1 filter changes nothing);
    a grouped instance also gets the wrong group offset."""
    if cfg.kernel == "gemm_1x1":
        return ("row_short",)
    if cfg.kernel == "depthwise_direct":   # depthwise problems only; a compiled stride refuses the stride-1 launch
        runtime_stride = tuple(cfg.conv_stride) == (0, 0)
        return tuple(b for b in PLANTED if b != "stride_ignored" or runtime_stride) + GROUP_PLANTED
    if cfg.kernel == "depthwise_simt":     # run-time stride; the group offset planted where x is read (fprop, wgrad)
        return PLANTED + (GROUP_PLANTED if cfg.op != "dgrad" else ())
    return PLANTED + GROUP_PLANTED if cfg.group_mode != "none" else PLANTED


def planted_problem(cfg: ConvConfig) -> ConvProblem:
    """A problem every planted bug changes visibly: 3x3, stride 2, padding 1, odd sizes (1x1 for gemm_1x1; four
    groups for a grouped instance, K/groups its tile n (single) or half of it (multiple))."""
    if cfg.kernel == "depthwise_simt":     # its filter at stride 2; channels: a CTA's block and a part
        r, s = cfg.filter or (3, 3)
        c = cfg.tile[2] + 8
        return ConvProblem(n=2, h=15 + r - 1, w=13 + s - 1, c=c, k=c, groups=c, r=r, s=s, pad_front=(0, r // 2, s // 2),
                           pad_back=(0, r // 2, s // 2), stride=(1, 2, 2))
    if cfg.kernel == "depthwise_direct":   # its filter, stride and dilation; channels: a CTA's block and a part
        r, s = cfg.filter or (3, 3)
        st = cfg.conv_stride if cfg.conv_stride and tuple(cfg.conv_stride) != (0, 0) else (2, 2)
        dl = cfg.conv_dilation if cfg.conv_dilation and tuple(cfg.conv_dilation) != (0, 0) else (1, 1)
        c = cfg.tile[2] + max(cfg.alignment_a, 8)
        return ConvProblem(n=2, h=15 + dl[0] * (r - 1), w=13 + dl[1] * (s - 1), c=c, k=c, groups=c, r=r, s=s,
                           pad_front=(0, r // 2, s // 2), pad_back=(0, r // 2, s // 2), stride=(1,) + tuple(st),
                           dilation=(1,) + tuple(dl))
    if cfg.group_mode != "none":
        cg = 3 * max(cfg.alignment_a, cfg.alignment_b)
        kg = cfg.tile[1] if cfg.group_mode == "single" else cfg.tile[1] // 2
        return ConvProblem(n=2, h=15, w=13, c=4 * cg, k=4 * kg, groups=4, r=3, s=3, pad_front=(0, 1, 1),
                           pad_back=(0, 1, 1), stride=(1, 2, 2))
    al = max(cfg.alignment_a, cfg.alignment_b, cfg.alignment_c, 8)
    if cfg.kernel == "gemm_1x1":
        return ConvProblem(n=2, h=15, w=13, c=al * 3, k=al * 5, r=1, s=1, bias=cfg.bias)
    return ConvProblem(n=2, h=15, w=13, c=al * 3, k=al * 5, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                       stride=(1, 2, 2) if cfg.stride_support != "unity" else (1, 1, 1))


def run_case(kern: ConvKernel, p: ConvProblem, data: str, seed: int, planted: str | None = None,
             device_reference: bool = True) -> dict[str, Any]:
    """One verify case on the GPU: fresh inputs, poisoned output, launch, compare with the float64 reference.
    `planted` runs the kernel on a deliberately wrong launch (the reference stays right)."""
    torch = kern.torch
    device = getattr(kern, "device", "cuda")      # "cpu" only in tests of this bookkeeping (a stand-in kernel)
    cfg = kern.cfg
    inputs = hooks.make_inputs(cfg, p, data, seed)
    in_dt = DType.f32 if cfg.a is DType.tf32 else cfg.a
    dts = {"x": in_dt, "w": in_dt, "y": in_dt, "source": cfg.c, "bias": cfg.c}
    out_name = inputs.outputs[0]
    dts[out_name] = cfg.c
    dev = {k: to_device(torch, v, dts[k], device) for k, v in inputs.buffers.items()}
    launch_p = p
    if planted == "wrong_padding":
        # no bounds check on the halo: the kernel runs unpadded on the image grown by the padding, the halo
        # holding what memory holds there (fprop, wgrad read it); dgrad's halo gradient is added into the
        # memory it aliases after the launch (check.fold_halo)
        launch_p = _check.unpadded(p)
        if out_name == "x":
            dev["x"] = to_device(torch, np.full(launch_p.shape("x"), hostdata.poison_value(cfg.c),
                                                dtype=hostdata.storage_dtype(cfg.c)), cfg.c, device)
        else:
            dev["x"] = to_device(torch, _check.grow_with_halo(inputs.buffers["x"], p), in_dt, device)
    elif planted == "swapped_filter_axes":   # the filter handed over with R and S exchanged
        if p.r != p.s:
            raise ValueError(f"planted swapped_filter_axes needs a square filter (R = S), not R={p.r} S={p.s}")
        if out_name != "w":
            dev["w"] = dev["w"].transpose(2, 3).contiguous()
    elif planted == "group_offset":          # every group reads group 0's input channels (offset never applied)
        if p.groups < 2:
            raise ValueError("planted group_offset needs a grouped problem (groups > 1)")
        cg = p.c // p.groups
        if out_name == "x":
            raise ValueError("planted group_offset is planted where x is read: grouped fprop and wgrad")
        dev["x"] = dev["x"][..., :cg].repeat(1, 1, 1, 1, p.groups).contiguous()
    elif planted == "stride_ignored":        # the kernel runs stride 1 into a larger output; we read its corner
        launch_p = replace(p, stride=(1, 1, 1))
        big = launch_p.shape(out_name)
        if out_name == "y":
            full = to_device(torch, np.full(big, hostdata.poison_value(cfg.c), dtype=hostdata.storage_dtype(cfg.c)), cfg.c,
                             device)
            if dev.get("source") is not None:
                src = torch.zeros(big, dtype=dev["source"].dtype, device=device)
                src[:, :, :p.shape("y")[2], :p.shape("y")[3]] = dev["source"]
                dev["source"] = src
            dev["y_small"], dev["y"] = dev["y"], full
        elif out_name == "x":                # dgrad reads dy of the stride-1 geometry: pad dy with zeros
            big_y = launch_p.shape("y")
            dy = torch.zeros(big_y, dtype=dev["y"].dtype, device=device)
            dy[:, :, :p.shape("y")[2], :p.shape("y")[3]] = dev["y"]
            dev["y"] = dy
        else:                                # wgrad: dy of the stride-1 geometry, zero-padded
            big_y = launch_p.shape("y")
            dy = torch.zeros(big_y, dtype=dev["y"].dtype, device=device)
            dy[:, :, :p.shape("y")[2], :p.shape("y")[3]] = dev["y"]
            dev["y"] = dy
    elif planted == "row_short":             # the last output row is never computed, every other one right
        if out_name == "y":
            # the image cut after the last input row that output row P-2 reads, no bottom padding: P-1 rows. Where
            # that row is bottom padding (a 5x5 at padding 2, stride 1) the image stays whole and keeps the padding
            # rows P-2 reads: a problem taller than the tensor would read past the caller's buffer.
            pp = p.output_extents()[1]
            rows = (pp - 2) * p.stride[1] - p.pad_front[1] + (p.r - 1) * p.dilation[1] + 1
            keep = min(rows, p.h)
            launch_p = replace(p, h=keep, pad_back=(p.pad_back[0], rows - keep, p.pad_back[2]))
            assert launch_p.output_extents()[1] == pp - 1, (p, launch_p)
            dev["x"] = dev["x"][:, :, :keep].contiguous()
            assert dev["x"].shape[2] == launch_p.h, (dev["x"].shape, launch_p)   # never a problem past the tensor
            dev["y_small"] = dev["y"]
            dev["y"] = dev["y"][:, :, :pp - 1].contiguous()
        elif out_name == "x" and cfg.kernel == "gemm_1x1":
            # a 1x1, stride-1, unpadded dgrad: dx row h reads dy row h only, so the problem one row shorter (dy's
            # last row dropped too) leaves exactly dx's last row unwritten (padding would be refused)
            launch_p = replace(p, h=p.h - 1)
            dev["x_small"] = dev["x"]
            dev["x"] = dev["x"][:, :, :p.h - 1].contiguous()
            dev["y"] = dev["y"][:, :, :p.h - 1].contiguous()
            if dev.get("source") is not None:
                dev["source"] = dev["source"][:, :, :p.h - 1].contiguous()
        elif out_name == "x":
            # the last input row made bottom padding: dy keeps its rows, the gradient of that row is dropped
            launch_p = replace(p, h=p.h - 1, pad_back=(p.pad_back[0], p.pad_back[1] + 1, p.pad_back[2]))
            assert launch_p.output_extents() == p.output_extents(), (p, launch_p)
            dev["x_small"] = dev["x"]
            dev["x"] = dev["x"][:, :, :p.h - 1].contiguous()
        else:
            launch_p = replace(p, k=p.k - (cfg.alignment_c if p.k > cfg.alignment_c else 0))
            if p.groups == p.c == p.k > 1:       # depthwise: C and the groups shrink with K (x cut to C - 8 channels)
                launch_p = replace(launch_p, c=launch_p.k, groups=launch_p.k)
                dev["x"] = dev["x"][..., :launch_p.k].contiguous()
            dev["w_small"] = dev["w"]
            dev["w"] = dev["w"][:launch_p.k].contiguous()
            dev["y"] = dev["y"][..., :launch_p.k].contiguous()
            if dev.get("source") is not None:
                dev["source"] = dev["source"][:launch_p.k].contiguous()
    t0 = time.perf_counter()
    try:
        info = kern.run(launch_p, {k: dev.get(k) for k in ("x", "w", "y", "source", "bias")})
    except CannotRun as e:
        return {"status": "SKIPPED", "reason": str(e), "problem": p.label(data), "planted": planted}
    wall = time.perf_counter() - t0
    out_t = dev[out_name]
    if planted == "stride_ignored" and out_name == "y":
        z, pp, q = p.output_extents()
        out_t = out_t[:, :z, :pp, :q]
    if planted == "row_short":
        full = dev[f"{out_name}_small"]
        if out_name == "y":
            full[:, :, :out_t.shape[2]] = out_t
        elif out_name == "x":
            full[:, :, :p.h - 1] = out_t
        else:
            full[:out_t.shape[0]] = out_t
        out_t = full
    got = to_host(torch, out_t.contiguous(), cfg.c)
    if planted == "wrong_padding" and out_name == "x":
        got = _fold_output(cfg, p, got)
    ref = hooks.reference(cfg, p, inputs, device if device_reference else None)
    verdict = hooks.compare(cfg, p, inputs, {out_name: got}, ref)
    verdict.update(problem=p.label(data), planted=planted, launch=info, wall_s=round(wall, 4))
    if planted:
        _judge(verdict, planted, cfg, p, inputs, got)
    return verdict


def _fold_output(cfg: ConvConfig, p: ConvProblem, got_big: np.ndarray) -> np.ndarray:
    """dgrad's output over the grown input folded onto the image (check.fold_halo), back in storage form;
    elements the kernel left unwritten stay poison. The epilogue is linear (alpha, no bias or activation)
    on the planted problem, so folding the output is folding the accumulator."""
    if cfg.activation != "identity" or p.bias or p.beta != 0.0:
        raise ValueError("planted wrong_padding on dgrad folds the output: it needs the identity epilogue, "
                         "no bias and beta 0")
    vals = hostdata.decode(got_big, cfg.c)
    inner = (slice(None), slice(p.pad_front[0], p.pad_front[0] + p.d), slice(p.pad_front[1], p.pad_front[1] + p.h),
             slice(p.pad_front[2], p.pad_front[2] + p.w))
    poison = hostdata.bits_of(np.asarray(hostdata.poison_value(cfg.c)).reshape(1))[0]
    unwritten = hostdata.bits_of(np.ascontiguousarray(got_big[inner])) == poison
    vals = np.where(hostdata.bits_of(got_big) == poison, 0.0, vals)
    folded = hostdata.encode(_check.fold_halo(vals, p), cfg.c)
    return np.where(unwritten, got_big[inner], folded)


def _judge(verdict: dict[str, Any], planted: str, cfg: ConvConfig, p: ConvProblem, inputs: Any, got: np.ndarray) -> None:
    """Add to a planted case's verdict its comparison with the fault model's output and what, if anything,
    keeps it from showing the fault's own mark (check.signature_misses)."""
    model = None
    if planted != "row_short":
        want = _check.fault_model_reference(planted, cfg.cfg, p, inputs.values)
        model = hooks.compare(cfg, p, inputs, {inputs.outputs[0]: got}, want)
        verdict["fault_model"] = {k: model.get(k) for k in ("status", "reason", "rel_err", "mismatches")}
    verdict["signature_misses"] = _check.signature_misses(planted, cfg.op, p, verdict, model)


def expected_reason(planted: str, verdict: Mapping[str, Any]) -> bool:
    """A planted bug is caught for its own reason: the case FAILED, the wrong (or unwritten) elements are where
    the fault puts them and the output is the fault model's (check.signature_misses found nothing)."""
    return verdict.get("status") == "FAILED" and verdict.get("signature_misses") == [] and verdict.get("planted") == planted


def planted_line(name: str, bug: str, v: Mapping[str, Any], ok: bool) -> str:
    """One planted case for a person: caught or missed, where the output went wrong, and if missed, why."""
    where = (f"bad rows {v.get('bad_rows')} cols {v.get('bad_cols')}" if bug != "row_short"
             else f"unwritten rows {v.get('unwritten_rows')} filters {v.get('unwritten_outer')}")
    text = (f"{'CAUGHT' if ok else 'MISSED'}  {name}  planted {bug}: {v.get('status')} "
            f"rel_err={v.get('rel_err', float('nan')):.2e} mismatches={v.get('mismatches')} {where}")
    return text if ok else text + f"; not its mark: {'; '.join(v.get('signature_misses') or [str(v.get('reason', ''))])}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="manifest directory (emitter emit -o ...; built with emitter build)")
    ap.add_argument("--select", default="*", help="glob on instance names")
    ap.add_argument("--quick", action="store_true", help="leave out the largest default problem")
    ap.add_argument("--planted", action="store_true", help="also run the planted bugs (each must FAIL)")
    ap.add_argument("--json", help="write every case's verdict here")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    root = Path(args.root)
    manifest = json.loads((root / "manifest.json").read_text())
    entries = [e for e in manifest["instances"] if e.get("family") == "conv" and fnmatch.fnmatchcase(e["name"], args.select)]
    results: list[dict[str, Any]] = []
    failed = caught = planted_total = 0
    for e in entries:
        try:
            kern = ConvKernel(root, e)
        except Exception as ex:   # noqa: BLE001  (a kernel that does not load fails alone)
            print(f"FAIL  {e['name']}: cannot load: {ex}")
            failed += 1
            results.append({"kernel": e["name"], "status": "FAILED", "reason": f"load: {ex}"})
            continue
        cases = hooks.default_problems(kern.cfg, quick=args.quick)
        for i, (p, data) in enumerate(cases):
            v = run_case(kern, p, data, args.seed + i)
            v["kernel"] = kern.name
            results.append(v)
            failed += v["status"] == "FAILED"
            print(f"{'PASS' if v['status'] == 'PASSED' else v['status'][:4]}  {kern.name}  {v['problem']}  "
                  f"rel_err={v.get('rel_err', float('nan')):.2e} tol={v.get('tol', float('nan')):.1e} {v.get('reason', '')}",
                  flush=True)
        if args.planted:
            p = planted_problem(kern.cfg)
            why = hooks.not_supported_reasons(kern.cfg, p)
            if why:   # e.g. a fixed-channels kernel: the planted geometry is not one it runs; not a miss
                print(f"SKIP  {kern.name}  planted bugs: the planted problem does not apply ({'; '.join(why)})")
                continue
            for bug in PLANTED + GROUP_PLANTED:
                if bug not in planted_bugs(kern.cfg):
                    if bug not in GROUP_PLANTED:
                        print(f"SKIP  {kern.name}  planted {bug}: does not apply to a gemm_1x1 instance")
                    continue
                if bug == "stride_ignored" and p.stride[1] == 1:
                    print(f"SKIP  {kern.name}  planted {bug}: a unity-stride instance")
                    continue
                if bug == "swapped_filter_axes" and kern.cfg.op == "wgrad":
                    v = _wgrad_swapped(kern, p, args.seed + 99)     # wgrad writes w: its result comes out swapped
                else:
                    try:
                        v = run_case(kern, p, "normal", args.seed + 99, planted=bug)
                    except Exception as ex:   # noqa: BLE001  (the shim refusing the wrong launch: not computed)
                        print(f"REFUSED  {kern.name}  planted {bug}: {ex}")
                        results.append({"kernel": kern.name, "planted": bug, "status": "REFUSED", "reason": str(ex)})
                        continue
                ok = expected_reason(bug, v)
                planted_total += 1
                caught += ok
                v.update(kernel=kern.name, caught=ok)
                results.append(v)
                print(planted_line(kern.name, bug, v, ok), flush=True)
    passed = sum(1 for r in results if r.get("status") == "PASSED")
    print(f"conv runner: {passed} passed, {failed} failed, "
          f"{sum(1 for r in results if r.get('status') == 'SKIPPED')} skipped; planted bugs caught {caught}/{planted_total}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed or caught != planted_total else 0


def _wgrad_swapped(kern: ConvKernel, p: ConvProblem, seed: int) -> dict[str, Any]:
    """wgrad writes the filter gradient: a kernel that swaps R and S writes dw transposed. Run it right, swap
    the result's axes, compare (the check must fail on values)."""
    if p.r != p.s:
        raise ValueError(f"planted swapped_filter_axes needs a square filter (R = S), not R={p.r} S={p.s}")
    torch = kern.torch
    device = getattr(kern, "device", "cuda")
    cfg = kern.cfg
    inputs = hooks.make_inputs(cfg, p, "normal", seed)
    in_dt = DType.f32 if cfg.a is DType.tf32 else cfg.a
    dts = {"x": in_dt, "w": cfg.c, "y": in_dt, "source": cfg.c, "bias": cfg.c}
    dev = {k: to_device(torch, v, dts[k], device) for k, v in inputs.buffers.items()}
    try:
        kern.run(p, {k: dev.get(k) for k in ("x", "w", "y", "source", "bias")})
    except CannotRun as e:
        return {"status": "SKIPPED", "reason": str(e), "problem": p.label("normal"), "planted": "swapped_filter_axes"}
    got = to_host(torch, dev["w"].transpose(2, 3).contiguous(), cfg.c)
    ref = hooks.reference(cfg, p, inputs, device)
    v = hooks.compare(cfg, p, inputs, {"w": got}, ref)
    v.update(problem=p.label("normal"), planted="swapped_filter_axes")
    _judge(v, "swapped_filter_axes", cfg, p, inputs, got)
    return v


if __name__ == "__main__":
    sys.exit(main())
