"""Compose, don't mix in: no class in ``src/`` has more than two bases, read with ``ast``.

Why: a class spread over many mixin bases that call each other through ``self`` hides who
calls whom: no import shows those calls, and a reader following one method cannot see it lead
into another module (issue 26: the engine was ``Engine(PreemptionSearch, BlockedHints,
PartialAdmission, BorrowRounds, UsageDecayOrder)``). A part is a class with its own state and
a narrow interface, passed what it needs. Bases that declare an interface or a kind rather
than bring behaviour do not count: ``Protocol``, ``Generic``, ``ABC`` and exceptions (with
every exception class of the tree).

Declare, don't probe (issue 26): no ``getattr(x, "name", default)`` or ``hasattr(x, "name")``
in ``src/`` but the allowed ones (``PROBES_ALLOWED``, each with its reason): a probe hides an
optional capability from the type checker and from the reader of the collaborator's class.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "gpupool"
MAX_BASES = 2
#: bases that say what a class is, not what it inherits to do
NOT_COUNTED = frozenset({"Protocol", "Generic", "ABC", "object"})
_BUILTIN_EXCEPTIONS = frozenset(
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
)

#: classes over the limit today, each with its reason, as "module:Class"
KNOWN: dict[str, str] = {}


def _base_name(node: ast.expr) -> str:
    """``Protocol`` for ``Protocol``, ``typing.Protocol`` and ``Generic[T]`` alike."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ast.unparse(node)


def _classes(tree: ast.Module) -> list[tuple[str, list[str]]]:
    return [(n.name, [_base_name(b) for b in n.bases]) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def exception_classes(trees: dict[str, ast.Module]) -> set[str]:
    """Names of the classes that derive from an exception, transitively over the tree."""
    found = set(_BUILTIN_EXCEPTIONS)
    classes = [c for tree in trees.values() for c in _classes(tree)]
    grew = True
    while grew:
        grew = False
        for name, bases in classes:
            if name not in found and any(b in found for b in bases):
                found.add(name)
                grew = True
    return found


def over_based(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Every class with more than ``MAX_BASES`` counted bases, as "module:Class" -> bases."""
    exceptions = exception_classes(trees)
    out: dict[str, list[str]] = {}
    for module, tree in trees.items():
        for name, bases in _classes(tree):
            counted = [b for b in bases if b not in NOT_COUNTED and b not in exceptions]
            if len(counted) > MAX_BASES:
                out[f"{module}:{name}"] = counted
    return out


def _tree() -> dict[str, ast.Module]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = ast.parse(p.read_text(), str(p))
    return out


def test_no_class_has_more_than_two_bases() -> None:
    """Every class of ``src/`` but the known ones keeps to two counted bases."""
    found = over_based(_tree())
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, f"compose instead of mixing in (a part is a field, passed what it needs): {new}"


def test_known_exceptions_are_still_needed() -> None:
    """An entry of ``KNOWN`` is removed once its class is composed (the list only shrinks)."""
    found = over_based(_tree())
    assert set(KNOWN) <= set(found), sorted(set(KNOWN) - set(found))
    assert all(reason.strip() for reason in KNOWN.values())


def test_the_check_counts_mixins_but_not_interfaces_or_exceptions() -> None:
    """The engine as it was (five mixins) fails; Protocol, Generic, ABC and exceptions do not
    count, also through a subscript or a module attribute."""
    src = """
import abc, typing
class Engine(PreemptionSearch, BlockedHints, PartialAdmission, BorrowRounds, UsageDecayOrder): ...
class Port(typing.Protocol, Generic[T], abc.ABC, Base): ...
class AppError(ValueError): ...
class InputError(AppError, KeyError, LookupError, Mixin): ...
class Two(A, B): ...
"""
    assert over_based({"m": ast.parse(src)}) == {
        "m:Engine": [
            "PreemptionSearch",
            "BlockedHints",
            "PartialAdmission",
            "BorrowRounds",
            "UsageDecayOrder",
        ]
    }


# -- optional capabilities are declared, not probed (issue 26) ---------------------------------
#: the literal ``getattr(x, "name", default)`` / ``hasattr(x, "name")`` calls that stay, as
#: "module:attribute" -> why it is no probe of one of gpupool's own collaborators
PROBES_ALLOWED: dict[str, str] = {
    "gpupool.discovery.nvml:NVML_NVLINK_MAX_LINKS": "a library constant older pynvml releases lack",
    "gpupool.sim.scenario:problem_mark": "PyYAML's error: only a MarkedYAMLError carries a mark",
    "gpupool.sim.scenario:problem": "PyYAML's error: only a MarkedYAMLError carries a problem",
    "gpupool.service.notify.config:problem_mark": "PyYAML's error: only a MarkedYAMLError carries a mark",
    "gpupool.service.notify.config:problem": "PyYAML's error: only a MarkedYAMLError carries a problem",
    "gpupool.manifests.documents:problem_mark": "PyYAML's error: only a MarkedYAMLError carries a mark",
    "gpupool.manifests.documents:problem": "PyYAML's error: only a MarkedYAMLError carries a problem",
    "gpupool.kube.adapters.config_source:errors": "whatever a refused apply raised: located "
    "errors where its type carries them (the API's ApiError, ManifestError, ...)",
    "gpupool.kube.adapters.config_source:message": "whatever a refused apply raised: the API's "
    "ApiError carries its message apart, any other exception is its str()",
    "gpupool.store.utilisation:rowcount": "SQLAlchemy's Result: rowcount is on CursorResult only",
    "gpupool.bench.kube:getloadavg": "the standard library: os.getloadavg is Unix-only",
    "gpupool.service.leader:state": "the ASGI scope's app: a Starlette app has state, another may not",
    "gpupool.service.leader:svc": "Starlette's app.state: svc is set once the app is built",
    "gpupool.service.audit_witness:audit_witness": "Starlette's app.state: the typed accessor "
    "witness_of, set only where a witness runs",
    "gpupool.service.alerts:alerts": "Starlette's app.state: the typed accessor loop_of, set only "
    "where the alert loop runs",
    "gpupool.service.routes.utilisation:utilisation": "Starlette's app.state: set only where the "
    "utilisation loop runs",
    "gpupool.service.routes.webhooks:namespace_queues": "Starlette's app.state: set only where the "
    "namespace webhook is served",
    "gpupool.service.routes.alerts:notifier": "Starlette's app.state: set only where notifications "
    "are configured",
}


def probes(trees: dict[str, ast.Module]) -> dict[str, list[int]]:
    """Every ``getattr(x, "<literal>", default)`` and ``hasattr(x, "<literal>")``, as
    "module:attribute" -> the lines it is on."""
    out: dict[str, list[int]] = {}
    for module, tree in trees.items():
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
                continue
            arity = {"getattr": 3, "hasattr": 2}.get(n.func.id)
            if arity is None or len(n.args) != arity:
                continue
            name = n.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                out.setdefault(f"{module}:{name.value}", []).append(n.lineno)
    return out


def test_optional_capabilities_are_declared_not_probed() -> None:
    """No ``getattr`` with a literal name and a default, no ``hasattr`` with a literal name, in
    ``src/`` but the allowed ones: an optional capability of a collaborator is declared (a
    Protocol method with its default, an attribute every implementation sets, an Optional
    field) and called directly, so a type checker and a reader see it."""
    found = probes(_tree())
    new = {k: v for k, v in found.items() if k not in PROBES_ALLOWED}
    assert not new, f"declare the capability (a Protocol member, an Optional field) and use it: {new}"


def test_allowed_probes_are_still_there() -> None:
    """An entry of ``PROBES_ALLOWED`` goes once its probe does (the list only shrinks)."""
    found = probes(_tree())
    assert set(PROBES_ALLOWED) <= set(found), sorted(set(PROBES_ALLOWED) - set(found))
    assert all(reason.strip() for reason in PROBES_ALLOWED.values())


def test_the_probe_check_sees_literal_getattr_defaults_and_hasattr_only() -> None:
    """A literal name with a default, and ``hasattr``, count; a plain ``getattr(x, "a")``, a
    computed name and a method of another object named getattr do not."""
    src = """
a = getattr(x, "pick_cpu", None)
b = hasattr(m, "max_wait_s")
c = getattr(x, "a")
d = getattr(self, f, None)
e = obj.getattr(x, "b", None)
f = getattr(x, 'pos', 0) + getattr(y, "pos", 1)
"""
    assert probes({"m": ast.parse(src)}) == {"m:pick_cpu": [2], "m:max_wait_s": [3], "m:pos": [7, 7]}
