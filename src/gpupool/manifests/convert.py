"""Translations between stored JSON (manifests, placements) and the engine's model objects.

Why in one place: the store keeps manifests and placements as JSON so it does not depend on the
engine; the controller and the API both need the same, lossless conversions. They sit with
the manifests (below the store, the service and the cost reports that all use them) so that no
lower package has to reach up into the service for them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gpupool.engine.decisions import Admit
from gpupool.manifests import (
    Bundle,
    Document,
    ManifestError,
    ManifestErrors,
    build,
    build_workload,
    default_priority_classes,
    validate_document,
)
from gpupool.manifests.base import TaskTypeTable
from gpupool.manifests.documents import SERVER_METADATA, expected_version, person_metadata
from gpupool.model import (
    Admission,
    PodGroup,
    PodPlacement,
    PodRequest,
    PriorityClass,
    Running,
    Workload,
)

log = logging.getLogger("gpupool.config")

CORDON_ANNOTATION = "gpupool.io/cordoned"
_LOCATED = re.compile(r"^(?P<src>.*?\(\S+/\S+\)): (?P<field>[^:]+): (?P<problem>.*)$", re.S)


def error_items(exc: ManifestError) -> list[dict[str, str]]:
    """ManifestError lines as ``{"field", "problem", "message"}`` for a 422 body."""
    out = []
    for line in exc.errors:
        m = _LOCATED.match(line)
        if m:
            out.append({"field": m["field"].strip(), "problem": m["problem"].strip(), "message": line})
        else:
            field, _, problem = line.rpartition(": ")
            out.append({"field": field.split(": ")[-1] if field else "", "problem": problem, "message": line})
    return out


def parse_manifest(manifest: Mapping[str, Any], source: str = "request") -> Document:
    """Validate one JSON manifest with the same models and messages as YAML files.

    Why not ``parse_documents(json.dumps(...))``: that goes through the pure-Python YAML
    parser, which costs about a millisecond per manifest; validating the mapping directly is the
    same check at a fraction of the cost on the submit path. Raises ManifestError.
    """
    if not isinstance(manifest, Mapping):
        raise ManifestError([f"{source}: body: expected a JSON object (a manifest)"])
    errors: list[str] = []
    raw = without_server_metadata(manifest, source)
    doc = validate_document(raw, f"{source}: document 1", errors)
    if doc is None:
        raise ManifestError(errors)
    return doc


def without_server_metadata(manifest: Mapping[str, Any], source: str = "request") -> dict[str, Any]:
    """The manifest without server-set metadata (:data:`SERVER_METADATA`), so an object read
    with GET can be PUT or applied back; none of it is stored.

    A resourceVersion that is not one the server could have returned (digits) is a located 422
    rather than being ignored: it is the precondition of the write."""
    raw = dict(manifest)
    md = raw.get("metadata")
    if not isinstance(md, Mapping) or not any(k in md for k in SERVER_METADATA):
        return raw
    errors: list[str] = []
    kind, name = raw.get("kind") or "?", md.get("name") or "?"
    raw["metadata"] = person_metadata(md, f"{source}: document 1 ({kind}/{name})", errors)
    if errors:
        raise ManifestError(errors)
    return raw


def resource_version(manifest: Mapping[str, Any]) -> int | None:
    """``metadata.resourceVersion`` as the expected stored version (None: absent or malformed).

    Sent back on PUT/apply it makes the write conditional, as in Kubernetes: a stale one is
    answered 409 and nothing is written."""
    md = manifest.get("metadata")
    return expected_version(md.get("resourceVersion")) if isinstance(md, Mapping) else None


class StoredObject(Protocol):
    """What :func:`object_manifest` needs of a stored object (``gpupool.store.ObjectRecord``)."""

    def to_manifest(self) -> dict[str, Any]: ...


def object_manifest(rec: StoredObject) -> dict[str, Any]:
    """A stored object as a manifest without the server-side resourceVersion."""
    m = rec.to_manifest()
    m["metadata"] = {k: v for k, v in m["metadata"].items() if k not in SERVER_METADATA}
    return m


def bundle_from_manifests(manifests: Iterable[Mapping[str, Any]], *, skip_invalid: bool = False) -> Bundle:
    """Build the configuration (nodes, pools, queues, classes) from manifests; all or nothing.

    ``skip_invalid``: for what is already stored — an object that a later, stricter validator
    refuses is left out (and logged) instead of leaving the server unable to start or to accept
    any other change; what still refers to it is reported as usual."""
    docs: list[Document] = []
    errors: list[str] = []
    for m in manifests:
        name = (m.get("metadata") or {}).get("name", "?") if isinstance(m, Mapping) else "?"
        try:
            docs.append(parse_manifest(m, f"{m.get('kind', '?') if isinstance(m, Mapping) else '?'}/{name}"))
        except ManifestError as exc:
            errors.extend(exc.errors)
    if errors and skip_invalid:
        log.error("stored configuration objects no longer valid, left out: %s", "; ".join(errors))
    elif errors:
        raise ManifestError(errors)
    bundle = build(docs, Bundle(priority_classes=list(default_priority_classes())))
    cordoned: set[str] = set()
    for d in docs:
        if d.kind == "Cluster":
            cordoned.update(x for x in d.metadata.annotations.get(CORDON_ANNOTATION, "").split(",") if x)
    if cordoned:
        bundle.nodes = [replace(n, schedulable=False) if n.name in cordoned else n for n in bundle.nodes]
    return bundle


def workload_model(
    manifest: Mapping[str, Any],
    classes: Sequence[PriorityClass],
    arrival: float,
    *,
    strict: bool = True,
    doc: Document | None = None,
    types: TaskTypeTable | None = None,
) -> Workload:
    """The engine's Workload for a stored or submitted manifest; ``types`` are the
    configuration's task-type defaults (``Bundle.task_types``; None: the packaged ones).

    ``strict=False`` never fails: a running workload must still be charged after its priority
    class was deleted, so the class is dropped rather than the workload.
    """
    try:
        if doc is None:
            doc = parse_manifest(manifest, "workload")
        err = ManifestErrors()
        w = build_workload(doc, {c.name: c for c in classes}, err, arrival=arrival, types=types)
        if err.items:
            raise ManifestError(err.items)
        return w
    except Exception:  # a stored manifest a later validator refuses, or worse
        if strict:
            raise
    spec = manifest.get("spec", {}) if isinstance(manifest, Mapping) else {}
    name = str((manifest.get("metadata") or {}).get("name", "")) if isinstance(manifest, Mapping) else ""
    return Workload(name, str(spec.get("queue", "")), (), arrival=arrival)


def placement_json(a: Admit, now: float) -> dict[str, Any]:
    """An admission as stored in the workload row (and handed to the backend)."""
    return {
        "pool": a.pool,
        "borrowing": a.borrowing,
        "admittedAt": now,
        "pods": [_pod_json(p) for p in a.pods],
    }


def _pod_json(p: PodPlacement) -> dict[str, Any]:
    """One placed pod; storage and bandwidth only where it holds some (rows stay as they were)."""
    out: dict[str, Any] = {
        "group": p.group,
        "index": p.index,
        "node": p.node,
        "devices": list(p.devices),
        "gpuMilli": p.gpu_milli,
        "gpuMemoryMiB": p.gpu_memory_mib,
        "cpuMilli": p.cpu_milli,
        "memoryMiB": p.memory_mib,
        "rdma": p.rdma,
    }
    if p.storage_mib:
        out["storageMiB"] = p.storage_mib
    if p.network_mbps:
        out["networkMbps"] = p.network_mbps
    return out


def admission_from_json(placement: Mapping[str, Any]) -> Admission:
    pods = tuple(
        PodPlacement(
            str(p["group"]),
            int(p["index"]),
            str(p["node"]),
            tuple(int(d) for d in p.get("devices", ())),
            int(p.get("gpuMilli", 1000)),
            int(p.get("gpuMemoryMiB", 0)),
            int(p.get("cpuMilli", 0)),
            int(p.get("memoryMiB", 0)),
            int(p.get("rdma", 0)),
            int(p.get("storageMiB", 0)),
            int(p.get("networkMbps", 0)),
        )
        for p in placement.get("pods", ())
    )
    return Admission(
        str(placement.get("pool", "")),
        pods,
        bool(placement.get("borrowing", False)),
        float(placement.get("admittedAt", 0.0)),
    )


def running_from_json(w: Workload, placement: Mapping[str, Any]) -> Running:
    """A stored admission as the engine's Running; a workload without pod groups gets them from its pods."""
    adm = admission_from_json(placement)
    if not w.pod_groups and adm.pods:
        groups = tuple(
            PodGroup(p.group, 1, PodRequest(gpus=len(p.devices), cpu_milli=p.cpu_milli)) for p in adm.pods
        )
        w = replace(w, pod_groups=groups)
    return Running(w, adm)
