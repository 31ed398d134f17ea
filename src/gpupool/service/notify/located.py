"""Where a field of a YAML document is: its path as the user writes it (``spec.sinks[0].url``)
and the line it is on, so an error points at what to edit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


def loc_text(parts: Iterable[object]) -> str:
    """``("spec", "sinks", 0, "url")`` -> ``spec.sinks[0].url``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _child(node: yaml.Node, key: object) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == str(key):
                return v
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key]
    return None


def line_of(text: str, loc: Iterable[Any]) -> int | None:
    """The 1-based line of the deepest node of ``loc`` found in ``text`` (None: not YAML)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    found = None
    for part in loc:
        if node is None:
            break
        found, node = node, _child(node, part)
    last = node if node is not None else found
    return None if last is None else last.start_mark.line + 1


__all__ = ["line_of", "loc_text"]
