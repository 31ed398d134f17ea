"""Every backend declares the optional parts of the protocol it has (``Capability``), and only those.

Why: the controller once probed backends with ``getattr(backend, "down_nodes", None)``; a typo
or a renamed method was then a feature silently off. Now a backend lists its capabilities and
the controller looks them up with ``capability()``; this test keeps each list true: a declared
capability's method (or attribute) exists, and an existing one is declared.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.service.backends import Capability, capability
from gpupool.service.backends.local import LocalBackend
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.leader import GuardedBackend

BACKENDS = [VirtualBackend, LocalBackend, KubernetesBackend]


def _instance_attributes(cls: type) -> set[str]:
    """Names assigned as ``self.NAME = ...`` in the class (and its project bases)."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("gpupool."):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def _has(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in _instance_attributes(cls)


@pytest.mark.parametrize("cls", BACKENDS, ids=lambda c: c.__name__)
def test_a_backend_declares_exactly_the_optional_parts_it_has(cls: type) -> None:
    declared = cls.capabilities  # type: ignore[attr-defined]
    assert isinstance(declared, frozenset) and all(isinstance(c, Capability) for c in declared)
    missing = sorted(c.value for c in declared if not _has(cls, c.value))
    undeclared = sorted(c.value for c in Capability if c not in declared and _has(cls, c.value))
    assert not missing, f"{cls.__name__} declares what it does not have: {missing}"
    assert not undeclared, f"{cls.__name__} has, but does not declare: {undeclared}"


def test_capability_finds_a_declared_method_and_nothing_else(tmp_path: object) -> None:
    be = VirtualBackend()
    assert capability(be, Capability.NEXT_FINISH) == be.next_finish
    assert capability(be, Capability.OBSERVED_NODES) is None
    guarded = GuardedBackend(be, lambda: True)  # the controller's wrapper passes them through
    assert capability(guarded, Capability.NEXT_FINISH) == be.next_finish
    assert capability(guarded, Capability.REFUSES) is None


def test_the_check_finds_an_undeclared_method() -> None:
    class Sloppy:
        capabilities = frozenset({Capability.RELOAD})

        def reload(self) -> None: ...

        def next_finish(self) -> float | None:
            return None

    assert _has(Sloppy, "next_finish") and not _has(Sloppy, "down_nodes")
    assert [c for c in Capability if c not in Sloppy.capabilities and _has(Sloppy, c.value)] == [
        Capability.NEXT_FINISH
    ]
