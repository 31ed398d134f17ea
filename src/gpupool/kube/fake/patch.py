"""The three patch kinds: JSON merge (RFC 7386), JSON patch (RFC 6902) and strategic merge.

Strategic merge here is the subset schedulers and ``kubectl apply`` send: lists of known
fields merge by their key (containers by ``name``, conditions by ``type``...), finalizers merge
as a set, ``$patch: delete``/``replace`` on list items and maps, ``$deleteFromPrimitiveList/``
and ``$setElementOrder/`` directives. A merged keyed list is ordered as the real server orders it:
the patch's items in the patch's order (or ``$setElementOrder``'s), the live object's other items
placed among them by their live order (apimachinery's ``normalizeElementOrder``).
"""

from __future__ import annotations

from typing import Any

from gpupool.kube.fake.errors import ApiError, bad_request
from gpupool.kube.fake.storage import deep_copy

#: list field name -> merge key, as the Kubernetes types declare ``patchMergeKey``
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "conditions": "type",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "schedulingGates": "name",
    "ownerReferences": "uid",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "taints": "key",
    "addresses": "type",
    "topologySpreadConstraints": "topologyKey",
}
#: lists of scalars that merge as sets
SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, f"json patch: path {path!r} does not exist", "Invalid")
    return cur


def _put(doc: Any, path: str, value: Any, insert: bool) -> None:
    parts = _pointer(path)
    if not parts:
        raise bad_request("json patch: replacing the whole object is not supported")
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, list):
        idx = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if idx < 0 or idx > len(parent) or (not insert and idx == len(parent)):
            raise ApiError(422, f"json patch: index in {path!r} out of range", "Invalid")
        if insert:
            parent.insert(idx, value)
        else:
            parent[idx] = value
    elif isinstance(parent, dict):
        if not insert and last not in parent:
            raise ApiError(422, f"json patch: path {path!r} does not exist", "Invalid")
        parent[last] = value
    else:
        raise ApiError(422, f"json patch: parent of {path!r} is not an object or list", "Invalid")


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1] if parts else ""
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    raise ApiError(422, f"json patch: path {path!r} does not exist", "Invalid")


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a copy of ``doc``: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise bad_request("json patch: the body must be a list of operations")
    doc = deep_copy(doc)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch: operation {i} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind == "add":
            _put(doc, path, deep_copy(op.get("value")), insert=True)
        elif kind == "replace":
            _put(doc, path, deep_copy(op.get("value")), insert=False)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            src = op.get("from", "")
            val = _remove(doc, src) if kind == "move" else deep_copy(_walk(doc, _pointer(src), src))
            _put(doc, path, val, insert=True)
        elif kind == "test":
            if _walk(doc, _pointer(path), path) != op.get("value"):
                raise ApiError(422, f"json patch: test failed at {path!r}", "Invalid")
        else:
            raise bad_request(f"json patch: unknown op {kind!r} in operation {i}")
    return doc


def strategic_merge(target: Any, patch: Any) -> Any:
    """Strategic merge patch of ``patch`` onto ``target`` (neither is modified)."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    if patch.get("$patch") == "replace":
        return {k: deep_copy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$retainKeys", "$patch"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in out.get(field) or [] if x not in (v or [])]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and k in MERGE_KEYS:
            order = patch.get(f"$setElementOrder/{k}")
            out[k] = _merge_keyed(
                out.get(k) or [], v, MERGE_KEYS[k], order if isinstance(order, list) else None
            )
        elif isinstance(v, list) and k in SET_LISTS:
            cur = list(out.get(k) or [])
            order = patch.get(f"$setElementOrder/{k}")
            out[k] = _normalized_order(
                cur + [x for x in v if x not in cur], cur, v, None, order if isinstance(order, list) else None
            )
        elif isinstance(v, dict):
            merged = strategic_merge(out.get(k), v)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = deep_copy(v)
    return out


def _merge_keyed(cur: list[Any], patch: list[Any], key: str, order: list[Any] | None = None) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [deep_copy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = list(cur)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"strategic merge patch: list items need the merge key {key!r}")
        pos = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if pos is not None:
                out.pop(pos)
        elif pos is None:
            out.append(deep_copy(item))
        else:
            out[pos] = strategic_merge(out[pos], item)
    return _normalized_order(out, cur, patch, key, order)


def _normalized_order(
    merged: list[Any], live: list[Any], patch: list[Any], key: str | None, order: list[Any] | None
) -> list[Any]:
    """The real server's order of a merged list (keyed by ``key``; a list of scalars when
    None): the items the patch names (in the order ``$setElementOrder`` gives, else the
    patch's own), with the live-only items slotted in by their live positions; a live-only item
    goes before a named one only when both are live and it was earlier."""

    def ident(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, dict) else item

    named = list(dict.fromkeys(ident(i) for i in [*(order if order is not None else patch), *patch]))
    present = {ident(i) for i in merged}
    right = [next(i for i in merged if ident(i) == k) for k in named if k in present]
    right_ids = {id(i) for i in right}
    left = [i for i in merged if id(i) not in right_ids]
    live_pos = {ident(c): n for n, c in enumerate(live)}
    out: list[Any] = []
    while left or right:
        pl, pr = (
            (live_pos.get(ident(left[0])) if left else None),
            (live_pos.get(ident(right[0])) if right else None),
        )
        if not right or (pl is not None and pr is not None and pl < pr):
            out.append(left.pop(0))
        else:
            out.append(right.pop(0))
    return out


def apply_patch(content_type: str, target: Any, patch: Any) -> Any:
    """Dispatch on the request's Content-Type (415 for kinds the server does not take)."""
    ct = content_type.split(";")[0].strip()
    if ct == "application/merge-patch+json":
        return merge_patch(target, patch)
    if ct == "application/json-patch+json":
        return json_patch(target, patch)
    if ct == "application/strategic-merge-patch+json":
        return strategic_merge(target, patch)
    raise ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types "
        f"include: application/json-patch+json, application/merge-patch+json, "
        f"application/strategic-merge-patch+json (got {ct!r})",
        "UnsupportedMediaType",
    )
