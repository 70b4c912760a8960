"""What an exported library is made of, beneath the families: the pieces a family adds to it (its C API, table and
loader functions), the error a bad export ends in, and the codes of the C API every family shares.

The shared files of a library (header, C API, table, loader, CMake, README: templates/library/*) hold what every
family uses (status codes, dtype enums, error and device helpers, the loader's operand and torch helpers); each
family's part comes from its package. GEMM's (emitter/families/gemm/library.py, templates/gemm/library/) is in
every library and fills the shared templates' named places; another family (attention, conv, ...) whose package
`emitter.families.<f>` defines

    library_pieces(entries, roots, ctx) -> LibraryPieces

gets its manifest entries (those with `family: <f>`, after --select/--exclude/--arch and build-failure
filtering), the manifest directory of each (`roots[name]`), and the library's template context `ctx` (lib,
LIB, version, abi_version, dtype_codes, ...; a copy), and returns the pieces below: C/C++/Python TEXT, which
the family renders from its own templates (templates/<f>/library/*.j2, through emitter.render.environment()
with ctx). The library templates paste each piece at a fixed place (docs/architecture.md "Library pieces a
family provides"):

    header       include/<lib>/<lib>.h, before the closing extern "C": the family's problem struct(s) and
                 `<LIB>_API <lib>_status <lib>_<family>(const <lib>_<family>_problem*, void* workspace,
                 size_t workspace_bytes, <lib>_stream_t stream);` declarations
    api          src/<lib>_api.cpp, at the end (inside no namespace): definitions; they may use the file's
                 helpers (fail, succeed, device_cc, log_enabled: anonymous namespace, same translation unit)
    table        src/<lib>_table.cpp, at the end: the family's kernel table (columns are the family's own)
    python       python/<lib>.py, at the end: the family's Python functions (e.g. attention(q, k, v, *,
                 causal, scale, lse, cu_seqlens_q, cu_seqlens_k)); they may use the loader's helper contract
                 (operand_view, check_status, call_on_device, register_torch_op, ...: the header of
                 templates/library/loader.py.j2 lists them)
    c_functions  (name without the `<lib>_` prefix, ctypes restype, [ctypes argtypes]) of each new C function:
                 exported by the linker map and declared by the loader's load()
    python_names names added to the loader's __all__
    files        extra files of the tree (relative path -> text): the family's instances and their
                 translation units
    sources      (relative path, arch) of the .cu translation units among `files` that CMake compiles with
                 the kernels of that arch (sm80, sm90a, ...)
    context      more template context, visible to the family's pieces as ctx[<family>]

`context` is also visible to the library's own templates as ctx[<family>]. A family without `library_pieces`
cannot be exported (LibraryError naming it, with the --exclude that leaves its instances out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emitter.errors import EmitterError

# ---- the C API's enum codes every family shares (the C header's values; append only) --------------
DTYPES = {"f16": 1, "bf16": 2, "f32": 3, "tf32": 4, "f64": 5, "s8": 6, "s32": 7, "e4m3": 8, "e5m2": 9}
DTYPE_ANY = 0
ACTIVATIONS = {"identity": 0, "relu": 1, "gelu": 2, "silu": 3, "sigmoid": 4, "clamp": 5}
DTYPE_BITS = {"f16": 16, "bf16": 16, "f32": 32, "tf32": 32, "f64": 64, "s8": 8, "s32": 32, "e4m3": 8, "e5m2": 8}

# arch name -> (compute capability, arch-specific (runs only on exactly that cc), CUTLASS major)
ARCHES = {"sm75": (75, False, 2), "sm80": (80, False, 2), "sm86": (86, False, 2), "sm89": (89, False, 2),
          "sm90a": (90, True, 3)}
# default CMAKE_CUDA_ARCHITECTURES value per instance arch (2.x: SASS + PTX, so newer GPUs can JIT it)
DEFAULT_CUDA_ARCHITECTURES = {"sm75": "75", "sm80": "80", "sm86": "86", "sm89": "89", "sm90a": "90a"}


ABI_VERSION = 1     # the exported library's C ABI (its structs only grow at the end)


class LibraryError(EmitterError):
    exit_code = 2


SLOTS = ("header", "api", "table", "python")


@dataclass(frozen=True)
class LibraryPieces:
    family: str
    header: tuple[str, ...] = ()
    api: tuple[str, ...] = ()
    table: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    c_functions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    python_names: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    sources: tuple[tuple[str, str], ...] = ()
    context: dict[str, Any] = field(default_factory=dict)
    kernels: int = 0    # how many kernels the family exports (the summary line)
    # the default family's part (GEMM's C API is in every library, emitter/families/gemm/library.py): template
    # context of the shared templates, text for their named places (`library_places.get("<place>")` in
    # templates/library/*.j2; each family's text in registry order), its C functions (exported; its loader text
    # declares them), the manifest's sections it writes (a list section lists kernels with `name` and `arch`),
    # notes for the export summary
    globals: dict[str, Any] = field(default_factory=dict)
    places: dict[str, str] = field(default_factory=dict)    # text for the named places of the shared templates
    exports: tuple[str, ...] = ()
    manifest: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def tuning_problem_label(problem: Any) -> str:
    """A tuning entry's problem as one short label for reports (its fields, the family left out)."""
    if not isinstance(problem, dict):
        return repr(problem)
    return ",".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in problem.items()
                    if k != "family")


# ---- the dispatch distance every family's tuned walk uses (C twin: log2_fixed in templates/gemm/library/dispatch.h.j2) ----
LOG2_FRAC_BITS = 16


def log2_fixed(x: int) -> int:
    """floor(log2(x) * 2**16) for an integer x >= 1, by repeated squaring (integer-only: the C++ twin
    `log2_fixed` gives the same bits). Exact integer part, 16 fractional bits (error < 2**-16)."""
    if x < 1:
        raise ValueError(f"log2_fixed needs x >= 1, got {x}")
    ip = x.bit_length() - 1
    # y in [1, 2) as Q1.31
    y = (x << (31 - ip)) if ip <= 31 else (x >> (ip - 31))
    frac = 0
    for i in range(1, LOG2_FRAC_BITS + 1):
        y = (y * y) >> 31
        if y >= (2 << 31):
            y >>= 1
            frac |= 1 << (LOG2_FRAC_BITS - i)
    return (ip << LOG2_FRAC_BITS) | frac
