"""The shared library templates and each family's text for them, read from the templates (no nvcc, no GPU).

A family's library text reaches the shared files in two ways, and Jinja drops both silently when a name drifts: a
block of templates/<f>/library/<file>.j2 fills the place `library_places.get("<block>")` of templates/library/<file>.j2
(rendered by the family's library_pieces), and a template that extends a shared one (sm90a entry, launch unit) fills
its `{% block %}` slots. Every name on one side must be on the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from emitter.families.registry import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"
PLACE = re.compile(r'library_places\.get\("([a-z_]+)"')


def _env() -> jinja2.Environment:
    from emitter.render import environment

    return environment(str(TEMPLATES))


def _blocks(rel: str) -> set[str]:
    env = _env()
    tree = env.parse(env.loader.get_source(env, rel)[0])
    return {b.name for b in tree.find_all(jinja2.nodes.Block)}


def _extends(rel: str) -> str | None:
    env = _env()
    node = env.parse(env.loader.get_source(env, rel)[0]).find(jinja2.nodes.Extends)
    return node.template.value if node is not None else None


def _family_place_files() -> list[Path]:
    return [p for f in FAMILIES for p in sorted((TEMPLATES / f / "library").glob("*.j2"))
            if (TEMPLATES / "library" / p.name).is_file() and _extends(str(p.relative_to(TEMPLATES))) is None
            and PLACE.search((TEMPLATES / "library" / p.name).read_text())]


def test_every_family_block_has_its_place_and_every_place_a_block():
    files = _family_place_files()
    assert {p.name for p in files} >= {"header.h.j2", "api.cpp.j2", "table.cpp.j2", "loader.py.j2", "README.md.j2"}
    filled: set[str] = set()
    for p in files:
        places = set(PLACE.findall((TEMPLATES / "library" / p.name).read_text()))
        blocks = _blocks(str(p.relative_to(TEMPLATES)))
        assert blocks <= places, f"{p.relative_to(ROOT)}: blocks with no place in templates/library/{p.name}: " \
                                 f"{sorted(blocks - places)}"
        filled |= {f"{p.name}:{b}" for b in blocks}
    for shared in sorted((TEMPLATES / "library").glob("*.j2")):
        for place in PLACE.findall(shared.read_text()):
            assert f"{shared.name}:{place}" in filled, \
                f"templates/library/{shared.name}: place {place!r} that no family's library template fills"


def test_a_template_that_extends_a_shared_one_fills_only_its_slots():
    children = {str(p.relative_to(TEMPLATES)): parent for f in FAMILIES for p in sorted((TEMPLATES / f).rglob("*.j2"))
                if (parent := _extends(str(p.relative_to(TEMPLATES)))) is not None}
    assert {"gemm/sm90a/entry.cu.j2", "gemm/library/launch.cu.j2"} <= set(children), sorted(children)
    for rel, parent in children.items():
        missing = _blocks(rel) - _blocks(parent)
        assert not missing, f"templates/{rel} fills blocks {sorted(missing)} that {parent} does not have (Jinja drops them)"


def test_the_check_sees_a_block_without_a_slot(tmp_path):
    """The check itself: a child block the parent lacks is found (Jinja would render without it)."""
    env = jinja2.Environment(loader=jinja2.DictLoader({"p": "{% block a %}{% endblock %}",
                                                       "c": '{% extends "p" %}{% block a %}x{% endblock %}{% block b %}y{% endblock %}'}))
    assert env.get_template("c").render() == "x"
    child = {b.name for b in env.parse(env.loader.get_source(env, "c")[0]).find_all(jinja2.nodes.Block)}
    parent = {b.name for b in env.parse(env.loader.get_source(env, "p")[0]).find_all(jinja2.nodes.Block)}
    assert child - parent == {"b"}
