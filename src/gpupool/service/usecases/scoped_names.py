"""Workload names unique per owner scope: no name oracle across teams.

Why: names were one key for every team, so a member submitting a name another team uses got a
409 where a fresh name got 201, and could probe which names exist elsewhere. The rule now: a
name is unique among the workloads the caller can read. When the name is held by a workload
the caller cannot read, the new workload is stored under a derived key, the name followed by
a short digest of the caller's scope (its subtree's root queue), deterministic so a
resubmission finds it again and every member of the scope addresses it by the name written.
The engine, the backends, events and audit key it by that stored key; the API shows the
written name (``name``) next to it (``key``) and resolves a name among the workloads the
caller can read (Service.visible_workload). A clash with a workload the caller can read keeps the 409.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpupool.auth import Principal
from gpupool.service.admission import pending_refusal
from gpupool.service.core import Service
from gpupool.service.errors import refusal_error
from gpupool.service.usecases.submit import Prepared
from gpupool.service.workload_names import NAME_ANNOTATION, scoped_key
from gpupool.store import NotFound, WorkloadRecord


def _get(svc: Service, key: str) -> WorkloadRecord | None:
    try:
        return svc.store.get_workload(key)
    except NotFound:
        return None


def foreign(svc: Service, p: Principal, rec: WorkloadRecord | None) -> bool:
    """True when ``rec`` exists and ``p`` cannot read it, and ``p`` has a scope to key by."""
    return rec is not None and p.scope is not None and not svc.can_read_workload(p, rec.queue)


def rescoped(svc: Service, p: Principal, prep: Prepared) -> Prepared:
    """``prep`` stored under the caller's derived key: the manifest names the key and keeps
    the written name in an annotation, the model, audit and pending reservation follow."""
    assert p.scope is not None
    name = prep.model.name
    key = scoped_key(name, p.scope)
    body: dict[str, Any] = dict(prep.body)
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), NAME_ANNOTATION: name}
    meta["name"] = key
    body["metadata"] = meta
    model = replace(prep.model, name=key)
    svc.pending_limits.release(name)
    refused = pending_refusal(key, model, p.name, svc.pending_limits, svc.controller)
    if refused is not None:
        raise refusal_error(refused)
    audit = replace(prep.audit, name=key, detail={**prep.audit.detail, "name": name})
    return replace(prep, body=body, model=model, audit=audit)


def rescope_if_foreign(svc: Service, p: Principal, prep: Prepared) -> Prepared:
    """``prep`` rescoped when its name is held by a workload ``p`` cannot read, else itself."""
    if foreign(svc, p, _get(svc, prep.model.name)):
        return rescoped(svc, p, prep)
    return prep
