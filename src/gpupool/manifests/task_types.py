"""Task types that mean something (issue 11): defaults a workload's ``type`` sets.

Why: ``type: inference`` or ``type: evaluation`` used to change nothing. A type now sets the
priority class, preemptibility, retry limit, preferred pools and the wait limit after which an
alert fires, each overridable: the workload's own field wins, then its queue's
``spec.typeDefaults.<type>``, then the Cluster's ``spec.taskTypes.<type>``, then the packaged
defaults (``src/gpupool/defaults/cluster.yaml``, section ``spec.taskTypes``). Every resolved
value keeps where it came from, so ``explain`` can say it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from gpupool import quantity as qty
from gpupool.manifests.base import Bundle, Document, ManifestErrors, StrictModel, TaskTypeTable
from gpupool.model import WorkloadType

#: the packaged defaults: the ``spec.taskTypes`` section of this Cluster manifest
PACKAGED = Path(__file__).resolve().parents[1] / "defaults" / "cluster.yaml"

FIELDS = ("priorityClass", "preemptible", "maxRetries", "preferredPools", "maxWait")


class TaskTypeSpec(StrictModel):
    """What one task type defaults (every field optional: unset defers to the next level)."""

    priorityClass: str | None = Field(default=None, min_length=1)
    preemptible: bool | None = None
    maxRetries: int | None = Field(default=None, ge=0, le=1000)
    preferredPools: list[str] | None = Field(default=None, max_length=64)
    #: how long a workload of this type may wait before an alert fires (a duration, e.g. 10m)
    maxWait: str | int | float | None = None


@dataclass(frozen=True, slots=True)
class Resolved:
    """A workload's task-type values and, per field, where each came from: ``workload``,
    ``queue <name>``, ``cluster``, ``packaged`` (or ``none``: no level sets it)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def max_wait_s(self) -> float | None:
        v = self.values.get("maxWait")
        return float(v) if isinstance(v, int | float) else None

    def as_json(self) -> dict[str, Any]:
        """``{field: {"value": ..., "from": ...}}``, as stored on the workload and shown by explain."""

        def plain(v: Any) -> Any:
            return list(v) if isinstance(v, tuple) else v

        return {f: {"value": plain(self.values.get(f)), "from": self.sources.get(f, "none")} for f in FIELDS}


@lru_cache(maxsize=1)
def packaged_task_types() -> dict[str, TaskTypeSpec]:
    """The packaged defaults by type (read once from the packaged Cluster manifest)."""
    doc = yaml.safe_load(PACKAGED.read_text(encoding="utf-8"))
    raw = ((doc or {}).get("spec") or {}).get("taskTypes") or {}
    err = ManifestErrors()
    out = parse_task_types(raw, f"{PACKAGED.name}: spec.taskTypes", err)
    if err.items:  # a packaging mistake: tests/manifests/test_task_types.py keeps it from shipping
        raise ValueError("; ".join(err.items))
    return out


def parse_task_types(raw: object, where: str, err: ManifestErrors) -> dict[str, TaskTypeSpec]:
    """``{type: TaskTypeSpec}`` from a mapping, with located errors (an unknown type, a bad
    field, a wait limit that is not a duration)."""
    if not isinstance(raw, Mapping):
        err.add(where, "must be a mapping of task type to its defaults")
        return {}
    known = {t.value for t in WorkloadType}
    out: dict[str, TaskTypeSpec] = {}
    for name, body in raw.items():
        if name not in known:
            err.add(f"{where}.{name}", f"unknown task type; use one of {', '.join(sorted(known))}")
            continue
        try:
            spec = body if isinstance(body, TaskTypeSpec) else TaskTypeSpec.model_validate(body or {})
        except ValidationError as exc:
            for e in exc.errors():
                loc = ".".join(str(p) for p in e["loc"])
                err.add(f"{where}.{name}{'.' + loc if loc else ''}", e["msg"])
            continue
        check_spec(spec, f"{where}.{name}", err)
        out[str(name)] = spec
    return out


def check_spec(spec: TaskTypeSpec, where: str, err: ManifestErrors) -> None:
    """What the model cannot say: the wait limit is a positive duration."""
    if spec.maxWait is not None:
        try:
            if not qty.parse_duration(spec.maxWait) > 0:
                err.add(f"{where}.maxWait", "must be a positive duration (e.g. 10m)")
        except qty.QuantityError as exc:
            err.add(f"{where}.maxWait", str(exc))


def _value(spec: TaskTypeSpec, f: str) -> Any:
    v = getattr(spec, f)
    if f == "maxWait" and v is not None:
        return qty.parse_duration(v)
    if f == "preferredPools" and v is not None:
        return tuple(v)
    return v


def resolve(
    wtype: str,
    workload: Mapping[str, Any],
    queue: tuple[str, Mapping[str, TaskTypeSpec]] | None,
    cluster: Mapping[str, TaskTypeSpec],
) -> Resolved:
    """Each field from the first level that sets it: ``workload`` (the fields the manifest
    wrote, already converted), the queue's ``typeDefaults``, the Cluster's ``taskTypes``, the
    packaged defaults."""
    levels: list[tuple[str, TaskTypeSpec | None]] = []
    if queue is not None:
        levels.append((f"queue {queue[0]}", queue[1].get(wtype)))
    levels.append(("cluster", cluster.get(wtype)))
    levels.append(("packaged", packaged_task_types().get(wtype)))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in FIELDS:
        if workload.get(f) is not None:
            values[f], sources[f] = workload[f], "workload"
            continue
        for src, spec in levels:
            if spec is not None and getattr(spec, f) is not None:
                values[f], sources[f] = _value(spec, f), src
                break
    return Resolved(values, sources)


def workload_fields(spec: Any) -> dict[str, Any]:
    """The task-type fields a Workload spec wrote itself (converted), for ``resolve``: a field
    left at its default defers to the queue, the Cluster and the packaged defaults."""
    wrote = spec.model_fields_set
    out: dict[str, Any] = {}
    if spec.priorityClass:
        out["priorityClass"] = spec.priorityClass
    if spec.preemptible is not None:
        out["preemptible"] = spec.preemptible
    if "maxRetries" in wrote:
        out["maxRetries"] = spec.maxRetries
    if spec.preferredPools is not None:
        out["preferredPools"] = tuple(spec.preferredPools)
    if spec.maxWait is not None:
        with contextlib.suppress(qty.QuantityError):  # reported, located, by ``resolve_workload``
            out["maxWait"] = qty.parse_duration(spec.maxWait)
    return out


def check_task_type_refs(b: Bundle, err: ManifestErrors, sources: Mapping[str, str]) -> None:
    """The configuration's task-type defaults name priority classes and pools that exist (the
    packaged defaults are not checked: a pool they prefer that a cluster lacks is skipped)."""
    classes = {c.name for c in b.priority_classes}
    pools = bool(b.pools)
    levels = [("Cluster", "spec.taskTypes", b.task_types.cluster)]
    levels += [(q, "spec.typeDefaults", t) for q, t in sorted(b.task_types.queues.items())]
    for owner, section, table in levels:
        src = sources.get(owner, owner) if owner != "Cluster" else "Cluster"
        for t, spec in sorted(table.items()):
            where = f"{src}: {section}.{t}"
            if spec.priorityClass is not None and spec.priorityClass not in classes:
                err.add(f"{where}.priorityClass", f"unknown priority class {spec.priorityClass!r}")
            for i, p in enumerate(spec.preferredPools or ()):
                if pools and not any(pl.answers_to(p) for pl in b.pools):
                    err.add(
                        f"{where}.preferredPools[{i}]", f"no pool is named {p!r} or has environment {p!r}"
                    )


def resolve_workload(doc: Document, queue: str, types: TaskTypeTable | None, err: ManifestErrors) -> Resolved:
    """A Workload document's task-type values, resolved workload > queue > Cluster > packaged
    (``types`` None: packaged only); a wait limit that is not a duration is a located error."""
    s = doc.spec
    if s.maxWait is not None:
        check_spec(TaskTypeSpec(maxWait=s.maxWait), f"{doc.source}: spec", err)
    table = types or TaskTypeTable()
    q = (queue, table.queues[queue]) if queue in table.queues else None
    return resolve(str(s.type), workload_fields(s), q, table.cluster)
