"""Configuration history over the API: the revisions of a pool, queue, priority class or
cluster, one revision, and the difference between two (``gpupool history``, ``gpupool diff``,
``gpupool rollback``).

Why a router of its own: history is read-only and answers for one object at a time; changing
configuration (a rollback included) stays on ``POST /v1/apply``, so a rollback is validated,
authorized, previewed and audited exactly as any other change.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import yaml
from fastapi import APIRouter, Path, Query

from gpupool.auth import Action, Principal, Resource
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.openapi import READ, doc
from gpupool.service.routes.base import Caller, Svc
from gpupool.service.routes.config import _kind
from gpupool.store.revisions import RevisionRecord

router = APIRouter()

#: revision numbers are database integers (32-bit on some backends)
MAX_REVISION = 2**31 - 1


def _authorize(svc: Service, p: Principal, kind: str, name: str) -> None:
    """As reading the object itself (every role may read configuration)."""
    parent = svc.controller.parents.get(name) if kind == "Queue" else None
    svc.check(p, Action.READ, Resource(kind, name, queue=parent))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf fields of a document by dotted path (list items by index), for a field-level diff."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def field_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every leaf that differs: path, value before (None: absent) and after."""
    a, b = flatten(old), flatten(new)
    return [
        {"field": k, "from": a.get(k), "to": b.get(k)}
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) or (k in a) != (k in b)
    ]


def as_yaml(m: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(m), sort_keys=False, default_flow_style=False)


def diff_of(old: RevisionRecord, new: RevisionRecord) -> dict[str, Any]:
    """A unified diff of the two revisions' YAML and the same as a list of field changes."""
    a, b = old.manifest(), new.manifest()
    text = "".join(
        difflib.unified_diff(
            as_yaml(a).splitlines(keepends=True),
            as_yaml(b).splitlines(keepends=True),
            fromfile=f"{old.kind}/{old.name}@{old.revision}",
            tofile=f"{new.kind}/{new.name}@{new.revision}",
        )
    )
    return {
        "kind": new.kind,
        "name": new.name,
        "from": old.revision,
        "to": new.revision,
        "unified": text,
        "changes": field_changes(a, b),
    }


@router.get("/v1/revisions/{plural}/{name}", tags=["config"], **doc(None, *READ, 422))
def list_revisions(plural: str, name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Every revision of one object, oldest first (author, time, reason, whole object)."""
    kind = _kind(plural)
    _authorize(svc, p, kind, name)
    return {"kind": kind, "name": name, "items": [r.to_json() for r in svc.store.list_revisions(kind, name)]}


@router.get("/v1/revisions/{plural}/{name}/diff", tags=["config"], **doc(None, *READ, 422))
def diff_revisions(
    plural: str,
    name: str,
    p: Caller,
    svc: Svc,
    from_: int | None = Query(
        None, alias="from", ge=1, le=MAX_REVISION, description="default: the one before `to`"
    ),
    to: int | None = Query(None, ge=1, le=MAX_REVISION, description="default: the latest"),
) -> dict[str, Any]:
    """What changed between two revisions (default: the latest against the one before it)."""
    kind = _kind(plural)
    _authorize(svc, p, kind, name)
    new = svc.store.get_revision(kind, name, to)
    if from_ is None and new.revision == 1:
        raise ApiError(
            422,
            f"{kind} {name!r} has only revision 1; nothing to compare",
            [{"field": "from", "problem": "no earlier revision"}],
        )
    old = svc.store.get_revision(kind, name, from_ if from_ is not None else new.revision - 1)
    return diff_of(old, new)


@router.get("/v1/revisions/{plural}/{name}/{revision}", tags=["config"], **doc(None, *READ, 422))
def get_revision(
    plural: str, name: str, p: Caller, svc: Svc, revision: int = Path(ge=1, le=MAX_REVISION)
) -> dict[str, Any]:
    """One revision of one object."""
    kind = _kind(plural)
    _authorize(svc, p, kind, name)
    return svc.store.get_revision(kind, name, revision).to_json()


__all__ = ["as_yaml", "diff_of", "field_changes", "flatten", "router"]
