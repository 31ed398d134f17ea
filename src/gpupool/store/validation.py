"""What the store checks before it writes: names, manifest envelopes, versions, submissions.

Why in the store: it is the last line before the database, so a caller that skipped the
manifest validator (or a future one) still cannot store a bad name or a non-JSON value;
every refusal is a ``ValidationFailed`` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry
from gpupool.store.errors import Conflict, ValidationFailed
from gpupool.store.records import API_VERSION, WorkloadSubmission

OBJECT_KINDS = ("ResourcePool", "Queue", "PriorityClass", "Cluster")
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def json_copy(value: Any, field: str) -> Any:
    """Normalise through JSON: rejects non-JSON values early and detaches from caller's objects."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(field, f"not JSON-serialisable: {exc}") from exc


def canonical(value: Any) -> str:
    return auditlog.canonical_json(value)


def check_name(name: Any, field: str = "metadata.name") -> str:
    if not isinstance(name, str) or not name:
        raise ValidationFailed(field, "required, must be a non-empty string")
    if not NAME_RE.match(name):
        raise ValidationFailed(
            field, f"{name!r} is not a valid name (lowercase letters, digits, '-', '.'; at most 253 chars)"
        )
    return name


def check_str_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationFailed(field, "must be a mapping of strings to strings")
    return dict(value)


def object_parts(manifest: Any) -> tuple[str, str, dict[str, Any], dict[str, str], dict[str, str]]:
    """A configuration object's kind, name, spec, labels and annotations, validated."""
    kind, name, meta, spec = check_manifest(manifest, OBJECT_KINDS)
    labels = check_str_map(meta.get("labels"), "metadata.labels")
    annotations = check_str_map(meta.get("annotations"), "metadata.annotations")
    return kind, name, spec, labels, annotations


def check_manifest(
    manifest: Any, kinds: Collection[str], *, copy: bool = True
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """Validate the envelope; returns (kind, name, metadata, spec); ``copy=False`` when already detached."""
    if not isinstance(manifest, Mapping):
        raise ValidationFailed("manifest", "must be a mapping")
    if manifest.get("apiVersion") != API_VERSION:
        raise ValidationFailed("apiVersion", f"must be {API_VERSION!r}, got {manifest.get('apiVersion')!r}")
    kind = manifest.get("kind")
    if kind not in kinds:
        raise ValidationFailed("kind", f"must be one of {sorted(kinds)}, got {kind!r}")
    meta = manifest.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValidationFailed("metadata", "required, must be a mapping")
    name = check_name(meta.get("name"))
    spec = manifest.get("spec", {})
    if not isinstance(spec, Mapping):
        raise ValidationFailed("spec", "must be a mapping")
    return str(kind), name, dict(meta), json_copy(dict(spec), "spec") if copy else dict(spec)


def check_version(field_owner: str, current: int, expected: int | None) -> None:
    if expected is not None and current != expected:
        raise Conflict(
            "metadata.resourceVersion",
            f"{field_owner} was modified: expected version {expected}, current is {current}",
        )


def check_submission(
    manifest: Any,
    *,
    owner: str,
    phase: str = "Pending",
    audit: AuditEntry | None = None,
    resolved_class: str | None = None,
) -> WorkloadSubmission:
    """Validate a Workload submission and detach it (one JSON round trip); raises ValidationFailed.

    Why separate from writing: the API validates on the request path and hands the result to
    the group-commit writer, which then needs no check of its own. ``resolved_class`` is the
    priority class the workload's task type gave it when its spec names none: kept on the record
    (not written into the manifest) so listings and reports show the class it runs with.
    """
    if not isinstance(manifest, Mapping):
        raise ValidationFailed("manifest", "must be a mapping")
    stored = json_copy({k: v for k, v in manifest.items() if k != "status"}, "manifest")
    _kind, name, _meta, spec = check_manifest(stored, ("Workload",), copy=False)
    queue = spec.get("queue")
    if not isinstance(queue, str) or not queue:
        raise ValidationFailed("spec.queue", "required, must be a non-empty string")
    check_name(queue, "spec.queue")
    pc = spec.get("priorityClass")
    if pc is not None and (not isinstance(pc, str) or not pc or len(pc) > 253):
        raise ValidationFailed(
            "spec.priorityClass", "must be a non-empty string (at most 253 chars) when given"
        )
    if not isinstance(owner, str) or not owner or len(owner) > 253:
        raise ValidationFailed("owner", "required, must be a non-empty string (at most 253 chars)")
    if phase not in ("Pending", "AwaitingApproval"):
        raise ValidationFailed("phase", "initial phase must be Pending or AwaitingApproval")
    return WorkloadSubmission(stored, name, queue, pc or resolved_class or None, owner, phase, audit)
