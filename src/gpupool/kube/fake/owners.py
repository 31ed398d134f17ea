"""What the simulated controllers share: finding owned objects, creating children with owner
references, writing status only when it changed.

Why status only on change: every write is a watch event for the scheduler under test; a
controller that rewrote identical status on each event would flood it (and the benchmark).
"""

from __future__ import annotations

import hashlib
from typing import Any

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.ops import Ops
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.storage import Obj, deep_copy, now_rfc3339

TERMINAL = ("Succeeded", "Failed")


def owner_ref(rt: ResourceType, owner: Obj) -> dict[str, Any]:
    md = owner["metadata"]
    return {
        "apiVersion": rt.api_version,
        "kind": rt.kind,
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned(ops: Ops, owner: Obj, key: str) -> list[Obj]:
    """The objects of resource ``key`` owned by ``owner`` (by uid), in name order."""
    store = ops.store
    out = []
    for k, (ns, name) in store.owned_by(owner["metadata"]["uid"]):
        if k == key:
            obj = store.find(store.types[key], ns, name)
            if obj is not None:
                out.append(obj)
    return out


def controller_of(obj: Obj, kind: str) -> tuple[str, str] | None:
    """(namespace, name) of the owner of ``kind`` that controls ``obj``."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == kind and ref.get("controller", True):
            return obj["metadata"].get("namespace", ""), ref.get("name", "")
    return None


def active(pods: list[Obj]) -> list[Obj]:
    """Pods that still count toward a controller's replicas (not finished, not going away)."""
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") not in TERMINAL and not p["metadata"].get("deletionTimestamp")
    ]


def is_ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def create_child(
    ops: Ops,
    key: str,
    owner_rt: ResourceType,
    owner: Obj,
    template: Obj,
    name: str = "",
    generate_name: str = "",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec_extra: dict[str, Any] | None = None,
) -> Obj | None:
    """Create a child (pod or job) from a template; None when it already exists."""
    tmd = template.get("metadata") or {}
    md: dict[str, Any] = {
        "labels": {**(tmd.get("labels") or {}), **(labels or {})},
        "annotations": {**(tmd.get("annotations") or {}), **(annotations or {})},
        "ownerReferences": [owner_ref(owner_rt, owner)],
    }
    if name:
        md["name"] = name
    else:
        md["generateName"] = generate_name
    body = {"metadata": md, "spec": {**deep_copy(template.get("spec") or {}), **(spec_extra or {})}}
    try:
        return ops.create(ops.store.types[key], owner["metadata"]["namespace"], body)
    except ApiError as exc:
        if exc.reason == "AlreadyExists":
            return None
        if exc.code in (400, 403, 404, 422):  # the template cannot be created: say so on the owner
            failed_create_event(ops, owner_rt, owner, exc.message)
            return None
        raise


def failed_create_event(ops: Ops, owner_rt: ResourceType, owner: Obj, message: str) -> None:
    """A ``FailedCreate`` Warning on the owner, once per distinct message (the real controllers
    emit it and back off; here a fixed name per message keeps retries from adding more)."""
    md = owner["metadata"]
    why = message.split(": ", 1)[-1]  # without the generated child name, which differs per try
    digest = hashlib.sha256(f"{md['uid']}/{why}".encode()).hexdigest()[:10]
    now = now_rfc3339()
    ev = {
        "metadata": {"name": f"{md['name']}.{digest}"},
        "type": "Warning",
        "reason": "FailedCreate",
        "message": f"Error creating: {message}",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "involvedObject": {
            "kind": owner_rt.kind,
            "apiVersion": owner_rt.api_version,
            "name": md["name"],
            "namespace": md.get("namespace", ""),
            "uid": md["uid"],
        },
        "source": {"component": f"{owner_rt.kind.lower()}-controller"},
    }
    try:
        ops.create(ops.store.types["events"], md.get("namespace", "default"), ev)
    except ApiError as exc:
        if exc.reason != "AlreadyExists":
            raise


def set_status(ops: Ops, rt: ResourceType, obj: Obj, status: Obj) -> None:
    """Write ``status`` through the status subresource when it differs from the stored one."""
    with ops.store.lock:
        cur = ops.store.find(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if cur is None or cur["metadata"]["uid"] != obj["metadata"]["uid"] or cur.get("status") == status:
            return
        ops.update(
            rt,
            cur["metadata"].get("namespace", ""),
            cur["metadata"]["name"],
            {**cur, "status": status},
            "status" if "status" in rt.subresources else "",
        )


def condition(conds: list[Obj], ctype: str, status: bool, reason: str = "", message: str = "") -> list[Obj]:
    """``conds`` with ``ctype`` set (its transition time kept when its status did not change)."""
    s = "True" if status else "False"
    old = next((c for c in conds if c.get("type") == ctype), None)
    if old is not None and old.get("status") == s and old.get("reason", "") == reason:
        return conds
    now = now_rfc3339()
    new = {
        "type": ctype,
        "status": s,
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now if old is None or old.get("status") != s else old.get("lastTransitionTime"),
    }
    return [c for c in conds if c.get("type") != ctype] + [new]


def has_condition(obj: Obj, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def delete_all(ops: Ops, key: str, objs: list[Obj]) -> None:
    rt = ops.store.types[key]
    for o in objs:
        try:
            ops.delete(rt, o["metadata"]["namespace"], o["metadata"]["name"], None, "Background")
        except ApiError as exc:
            if exc.code != 404:
                raise
