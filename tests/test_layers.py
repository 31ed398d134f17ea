"""The layers of the code, read from its imports with ``ast`` (nothing is imported to check).

Why: a layering rule that lives only in a document erodes one convenient import at a time;
the engine once imported the fragmentation benchmark, which then had to import the engine
late to get around the circle. These tests make each rule a failure the day it is broken:

- the engine (``gpupool.engine``) imports only the model, the quantities and itself, plus the
  standard library, numpy and sortedcontainers: it can be read, tested and reused without the
  service, the simulator or the benchmarks;
- no module imports a private (underscore) name of another package: what a package exposes is
  what it means to keep; the few such imports that remain are listed below with their reason,
  so that only a new one fails;
- no import circle between modules at module level;
- the top-level packages have an order, low to high (``PACKAGE_ORDER``): no import, at module
  level or inside a function (a late import is how a circle was hidden), goes from a package
  to a higher one, so there is no circle across packages; inside a package, no circle even
  through late imports except the few listed in ``LATE_CYCLES_ALLOWED`` with their reason;
- no module over 600 lines and no function over 100 (the aim is about 500 and 80): a newcomer
  should be able to read a module by its ideas and a function at once.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "gpupool"

#: what the engine may import from outside the standard library
ENGINE_THIRD_PARTY = frozenset({"numpy", "sortedcontainers"})
#: the project modules (and packages) the engine may import besides its own
ENGINE_PROJECT = ("gpupool.model", "gpupool.quantity", "gpupool.engine")

#: imports of another package's private names that exist today, as (importer, module, name).
#: Each has an owner outside this change; remove an entry when its import is fixed.
PRIVATE_ALLOWED: frozenset[tuple[str, str, str]] = frozenset()

#: module-level import circles that exist today (each as its sorted module names)
CYCLES_ALLOWED: frozenset[tuple[str, ...]] = frozenset()

#: the size limits: a module's lines, a function's lines (``def`` to its last line)
MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 80
#: modules over a limit today whose owners are outside this change, whole (module and functions)
SIZE_ALLOWED_MODULES: frozenset[str] = frozenset()
#: single functions over the limit today, as (module, qualified name): none left
SIZE_ALLOWED_FUNCTIONS: frozenset[tuple[str, str]] = frozenset()
#: module-name prefixes left out of the size limits while under construction: none left
SIZE_UNDER_CONSTRUCTION: tuple[str, ...] = ()


@dataclass(frozen=True)
class Import:
    """One imported module (or one name from it) as a module of the tree sees it."""

    importer: str
    module: str  # the module or package imported from
    name: str | None  # the name taken from it (``from module import name``), else None
    top_level: bool  # run when the importer is imported (not inside a function, not for typing)
    line: int
    typing: bool = False  # under ``if TYPE_CHECKING``: never run


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from ... import``, resolving a relative one against the importer."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if MODULES[importer].name != "__init__.py":
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Collector(ast.NodeVisitor):
    """Every import of one module, marked whether it runs when the module is imported."""

    def __init__(self, importer: str) -> None:
        self.importer = importer
        self.deferred = 0  # inside a function, or under ``if TYPE_CHECKING``
        self.typing = 0  # under ``if TYPE_CHECKING``
        self.out: list[Import] = []

    def _later(self, node: ast.AST) -> None:
        self.deferred += 1
        self.generic_visit(node)
        self.deferred -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _later

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node):
            self.generic_visit(node)
            return
        self.deferred += 1
        self.typing += 1
        for stmt in node.body:
            self.visit(stmt)
        self.typing -= 1
        self.deferred -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        top, typ = not self.deferred, bool(self.typing)
        self.out.extend(Import(self.importer, a.name, None, top, node.lineno, typ) for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = _absolute(self.importer, node)
        top, typ = not self.deferred, bool(self.typing)
        for a in node.names:
            sub = f"{mod}.{a.name}"
            if sub in MODULES:  # ``from package import submodule``
                self.out.append(Import(self.importer, sub, None, top, node.lineno, typ))
            else:
                self.out.append(Import(self.importer, mod, a.name, top, node.lineno, typ))


def _imports() -> list[Import]:
    out: list[Import] = []
    for name, path in MODULES.items():
        collector = _Collector(name)
        collector.visit(ast.parse(path.read_text(), str(path)))
        out.extend(collector.out)
    return out


IMPORTS = _imports()


def _unit(module: str) -> str:
    """The package a module belongs to: ``gpupool.engine`` for its modules, else the module."""
    return ".".join(module.split(".")[:2])


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_tree_is_read() -> None:
    assert "gpupool.engine.core" in MODULES and "gpupool.fragbench.engine_run" in MODULES
    assert any(i.importer == "gpupool.engine.core" and i.module == "gpupool.model" for i in IMPORTS)


def test_engine_imports_only_the_model_quantities_and_itself() -> None:
    allowed_outside = set(sys.stdlib_module_names) | ENGINE_THIRD_PARTY
    bad: set[str] = set()
    for i in IMPORTS:
        if not _within(i.importer, "gpupool.engine"):
            continue
        if i.module.split(".")[0] == "gpupool":
            ok = any(_within(i.module, p) for p in ENGINE_PROJECT)
        else:
            ok = i.module.split(".")[0] in allowed_outside
        if not ok:
            bad.add(f"{i.importer}:{i.line} imports {i.module}")
    assert not bad, "the engine imports outside its layer:\n" + "\n".join(sorted(bad))


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for i in IMPORTS:
        if not _within(i.module, "gpupool") or _unit(i.module) == _unit(i.importer):
            continue
        parts = i.module.split(".") + ([i.name] if i.name else [])
        private = [p for p in parts if p.startswith("_") and not p.startswith("__")]
        if private:
            found.add((i.importer, i.module, i.name or ""))
    return found


def test_no_module_imports_another_packages_private_names() -> None:
    new = sorted(_private_imports() - PRIVATE_ALLOWED)
    assert not new, "imports of another package's private names:\n" + "\n".join(
        f"{importer} imports {name or module} from {module}" for importer, module, name in new
    )


#: the HTTP layer (``gpupool.service.routes``) and who may import it: the routes themselves and
#: the application factories that mount them. Everything else (the CLI, the Kubernetes source,
#: the backends, the loops) calls the use-cases below it (``gpupool.service.usecases``).
HTTP_LAYER = "gpupool.service.routes"
HTTP_IMPORTERS_ALLOWED = {
    "gpupool.service.api": "the application factory: mounts every router",
    "gpupool.deploy.cli": "the admission webhook's own small application (routes.webhooks)",
}


def _route_importers(imports: list[Import]) -> set[str]:
    """Every import of the HTTP layer from outside it, at any depth (inside functions and under
    ``TYPE_CHECKING`` too: a late import is still a call into the routes)."""
    return {
        f"{i.importer}:{i.line} imports {i.module}"
        for i in imports
        if _within(i.module, HTTP_LAYER)
        and not _within(i.importer, HTTP_LAYER)
        and i.importer not in HTTP_IMPORTERS_ALLOWED
    }


def test_only_the_http_layer_and_the_app_factory_import_the_routes() -> None:
    bad = sorted(_route_importers(IMPORTS))
    assert not bad, (
        "modules below the HTTP layer import a route module (call gpupool.service."
        "usecases instead):\n" + "\n".join(bad)
    )


#: gpupool.kube's folders, low to high: a folder imports none of the folders after it
KUBE_FOLDERS = ("gpupool.kube.translate", "gpupool.kube.runtime", "gpupool.kube.adapters")


def test_kube_folders_import_only_downward() -> None:
    """The pure translation imports neither the runtime nor the adapters, and the runtime does
    not import the adapters (late imports included): the folders show the layers (issue 26)."""
    bad = sorted(
        f"{i.importer}:{i.line} imports {i.module}"
        for i in IMPORTS
        for n, low in enumerate(KUBE_FOLDERS)
        if _within(i.importer, low) and any(_within(i.module, high) for high in KUBE_FOLDERS[n + 1 :])
    )
    assert not bad, "a kube folder imports one above it:\n" + "\n".join(bad)


def test_the_route_check_sees_imports_inside_functions() -> None:
    src = "def f():\n    from gpupool.service.routes.config import apply\n"
    collector = _Collector("gpupool.kube.adapters.config_source")
    collector.visit(ast.parse(src))
    assert _route_importers(collector.out) == {
        "gpupool.kube.adapters.config_source:2 imports gpupool.service.routes.config"
    }


def _module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports when it is imported."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if i.top_level and i.module in MODULES:
            graph[i.importer].add(i.module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The circles of an import graph: its strongly connected components of more than one
    module, or a module importing itself (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[tuple[str, ...]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    out.append(tuple(sorted(comp)))
    return out


def test_no_import_circles_at_module_level() -> None:
    new = sorted(set(_cycles(_module_graph())) - CYCLES_ALLOWED)
    assert not new, "module-level import circles:\n" + "\n".join(" <-> ".join(c) for c in new)


#: the top-level packages (and top modules) of gpupool, low to high: a module imports only from
#: its own package and the ones before it, whether at module level or inside a function
#: (``TYPE_CHECKING`` imports never run and are left out). A new package must be placed here.
PACKAGE_ORDER: tuple[str, ...] = (
    "gpupool",  # the root package: the version
    "gpupool.model",
    "gpupool.quantity",
    "gpupool.audit",
    "gpupool.auth",
    "gpupool.oidc",
    "gpupool.audit_checkpoint",
    "gpupool.defaults",
    "gpupool.web",  # the dashboard's static files
    "gpupool.discovery",
    "gpupool.engine",
    "gpupool.fragbench",
    "gpupool.manifests",  # manifests and the translations of stored JSON to the model
    "gpupool.store",
    "gpupool.migrations",
    "gpupool.sim",
    "gpupool.cost",
    "gpupool.service",  # the controller, the backends' port, use-cases, the HTTP layer
    "gpupool.kube",  # an adapter: implements the backend port, calls the use-cases
    "gpupool.deploy",
    "gpupool.composition",  # the one place that builds a backend of any kind
    "gpupool.bench",
    "gpupool.cli",
)

#: imports up the order that exist today, as (importer, imported module) -> why; remove an
#: entry when its import is fixed (each is one late import)
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

#: circles inside one package through imports at any depth, as sorted module names -> why.
#: Each is a module split by size that imports the other half back inside one function.
LATE_CYCLES_ALLOWED: dict[tuple[str, ...], str] = {}


def _target(module: str) -> str | None:
    """The project module an import loads: the module itself, else its nearest package."""
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def _runtime_graph(imports: list[Import]) -> dict[str, set[str]]:
    """Module -> the project modules it imports at any depth (``TYPE_CHECKING`` left out)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in imports:
        target = _target(i.module) if _within(i.module, "gpupool") else None
        if not i.typing and target is not None and target != i.importer:
            graph.setdefault(i.importer, set()).add(target)
    return graph


def test_every_package_has_a_place_in_the_order() -> None:
    missing = sorted({_unit(m) for m in MODULES} - set(PACKAGE_ORDER))
    assert not missing, f"place these in PACKAGE_ORDER (low to high): {missing}"


def _upward_imports(imports: list[Import]) -> list[str]:
    rank = {p: n for n, p in enumerate(PACKAGE_ORDER)}
    return sorted(
        f"{i.importer}:{i.line} imports {i.module} ({'module level' if i.top_level else 'late'})"
        for i in imports
        if not i.typing
        and _within(i.module, "gpupool")
        and rank.get(_unit(i.module), -1) > rank.get(_unit(i.importer), len(rank))
        and (i.importer, _target(i.module)) not in UPWARD_ALLOWED
    )


def test_no_import_goes_up_the_package_order() -> None:
    bad = _upward_imports(IMPORTS)
    assert not bad, "imports from a lower package to a higher one:\n" + "\n".join(bad)


def test_no_circle_across_packages_even_through_late_imports() -> None:
    units: dict[str, set[str]] = {}
    for importer, targets in _runtime_graph(IMPORTS).items():
        units.setdefault(_unit(importer), set()).update(
            _unit(t) for t in targets if _unit(t) != _unit(importer) and (importer, t) not in UPWARD_ALLOWED
        )
    circles = _cycles(units)
    assert not circles, "circles across packages:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_circle_inside_a_package_even_through_late_imports() -> None:
    found = set(_cycles(_runtime_graph(IMPORTS)))
    new = sorted(found - set(LATE_CYCLES_ALLOWED))
    gone = sorted(set(LATE_CYCLES_ALLOWED) - found)
    assert not new, "import circles (late imports included):\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, f"no longer circles, drop them from LATE_CYCLES_ALLOWED: {gone}"


def test_the_order_check_sees_a_late_import_upward() -> None:
    src = "def f():\n    from gpupool.kube.adapters.backend import connect\n"
    collector = _Collector("gpupool.service.backends")
    collector.visit(ast.parse(src))
    assert _upward_imports(collector.out) == [
        "gpupool.service.backends:2 imports gpupool.kube.adapters.backend (late)"
    ]
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpupool.cli\n"
    collector = _Collector("gpupool.engine.core")
    collector.visit(ast.parse(typing_only))
    assert _upward_imports(collector.out) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    # the finder itself, on made-up graphs: a -> b -> c -> a with d -> a; e importing itself
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert _cycles({"e": {"e"}, "f": set()}) == [("e",)]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_scoring_modules_import_each_other_at_module_level_only() -> None:
    # the Score plugins and the measure once imported each other inside functions to hide a
    # circle; the registry (placement) now imports the scorers, which import the protocol
    mine = {
        "gpupool.engine.placement",
        "gpupool.engine.scoring",
        "gpupool.engine.fragscore",
        "gpupool.engine.fgd",
    }
    late = [
        f"{i.importer}:{i.line} imports {i.module} inside a function"
        for i in IMPORTS
        if i.importer in mine and not i.top_level and _within(i.module, "gpupool")
    ]
    assert not late, "\n".join(late)


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function or method longer than ``limit`` lines."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    n = (child.end_lineno or child.lineno) - child.lineno + 1
                    if n > limit:
                        out.append((name, n))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _size_checked(module: str) -> bool:
    return module not in SIZE_ALLOWED_MODULES and not any(
        module == p.rstrip(".") or module.startswith(p) for p in SIZE_UNDER_CONSTRUCTION
    )


def test_no_module_or_function_is_too_long() -> None:
    too_long: list[str] = []
    for module, path in MODULES.items():
        if not _size_checked(module):
            continue
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            too_long.append(
                f"{path.relative_to(SRC)}: {n} lines (at most {MAX_MODULE_LINES}); split it by idea"
            )
        for name, lines in _long_functions(ast.parse(text, str(path)), MAX_FUNCTION_LINES):
            if (module, name) not in SIZE_ALLOWED_FUNCTIONS:
                too_long.append(
                    f"{path.relative_to(SRC)}: {name} has {lines} lines (at most {MAX_FUNCTION_LINES})"
                )
    assert not too_long, "too long to read at once:\n" + "\n".join(too_long)


def test_the_size_check_measures_functions_and_methods() -> None:
    # the measure itself, on made-up source: a long method and a long nested function are found
    body = "\n".join(f"        x{i} = {i}" for i in range(101))
    src = f"class C:\n    def m(self):\n{body}\n\ndef f():\n    def g():\n{body}\n    return g\n"
    found = dict(_long_functions(ast.parse(src), MAX_FUNCTION_LINES))
    assert found == {"C.m": 102, "f": 104, "f.g": 102}
    assert _long_functions(ast.parse("def short():\n    return 1\n"), MAX_FUNCTION_LINES) == []
    assert _size_checked("gpupool.engine.core") and _size_checked("gpupool.kube.adapters.source")
