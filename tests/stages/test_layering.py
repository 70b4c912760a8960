"""The layers of emitter/ and the family seam, read from the code (no GPU, no nvcc).

Three layers, the import graph running one way: the stages (cli, api, emit, build, runtime, verify, profile, library,
the registry) above the families (emitter/families/<f>/) above the kit (emitter/kit/ and the shared foundation:
errors, dtypes, spec helpers, render, ...). The stages name no family in their code; a family imports the kit,
never a stage nor another family's private names; nothing imports in a circle.

What does not hold yet would be listed below by file, with how many (the lists are empty now): a count may only go
down, and a file or import that is not listed fails the test, so what is gone cannot come back unnoticed.
docs/architecture.md "Layers" has the counts before and after.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from emitter.families.registry import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "emitter"

# family names in the stages' code (AST names, attributes, imports, string constants; docstrings aside) and in
# templates/library/ (each family's library text is its own, templates/<f>/library/): none
KNOWN_FAMILY_NAMES: dict[str, int] = {}
# family modules that import a stage: none (a family's in-process runner takes the backend its caller constructs)
KNOWN_UPWARD: set[tuple[str, str]] = set()
# another family's private names: none
KNOWN_PRIVATE: set[tuple[str, str]] = set()
# import circles (lazy imports included), each inside one family
KNOWN_CYCLES: set[frozenset[str]] = set()

KIT_MODULES = {"emitter.errors", "emitter.dtypes", "emitter.fsutil", "emitter.render", "emitter.resources",
               "emitter.cutlass_path", "emitter.version", "emitter.families", "emitter.families.base"}
FAMILY_WORD = re.compile(r"(?<![a-z])(" + "|".join(map(re.escape, FAMILIES)) + r")(?![a-z])", re.IGNORECASE)


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def layer(mod: str) -> int:
    """0 kit, 1 family, 2 stage."""
    if mod in KIT_MODULES or mod.startswith(("emitter.kit", "emitter.spec")):
        return 0
    if any(mod == f"emitter.families.{f}" or mod.startswith(f"emitter.families.{f}.") for f in FAMILIES):
        return 1
    return 2


def family_of(mod: str) -> str | None:
    return next((f for f in FAMILIES if mod == f"emitter.families.{f}" or mod.startswith(f"emitter.families.{f}.")),
                None)


def imports(mod: str) -> dict[str, set[str]]:
    """Modules of emitter/ that `mod` imports anywhere in its code (lazy imports too) -> the names it takes."""
    path = MODULES[mod]
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[tuple[str, str | None]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append((sub, None) if sub in MODULES else (base, a.name))
        for target, name in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != mod and target.startswith("emitter"):
                names = out.setdefault(target, set())
                if name:
                    names.add(name)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            out.add(id(n.body[0].value))
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def family_names_in_code(path: Path) -> list[str]:
    """Each family name a Python file's code holds: names, attributes, arguments, imports and string constants
    (docstrings and comments aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    hits = []
    for n in ast.walk(tree):
        texts: list[str] = []
        if isinstance(n, ast.Name):
            texts = [n.id]
        elif isinstance(n, ast.Attribute):
            texts = [n.attr]
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [n.name]
        elif isinstance(n, ast.arg):
            texts = [n.arg]
        elif isinstance(n, ast.keyword) and n.arg:
            texts = [n.arg]
        elif isinstance(n, ast.alias):
            texts = [n.name, n.asname or ""]
        elif isinstance(n, ast.ImportFrom):
            texts = [n.module or ""]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            texts = [n.value]
        hits += [f"{_rel(path)}:{getattr(n, 'lineno', 0)}: {t[:60]!r}" for t in texts if FAMILY_WORD.search(t)]
    return hits


def family_names_in_template(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:60]!r}"
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for _ in FAMILY_WORD.finditer(line)]


def test_the_stages_and_the_kit_name_no_family():
    """Family names in the code of the stages and of the kit, and in the library templates: only the known ones."""
    found: dict[str, list[str]] = {}
    for mod, path in MODULES.items():
        if layer(mod) == 1 or mod == "emitter.families.registry":      # the registry is where the names are
            continue
        hits = family_names_in_code(path)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    for path in sorted((ROOT / "templates" / "library").rglob("*")):
        if path.is_file():
            hits = family_names_in_template(path)
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    new = {f: h for f, h in found.items() if len(h) > KNOWN_FAMILY_NAMES.get(f, 0)}
    assert not new, ("family names in stage, kit or library-template code (go through the registry's hooks, or put "
                     "the code in emitter/families/<f>/):\n" + "\n".join(x for h in new.values() for x in h))
    fewer = {f: (n, len(found.get(f, []))) for f, n in KNOWN_FAMILY_NAMES.items() if len(found.get(f, [])) < n}
    assert not fewer, f"fewer family names than KNOWN_FAMILY_NAMES says, lower it (file: (listed, found)): {fewer}"


def test_the_check_sees_family_names_where_they_are(tmp_path):
    """The check itself: it finds a family name in an import, a name and a string, and not in a docstring nor
    inside a longer word."""
    src = tmp_path / "probe.py"
    src.write_text('"""gemm in a docstring."""\nfrom emitter.families.gemm import x\nattention_op = 1\n'
                   'y = f(kind="conv")\nz = "convert"\n', encoding="utf-8")
    hits = family_names_in_code(src)
    assert [h.split(": ", 1)[1] for h in hits] == ["'emitter.families.gemm'", "'attention_op'", "'conv'"], hits


def test_imports_run_down_the_layers():
    """A kit module imports no family and no stage; a family imports no stage."""
    up = {(a, b) for a, deps in GRAPH.items() for b in deps if layer(a) < layer(b)}
    assert not up - KNOWN_UPWARD, f"imports running up the layers (kit < families < stages): {sorted(up - KNOWN_UPWARD)}"
    assert not KNOWN_UPWARD - up, f"gone, take them off KNOWN_UPWARD: {sorted(KNOWN_UPWARD - up)}"


def test_no_family_takes_another_familys_private_names():
    found = {(a, b) for a, deps in GRAPH.items() for b, names in deps.items()
             if family_of(a) and family_of(b) and family_of(a) != family_of(b) and any(n.startswith("_") for n in names)}
    assert found <= KNOWN_PRIVATE, f"a family reaching into another's private names: {sorted(found - KNOWN_PRIVATE)}"
    assert found == KNOWN_PRIVATE, f"gone, take them off KNOWN_PRIVATE: {sorted(KNOWN_PRIVATE - found)}"


def _cycles() -> set[frozenset[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(frozenset(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    cycles = _cycles()
    assert cycles <= KNOWN_CYCLES, f"import circles: {[sorted(c) for c in cycles - KNOWN_CYCLES]}"
    assert cycles == KNOWN_CYCLES, f"gone, take them off KNOWN_CYCLES: {[sorted(c) for c in KNOWN_CYCLES - cycles]}"


def _help_family(tmp_path, monkeypatch, problem_help: str, data_help: str) -> None:
    """A family `helpfam` registered last whose runtime module has only the data attributes (all --help loads)."""
    from emitter.families import registry

    pkg = tmp_path / "helpfam_family"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime.py").write_text(f"NAME = 'helpfam'\nDATA_KINDS = ('normal',)\nPROBLEM_KEYS = ()\nFAKE_FAULTS = ()\n"
                                    f"BASELINES = ()\nPROBLEM_HELP = {problem_help!r}\nDATA_HELP = {data_help!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.FAMILIES, "helpfam", "helpfam_family")


def test_the_cli_help_is_the_families_texts(tmp_path, monkeypatch):
    """`--problem` and `--data` help: the default family's text first, the others' in registry order (an empty text
    adds nothing), read from the runtime modules when help is shown."""
    import importlib
    import sys

    from click.testing import CliRunner

    from emitter.cli import main
    from emitter.families.registry import DEFAULT_FAMILY
    from emitter.verify.cli import data_help, problem_help

    texts = {n: importlib.import_module(m + ".runtime") for n, m in FAMILIES.items()}
    others = [t.PROBLEM_HELP for n, t in texts.items() if n != DEFAULT_FAMILY and t.PROBLEM_HELP]
    assert problem_help() == (f"a problem (repeatable): {texts[DEFAULT_FAMILY].PROBLEM_HELP}; each family parses its "
                              f"own ({'; '.join(others)})")
    kinds = "; ".join(t.DATA_HELP for t in texts.values() if t.DATA_HELP)
    assert data_help() == f"input data kind of the family ({kinds}), or both = every kind"
    _help_family(tmp_path, monkeypatch, "helpfam `len=N`", "helpfam: normal only")
    try:
        assert problem_help().endswith("; helpfam `len=N`)") and data_help().endswith("; helpfam: normal only), or "
                                                                                       "both = every kind")
        for cmd in ("verify", "profile"):
            res = CliRunner().invoke(main, [cmd, "--help"], terminal_width=400)
            assert res.exit_code == 0 and "helpfam `len=N`)" in res.output, res.output
        assert "helpfam: normal only), or both = every kind" in CliRunner().invoke(main, ["verify", "--help"],
                                                                                   terminal_width=400).output
    finally:
        for mod in [m for m in sys.modules if m.startswith("helpfam_family")]:
            del sys.modules[mod]


def test_the_cli_loads_no_family_runtime_until_help_is_shown():
    """`emitter --help` (and importing the CLI) loads no family's runtime module nor numpy: the help texts the
    families write are read only when `verify --help` / `profile --help` shows them."""
    import subprocess
    import sys

    code = ("import sys\nfrom click.testing import CliRunner\nfrom emitter.cli import main\n"
            "assert CliRunner().invoke(main, ['--help']).exit_code == 0\n"
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.endswith('.runtime')))\n"
            "out = CliRunner().invoke(main, ['verify', '--help'], terminal_width=400).output\n"
            "print(sorted(m for m in sys.modules if m.startswith('emitter.families.') and m.endswith('.runtime')))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    before, after = res.stdout.splitlines()
    assert before == "[]", before
    assert after == str(sorted(f"{m}.runtime" for m in FAMILIES.values())), after


# ---------------------------------------------------------------------------------------------- the contract
def test_every_family_fits_the_family_protocols():
    """Each registered family's package fits Family (the emit hooks) and its runtime module RuntimeFamily (data,
    verify and profile hooks), by name, type and call shape."""
    import importlib

    from emitter.families.base import (EMIT_HOOKS, PROFILE_HOOKS, RUNTIME_DATA, VERIFY_HOOKS, Family, RuntimeFamily,
                                       contract_misfits)

    for name, module in FAMILIES.items():
        assert contract_misfits(importlib.import_module(module), Family, EMIT_HOOKS) == [], name
        runtime = importlib.import_module(module + ".runtime")
        assert contract_misfits(runtime, RuntimeFamily, RUNTIME_DATA + VERIFY_HOOKS + PROFILE_HOOKS) == [], name


def test_the_registry_refuses_a_family_that_does_not_fit(tmp_path, monkeypatch):
    """A package registered as a family is checked when a stage first takes it: a missing emit hook, a hook that
    cannot take the protocol's arguments and a runtime module whose data or hooks are off are named."""
    import sys

    import pytest

    from emitter.families import registry
    from emitter.families.base import FamilyContractError, FamilyNotRunnable

    pkg = tmp_path / "misfit_family"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def expand_entry(doc, entry_path, entry, key_paths):\n    return iter(())\n"
                                     "def resolve():\n    return None\n"
                                     "def render_instance(instance, name, banner):\n    return ''\n")
    (pkg / "runtime.py").write_text("NAME = 'misfit'\nDATA_KINDS = 'normal'\nPROBLEM_KEYS = ()\nFAKE_FAULTS = ()\n"
                                    "BASELINES = ()\nPROBLEM_HELP = 3\nDATA_HELP = ''\n"
                                    "def config_from_entry(entry, root=None):\n    return None\n"
                                    "def problem_label(problem):\n    return ''\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.FAMILIES, "misfit", "misfit_family")
    try:
        with pytest.raises(FamilyContractError) as e:
            registry.family_module("misfit")
        assert "lacks instance_name" in str(e.value) and "resolve() cannot be called as resolve(candidate)" in str(e.value)
        assert registry.family_module("misfit", need=()).__name__ == "misfit_family"   # an optional hook's lookup
        with pytest.raises(FamilyNotRunnable) as e:
            registry.runtime_family("misfit", need=("config_from_entry", "problem_label"))
        assert "DATA_KINDS is str, not tuple" in str(e.value) and "PROBLEM_HELP is int, not str" in str(e.value)
        assert "problem_label(problem) cannot be called as problem_label(problem, data)" in str(e.value)
    finally:
        for mod in [m for m in sys.modules if m.startswith("misfit_family")]:
            del sys.modules[mod]
