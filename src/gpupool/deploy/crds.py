"""gpupool's CustomResourceDefinitions, generated from the manifest models.

Why generated: ``gpupool validate``, the store and the cluster must accept the same objects, so
the pydantic models in :mod:`gpupool.manifests` are the one source of truth and the CRDs'
``openAPIV3Schema`` is derived from their JSON schema. Kubernetes wants *structural* schemas:
no ``$ref``, a ``type`` on every node, no types inside ``anyOf``, OpenAPI 3.0's ``nullable`` and
boolean ``exclusiveMinimum``. Unions of scalars become ``x-kubernetes-int-or-string`` (as
Kubernetes' own quantities: write ``"0.5"``, not ``0.5``), free-form maps
``x-kubernetes-preserve-unknown-fields``. Defaults are left out: the API server would write
them into stored objects, and gpupool applies its own defaults when it reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupool.manifests import API_VERSION, SPECS

GROUP, VERSION = API_VERSION.split("/")
#: JSON-schema keywords that carry over to OpenAPI 3.0 unchanged
_KEPT = ("type", "enum", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern")
_SCALARS = {"string", "integer", "number"}


@dataclass(frozen=True, slots=True)
class CrdInfo:
    """What a CRD says besides its spec schema: names, scope and the columns ``kubectl get`` shows."""

    kind: str
    plural: str
    short: str
    namespaced: bool
    columns: tuple[tuple[str, str, str], ...]  # (name, type, JSONPath)
    status: dict[str, Any]


_AGE = ("Age", "date", ".metadata.creationTimestamp")
_FREE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
CRDS = (
    CrdInfo(
        "ResourcePool",
        "resourcepools",
        "gprp",
        False,
        (
            ("Environment", "string", ".spec.environment"),
            ("Preemptible", "boolean", ".spec.preemptible"),
            _AGE,
        ),
        _FREE,
    ),
    CrdInfo(
        "Queue",
        "queues",
        "gpq",
        False,
        (("Parent", "string", ".spec.parent"), ("Weight", "number", ".spec.weight"), _AGE),
        _FREE,
    ),
    CrdInfo(
        "Workload",
        "workloads",
        "gpwl",
        True,
        (
            ("Queue", "string", ".spec.queue"),
            ("Phase", "string", ".status.phase"),
            ("Position", "integer", ".status.position"),
            ("Reason", "string", ".status.reason"),
            ("Pool", "string", ".status.admission.pool"),
            _AGE,
        ),
        {
            **_FREE,
            "description": "The engine's view, mirrored by gpupool: phase, queue position, why it waits.",
            "properties": {
                "phase": {"type": "string"},
                "queue": {"type": "string"},
                "position": {"type": "integer"},
                "reason": {"type": "string"},
                "reasonCode": {"type": "string"},
                "admission": {
                    "type": "object",
                    "properties": {
                        "pool": {"type": "string"},
                        "nodes": {"type": "array", "items": {"type": "string"}},
                        "borrowing": {"type": "boolean"},
                    },
                },
            },
        },
    ),
)


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-schema node of a pydantic model as a structural OpenAPI 3.0 schema node."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return structural({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if "anyOf" in node:
        return _union(node, defs)
    out: dict[str, Any] = {k: node[k] for k in _KEPT if k in node}
    if "description" in node:
        out["description"] = " ".join(node["description"].split())
    if "exclusiveMinimum" in node:  # JSON Schema's number -> OpenAPI 3.0's minimum + flag
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if out.get("type") == "array":
        out["items"] = structural(node.get("items", {}), defs)
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        _object(node, out, defs)
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        return {**out, **_FREE}  # an untyped node (Any): keep whatever is there
    return out


def _object(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any]) -> None:
    props = node.get("properties")
    if props:
        out["properties"] = {k: structural(v, defs) for k, v in props.items()}
        if node.get("required"):
            out["required"] = list(node["required"])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        out["additionalProperties"] = structural(extra, defs)
    elif extra is True or (not props and extra is None):
        out["x-kubernetes-preserve-unknown-fields"] = True


def _union(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``X | None`` is X, nullable; ``str | int (| float)`` is int-or-string; others are free-form."""
    variants = [v for v in node["anyOf"] if v.get("type") != "null"]
    nullable = len(variants) < len(node["anyOf"])
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if len(variants) == 1:
        out = structural({**variants[0], **rest}, defs)
    elif {v.get("type") for v in variants} <= _SCALARS and any(v.get("type") == "string" for v in variants):
        out = {"x-kubernetes-int-or-string": True}
    elif {v.get("type") for v in variants} == {"string", "object"}:
        out = {"x-kubernetes-preserve-unknown-fields": True}  # a short string or its object form
    else:
        out = dict(_FREE)
    if nullable:
        out["nullable"] = True
    return out


def spec_schema(kind: str) -> dict[str, Any]:
    """The structural schema of ``kind``'s spec, from its pydantic model."""
    raw = SPECS[kind].model_json_schema()
    return structural(raw, raw.get("$defs", {}))


def crd(info: CrdInfo) -> dict[str, Any]:
    """One CustomResourceDefinition (apiextensions.k8s.io/v1) as a plain dict."""
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(info.kind),
            "status": info.status,
        },
        "required": ["spec"],
    }
    columns = [{"name": n, "type": t, "jsonPath": p} for n, t, p in info.columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "gpupool"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.kind.lower(),
                "shortNames": [info.short],
                "categories": ["gpupool"],
            },
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def all_crds() -> list[dict[str, Any]]:
    """gpupool's CRDs in a fixed order (ResourcePool, Queue, Workload)."""
    return [crd(info) for info in CRDS]


def crd_file_name(obj: dict[str, Any]) -> str:
    """The committed file name of a CRD: ``<group>_<plural>.yaml``, as controller-gen names them."""
    plural = obj["spec"]["names"]["plural"]
    return f"{GROUP}_{plural}.yaml"
