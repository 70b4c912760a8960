"""The attention family's library pieces (`emitter library`, issue 27 must-have 6): what an exported library
gains from attention instances, through the plug of emitter/kit/library.py (docs/architecture.md "Library
pieces a family provides"; docs/library.md "Attention").

    C API      <lib>_attention(const <lib>_attention_problem*, void* workspace, size_t workspace_bytes, stream),
               <lib>_attention_problem_init / _can_implement / _workspace_size / _select,
               <lib>_attention_kernel_count / _kernel_name
    files      src/attention/<name>.cu          the emitted instance, byte for byte
               src/attention/<name>.shim.cu     its host shim (compiled without EMITTER_DEVICE), renamed
               src/attention/<name>.launch.cu   its kernel (EMITTER_DEVICE, renamed) + a <<<>>> launcher that
                                                passes the shim's Params by value
               src/emitter_attention_abi.h      templates/attention/common/attention_abi.h
               src/curand_kernel.h              emitter's empty stand-in (sm80 instances only; see that file)
    python     attention(q, k, v, *, causal, causal_align, scale, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, out, check_cu_seqlens), torch.ops.<lib>.attention / attention_out
    backward   `op: backward` instances (beside a forward one): backward_library.py adds <lib>_attention_backward,
               attention_backward() and the autograd of torch.ops.<lib>.attention

Dispatch: the candidates are the kernels whose compiled operation matches the problem (dtype, head dims, mask,
varlen; GQA when heads_kv != heads_q; LSE when an LSE pointer is given; key-tail masking when seq_k is not a
tile_kv multiple) and that run on the device. Tuned first: the kernels of the tuning records (`emitter profile`'s
tuning.json entries of the attention family: dtype, head dims, mask, GQA ratio, sequence lengths -> kernel) among
the candidates, nearest record first by `tuning_distance` (sum of |log2| differences over batch x heads_q,
heads_q / heads_kv, seq_q, seq_k; 16.16 fixed point, the GEMM rule's log2_fixed; records measured on another
compute capability are not used); then the rest in the static order of `order_key` (mirrored in C by the api
piece): arch-specific kernels of the device first (sm90a on cc 9.0), then split_kv kernels first for decode
(seq_q <= DECODE_SEQ) and last otherwise, then fewer unused features (an LSE
kernel for a problem without LSE, a GQA kernel for equal heads), then tile area (larger first when
seq_q >= LONG_SEQ, smaller first below), then name. The first whose host shim accepts runs. Attention kernels
have no run-time options (no split-K, no scheduler options): an entry with others is left out and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from emitter.families.attention.library_common import (  # noqa: F401 - AttentionTuningRecord, tuning_distance: public here
    LONG_SEQ, MASKS, _NAME_RE, AttentionTuningRecord, _read_source, checked_tuning_records, tuning_distance,
)
from emitter.families.attention.model import Arch, AttentionInstance, Schedule

DECODE_SEQ = 16         # seq_q up to which split_kv kernels come first (they split long key ranges over CTAs)
C_FUNCTIONS = (
    ("attention_problem_init", "None", ("ctypes.c_void_p",)),
    ("attention_can_implement", "ctypes.c_int", ("ctypes.c_char_p",)),
    ("attention_workspace_size", "ctypes.c_int", ("ctypes.c_char_p", "ctypes.POINTER(ctypes.c_size_t)")),
    ("attention_select", "ctypes.c_int", ("ctypes.c_char_p", "ctypes.c_void_p")),
    ("attention", "ctypes.c_int", ("ctypes.c_char_p", "ctypes.c_void_p", "ctypes.c_size_t", "ctypes.c_void_p")),
    ("attention_kernel_count", "ctypes.c_int", ()),
    ("attention_kernel_name", "ctypes.c_char_p", ("ctypes.c_int",)),
)

# The problem struct, field by field (C type, ctypes type); the header, the api's static_asserts and the
# loader's packer are rendered from this one list.
PROBLEM_FIELDS = (
    ("struct_size", "uint32_t", "c_uint32"),
    ("flags", "uint32_t", "c_uint32"),
    ("dtype", "int32_t", "c_int32"),
    ("mask", "int32_t", "c_int32"),
    ("batch", "int32_t", "c_int32"),
    ("heads_q", "int32_t", "c_int32"),
    ("heads_kv", "int32_t", "c_int32"),
    ("seq_q", "int32_t", "c_int32"),
    ("seq_k", "int32_t", "c_int32"),
    ("head_dim", "int32_t", "c_int32"),
    ("head_dim_v", "int32_t", "c_int32"),
    ("total_q", "int32_t", "c_int32"),
    ("total_k", "int32_t", "c_int32"),
    ("scale", "float", "c_float"),
) + tuple((f"{t}_stride_{d}", "int64_t", "c_int64") for t in "qkvo" for d in ("batch", "seq", "head")) + (
    ("lse_stride_batch", "int64_t", "c_int64"),
    ("lse_stride_head", "int64_t", "c_int64"),
    ("q", "const void*", "c_void_p"),
    ("k", "const void*", "c_void_p"),
    ("v", "const void*", "c_void_p"),
    ("o", "void*", "c_void_p"),
    ("lse", "float*", "c_void_p"),
    ("cu_seqlens_q", "const int32_t*", "c_void_p"),
    ("cu_seqlens_k", "const int32_t*", "c_void_p"),
    ("kernel", "const char*", "c_char_p"),
)
SELECTION_FIELDS = (
    ("struct_size", "uint32_t", "c_uint32"),
    ("kernel", "int32_t", "c_int32"),
    ("tried", "int32_t", "c_int32"),
    ("forced", "int32_t", "c_int32"),
    ("workspace_bytes", "int64_t", "c_int64"),
    ("name", "const char*", "c_char_p"),
)


def _ctypes_struct(fields) -> type:
    import ctypes
    return type("S", (ctypes.Structure,), {"_fields_": [(f, getattr(ctypes, t)) for f, _, t in fields]})


def abi_sizes() -> dict[str, int]:
    """sizeof / offsets of the C structs as ctypes lays them out (the api piece static_asserts them)."""
    import ctypes
    P, S = _ctypes_struct(PROBLEM_FIELDS), _ctypes_struct(SELECTION_FIELDS)
    return {"problem_size": ctypes.sizeof(P), "problem_q_offset": P.q.offset, "selection_size": ctypes.sizeof(S)}


@dataclass(frozen=True)
class AttentionKernel:
    index: int
    name: str
    inst: AttentionInstance
    dtype_code: int

    @property
    def arch(self) -> str:
        return self.inst.arch.yaml

    @property
    def cc(self) -> int:
        return self.inst.arch.cc

    @property
    def arch_specific(self) -> bool:
        return self.inst.arch is Arch.sm90a

    @property
    def split_kv(self) -> bool:
        return self.inst.schedule is Schedule.split_kv

    @property
    def mask_code(self) -> int:
        return MASKS[self.inst.mask]

    def runs_on(self, cc: int) -> bool:
        return cc == self.cc if self.arch_specific else cc >= self.cc


def order_key(k: AttentionKernel, cc: int, seq_q: int, lse: bool, gqa: bool) -> tuple:
    """The static dispatch priority among candidates (lower first); templates/attention/library/api.cpp.j2
    computes the same key."""
    unused = int(k.inst.lse and not lse) + int(k.inst.gqa and not gqa)
    area = k.inst.tile_q * k.inst.tile_kv
    split = (0 if seq_q <= DECODE_SEQ else 2) if k.split_kv else 1
    return (0 if (k.arch_specific and k.cc == cc) else 1, -k.cc, split, unused, -area if seq_q >= LONG_SEQ else area,
            k.index)


def candidates(kernels: Sequence[AttentionKernel], *, cc: int, dtype: int, head_dim: int, head_dim_v: int, mask: int,
               varlen: bool, heads_q: int, heads_kv: int, seq_q: int, seq_k: int, lse: bool, batch: int = 1,
               tuning: Sequence[AttentionTuningRecord] = ()) -> list[AttentionKernel]:
    """The kernels that compute this problem's operation on a device of `cc`, in dispatch order: the tuned
    ones nearest record first, then the static order (the host shims' can_implement decides among them at run
    time)."""
    out = []
    for k in kernels:
        i = k.inst
        if not k.runs_on(cc) or k.dtype_code != dtype or i.head_dim != head_dim or i.head_dim_v != head_dim_v:
            continue
        if k.mask_code != mask or i.varlen != varlen or (heads_kv != heads_q and not i.gqa) or (lse and not i.lse):
            continue
        if not varlen and not i.key_tail and seq_k % i.tile_kv:
            continue
        out.append(k)
    static = sorted(out, key=lambda k: order_key(k, cc, seq_q, lse, heads_kv != heads_q))
    ok = {k.index for k in static}
    ranked = sorted(((tuning_distance(t, batch=batch, heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q, seq_k=seq_k), i)
                     for i, t in enumerate(tuning) if t.kernel in ok and t.cc in (0, cc)))
    by_index = {k.index: k for k in static}
    tuned: list[AttentionKernel] = []
    for _, i in ranked:
        k = by_index[tuning[i].kernel]
        if k not in tuned:
            tuned.append(k)
    return tuned + [k for k in static if k not in tuned]


def tuning_records(kernels: Sequence[AttentionKernel], entries: Sequence[dict[str, Any]], backward: Sequence[str] = ()
                   ) -> tuple[list[AttentionTuningRecord], list[dict[str, Any]]]:
    """Records from `emitter profile`'s tuning-table entries of the attention family (the export hands them over
    as ctx["tuning_entries"]["attention"], each with its table's `source`, `position` and `gpu_cc`), and the
    entries not used, each with the reason (the export reports them)."""
    def first(ks, tuning, k, cc, d, dv, hq, hkv, sq, sk, b):
        return candidates(ks, cc=cc, dtype=k.dtype_code, head_dim=d, head_dim_v=dv, mask=k.mask_code,
                          varlen=k.inst.varlen, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk, lse=False, batch=b,
                          tuning=tuning)

    return checked_tuning_records(
        kernels, entries, other_names=backward, first=first,
        other_pass="a backward kernel in a forward op's entry (was the table edited?)",
        missing="kernel not in this library (not in the manifests, or left out by --select/--exclude/--arch or a "
                "failed build)",
        no_options="attention kernels have no run-time options")


def kernel_records(entries: Sequence[dict[str, Any]], dtype_codes: dict[str, int], error: type[Exception]
                   ) -> list[AttentionKernel]:
    out = []
    for e in sorted(entries, key=lambda e: e["name"]):
        name = e["name"]
        if not _NAME_RE.match(name):
            raise error(f"attention instance name {name!r} is not [a-z0-9_]+ (was the manifest edited?)")
        if isinstance(e.get("config"), dict) and e["config"].get("op") == "backward":
            raise error(f"attention instance {name} is a backward instance (op: backward): library_pieces hands "
                        f"those to backward_library.backward_records")
        try:
            inst = AttentionInstance.from_config(e["config"])
        except (KeyError, ValueError, TypeError) as ex:
            raise error(f"attention instance {name}: its manifest config is not a resolved attention instance "
                        f"({type(ex).__name__}: {ex}); run `emitter emit` again") from None
        code = dtype_codes.get(inst.dtype.yaml)
        if code is None:
            raise error(f"attention instance {name}: dtype {inst.dtype} has no library dtype code")
        out.append(AttentionKernel(len(out), name, inst, code))
    return out


def library_pieces(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any]):
    from emitter.kit.library import LibraryError, LibraryPieces
    from emitter.render import environment, templates_root

    dtype_codes = dict(ctx["dtype_codes"])
    backward = [e for e in entries if isinstance(e.get("config"), dict) and e["config"].get("op") == "backward"]
    entries = [e for e in entries if e not in backward]
    if backward and not entries:
        raise LibraryError(f"attention backward instances ({backward[0]['name']}, ...) without a forward attention "
                           f"instance: the backward runs on what the forward saves (O and its LSE); add the forward "
                           f"(op: forward, lse: true) or leave the backward out with --exclude 'op=backward'")
    kernels = kernel_records(entries, dtype_codes, LibraryError)
    from emitter.families.attention.backward_library import backward_tuning_records, is_backward_entry

    all_tuning = (ctx.get("tuning_entries") or {}).get("attention") or ()
    backward_names = [e["name"] for e in backward]
    bwd_tuning = [e for e in all_tuning if is_backward_entry(e, backward_names)]
    tuning, dropped = tuning_records(kernels, [e for e in all_tuning if e not in bwd_tuning], backward_names)
    by_name = {e["name"]: e for e in entries}
    env = environment()
    actx = dict(ctx, akernels=kernels, atuning=tuning, problem_fields=PROBLEM_FIELDS, selection_fields=SELECTION_FIELDS,
                long_seq=LONG_SEQ, decode_seq=DECODE_SEQ, **abi_sizes(), dtype_of={v: k for k, v in dtype_codes.items()})

    def render(template: str, **more: Any) -> str:
        return env.get_template(f"attention/library/{template}").render(**actx, **more)

    files: dict[str, str] = {
        "src/emitter_attention_abi.h": (templates_root() / "attention" / "common" / "attention_abi.h").read_text(
            encoding="utf-8"),
    }
    sources: list[tuple[str, str]] = []
    for k in kernels:
        e = by_name[k.name]
        files[f"src/attention/{k.name}.cu"] = _read_source(roots[k.name], e["source"], k.name, LibraryError)
        files[f"src/attention/{k.name}.shim.cu"] = render("shim.cu.j2", k=k)
        files[f"src/attention/{k.name}.launch.cu"] = render("launch.cu.j2", k=k)
        sources += [(f"src/attention/{k.name}.shim.cu", k.arch), (f"src/attention/{k.name}.launch.cu", k.arch)]
    bwd = None
    if backward:
        from emitter.families.attention.backward_library import backward_pieces

        bwd = backward_pieces(backward, roots, ctx, LibraryError, bwd_tuning, [k.name for k in kernels])
        files.update(bwd["files"])
        sources += list(bwd["sources"])
        dropped += bwd["dropped_tuning"]
    elif bwd_tuning:       # backward entries without backward kernels: each reported as a missing kernel
        dropped += backward_tuning_records([], bwd_tuning, [k.name for k in kernels])[1]
    if any(k.inst.arch is Arch.sm80 for k in kernels) or (bwd and any(k.inst.arch is Arch.sm80 for k in bwd["kernels"])):
        from emitter.families.attention.sm80 import include_dirs

        for d in include_dirs(Arch.sm80):
            stub = Path(d) / "curand_kernel.h"
            if stub.is_file():
                files["src/curand_kernel.h"] = stub.read_text(encoding="utf-8")
    more = bwd or {"header": None, "api": None, "python": None, "c_functions": (), "python_names": (), "kernels": [],
                   "tuning": []}
    tuned = len(tuning) + len(more["tuning"])
    return LibraryPieces(
        family="attention",
        header=tuple(x for x in (render("header.h.j2"), more["header"]) if x),
        api=tuple(x for x in (render("api.cpp.j2"), more["api"]) if x),
        python=tuple(x for x in (render("loader.py.j2"), more["python"]) if x),
        c_functions=C_FUNCTIONS + tuple(more["c_functions"]),
        python_names=("attention", "attention_select", "attention_kernels", "register_attention_ops",
                      "AttentionProblem") + tuple(more["python_names"]),
        files=files,
        sources=tuple(sources),
        context={"kernels": [{"index": k.index, "name": k.name, "arch": k.arch, "config": k.inst.config()}
                             for k in kernels],
                 **({"tuning": tuned} if tuned else {}),
                 **({"backward_tuning": len(more["tuning"])} if more["tuning"] else {}),
                 **({"dropped_tuning": dropped} if dropped else {}),
                 **({"backward_kernels": [{"index": k.index, "name": k.name, "arch": k.arch, "config": k.inst.config()}
                                          for k in more["kernels"]]} if more["kernels"] else {})},
        kernels=len(kernels) + len(more["kernels"]),
    )


__all__ = ["library_pieces", "candidates", "order_key", "tuning_records", "tuning_distance", "AttentionTuningRecord", "kernel_records", "AttentionKernel", "DECODE_SEQ", "PROBLEM_FIELDS",
           "SELECTION_FIELDS", "MASKS", "LONG_SEQ"]
