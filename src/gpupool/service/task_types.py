"""The service's side of task types (docs/engine.md, "Task types"): what a stored workload's
type resolved to under the configuration in force, and where each value came from.

Why recomputed, not stored: the resolution is a pure function of the manifest and the
configuration, like its priority class; a configuration change (a queue's ``typeDefaults``)
applies to waiting work at once, as a changed priority class does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.manifests import Bundle, ManifestErrors
from gpupool.manifests.base import KUEUE_QUEUE_LABEL
from gpupool.manifests.convert import parse_manifest
from gpupool.manifests.task_types import Resolved, resolve_workload


def resolved(manifest: Mapping[str, Any], bundle: Bundle) -> Resolved | None:
    """The task-type values of a stored workload, or None when its manifest no longer parses."""
    try:
        doc = parse_manifest(manifest, "workload")
    except Exception:  # a stored manifest a later validator refuses: nothing to explain
        return None
    queue = doc.spec.queue or doc.metadata.labels.get(KUEUE_QUEUE_LABEL) or ""
    return resolve_workload(doc, queue, bundle.task_types, ManifestErrors())


def explained(manifest: Mapping[str, Any], bundle: Bundle) -> dict[str, Any] | None:
    """``{field: {"value", "from"}}`` for ``explain`` (None when the manifest does not parse)."""
    r = resolved(manifest, bundle)
    return r.as_json() if r is not None else None


def max_retries(manifest: Mapping[str, Any], bundle: Bundle) -> int | None:
    """The retry limit the workload's type (or its own ``maxRetries``) resolved to."""
    r = resolved(manifest, bundle)
    v = r.values.get("maxRetries") if r is not None else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def pod_counts(manifest: Mapping[str, Any], placement: Mapping[str, Any] | None) -> dict[str, int]:
    """``admittedPods`` and ``requestedPods`` of an admitted workload (partial admission may
    admit fewer pods than it asks for); empty when it is not admitted."""
    if not placement:
        return {}
    spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
    groups = spec.get("podGroups") if isinstance(spec, Mapping) else None
    asked = 0
    for g in groups if isinstance(groups, list) else ():
        n = g.get("replicas", 1) if isinstance(g, Mapping) else 1
        asked += n if isinstance(n, int) and not isinstance(n, bool) else 1
    pods = placement.get("pods")
    return {"admittedPods": len(pods) if isinstance(pods, list) else 0, "requestedPods": asked}
