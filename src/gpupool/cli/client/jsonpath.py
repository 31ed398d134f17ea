"""The small JSONPath that ``-o jsonpath=...`` and ``--sort-by`` read, as kubectl writes them.

Why our own: kubectl users type ``{.items[*].name}`` and ``--sort-by=.submittedAt``; that needs
fields, indexes and ``[*]`` over plain JSON, not a general query language with its own syntax.

A template is literal text with ``{expression}`` parts; an expression is a path of ``.field``,
``['field']``, ``[N]`` (negative counts from the end) and ``[*]``. Several results are joined
by a space, as kubectl does; ``\\n`` and ``\\t`` in the literal text are a newline and a tab.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STEP = re.compile(r"\.([A-Za-z0-9_\-/]+)|\[\*\]|\[(-?\d+)\]|\['([^']*)'\]|\.\*")


class JsonPathError(ValueError):
    """A template or path that cannot be read; the message names the bad part."""


def steps(path: str) -> list[str | int | None]:
    """A path's steps: a field name, an index, or ``None`` for every element."""
    path = path.strip()
    if path.startswith("$"):
        path = path[1:]
    if path and not path.startswith((".", "[")):
        path = "." + path
    out: list[str | int | None] = []
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            raise JsonPathError(f"cannot read {path[pos:]!r} in {path!r}")
        field, index, quoted = m.group(1), m.group(2), m.group(3)
        out.append(field if field is not None else int(index) if index is not None else quoted)
        pos = m.end()
    return out


def find(path: str, data: Any) -> list[Any]:
    """Every value ``path`` reaches in ``data`` (missing fields reach nothing)."""
    values = [data]
    for step in steps(path):
        nxt: list[Any] = []
        for v in values:
            if step is None:
                nxt.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else [])
            elif isinstance(step, int):
                if isinstance(v, list) and -len(v) <= step < len(v):
                    nxt.append(v[step])
            elif isinstance(v, dict) and step in v:
                nxt.append(v[step])
        values = nxt
    return values


def text(v: Any) -> str:
    """A value as kubectl prints it: strings bare, everything else as JSON."""
    return v if isinstance(v, str) else json.dumps(v)


def render_template(template: str, data: Any) -> str:
    """The template with each ``{expression}`` replaced by what it finds in ``data``."""
    out: list[str] = []
    pos = 0
    for m in re.finditer(r"\{([^{}]*)\}", template):
        out.append(template[pos : m.start()])
        out.append(" ".join(text(v) for v in find(m.group(1), data)))
        pos = m.end()
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise JsonPathError(f"unbalanced braces in {template!r}")
    out.append(rest)
    return "".join(out).replace("\\n", "\n").replace("\\t", "\t")


def sort_key(path: str) -> Any:
    """A key for ``sorted`` by the first value ``path`` finds: numbers before text, missing last."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    steps(path)  # a bad path is an error before anything is printed

    def key(item: Any) -> tuple[int, float, str]:
        found = find(path, item)
        if not found or found[0] is None:
            return (2, 0.0, "")
        v = found[0]
        if isinstance(v, bool | int | float):
            return (0, float(v), "")
        return (1, 0.0, text(v))

    return key
