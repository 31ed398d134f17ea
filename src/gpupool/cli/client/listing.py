"""Lists as ``kubectl get`` gives them: every page followed, ``-l`` label selectors, ``-w`` watch.

Why follow pages here: the server answers a bounded page and a continue token; a client that
read one page would silently drop everything past it (the first day's "only 1,000" bug).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.cli.client.http import Api
from gpupool.cli.client.output import Format, Out, emit, fail, plain_lines, show
from gpupool.cli.client.rows import rows_for

#: objects asked per request; the server may answer fewer
PAGE = 500
#: the resources the server pages (the others are small and answer whole)
PAGED = ("workloads", "approvals", "audit")

Labels = Mapping[str, str]


def list_all(api: Api, res: str, params: Mapping[str, Any], url: str) -> dict[str, Any]:
    """Every item of ``res``'s list at ``url`` (``objects.path``: the kinds table is
    there), page after page, following the server's continue token."""
    q: dict[str, Any] = dict(params)
    if res in PAGED:
        q["limit"] = PAGE
    items: list[Any] = []
    while True:
        data = api.call("GET", url, params=q)
        page = list(data.get("items", []))
        items += page
        token = (data.get("metadata") or {}).get("continue")
        if token and page:
            q["continue"] = token
        elif res == "workloads" and "metadata" not in data and len(page) == PAGE:
            q["after"] = page[-1]["seq"]  # a server from before continue tokens pages by seq
        else:
            return {"items": items}


def labels_of(item: Mapping[str, Any]) -> Labels:
    """An object's labels, wherever its kind keeps them (a workload's are in its manifest)."""
    for holder in (item.get("metadata"), (item.get("manifest") or {}).get("metadata"), item):
        if isinstance(holder, Mapping) and isinstance(holder.get("labels"), Mapping):
            return holder["labels"]
    return {}


_TERM = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w./-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?)\s*$"
)


def _term(text: str) -> Callable[[Labels], bool]:
    """One selector term as a test of a label set."""
    m = _TERM.match(text)
    if m is None:
        fail(f"-l: cannot read {text!r}; use key=value, key!=value, key, !key or key in (a,b)", 2)
    if m["absent"]:
        gone: str = m["absent"]
        return lambda ls: gone not in ls
    key: str = m["key"]
    if m["op"]:
        value, want = m["value"], m["op"] != "!="
        return lambda ls: (ls.get(key) == value) is want
    if m["set"]:
        values = {v.strip() for v in m["values"].split(",") if v.strip()}
        inside = m["set"] == "in"
        return lambda ls: (key in ls and ls[key] in values) is inside
    return lambda ls: key in ls


def parse_selector(selector: str) -> Callable[[Labels], bool]:
    """A kubectl label selector (terms joined by commas, all must hold) as a test of labels."""
    parts = [p for p in re.split(r",(?![^(]*\))", selector) if p.strip()]
    if not parts:
        fail("-l: an empty selector", 2)
    tests = [_term(p) for p in parts]
    return lambda ls: all(t(ls) for t in tests)


def _identity(item: Mapping[str, Any]) -> str:
    meta = item.get("metadata") or {}
    return str(meta.get("name") or item.get("name") or item.get("id") or json.dumps(item, sort_keys=True))


def watch_list(
    fetch: Callable[[], dict[str, Any]],
    res: str,
    output: Format,
    *,
    interval: float = 2.0,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print the list, then each object again whenever it changes, until Ctrl-C (or ``rounds``).

    Why polling: every list is a plain GET, so the watch works against any server and any
    token that may list; a changed object prints one more row, as ``kubectl get -w`` does.
    """
    seen: dict[str, str] = {}
    first = True
    try:
        while rounds is None or rounds > 0:
            data = fetch()
            changed = []
            for item in data.get("items", []):
                k, v = _identity(item), json.dumps(item, sort_keys=True, default=str)
                if seen.get(k) != v:
                    seen[k] = v
                    changed.append(item)
            _print_changes(changed, res, output, first)
            first = False
            rounds = None if rounds is None else rounds - 1
            if rounds is None or rounds > 0:
                sleep(interval)
    except KeyboardInterrupt:
        return


def _print_changes(items: list[Any], res: str, output: Format, header: bool) -> None:
    """The changed objects: table rows (the header only the first time), or one document each."""
    if not items and not header:
        return
    if output in (Out.table, Out.wide):
        t = rows_for(res, {"items": items}, output is Out.wide)
        if header:
            show(t)
        else:
            print("\n".join(plain_lines(t)[1:]), flush=True)
        return
    for item in items:
        emit(item, output)
