"""The submit use-case: validate, authorize and admission-check a workload manifest
(``prepare``), then hand a committed submission to the controller (``after``) or give its
place back (``failed``); ``submit_many`` does both for a set through the group commit.

Who calls it: the HTTP submit route and ``POST /v1/apply`` (gpupool.service.routes), the
Kubernetes source (gpupool.kube.wiring), the local backend. One path, so a workload from
kubectl meets the same authorization, limits and admission policy as one from the API.
Refusals are the service's typed errors (gpupool.service.errors): the HTTP layer turns them
into the status and body the API documents.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests import KUEUE_QUEUE_LABEL
from gpupool.manifests.convert import parse_manifest, workload_model
from gpupool.model import Workload
from gpupool.service.admission import (
    backend_refusal,
    is_exception,
    needs_approval,
    pending_refusal,
    queue_refusal,
    request_refusal,
)
from gpupool.service.controller import Controller
from gpupool.service.core import Service
from gpupool.service.errors import ApiError, refusal_error
from gpupool.service.limits import TokenBuckets
from gpupool.service.view import ConfigView
from gpupool.service.workload_names import written_name
from gpupool.store import StoreError, WorkloadRecord


def normalise_workload(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form: the Kueue queue-name label becomes spec.queue (so lookups by queue work)."""
    m = {k: v for k, v in manifest.items() if k != "status"}
    spec = dict(m.get("spec") or {})
    labels = (m.get("metadata") or {}).get("labels") or {}
    if not spec.get("queue") and isinstance(labels, Mapping) and labels.get(KUEUE_QUEUE_LABEL):
        spec["queue"] = labels[KUEUE_QUEUE_LABEL]
        m["spec"] = spec
    return m


@dataclass(slots=True)
class Prepared:
    body: dict[str, Any]
    model: Workload
    queue: str
    approval: bool
    audit: AuditEntry


def prepare(svc: Service, p: Principal, body: Mapping[str, Any], view: ConfigView | None = None) -> Prepared:
    """Validate and authorize a submission from memory only (safe on the event loop);
    against ``view`` (a configuration about to be applied) instead of the one in force."""
    doc = parse_manifest(body)
    if doc.kind != "Workload":
        raise ApiError(
            422,
            f"kind: expected Workload, got {doc.kind}",
            [{"field": "kind", "problem": "must be Workload"}],
        )
    body = normalise_workload(body)
    ctl: Controller | ConfigView = view or svc.controller
    bundle = ctl.bundle
    model = workload_model(body, bundle.priority_classes, 0.0, doc=doc, types=bundle.task_types)
    queue = model.queue
    refused = queue_refusal(queue, ctl)
    if refused is None:
        svc.check(
            p,
            Action.SUBMIT,
            Resource("Workload", doc.name, queue=queue, owner=p.name),
            defer=True,
            tree=ctl,
        )
        refused = request_refusal(model, body, ctl)
    if refused is None:
        refused = backend_refusal(doc.name, p.name, svc.controller.backend)
    if refused is None:  # last: it reserves the workload's place until ``after`` or ``failed``
        refused = pending_refusal(doc.name, model, p.name, svc.pending_limits, ctl)
    if refused is not None:
        raise refusal_error(refused)
    exception = is_exception(body)
    approval = needs_approval(model, body, bundle, ctl)
    audit = AuditEntry(
        p.name,
        "workload.submit",
        "Workload",
        doc.name,
        {"queue": queue, "approval": approval, "exception": exception},
    )
    return Prepared(dict(body), model, queue, approval, audit)


def after(svc: Service, prep: Prepared, rec: WorkloadRecord, created: bool) -> WorkloadRecord:
    """Hand a committed submission to the controller (or open its approval request)."""
    try:
        out = _handed(svc, prep, rec, created)
    except BaseException:
        failed(svc, prep)
        raise
    if created and not prep.approval:
        svc.pending_limits.handed(prep.model.name)  # counted until the controller holds it
    else:
        failed(svc, prep)  # unchanged, or awaiting approval: not new pending work
    return out


def failed(svc: Service, prep: Prepared) -> None:
    """A prepared submission adds no pending work (not committed, unchanged, or awaiting
    approval): it no longer counts against the limits."""
    svc.pending_limits.release(prep.model.name)


def _handed(svc: Service, prep: Prepared, rec: WorkloadRecord, created: bool) -> WorkloadRecord:
    if not created:
        return rec
    svc.metrics.submits.labels(prep.queue).inc()
    if prep.approval:
        # the workload is committed: a failure to open its request must not answer 500 for
        # an accepted submission; it is rejected with the reason instead (never left waiting)
        with svc.controller.lock:
            svc.controller.open_approval(rec, time.time())
        return svc.store.get_workload(rec.name)
    svc.controller.submitted(rec, prep.model)
    return rec


def submit_many(svc: Service, p: Principal, preps: Sequence[Prepared]) -> list[dict[str, str]]:
    """Submit checked workloads together; one apply result each, in order.

    Why all queued at once: the group commit then writes them in batches of its
    ``max_batch``, each batch one transaction; submitted one after another, 10,000 workloads
    were 10,000 transactions (over a minute). A failure fails its item alone."""
    queued: list[tuple[Prepared, Future[tuple[WorkloadRecord, bool]] | StoreError]] = []
    for prep in preps:
        try:
            fut: Future[tuple[WorkloadRecord, bool]] | StoreError = svc.batcher.submit(
                prep.body,
                owner=p.name,
                phase="AwaitingApproval" if prep.approval else "Pending",
                audit=prep.audit,
                resolved_class=prep.model.priority_class or None,
            )
        except StoreError as exc:
            fut = exc
        queued.append((prep, fut))
    out: list[dict[str, str]] = []
    for i, (prep, fut) in enumerate(queued):
        try:
            if isinstance(fut, StoreError):
                raise fut
            rec, created = fut.result()
        except StoreError as exc:
            failed(svc, prep)
            out.append({"kind": "Workload", "name": prep.model.name, "result": "failed", "error": str(exc)})
            continue
        except BaseException:  # the database is away: nothing after it counts as pending work
            for rest, _ in queued[i:]:
                failed(svc, rest)
            raise
        after(svc, prep, rec, created)
        result = "created" if created else "unchanged"
        out.append({"kind": "Workload", "name": written_name(rec), "result": result})
    return out


def rate_limit(buckets: TokenBuckets, p: Principal) -> None:
    """429 with Retry-After (whole seconds, rounded up) when this token's bucket is empty."""
    wait = buckets.take(p.token_id if p.token_id is not None else p.name)
    if wait is None:
        return
    secs = max(1, math.ceil(wait))
    problem = (
        f"this token may submit {buckets.rate:g} workloads a second (a burst of {buckets.burst}); "
        f"try again in {secs} s"
    )
    raise ApiError(
        429,
        f"submit rate limit: {problem}",
        [{"field": "submit-rate", "problem": problem}],
        headers={"Retry-After": str(secs)},
    )
