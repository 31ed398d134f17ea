"""Discovery documents (``/version``, ``/api``, ``/apis``, resource lists) built from the store's types.

Why built per request from the table: a CRD applied a moment ago must show up at once, since
kubectl re-reads discovery when it meets a kind it does not know.
"""

from __future__ import annotations

from typing import Any

from gpupool.kube.fake.resources import ALL_VERBS, GROUP_ORDER, ResourceType
from gpupool.kube.fake.storage import Store

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-gpupool-fake",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "binding": ["create"],
    "eviction": ["create"],
    "scale": ["get", "patch", "update"],
}
_SUB_KINDS = {
    "binding": ("Binding", "", "v1"),
    "eviction": ("Eviction", "policy", "v1"),
    "scale": ("Scale", "autoscaling", "v1"),
}


def _groups(store: Store) -> dict[str, list[str]]:
    """group -> served versions, groups in the order the real server lists them."""
    out: dict[str, list[str]] = {}
    for group, version, _ in store.by_path:
        vs = out.setdefault(group, [])
        if version not in vs:
            vs.append(version)
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def core_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def group_list(store: Store) -> dict[str, Any]:
    groups = [_group_doc(g, vs) for g, vs in _groups(store).items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(store: Store, name: str) -> dict[str, Any] | None:
    vs = _groups(store).get(name)
    if not vs:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(name, vs)}


def _resource_doc(rt: ResourceType) -> dict[str, Any]:
    verbs = ["create"] if rt.plural == "bindings" else list(ALL_VERBS)
    doc: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": verbs,
        "storageVersionHash": "",
    }
    if rt.short_names:
        doc["shortNames"] = list(rt.short_names)
    if rt.categories or rt.plural in ("pods", "jobs", "deployments", "replicasets", "statefulsets"):
        doc["categories"] = list(rt.categories) or ["all"]
    return doc


def resource_list(store: Store, group_name: str, version: str) -> dict[str, Any] | None:
    """``APIResourceList`` of one group/version, subresources as ``pods/binding`` entries."""
    rts = [rt for (g, v, _), rt in sorted(store.by_path.items()) if g == group_name and v == version]
    if not rts:
        return None
    resources: list[dict[str, Any]] = []
    for rt in rts:
        resources.append(_resource_doc(rt))
        for sub in rt.subresources:
            kind, g, v = _SUB_KINDS.get(sub, (rt.kind, "", ""))
            entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": kind,
                "verbs": _SUB_VERBS.get(sub, ["get"]),
            }
            if g or v:
                entry["group"], entry["version"] = g, v
            resources.append(entry)
    gv = version if not group_name else f"{group_name}/{version}"
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def openapi_index(store: Store) -> dict[str, Any]:
    """``/openapi/v3``: one entry per group/version (the hash changes when the types do)."""
    paths = {}
    for group, version, _ in sorted(store.by_path):
        gv = _gv_path(group, version)
        tag = abs(hash(tuple(p for p in store.by_path if p[0] == group and p[1] == version))) % 10**12
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={tag:012d}"}
    return {"paths": paths}


def openapi_gv(store: Store, path: str) -> dict[str, Any] | None:
    """``/openapi/v3/<gv>``: just enough for kubectl — each resource's PATCH operation with its
    group/version/kind and the ``fieldValidation`` query parameter.

    Why so little: kubectl then validates server-side (it sends ``fieldValidation=Strict``), and
    since no PATCH declares a strategic-merge request body, ``kubectl apply`` computes its
    patches from its compiled-in types (built-ins) or as JSON merge patches (custom resources)."""
    paths = {}
    for (group, version, plural), rt in sorted(store.by_path.items()):
        if _gv_path(group, version) != path or plural == "bindings":
            continue
        ns = "namespaces/{namespace}/" if rt.namespaced else ""
        item = f"/{path}/{ns}{plural}/{{name}}"
        gvk = {"group": group, "version": version, "kind": rt.kind}
        params = [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        ]
        paths[item] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            }
        }
    if not paths:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }
