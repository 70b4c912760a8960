"""The exported loader's helper contract (templates/library/loader.py.j2's header): the families' loader text uses the
shared loader's public helpers only, never its private (`_`) names, and every public helper is in the header's list."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "templates" / "library" / "loader.py.j2"
FAMILY_TEXTS = sorted(ROOT.glob("templates/*/library/*loader*.py.j2"))
TOP_LEVEL = re.compile(r"^(?:def |class )?([A-Za-z_]\w*)\s*(?:[:=(]|$)", re.M)


def _shared() -> tuple[str, str, set[str]]:
    text = SHARED.read_text(encoding="utf-8")
    header, body = text.split("#}", 1)
    names = {m.group(1) for m in TOP_LEVEL.finditer(body) if m.group(1) not in ("if", "try", "from", "import")}
    return header, body, names


def test_family_loader_text_uses_no_private_name_of_the_shared_loader():
    _, _, names = _shared()
    private = {n for n in names if n.startswith("_") and not n.startswith("__")}
    assert {"_lib", "_declare", "_view"} & private == {"_lib", "_declare"}, sorted(private)
    assert FAMILY_TEXTS and any("gemm" in str(p) for p in FAMILY_TEXTS), FAMILY_TEXTS
    found = []
    for path in FAMILY_TEXTS:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for n in private:
                if re.search(rf"(?<![\w.]){re.escape(n)}\b", line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {n}")
    assert not found, "family loader text calls the shared loader's private helpers:\n" + "\n".join(found)


def test_every_public_helper_is_in_the_contract_list():
    header, body, names = _shared()
    in_all = set(re.findall(r'"(\w+)"', body.split("__all__ = [", 1)[1].split("]", 1)[0]))
    helpers = {n for n in names if not n.startswith("_")} - in_all - {"STATUS", "ABI_VERSION", "as_operand"}
    assert {"operand_view", "check_status", "register_torch_op", "TORCH_OP_REGISTRARS"} <= helpers, sorted(helpers)
    listed = set(re.findall(r"\b\w+\b", header))
    assert not helpers - listed, f"public helpers missing from the loader header's contract: {sorted(helpers - listed)}"
    missing = {n for n in re.findall(r"\b([a-z]+(?:_[a-z]+)+)\(", header)} - names
    assert not missing, f"the contract lists helpers the shared loader does not define: {sorted(missing)}"
