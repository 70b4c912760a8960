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
and the three gradients. Dispatch: the kernels computing the problem (dtype, head dims, mask, varlen; GQA when
heads_kv != heads_q; deterministic ones only when the problem asks) that run on the device, in the order: key-split
kernels before deterministic ones (unless determinism is asked for), then the arch (newest first), then the tile
area (larger first for seq_q >= LONG_SEQ), then the name; the first whose shim accepts runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.library_common import LONG_SEQ, MASKS, _NAME_RE, _read_source

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


def backward_pieces(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any], error: type[Exception]
                    ) -> dict[str, Any]:
    """The backward's slot texts and files (attention/library.py adds them to the forward's LibraryPieces)."""
    from emitter.render import environment, templates_root

    kernels = backward_records(entries, dict(ctx["dtype_codes"]), error)
    by_name = {e["name"]: e for e in entries}
    env = environment()
    bctx = dict(ctx, bkernels=kernels, bproblem_fields=PROBLEM_FIELDS, long_seq=LONG_SEQ, **abi_sizes())

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
    }


__all__ = ["C_FUNCTIONS", "PROBLEM_FIELDS", "BackwardKernel", "backward_records", "backward_pieces", "abi_sizes"]
