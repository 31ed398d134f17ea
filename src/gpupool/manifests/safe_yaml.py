"""YAML from users, read with bounded aliases, expansion and nesting.

Why a loader of our own: ``yaml.safe_load`` shares an aliased node rather than copying it, so
a "billion laughs" (nine levels of ten aliases) loads in microseconds, but whatever walks the
result afterwards (validation, the store's checks, a dump) visits 10^9 nodes and never ends.
This loader counts alias events and nesting while it composes, then sizes each document as if
every alias were expanded (each shared node counted once per use, computed once), and refuses
past the limits of :mod:`gpupool.manifests.limits`, naming the document and the limit. A node
that contains an alias to itself (a recursive document) is refused too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

from gpupool.manifests.limits import MAX_YAML_ALIASES, MAX_YAML_DEPTH, MAX_YAML_NODES


class YamlLimitError(ComposerError):
    """A YAML document past a stated limit (a ``yaml.YAMLError``, located at its line)."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses documents past the limits (see the module docstring)."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._document = 0
        self._aliases = 0
        self._depth = 0

    def compose_document(self) -> Node | None:
        self._document += 1
        self._aliases = 0
        node: Node | None = super().compose_document()
        if node is not None:
            size = expanded_size(node, MAX_YAML_NODES)
            if size is None:
                self._refuse("an alias refers to a node that contains it (a recursive document)", node)
            elif size > MAX_YAML_NODES:
                self._refuse(
                    f"expands to more than {MAX_YAML_NODES:,} nodes through its aliases "
                    f"(the limit MAX_YAML_NODES)",
                    node,
                )
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                self._refuse(f"has more than {MAX_YAML_ALIASES:,} aliases (the limit MAX_YAML_ALIASES)")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                self._refuse(f"is nested more than {MAX_YAML_DEPTH} levels deep (the limit MAX_YAML_DEPTH)")
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def _refuse(self, problem: str, node: Node | None = None) -> None:
        mark = node.start_mark if node is not None else self.peek_event().start_mark
        raise YamlLimitError(None, None, f"document {self._document} {problem}", mark)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: Node, limit: int) -> int | None:
    """How many nodes ``root`` has with every alias expanded (capped at ``limit + 1``), or None
    when it is recursive. Each distinct node is visited once, so a billion laughs costs what
    its text does; iterative, so a deep document cannot exhaust the stack."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the ancestors of the node being visited
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in _children(node)))
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            return None
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def load_all(text: str) -> Iterator[Any]:
    """Every document of ``text``, as ``yaml.safe_load_all``; YamlLimitError past a limit."""
    loader = BoundedLoader(text)
    try:
        while loader.check_data():
            yield loader.get_data()
    finally:
        loader.dispose()


def load(text: str) -> Any:
    """The single document of ``text``, as ``yaml.safe_load``; YamlLimitError past a limit."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
