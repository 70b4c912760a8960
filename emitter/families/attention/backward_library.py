"""Attention backward in the exported library: what a library gains from `op: backward` instances, beside the
forward's pieces (attention/library.py merges them into the family's LibraryPieces).

    C API    <lib>_attention_backward(const <lib>_attention_backward_problem*, void* workspace, size_t bytes, stream)
             <lib>_attention_backward_problem_init / _can_implement / _workspace_size / _kernel_count / _kernel_name
    files    src/attention/<name>.cu, <name>.shim.cu, <name>.launch.cu (as the forward's), and
             src/emitter_attention_backward_abi.h
    python   attention_backward(q, k, v, out, lse, grad_out, ...) -> (dq, dk, dv), torch.ops.<lib>.attention_backward,
             and the forward op's autograd (torch.library.register_autograd on torch.ops.<lib>.attention): attention()
             asks the forward for its LSE whenever a gradient is needed, the backward call gets O and that LSE

The backward problem is the forward's (sizes, mask, scale, strides of q, k, v, o, the LSE, cu_seqlens) plus dO
and the three gradients. Dispatch: the candidates are the kernels computing the problem (dtype, head dims, mask,
varlen; GQA when heads_kv != heads_q; deterministic ones only when the problem asks) that run on the device. Tuned
first: the kernels of the tuning records (`emitter profile`'s tuning.json entries of backward ops, `attnbwd_...`:
dtype, head dims, mask, GQA ratio, sequence lengths -> kernel) among the candidates, nearest record first by the
forward's tuning_distance (records of another compute capability are not used); then the rest in the static order
of backward_order_key: key-split kernels before deterministic ones (unless determinism is asked for), then the arch
(newest first), then split-dQ kernels (sm90a `dq_split`: 1.3-1.7x upstream's dQ at d64 on an H200), then the tile area (larger first for seq_q >= LONG_SEQ), then the index (name order). The first
whose shim accepts runs. templates/attention/library/backward_api.cpp.j2 is the same rule in C++.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.library_common import (
    LONG_SEQ, MASKS, _NAME_RE, AttentionTuningRecord, _read_source, checked_tuning_records, tuning_distance,
)

C_FUNCTIONS = (
    ("attention_backward_problem_init", "None", ("ctypes.c_void_p",)),
    ("attention_backward_can_implement", "ctypes.c_int", ("ctypes.c_char_p",)),
    ("attention_backward_workspace_size", "ctypes.c_int", ("ctypes.c_char_p", "ctypes.POINTER(ctypes.c_size_t)")),
    ("attention_backward", "ctypes.c_int", ("ctypes.c_char_p", "ctypes.c_void_p", "ctypes.c_size_t", "ctypes.c_void_p")),
    ("attention_backward_kernel_count", "ctypes.c_int", ()),
    ("attention_backward_kernel_name", "ctypes.c_char_p", ("ctypes.c_int",)),
)

_TENSORS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
# The backward problem, field by field (C type, ctypes type): the header, the api's static_asserts and the
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
    ("deterministic", "int32_t", "c_int32"),
    ("scale", "float", "c_float"),
) + tuple((f"{t}_stride_{d}", "int64_t", "c_int64") for t in _TENSORS for d in ("batch", "seq", "head")) + (
    ("lse_stride_batch", "int64_t", "c_int64"),
    ("lse_stride_head", "int64_t", "c_int64"),
    ("q", "const void*", "c_void_p"),
    ("k", "const void*", "c_void_p"),
    ("v", "const void*", "c_void_p"),
    ("o", "const void*", "c_void_p"),
    ("d_o", "const void*", "c_void_p"),
    ("lse", "const float*", "c_void_p"),
    ("dq", "void*", "c_void_p"),
    ("dk", "void*", "c_void_p"),
    ("dv", "void*", "c_void_p"),
    ("cu_seqlens_q", "const int32_t*", "c_void_p"),
    ("cu_seqlens_k", "const int32_t*", "c_void_p"),
    ("kernel", "const char*", "c_char_p"),
)


def abi_sizes() -> dict[str, int]:
    import ctypes
    P = type("P", (ctypes.Structure,), {"_fields_": [(f, getattr(ctypes, t)) for f, _, t in PROBLEM_FIELDS]})
    return {"bproblem_size": ctypes.sizeof(P), "bproblem_q_offset": P.q.offset}


@dataclass(frozen=True)
class BackwardKernel:
    index: int
    name: str
    inst: AttentionBackwardInstance
    dtype_code: int

    @property
    def arch(self) -> str:
        return self.inst.arch.yaml

    @property
    def cc(self) -> int:
        return self.inst.arch.cc

    @property
    def mask_code(self) -> int:
        return MASKS[self.inst.mask]


def backward_order_key(k: BackwardKernel, seq_q: int, deterministic: bool) -> tuple:
    """The static dispatch priority among candidates (lower first); backward_api.cpp.j2's Key is the same."""
    area = k.inst.tile_q * k.inst.tile_kv
    return (0 if deterministic else int(k.inst.deterministic), -k.cc, 0 if k.inst.dq_split else 1,
            -area if seq_q >= LONG_SEQ else area, k.index)


def backward_computes(k: BackwardKernel, *, dtype: int, head_dim: int, head_dim_v: int, mask: int, varlen: bool,
                      heads_q: int, heads_kv: int, deterministic: bool) -> bool:
    i = k.inst
    return (k.dtype_code == dtype and i.head_dim == head_dim and i.head_dim_v == head_dim_v and k.mask_code == mask
            and i.varlen == varlen and (i.gqa or heads_kv == heads_q) and (i.deterministic or not deterministic))


def backward_candidates(kernels: Sequence[BackwardKernel], *, cc: int, dtype: int, head_dim: int, head_dim_v: int,
                        mask: int, varlen: bool, heads_q: int, heads_kv: int, seq_q: int, seq_k: int, batch: int = 1,
                        deterministic: bool = False, tuning: Sequence[AttentionTuningRecord] = ()
                        ) -> list[BackwardKernel]:
    """The backward kernels that compute this problem on a device of `cc`, in dispatch order: the tuned ones
    nearest record first, then the static order (the host shims' can_implement decides among them at run time)."""
    out = [k for k in kernels if cc >= k.cc and backward_computes(
        k, dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v, mask=mask, varlen=varlen, heads_q=heads_q,
        heads_kv=heads_kv, deterministic=deterministic)]
    static = sorted(out, key=lambda k: backward_order_key(k, seq_q, deterministic))
    by_index = {k.index: k for k in static}
    ranked = sorted((tuning_distance(t, batch=batch, heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q, seq_k=seq_k), i)
                    for i, t in enumerate(tuning) if t.kernel in by_index and t.cc in (0, cc))
    tuned: list[BackwardKernel] = []
    for _, i in ranked:
        k = by_index[tuning[i].kernel]
        if k not in tuned:
            tuned.append(k)
    return tuned + [k for k in static if k not in tuned]


def is_backward_entry(e: dict[str, Any], backward_names: Sequence[str] = ()) -> bool:
    """Whether a tuning-table entry of the attention family is a backward op's (its op, its problem's pass, or a
    backward kernel named)."""
    op = e.get("op") if isinstance(e.get("op"), dict) else {}
    prob = e.get("problem") if isinstance(e.get("problem"), dict) else {}
    return op.get("op") == "backward" or prob.get("pass") == "backward" or e.get("kernel") in set(backward_names)


def backward_tuning_records(kernels: Sequence[BackwardKernel], entries: Sequence[dict[str, Any]],
                            forward_names: Sequence[str] = ()
                            ) -> tuple[list[AttentionTuningRecord], list[dict[str, Any]]]:
    """Records from the backward ops' tuning-table entries (each with its table's `source`, `position` and
    `gpu_cc`), and the entries not used, each with the reason (the export reports them)."""
    def first(ks, tuning, k, cc, d, dv, hq, hkv, sq, sk, b):
        # determinism not asked for: what the profile timed
        return backward_candidates(ks, cc=cc, dtype=k.dtype_code, head_dim=d, head_dim_v=dv, mask=k.mask_code,
                                   varlen=k.inst.varlen, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk, batch=b,
                                   tuning=tuning)

    return checked_tuning_records(
        kernels, entries, other_names=forward_names, first=first,
        other_pass="a forward kernel in a backward op's entry (was the table edited?)",
        missing="backward kernel not in this library (not in the manifests, or left out by --select/--exclude/--arch "
                "or a failed build)",
        no_options="attention backward kernels have no run-time options")


def backward_records(entries: Sequence[dict[str, Any]], dtype_codes: dict[str, int], error: type[Exception]
                     ) -> list[BackwardKernel]:
    out = []
    for e in sorted(entries, key=lambda e: e["name"]):
        name = e["name"]
        if not _NAME_RE.match(name):
            raise error(f"attention instance name {name!r} is not [a-z0-9_]+ (was the manifest edited?)")
        try:
            inst = AttentionBackwardInstance.from_config(e["config"])
        except (KeyError, ValueError, TypeError) as ex:
            raise error(f"attention backward instance {name}: its manifest config is not a resolved backward instance "
                        f"({type(ex).__name__}: {ex}); run `emitter emit` again") from None
        code = dtype_codes.get(inst.dtype.yaml)
        if code is None:
            raise error(f"attention backward instance {name}: dtype {inst.dtype} has no library dtype code")
        out.append(BackwardKernel(len(out), name, inst, code))
    return out


def backward_pieces(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any], error: type[Exception],
                    tuning_entries: Sequence[dict[str, Any]] = (), forward_names: Sequence[str] = ()
                    ) -> dict[str, Any]:
    """The backward's slot texts and files (attention/library.py adds them to the forward's LibraryPieces), its
    tuning records and the tuning entries it left out."""
    from emitter.render import environment, templates_root

    kernels = backward_records(entries, dict(ctx["dtype_codes"]), error)
    tuning, dropped = backward_tuning_records(kernels, tuning_entries, forward_names)
    by_name = {e["name"]: e for e in entries}
    env = environment()
    bctx = dict(ctx, bkernels=kernels, btuning=tuning, bproblem_fields=PROBLEM_FIELDS, long_seq=LONG_SEQ, **abi_sizes())

    def render(template: str, **more: Any) -> str:
        return env.get_template(f"attention/library/{template}").render(**bctx, **more)

    files = {"src/emitter_attention_backward_abi.h":
             (templates_root() / "attention" / "common" / "attention_backward_abi.h").read_text(encoding="utf-8")}
    sources = []
    for k in kernels:
        e = by_name[k.name]
        files[f"src/attention/{k.name}.cu"] = _read_source(roots[k.name], e["source"], k.name, error)
        files[f"src/attention/{k.name}.shim.cu"] = render("backward_shim.cu.j2", k=k)
        files[f"src/attention/{k.name}.launch.cu"] = render("backward_launch.cu.j2", k=k)
        sources += [(f"src/attention/{k.name}.shim.cu", k.arch), (f"src/attention/{k.name}.launch.cu", k.arch)]
    return {
        "header": render("backward_header.h.j2"),
        "api": render("backward_api.cpp.j2"),
        "python": render("backward_loader.py.j2"),
        "c_functions": C_FUNCTIONS,
        "python_names": ("attention_backward", "attention_backward_kernels", "register_attention_backward_ops",
                         "AttentionBackwardProblem"),
        "files": files,
        "sources": tuple(sources),
        "kernels": kernels,
        "tuning": tuning,
        "dropped_tuning": dropped,
    }


__all__ = ["C_FUNCTIONS", "PROBLEM_FIELDS", "BackwardKernel", "backward_records", "backward_pieces", "abi_sizes",
           "backward_order_key", "backward_computes", "backward_candidates", "backward_tuning_records",
           "is_backward_entry"]
