"""What every family shares: the Rejection record and the emit-side hooks a family package provides.

A family is a package `emitter.families.<name>` registered in `emitter.families.registry.FAMILIES`.
Emit-side hooks (module-level functions of the package; see docs/architecture.md "What a family provides"):

    expand_entry(doc, entry_path, entry, key_paths) -> Iterator[(candidate, sweep_point)]
        parse one spec entry (a mapping with `family: <name>`) into candidate instances; raise SpecError
        (via doc.error) for malformed input, naming file, line, key path, value, allowed, fix
    resolve(candidate) -> instance | Rejection
        fill derived fields, check every constraint before nvcc
    instance_name(instance) -> str
        the one deterministic name ([a-z0-9_]+): file name, C symbol, cache and manifest key
    render_instance(instance, name, banner) -> str
        the .cu text (templates/<family>/<arch>/instance.cu.j2 and its levels)

An instance is a frozen dataclass with `family` (str), `arch` (an enum with `.yaml`), `spec_file`,
`spec_index`, `spec_hash` (not part of identity), `replace(**changes)` and `config()` (plain JSON for the
manifest's `config`).

Run-time hooks (verify, profile, the runtime backends) live in a second module of the package,
`emitter.families.<name>.runtime`, so emitting never imports numpy/ctypes machinery; `RuntimeFamily` below
lists them (signatures and meaning), `emitter.families.registry.runtime_family(name)` loads and checks one, and
docs/architecture.md "What a family provides" repeats the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import inspect
import typing
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot work: which rule it broke, why, and how to fix it."""

    instance: Any
    rule: str      # stable id, e.g. "tile-k-multiple-of-instruction-k"
    reason: str    # "tile k=48 is not a multiple of instruction k=16: use 32 or 64"


class Family(Protocol):
    """What the package `emitter.families.<name>` provides (module-level functions): the emit hooks above.
    Optional beside them: `include_dirs(arch) -> list[Path]` (extra -I directories of its instances' builds) and
    `library_pieces(entries, roots, ctx) -> emitter.kit.library.LibraryPieces` (its part of an exported library).
    The registry checks a family package against this protocol when a stage first takes it
    (emitter.families.registry.family_module), and its runtime module against RuntimeFamily (runtime_family)."""

    def expand_entry(self, doc: Any, entry_path: Any, entry: Mapping[str, Any],
                     key_paths: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]: ...
    def resolve(self, candidate: Any) -> Any: ...
    def instance_name(self, instance: Any) -> str: ...
    def render_instance(self, instance: Any, name: str, banner: str) -> str: ...


EMIT_HOOKS = ("expand_entry", "resolve", "instance_name", "render_instance")


# ================================================================================================ run time
# The run-time seam. A family's `runtime` module provides the functions of `RuntimeFamily` (module-level,
# like the emit hooks) and the data attributes it names. The stages (emitter.verify, emitter.profile,
# emitter.runtime's backends) hold no family code: they read `entry["family"]` (default "gemm"), call
# `runtime_family(family)` and go through these hooks only. Shapes follow xFormers' ops/fmha: capabilities
# are data (the config), and "can this kernel run this problem" is `not_supported_reasons` -> [reasons].
#
# Terms:
#   config   the family's frozen dataclass parsed from a manifest entry (config_from_entry): everything
#            running and checking an instance needs; has `.name` and `.arch`.
#   problem  the family's frozen dataclass of one launch (GEMM: m, n, k, batch, alpha, beta, lds, ...);
#            JSON round trip through problem_to_dict / problem_from_dict (worker pipes, results, replays).
#   data     an input kind the family draws (GEMM: "int" = small integers checked bit for bit,
#            "normal" = random normal checked with tolerance); DATA_KINDS lists them.
#   storage  numpy arrays holding the bytes a device buffer holds (emitter.kit.hostdata codecs).
#   FAMILY   the config, problem and profile-op classes carry a class attribute FAMILY = "<name>", so a
#            stage holding one of them finds its hooks (runtime_family(type(obj).FAMILY)).

@dataclass(frozen=True)
class Footprint:
    """Bytes one problem needs, computed from sizes alone (nothing allocated): verify and profile refuse a
    problem that does not fit before allocating (issue 25 item 7)."""

    device: int          # device buffers of one run (inputs, outputs, workspace estimate)
    host: int            # host arrays of one verify case (storage + float64 logical copies + reference)


@dataclass
class Inputs:
    """One case's inputs, from make_inputs.

    buffers: storage arrays by the name the family's C problem struct gives their pointers (GEMM: A, B, C,
             D, bias), in that order; None = no buffer (null pointer). Output buffers hold the poison.
    outputs: the names of the buffers the kernel writes (copied back after the launch).
    values:  logical float64 arrays (or anything) the reference reads; the family's own business.
    exact:   True when the result must match the reference bit for bit (small-integer data).
    info:    JSON-able facts for the result record (GEMM: {"int_range": [r, rc]}).
    """

    buffers: dict[str, Any]
    outputs: tuple[str, ...]
    values: dict[str, Any] = field(default_factory=dict)
    exact: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class BaselineLaunch:
    """A library call timed exactly like a kernel: launch(i) runs it on the profile's operand set i (on the
    profile stream), `provider` says what was called (goes into every output row)."""

    name: str
    provider: str
    launch: Callable[[int], None]
    torch_stream: Any = None


class BaselineUnavailable(Exception):
    """This baseline cannot run this op/problem here (no torch, dtype or layout not supported)."""


class RuntimeFamily(Protocol):
    """What `emitter.families.<name>.runtime` provides (module attributes and functions).

    ---- data ---------------------------------------------------------------------------------------
    NAME: str                       the family name (the registry key, the manifest entry's `family`)
    DATA_KINDS: tuple[str, ...]     input kinds make_inputs draws, e.g. ("int", "normal")
    PROBLEM_KEYS: tuple[str, ...]   keys a problem mapping may have (YAML problem files, --problem k=v)
    FAKE_FAULTS: tuple[str, ...]    family fault kinds fake_run can plant (the generic ones -- crash, hang,
                                    illegal_address, launch_error, cannot_implement -- are the fake backend's)
    BASELINES: tuple[str, ...]      names of the profile baselines (GEMM: ("cublas",))
    PROBLEM_HELP: str               the family's `--problem` syntax for the CLI help, e.g. "GEMM `MxNxK`, ..."
                                    ("" adds nothing); `emitter verify` / `profile --help` put the default family's
                                    first, then the others' in registry order
    DATA_HELP: str                  what its DATA_KINDS mean, for `emitter verify --help`'s --data ("" adds nothing)

    ---- manifest -> config --------------------------------------------------------------------------
    config_from_entry(entry, root=None) -> config
        parse a manifest entry's `config` (ManifestError naming the instance, key and value)

    ---- problems --------------------------------------------------------------------------------------
    problem_from_dict(d) -> problem;  problem_to_dict(problem) -> dict      JSON round trip
    problem_label(problem, data) -> str        stable label [A-Za-z0-9_.+-], e.g. "1000x517x129_..._normal"
    parse_problem(text, where="<command line>") -> list[dict]
        one `--problem` string (GEMM "MxNxK[xB]" or "m=..,n=..,k=..[,alpha=..]"; attention
        "b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128") -> problem mappings; SpecError on bad text
    problem_from_mapping(item, where, line, key_path[, key_lines=None]) -> problem
        a checked problem from a mapping (keys in PROBLEM_KEYS minus data/label); SpecError names the key;
        optional keyword key_lines {key: line} (problem files) is passed only where the hook declares it
    default_problems(config, quick=False) -> list[(problem, data)]
        the default verify set (quick: leaves out the largest, for CI / fake backend)
    not_supported_reasons(config, problem) -> list[str]
        why this instance cannot run this problem (alignment, mode, ...), [] when it can; a reason makes
        the case SKIPPED, never PASSED
    resolve_problem(config, problem) -> problem
        fill defaults that depend on the instance (GEMM: packed leading dims / batch strides)
    with_options(config, problem, options: int) -> problem | str
        run-time scheduler options (emitter.kit.scheduler encoding) on a problem, or why the
        instance has no such choice (families without options: return a reason for options != 0)

    ---- one verify case -------------------------------------------------------------------------------
    footprint(config, problem) -> Footprint           bytes needed (device, host), before allocating
    flops(config, problem) -> int                     useful floating-point operations of one launch
    make_inputs(config, problem, data, seed) -> Inputs   fresh inputs from seed, outputs poisoned
    reference(config, problem, inputs, device=None) -> Any
        the expected outputs in float64 (numpy; torch on `device` when given, for large problems)
    compare(config, problem, inputs, outputs: dict[str, ndarray], reference) -> dict
        the verdict: {"status": "PASSED"|"FAILED", "reason", "check": "exact"|"tolerance", "rel_err",
        "tol", "max_abs_err", "worst": {...coordinates, got, want}, "unwritten", "nonfinite",
        "mismatches", "stray_writes", ...}; every output element written, NaN never passes

    ---- backends ------------------------------------------------------------------------------------
    c_problem(config, problem, pointers: dict[str, int]) -> ctypes.Structure
        the host shim's problem struct (templates/common/emitter_abi.h) for device pointers by buffer name
    fake_run(config, problem, buffers: dict[str, ndarray], faults: dict[str, dict]) -> dict[str, ndarray]
        the fake backend's computation of the outputs' storage, written with its own arithmetic (no code
        shared with `reference`, so a bug in one cannot cancel in the other); raises CannotImplement;
        `faults` maps FAKE_FAULTS kinds to their settings

    ---- profile ---------------------------------------------------------------------------------------
    profile_op(config) -> op
        what kernels are compared under apart from the size: frozen, hashable, with FAMILY, `.key` (str),
        `.to_json()` (with "family" unless gemm) and optionally `.a` (the input dtype, for % of peak) and
        `.layout`, `.b`, `.c`, `.d` (report columns); GEMM: emitter.families.gemm.profile.Op
    profile_set_bytes(op, problem, settings) -> int    device bytes of one rotated operand set
    profile_allocate(op, problem, settings, sets: int) -> data
        device-resident operand sets (random, seeded by op and problem); `.sets`, `.working_set_bytes`,
        `.free()`
    kernel_launch(kernel, data, stream, **run_options) -> launch
        launch(i) runs the loaded kernel on operand set i; `.info` (grid, block, ...), `.free()`; run_options:
        split_k, options, workspace_reset ("library": any workspace the shim's initialize() zeroes is zeroed
        again on the stream before each launch, as the exported library pays it; "settled": not where a launch
        leaves it zeroed; emitter/kit/workspace.py); `.resets` (optional): (pointer, bytes) or None per set
    baseline(name, data, stream) -> BaselineLaunch     raises BaselineUnavailable
    profile_check(data, config, use_torch, **run_options) -> dict
        (the caller poisoned and launched on set 0) compare set 0's outputs with the reference: {"passed",
        "reason", "rel_err", "tolerance", "unwritten", "nonfinite", "mismatches", "reference"}; config is the
        kernel's, or the data's own `.cfg` (None if it has none) for a baseline's recorded check
    profile_poison(data, set_index=0) -> None
        poison the outputs of operand set `set_index` (the profiler calls it, launches once, then profile_check)
    profile_fake_problem(config, problem, settings, limit, **run_options) -> problem
        the fake profile engine's check problem: the profile problem shrunk to at most `limit` per size
    BASELINE_PROVIDERS: dict[str, str]   (optional) what each baseline calls, for records before it ran
    profile_problem(problem) -> profile problem | str
        the profile's unit for a parsed problem (`--problem`, YAML string entries), or why it cannot be one;
        a profile problem has FAMILY, key (str), flops (int), as_dict() (JSON, with "family" for families
        other than gemm) and is hashable; GEMM's is emitter.families.gemm.profile.Problem
        (optional `ident`: the tuple groupings and sort orders use instead of `key`)
    profile_problem_from_dict(d) -> profile problem;  profile_op_from_json(d) -> op   (JSON round trips)
    profile_min_bytes(op, problem, beta) -> int   (optional) fewest bytes moved, for GB/s (None without it)
    profile_variants(config, problem, options: list[int]) -> list[int]   (optional) the run-time option sets
        of the profile's `scheduler` sweep the instance takes, distinct launches only (default: [0])
    profile_splits(config, problem, sm_count) -> list[int]   (optional) split-K slice counts to time (default [1])
    PROFILE_SETS: tuple[str, ...]; profile_named_set(name) -> list   (optional) named problem sets (`--problem
        llm`, a profile YAML's `set: llm`) and their problems
    profile_placeholder() -> profile problem   (optional) the problem a record names for a kernel that could not
        load (without it: the job's first problem of the family)
    """

    NAME: str
    DATA_KINDS: tuple[str, ...]
    PROBLEM_KEYS: tuple[str, ...]
    FAKE_FAULTS: tuple[str, ...]
    BASELINES: tuple[str, ...]
    PROBLEM_HELP: str
    DATA_HELP: str

    def config_from_entry(self, entry: Mapping[str, Any], root: Any = None) -> Any: ...
    def problem_from_dict(self, d: Mapping[str, Any]) -> Any: ...
    def problem_to_dict(self, problem: Any) -> dict[str, Any]: ...
    def problem_label(self, problem: Any, data: str) -> str: ...
    def parse_problem(self, text: str, where: str = "<command line>") -> list[dict[str, Any]]: ...
    def problem_from_mapping(self, item: Mapping[str, Any], where: str, line: int | None, key_path: str) -> Any: ...
    def default_problems(self, config: Any, quick: bool = False) -> list[tuple[Any, str]]: ...
    def not_supported_reasons(self, config: Any, problem: Any) -> list[str]: ...
    def resolve_problem(self, config: Any, problem: Any) -> Any: ...
    def with_options(self, config: Any, problem: Any, options: int) -> Any: ...
    def footprint(self, config: Any, problem: Any) -> Footprint: ...
    def flops(self, config: Any, problem: Any) -> int: ...
    def make_inputs(self, config: Any, problem: Any, data: str, seed: int) -> Inputs: ...
    def reference(self, config: Any, problem: Any, inputs: Inputs, device: str | None = None) -> Any: ...
    def compare(self, config: Any, problem: Any, inputs: Inputs, outputs: Mapping[str, Any],
                reference: Any) -> dict[str, Any]: ...
    def c_problem(self, config: Any, problem: Any, pointers: Mapping[str, int]) -> Any: ...
    def fake_run(self, config: Any, problem: Any, buffers: Mapping[str, Any],
                 faults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]: ...
    def profile_op(self, config: Any) -> Any: ...
    def profile_set_bytes(self, op: Any, problem: Any, settings: Any) -> int: ...
    def profile_allocate(self, op: Any, problem: Any, settings: Any, sets: int) -> Any: ...
    def kernel_launch(self, kernel: Any, data: Any, stream: Any, **run_options: Any) -> Any: ...
    def baseline(self, name: str, data: Any, stream: Any) -> BaselineLaunch: ...
    def profile_check(self, data: Any, config: Any, use_torch: bool, **run_options: Any) -> dict[str, Any]: ...
    def profile_poison(self, data: Any, set_index: int = 0) -> None: ...
    def profile_fake_problem(self, config: Any, problem: Any, settings: Any, limit: int = 64,
                             **run_options: Any) -> Any: ...
    def profile_problem(self, problem: Any) -> Any: ...
    def profile_problem_from_dict(self, d: Mapping[str, Any]) -> Any: ...
    def profile_op_from_json(self, d: Mapping[str, Any]) -> Any: ...


VERIFY_HOOKS = (
    "config_from_entry", "problem_from_dict", "problem_to_dict", "problem_label", "parse_problem",
    "problem_from_mapping", "default_problems", "not_supported_reasons", "resolve_problem", "with_options",
    "footprint", "flops", "make_inputs", "reference", "compare", "c_problem", "fake_run",
)
PROFILE_HOOKS = (
    "profile_op", "profile_set_bytes", "profile_allocate", "kernel_launch", "baseline", "profile_check",
    "profile_poison", "profile_fake_problem", "profile_problem", "profile_problem_from_dict", "profile_op_from_json",
)
RUNTIME_DATA = ("NAME", "DATA_KINDS", "PROBLEM_KEYS", "FAKE_FAULTS", "BASELINES", "PROBLEM_HELP", "DATA_HELP")


class FamilyNotRunnable(Exception):
    """The family's runtime module is missing or lacks hooks (verify/profile cannot run its instances)."""


class FamilyContractError(Exception):
    """A family package whose emit hooks do not fit the Family protocol (a bug in the family)."""


def contract_misfits(module: Any, protocol: type, names: Sequence[str]) -> list[str]:
    """How `module` falls short of `protocol` for the members `names`: each one missing, a data attribute of the
    wrong type, a function that cannot be called the way the protocol calls it (its required positional
    parameters, and **kwargs where the protocol passes keywords). [] when it fits."""
    hints = typing.get_type_hints(protocol)
    out = []
    for name in names:
        if not hasattr(module, name):
            out.append(f"lacks {name}")
            continue
        value = getattr(module, name)
        if name in hints and not callable(getattr(protocol, name, None)):
            kind = typing.get_origin(hints[name]) or hints[name]
            if isinstance(kind, type) and not isinstance(value, kind):
                out.append(f"{name} is {type(value).__name__}, not {kind.__name__}")
            continue
        want = inspect.signature(getattr(protocol, name))
        params = list(want.parameters.values())[1:]                       # without self
        required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not callable(value):
            out.append(f"{name} is {type(value).__name__}, not a function")
            continue
        try:
            have = inspect.signature(value)
        except (TypeError, ValueError):       # a builtin without a signature: trust it
            continue
        try:
            have.bind(*range(len(required)))
        except TypeError:
            out.append(f"{name}{have} cannot be called as {name}({', '.join(p.name for p in required)})")
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params) and not any(p.kind is p.VAR_KEYWORD for p in have.parameters.values()):
            out.append(f"{name}{have} takes no **keywords, which the protocol passes")
    return out
