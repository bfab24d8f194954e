"""No import circles among the project's modules: every import counts, a lazy one inside
a function included (it runs the importing module's code path all the same); imports
under `if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
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
ENTRY_POINTS = ("trainer.commands", "trainer.__main__")


def test_only_the_runtime_imports_ray_and_only_entry_points_import_the_runtime():
    for module, path in project_modules().items():
        if not module.startswith("trainer.") or module.startswith("trainer.runtime"):
            continue
        names = imported_names(module, path)
        assert not any(n == "ray" or n.startswith("ray.") for n in names), module
        if not module.startswith(ENTRY_POINTS):
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


def package_graph(prefix: str) -> dict[str, set[str]]:
    """The graph of `prefix`'s packages (`trainer.runner`, ...): one imports another when
    any of its modules does."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module.startswith(prefix + "."):
            inside = {package(t) for t in targets if t.startswith(prefix + ".")}
            graph.setdefault(package(module), set()).update(inside - {package(module)})
    return graph


def test_the_trainer_packages_import_each_other_without_a_circle():
    """The layers docs/architecture.md draws: commands above runtime above runner."""
    graph = package_graph("trainer")
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        raise AssertionError(f"a circle of packages: {' -> '.join(error.args[1])}") from None
    assert "trainer.runner" in graph["trainer.runtime"]
    assert "trainer.runtime" not in graph["trainer.runner"]


def drawn_layers(prefix: str = "trainer") -> str:
    """`package_graph` as docs/architecture.md shows it: each package with the packages
    it imports, the highest layer (the longest chain of imports below it) first."""
    graph = package_graph(prefix)
    height: dict[str, int] = {}
    for name in TopologicalSorter(graph).static_order():  # imported before importers
        height[name] = 1 + max((height[t] for t in graph.get(name, ())), default=-1)
    order = sorted(height, key=lambda name: (-height[name], name))
    width = max(len(name) for name in order) - len(prefix) - 1

    def short(name: str) -> str:
        return name.removeprefix(prefix + ".")

    lines = []
    for name in order:
        below = ", ".join(short(t) for t in sorted(graph.get(name, ()), key=order.index))
        lines.append(f"{short(name):<{width}}  → {below or '(nothing)'}")
    return "\n".join(lines)


def test_the_architecture_page_draws_the_packages_as_they_import_each_other():
    page = (ROOT / "docs/architecture.md").read_text()
    assert textwrap.indent(drawn_layers(), "  ") in page, (
        "docs/architecture.md, 'Rules kept':\n" + drawn_layers()
    )


def test_what_the_control_plane_imports_from_the_trainer_pulls_in_no_training_stack():
    """The control plane shares the trainer's config, cluster and wire-format modules:
    importing them all loads neither torch, Ray nor the link's WebSocket client."""
    shared = sorted(
        name
        for module, targets in import_graph().items()
        if module.startswith("controlplane.")
        for name in targets
        if name.startswith("trainer.")
    )
    script = (
        "import importlib, sys\n"
        f"for name in {shared!r}: importlib.import_module(name)\n"
        "print(sorted({'torch', 'ray', 'websockets'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", (shared, done.stdout)
