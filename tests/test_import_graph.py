"""No import circles among the project's modules: every import counts, a lazy one inside
a function included (it runs the importing module's code path all the same); imports
under `if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "controlplane", "bench")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


class _Imports(ast.NodeVisitor):
    """The names a module imports, relative imports made absolute."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.names: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for statement in node.orelse:
                self.visit(statement)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.names.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base.pop()
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        self.names.add(source)
        # `from package import module` imports the module.
        self.names.update(f"{source}.{alias.name}" for alias in node.names)


def imported_names(module: str, path: Path) -> set[str]:
    """Every name `module` imports (its modules and the names it takes from them)."""
    visitor = _Imports(module, path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return visitor.names


def import_graph() -> dict[str, set[str]]:
    """Each project module and the project modules it imports."""
    modules = project_modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in modules:  # a name from a module: that module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def test_no_module_imports_itself_through_others():
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as error:
        circle = " -> ".join(error.args[1])
        raise AssertionError(f"an import circle: {circle}") from None


def test_the_walk_sees_lazy_imports_and_leaves_out_type_checking_ones():
    graph = import_graph()
    # trainer/runtime/rlpd_split.py imports the runner inside a function, and only
    # for type checking at its top.
    assert "trainer.runner.rlpd_runner" in graph["trainer.runtime.rlpd_split"]
    assert "trainer.runtime.rlpd_split" not in graph["trainer.runner.rlpd_runner"]


# The `python -m trainer` entry points drive placed runs: they sit above the runtime.
ENTRY_POINTS = {"trainer.runner.cli", "trainer.evaluation.cli", "trainer.__main__"}


def test_only_the_runtime_imports_ray_and_only_entry_points_import_the_runtime():
    for module, path in project_modules().items():
        if not module.startswith("trainer.") or module.startswith("trainer.runtime"):
            continue
        names = imported_names(module, path)
        assert not any(n == "ray" or n.startswith("ray.") for n in names), module
        if module not in ENTRY_POINTS:
            assert not any(n.startswith("trainer.runtime") for n in names), module


# The apps every feature builds on: they import none of the features.
SHARED_LAYERS = ("controlplane.access",)
FEATURE_APPS = (
    "controlplane.runs",
    "controlplane.experiments",
    "controlplane.inventory",
    "controlplane.console",
    "controlplane.realtime",
    "controlplane.api",
)


def test_the_shared_access_layer_imports_no_feature_app():
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith(SHARED_LAYERS):
            wrong = sorted(t for t in targets if t.startswith(FEATURE_APPS))
            assert not wrong, f"{module} imports {wrong}"
