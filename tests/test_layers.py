"""The package reads from the bottom up: no module imports one of a higher layer, and no two parts
import each other, directly or around a loop. A part is a top-level module or a subpackage of
evospec; imports inside functions count too. README.md's layout section names the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "evospec"

# Bottom to top; a part may import parts of its own layer and of the layers below.
LAYERS = [
    (
        "errors",
        "config",
        "files",
        "machine",
        "types",
        "sampling",
        "stats",
        "verify",
        "target",
        "rescore",
        "cost",
        "learnable",
    ),
    ("models",),
    ("drafters", "learning", "selection", "draft_length"),
    ("engine",),
    ("generation", "reasoning"),
    ("bench", "serve", "distill", "hf"),
    ("cli",),
]
LAYER_OF = {part: index for index, parts in enumerate(LAYERS) for part in parts}


def part_of(dotted: str) -> str | None:
    """The part of evospec a dotted module name lies in (None outside evospec, or for the package itself)."""
    names = dotted.split(".")
    return names[1] if names[0] == "evospec" and len(names) > 1 else None


def imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """part -> the other parts its modules import."""
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        part = part_of(".".join(path.relative_to(package.parent).with_suffix("").parts))
        if part is None or part == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from evospec import engine` names the part in the alias
                names = (
                    [f"{node.module}.{alias.name}" for alias in node.names]
                    if node.module == "evospec"
                    else [node.module]
                )
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            graph.setdefault(part, set()).update(
                imported for name in names if (imported := part_of(name)) not in (None, part)
            )
    return graph


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(part, imported) wherever a part imports one of a higher layer."""
    return sorted(
        (part, imported)
        for part, targets in graph.items()
        for imported in targets
        if LAYER_OF[imported] > LAYER_OF[part]
    )


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """Parts that import each other around a loop, the first part repeated at the end ([] if none)."""
    done: set[str] = set()

    def visit(part: str, path: list[str]) -> list[str]:
        if part in path:
            return [*path[path.index(part) :], part]
        if part in done:
            return []
        for imported in sorted(graph.get(part, ())):
            if found := visit(imported, [*path, part]):
                return found
        done.add(part)
        return []

    return next((found for part in sorted(graph) if (found := visit(part, []))), [])


def test_every_part_has_a_layer():
    parts = {
        part_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)) for path in PACKAGE.rglob("*.py")
    }
    assert parts - {"__init__", None} == set(LAYER_OF)


def test_no_part_imports_a_higher_layer():
    assert upward(imports()) == []


def test_no_parts_import_each_other_around_a_loop():
    assert cycle(imports()) == []


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    """A tiny made-up package that breaks both rules, with imports of each form."""
    package = tmp_path / "evospec"
    (package / "drafters").mkdir(parents=True)
    (package / "errors.py").write_text("from evospec import engine\n")  # the bottom layer reaching up
    (package / "engine.py").write_text("import evospec.errors\n")
    (package / "drafters" / "a.py").write_text("def f():\n    from evospec.learning import x\n")
    (package / "learning.py").write_text("from evospec.drafters.a import f\n")
    graph = imports(package)
    assert graph == {"errors": {"engine"}, "engine": {"errors"}, "drafters": {"learning"}, "learning": {"drafters"}}
    assert upward(graph) == [("errors", "engine")]
    assert cycle(graph) == ["drafters", "learning", "drafters"]
