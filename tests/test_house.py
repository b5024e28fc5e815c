"""The house's shape, checked against the tree: docs/architecture.md's module table names every module and no module
that is gone; no circle between the studio's modules, of any length (a function-level import counts: a lazy import
hides a circle, it does not remove it); nothing below the edges reads the settings record."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "studio"

pytestmark = pytest.mark.quick


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if "models" not in p.parts}


def _lab_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / "lab").rglob("*.py")}


def test_the_labs_table_names_every_lab_module_and_the_studio_never_imports_the_lab():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## The lab: every module") : doc.index("## Data flow")]
    named = set(re.findall(r"`(lab/[\w/]+\.py)`", table))
    mods = _lab_modules() - {"lab/__init__.py", "lab/tiny/__init__.py", "lab/regimes/__init__.py"}
    assert sorted(mods - named) == [] and sorted(named - _lab_modules()) == []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not any(n == "lab" or n.startswith("lab.") for n in names), f"{path} imports the lab"


def test_the_architecture_module_table_matches_the_tree():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## Every module") : doc.index("## The lab: every module")]
    named = set(re.findall(r"`(studio/[\w/]+\.py)`", table))
    inits = {m for m in _modules() if m.endswith("__init__.py")}  # one row says what every part's front door holds
    assert "`studio/<part>/__init__.py`" in table
    assert sorted(_modules() - inits - named) == []  # a module the table leaves out
    assert sorted(named - _modules()) == []  # a row of a module that is gone


def _imports(path: Path) -> set[str]:
    """The studio modules `path` imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("studio"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("studio"))
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the studio modules it imports (a part's front door, its __init__, is a module too; a module's import
    of its own part's door is not an edge)."""
    names = {}
    for p in PKG.rglob("*.py"):
        if "models" not in p.parts:
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            names[name.removesuffix(".__init__")] = p
    return {
        m: {
            i for i in _imports(p) if i in names and i != m and not m.startswith(i + ".") and not i.startswith(m + ".")
        }
        for m, p in names.items()
    }


def test_no_circle_between_modules():
    """Any length, lazy imports included: the imports go one way (docs/architecture.md, the floors)."""
    graph, seen, circles = _graph(), {}, []

    def walk(m: str, path: list[str]) -> None:  # depth first; a module on the current path again closes a circle
        seen[m] = "open"
        for n in sorted(graph[m]):
            if seen.get(n) == "open":
                circles.append(path[path.index(n) :] + [n])
            elif n not in seen:
                walk(n, path + [n])
        seen[m] = "done"

    for m in sorted(graph):
        if m not in seen:
            walk(m, [m])
    assert circles == []


def test_nothing_below_the_edges_reads_the_settings_record():
    """The engine, the measurements and the bench take their settings as parameters (the model manager's record,
    handed down from the edge that built it): none calls spec.settings.current()."""
    readers = []
    for part in ("engine", "measure", "bench"):
        for p in (PKG / part).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "current",
                    "settings",
                ):
                    readers.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


# each feature's state record (engine.state) and the modules that apply that feature: its only writers
OWNERS = {
    "quantize": {"quantize.py"},
    "step_cache": {"cache.py", "hooks.py"},  # (hooks: diffusers' cache hooks, engine.cache's other half)
    "compile": {"compile.py", "aot.py"},  # (aot: compile's ahead-of-time form)
    "lora": {"lora.py"},
    "offloading": {"offload.py", "streams.py"},  # (streams: what a block-streaming regime moves)
    "workers": {"parallel.py"},
}
MUTATORS = {"add", "append", "clear", "pop", "update", "reset", "setdefault"}


def _written_records(tree: ast.AST) -> list[tuple[str, int]]:
    """(record, line) of every write to a StackState record (`state.<record>...` or `stack_state(...).<record>...`):
    an assignment to it or under it, or a mutating call on it."""
    chains = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            chains += [(t, node.lineno) for t in node.targets]
        elif isinstance(node, ast.AugAssign):
            chains.append((node.target, node.lineno))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            chains.append((node.func.value, node.lineno))
    out = []
    for target, line in chains:
        for t in ast.walk(target) if isinstance(target, ast.Tuple) else [target]:
            attrs = []
            while isinstance(t, (ast.Attribute, ast.Subscript)):
                if isinstance(t, ast.Attribute):
                    attrs.append(t.attr)
                t = t.value
            rooted = (isinstance(t, ast.Name) and t.id == "state") or (
                isinstance(t, ast.Call) and getattr(t.func, "id", "") == "stack_state"
            )
            if rooted and attrs and attrs[-1] in OWNERS:
                out.append((attrs[-1], line))
    return out


def test_each_state_record_is_written_only_by_the_module_that_applies_it():
    strays = []
    for p in (PKG / "engine").glob("*.py"):
        for record, line in _written_records(ast.parse(p.read_text())):
            if p.name not in OWNERS[record]:
                strays.append(f"{p.name}:{line} writes {record}")
    assert strays == []
    seen = {r for p in (PKG / "engine").glob("*.py") for r, _ in _written_records(ast.parse(p.read_text()))}
    assert seen == set(OWNERS)  # the check sees every record's writes (it would pass vacuously otherwise)
