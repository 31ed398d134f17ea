"""Label and field selectors, parsed once per request into predicates.

Why parse once: a list or watch over 10,000 pods evaluates the selector per object, so the
string is turned into a tuple of small requirement checks up front.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.kube.fake.errors import bad_request

Pred = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_top(sel: str) -> list[str]:
    """Split on commas that are not inside ``in (...)`` value lists."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _requirement(term: str) -> Callable[[Mapping[str, str]], bool]:
    m = _EQ_RE.match(term)
    if m:
        key, op, val = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != val
        return lambda labels: labels.get(key) == val
    m = _SET_RE.match(term)
    if not m:
        raise bad_request(f"unable to parse requirement: {term.strip()!r} in labelSelector")
    neg, key, op, vals = m.groups()
    if op:
        if neg:
            raise bad_request(f"unable to parse requirement: {term.strip()!r} in labelSelector")
        values = frozenset(v.strip() for v in vals.split(",") if v.strip())
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if neg:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def label_selector(sel: str | None) -> Pred | None:
    """A predicate on an object for a labelSelector string, or None when it selects everything."""
    if not sel or not sel.strip():
        return None
    reqs = tuple(_requirement(t) for t in _split_top(sel))

    def pred(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r(labels) for r in reqs)

    return pred


def match_labels(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector object (matchLabels + matchExpressions) against labels (controllers use it)."""
    if not selector:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values):
            return False
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A dotted field path as the string a fieldSelector compares against ('' when absent)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_selector(sel: str | None) -> Pred | None:
    """A predicate for a fieldSelector (``a.b=v``, ``a.b==v``, ``a.b!=v``, comma-joined)."""
    if not sel or not sel.strip():
        return None
    reqs: list[tuple[str, bool, str]] = []
    for term in sel.split(","):
        if not term.strip():
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid field selector: {term.strip()!r}")
        reqs.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def pred(obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, p) == v) == eq for p, eq, v in reqs)

    return pred


def combine(*preds: Pred | None) -> Pred | None:
    """Both predicates (None means 'everything')."""
    live = [p for p in preds if p is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]
    return lambda obj: all(p(obj) for p in live)
