"""No import circles among trainer.algorithms' modules, lazy ones included: every import
statement counts, those under `if TYPE_CHECKING:` and inside functions too, since a
circle hidden there still ties two modules into one."""

import ast
from pathlib import Path

import trainer.algorithms

PACKAGE = "trainer.algorithms"
FOLDER = Path(trainer.algorithms.__file__).parent


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the file at `path` imports, by any statement."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from pkg import name`: the submodule `pkg.name` where there is one,
            # else the module `pkg` itself.
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in modules
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {
        (PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"): path
        for path in FOLDER.glob("*.py")
    }
    modules = set(files)
    return {name: module_imports(path, modules) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as the modules along it."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target == start:
                if frozenset(path) not in seen:
                    seen.add(frozenset(path))
                    found.append([*path, start])
            elif target not in path and target > start:  # each circle from its least module
                walk(start, target, [*path, target])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def test_the_walk_finds_a_circle_hidden_under_type_checking(tmp_path):
    (tmp_path / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    modules = {"pkg.a", "pkg.b"}
    graph = {f"pkg.{p.stem}": module_imports(p, modules) for p in tmp_path.glob("*.py")}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_the_algorithms_import_no_circle():
    """on_policy <-> step_graph and rlpd <-> rlpd_graph were circles: the graphed steps
    took the algorithm classes."""
    circles = cycles(import_graph())
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
