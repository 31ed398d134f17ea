"""``pods/binding`` and ``pods/eviction``: the two writes a scheduler makes that are not updates.

Why the refusals matter: a scheduler that binds twice, binds a gated pod, or binds a pod that is
going away must get the same 409 the real registry gives (Kubernetes'
``pkg/registry/core/pod/storage`` assigns the node and the Binding's annotations in one write).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpupool.kube.fake import errors
from gpupool.kube.fake.ops import Ops
from gpupool.kube.fake.patch import apply_patch
from gpupool.kube.fake.selectors import match_labels
from gpupool.kube.fake.storage import Obj, now_rfc3339


def bind(ops: Ops, ns: str, name: str, body: Any) -> Obj:
    """Bind pod ``ns/name`` to ``body.target.name``; returns a success Status (201)."""
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a Binding object")
    target = body.get("target") or {}
    node = target.get("name")
    # The real server's messages and status (500: its binding storage returns field errors as
    # a plain error) for the two checks it makes.
    if not node:
        raise errors.unwrapped("target.name: Required value")
    if target.get("kind") not in (None, "", "Node"):
        raise errors.unwrapped(
            f'target.kind: Unsupported value: "{target.get("kind")}": supported values: "Node"'
        )
    store = ops.store
    pods = store.types["pods"]
    bmd = body.get("metadata") or {}
    with store.lock:
        pod = store.get(pods, ns, name)
        md = pod["metadata"]
        if bmd.get("uid") and bmd["uid"] != md["uid"]:
            raise errors.conflict(
                "pods/binding",
                name,
                f"Precondition failed: UID in precondition: {bmd['uid']}, UID in object meta: {md['uid']}",
            )
        if bmd.get("resourceVersion") and bmd["resourceVersion"] != md["resourceVersion"]:
            raise errors.conflict(
                "pods/binding",
                name,
                "Precondition failed: resourceVersion in precondition "
                f"{bmd['resourceVersion']} does not match {md['resourceVersion']}",
            )
        spec = pod.get("spec") or {}
        if md.get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if spec.get("nodeName"):
            raise errors.conflict(
                "pods/binding", name, f'pod {name} is already assigned to node "{spec["nodeName"]}"'
            )
        if spec.get("schedulingGates"):
            raise errors.conflict("pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates")
        new_md = {**md, "annotations": {**(md.get("annotations") or {}), **(bmd.get("annotations") or {})}}
        status = dict(pod.get("status") or {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status["conditions"] = conds
        new = {**pod, "metadata": new_md, "spec": {**spec, "nodeName": node}, "status": status}
        store.commit(pods, "MODIFIED", new, pod)
        store.stats.binds += 0 if store.dry_run else 1
    return errors.success(name, "pods", 201)


def _selected(sel: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> bool:
    return match_labels(sel, pod["metadata"].get("labels") or {})


def _healthy(pod: Obj) -> bool:
    st = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return st.get("phase") == "Running" and ready and not pod["metadata"].get("deletionTimestamp")


def _pdb_refusal(ops: Ops, ns: str, pod: Obj) -> str:
    """Why evicting ``pod`` would violate a PodDisruptionBudget ('' when none would be)."""
    if not _healthy(pod):
        return ""
    store = ops.store
    pdbs, _ = store.list(store.types["poddisruptionbudgets.policy"], ns)
    for pdb in pdbs:
        spec = pdb.get("spec") or {}
        if not match_labels(spec.get("selector"), pod["metadata"].get("labels") or {}):
            continue
        sel = spec.get("selector")
        matching, _ = store.list(store.types["pods"], ns, functools.partial(_selected, sel))
        healthy = sum(1 for p in matching if _healthy(p))
        total = len(matching)
        if "minAvailable" in spec and healthy - 1 < _count(spec["minAvailable"], total):
            return pdb["metadata"]["name"]
        if "maxUnavailable" in spec and total - healthy + 1 > _count(spec["maxUnavailable"], total):
            return pdb["metadata"]["name"]
    return ""


def _count(value: Any, total: int) -> int:
    """A PDB's int-or-percent field as a pod count (percentages round up, as the real one does)."""
    text = str(value).strip()
    try:
        return -(-int(text[:-1]) * total // 100) if text.endswith("%") else int(text)
    except ValueError:
        raise errors.invalid(
            "PodDisruptionBudget", "", "spec", f"{value!r} is not an integer or percentage"
        ) from None


def evict(ops: Ops, ns: str, name: str, body: Any) -> Obj:
    """Evict (delete with grace) unless a PodDisruptionBudget forbids it (429, as the real one)."""
    body = body if isinstance(body, dict) else {}
    opts = body.get("deleteOptions") or {}
    store = ops.store
    pods = store.types["pods"]
    with store.lock:
        pod = store.get(pods, ns, name)
        pdb = _pdb_refusal(ops, ns, pod)
        if pdb:
            raise errors.ApiError(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
                "TooManyRequests",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb} needs more healthy pods",
                        }
                    ]
                },
            )
        ops.delete(
            pods,
            ns,
            name,
            opts.get("gracePeriodSeconds"),
            opts.get("propagationPolicy"),
            opts.get("preconditions"),
        )
        store.stats.evictions += 0 if store.dry_run else 1
    return errors.success(name, "pods", 201)


def _scale_of(obj: Obj) -> Obj:
    """The ``autoscaling/v1`` Scale of a Deployment, ReplicaSet or StatefulSet, as the real
    registry answers ``.../scale`` (``kubectl scale`` and an HPA read and write only this)."""
    md, spec, st = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in md
        },
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {
            "replicas": int(st.get("replicas") or 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def scale(ops: Ops, rt: Any, ns: str, name: str, method: str, ctype: str, body: Any) -> Obj:
    """GET, PUT or PATCH ``.../scale``: a write changes only ``spec.replicas`` of the object
    (409 on a stale resourceVersion; a negative or non-integer count is refused naming it)."""
    with ops.store.lock:
        cur = ops.store.get(rt, ns, name)
        current = _scale_of(cur)
        if method == "GET":
            return current
        new = apply_patch(ctype, current, body) if method == "PATCH" else body
        if not isinstance(new, dict):
            raise errors.bad_request("the request body must be a Scale object")
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != cur["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, name, "the object has been modified", rt.group)
        replicas = (new.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid("Scale", name, "spec.replicas", "must be an integer >= 0")
        out = ops.update(rt, ns, name, {**cur, "spec": {**(cur.get("spec") or {}), "replicas": replicas}})
        return _scale_of(out)
