"""Offline checks of generated objects: CRD schemas are structural, custom resources match them.

Why here and not only in tests: ``gpupool deploy check`` runs the same checks on a directory a
platform team edited, with no cluster at hand. Built-in kinds are checked by kubernetes-validate
(a dev dependency, imported only when asked for).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_NO_TYPE_OK = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")
_FORBIDDEN_IN_UNION = ("type", "description", "default", "additionalProperties", "nullable")


def structural_problems(schema: dict[str, Any], path: str = "") -> list[str]:
    """Why ``schema`` is not a structural schema, one located line each (empty when it is)."""
    out: list[str] = []
    where = path or "<root>"
    if "$ref" in schema:
        out.append(f"{where}: $ref is not allowed")
    if "type" not in schema and not any(schema.get(k) for k in _NO_TYPE_OK):
        out.append(f"{where}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        out.append(f"{where}: properties and additionalProperties together")
    for key in ("anyOf", "allOf", "oneOf"):
        for i, sub in enumerate(schema.get(key, [])):
            out.extend(f"{where}.{key}[{i}]: {k} inside {key}" for k in _FORBIDDEN_IN_UNION if k in sub)
    for name, sub in schema.get("properties", {}).items():
        out.extend(structural_problems(sub, f"{path}.{name}"))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out.extend(structural_problems(schema[key], f"{path}.{key}"))
    return out


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.0 structural schema as the JSON Schema the API server would apply."""
    if node.get("x-kubernetes-int-or-string"):
        out: dict[str, Any] = {"type": ["integer", "string"]}
    elif node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
        out = {} if "type" not in node else {"type": node["type"]}
    else:
        out = {
            k: v
            for k, v in node.items()
            if not k.startswith("x-") and k not in ("nullable", "exclusiveMinimum", "exclusiveMaximum")
        }
        for flag, bound, kw in (
            ("exclusiveMinimum", "minimum", "exclusiveMinimum"),
            ("exclusiveMaximum", "maximum", "exclusiveMaximum"),
        ):
            if node.get(flag) and bound in out:
                out[kw] = out.pop(bound)
        if "properties" in node:
            out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
            if not node.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False  # the API server prunes; gpupool would refuse
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                out[key] = to_json_schema(node[key])
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def resource_problems(obj: dict[str, Any], crds: Iterable[dict[str, Any]]) -> list[str]:
    """Why ``obj`` (a gpupool custom resource) does not match its CRD, one located line each."""
    import jsonschema  # from the dev dependencies (schemathesis, kubernetes-validate)

    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    for c in crds:
        spec = c["spec"]
        for v in spec["versions"]:
            if f"{spec['group']}/{v['name']}" == api and spec["names"]["kind"] == kind:
                schema = to_json_schema(v["schema"]["openAPIV3Schema"])
                errors = jsonschema.Draft7Validator(schema).iter_errors(obj)
                return sorted(
                    f"{kind}: {'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                    for e in errors
                )
    return [f"{api} {kind}: no CRD defines this kind"]


def builtin_problems(obj: dict[str, Any], version: str) -> list[str]:
    """Why a built-in object is invalid for Kubernetes ``version`` (kubernetes-validate, strict)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return [f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}: {where}: {exc.message}"]
    return []
