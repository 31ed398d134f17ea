"""Admission checks at submission: is a workload's request one the cluster could ever hold?

Why here and not only in the engine: a request larger than any node (``cpu: 10000`` where the
biggest node has 224 cores) would wait forever with a capacity reason that suggests it might
still start. Refusing it when it is submitted, naming the field and the largest offer, tells the
user at once what to fix. The check is deliberately loose (it ignores taints, selectors and what
runs now): it only refuses what no node of any pool the workload may use could ever hold.

The module also holds the policy a submission is judged by before it is stored: whether it must
wait for an approver (a pool or queue on its path says so, or it asks for an exception), why,
and whether it could ever fit its queue's limits. The HTTP layer only turns a ``Refusal`` into
a 422; the controller asks the same functions when it opens an approval request or grants an
exception window. Everything here reads a configuration (the one in force or one about to be
applied, ``ConfigView``) and never changes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpupool.manifests import Bundle
from gpupool.model import UNLIMITED, Node, PodRequest, Workload
from gpupool.quantity import QuantityError, format_cpu, format_mib, parse_duration
from gpupool.service.backends import Backend, Capability, capability

if TYPE_CHECKING:
    from gpupool.service.controller import Controller
    from gpupool.service.limits import PendingCounter, QueueTree
    from gpupool.service.view import ConfigView


@dataclass(frozen=True, slots=True)
class _Shape:
    """What one kind of node offers to a single pod."""

    model: str
    gpus: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    rdma: int

    @classmethod
    def of(cls, n: Node) -> _Shape:
        return cls(n.gpu_model, n.gpu_count, n.gpu_memory_mib, n.cpu_milli, n.memory_mib, n.rdma)

    def holds(self, r: PodRequest) -> bool:
        if r.gpus > self.gpus or r.cpu_milli > self.cpu_milli or r.memory_mib > self.memory_mib:
            return False
        if r.rdma > self.rdma:
            return False
        if r.fractional:
            return self.gpus >= 1 and r.gpu_memory_mib <= self.gpu_memory_mib
        return True


#: node shapes per pool of the current configuration (a bundle is replaced, never changed)
_cache: list[tuple[Bundle, dict[str, frozenset[_Shape]]]] = []


def _shapes(bundle: Bundle) -> dict[str, frozenset[_Shape]]:
    if _cache and _cache[0][0] is bundle:
        return _cache[0][1]
    out = {p.name: frozenset(_Shape.of(n) for n in bundle.nodes if p.selects(n)) for p in bundle.pools}
    _cache[:] = [(bundle, out)]
    return out


def _largest(shapes: list[_Shape]) -> str:
    if not shapes:
        return "the pools it may use have no nodes"
    return (
        f"the largest node offers {max(s.gpus for s in shapes)} GPUs, "
        f"{format_cpu(max(s.cpu_milli for s in shapes))} CPUs, "
        f"{format_mib(max(s.memory_mib for s in shapes))} memory, {max(s.rdma for s in shapes)} rdma"
    )


def unfit(w: Workload, bundle: Bundle, pools: list[str]) -> tuple[str, str] | None:
    """``(field, problem)`` when a pod of ``w`` fits no node of ``pools``; None when all could fit."""
    by_pool = _shapes(bundle)
    shapes = [s for p in pools for s in by_pool.get(p, ()) if not w.gpu_models or s.model in w.gpu_models]
    for i, g in enumerate(w.pod_groups):
        if not any(s.holds(g.request) for s in shapes):
            return (
                f"spec.podGroups[{i}].resources",
                f"a pod of group {g.name!r} fits no node of {', '.join(pools) or 'any pool'}: "
                f"{_largest(shapes)}",
            )
    return None


def is_exception(manifest: Mapping[str, Any]) -> bool:
    spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
    return isinstance(spec, Mapping) and isinstance(spec.get("exception"), Mapping)


def exception_duration_s(manifest: Mapping[str, Any]) -> float | None:
    """``spec.exception.duration`` in seconds (None when not given); raises QuantityError if malformed."""
    spec = manifest.get("spec", {})
    exc = spec.get("exception") if isinstance(spec, Mapping) else None
    if not isinstance(exc, Mapping) or exc.get("duration") is None:
        return None
    return parse_duration(exc["duration"])


def approval_reason(manifest: Mapping[str, Any], bundle: Bundle) -> str:
    """Why a workload needs an approver (shown in the approval request)."""
    spec = manifest.get("spec", {}) if isinstance(manifest, Mapping) else {}
    if is_exception(manifest):
        exc = spec["exception"]
        return f"exception requested: {exc.get('reason', '')}".strip()
    queues = {q.name: q for q in bundle.queues}
    pools = {p.name: p for p in bundle.pools}
    pool = spec.get("pool")
    if isinstance(pool, str) and pool in pools and pools[pool].requires_approval:
        return f"pool {pool} requires approval"
    cur = spec.get("queue")
    seen: set[str] = set()
    while isinstance(cur, str) and cur in queues and cur not in seen:
        seen.add(cur)
        if queues[cur].requires_approval:
            return f"queue {cur} requires approval"
        cur = queues[cur].parent
    return "approval required"


def needs_approval(
    model: Workload, manifest: Mapping[str, Any], bundle: Bundle, ctl: Controller | ConfigView
) -> bool:
    """A pool or queue on the workload's path requires approval, or it asks for an exception."""
    if is_exception(manifest):
        return True
    current = bundle is ctl.bundle and ctl.pools_by_name  # the controller's cached lookups
    pools = ctl.pools_by_name if current else {p.name: p for p in bundle.pools}
    if model.pool is not None and model.pool in pools and pools[model.pool].requires_approval:
        return True
    queues = ctl.queues_by_name if current else {q.name: q for q in bundle.queues}
    if any(queues[n].requires_approval for n in ctl.queue_path(model.queue) if n in queues):
        return True
    if model.pool is None:
        cands = ctl.engine.candidate_pools(model) if model.queue in ctl.engine.quota.queues else []
        if cands and all(pools[c].requires_approval for c in cands if c in pools):
            return True
    return False


def over_limit(model: Workload, ctl: Controller | ConfigView) -> str | None:
    """Why the workload can never fit its queue's limits (None when it could)."""
    eng = ctl.engine
    if model.queue not in eng.quota.queues:
        return None
    cands = eng.candidate_pools(model)
    if not cands:
        return None
    need = model.quota_vec()[0]
    best = max(ctl.queue_limit_gpu_milli(model.queue, p) for p in cands)
    if need <= best or best >= UNLIMITED:
        return None
    return (
        f"requests {need / 1000:g} GPUs but queue {model.queue} can hold at most {best / 1000:g} "
        f"in {', '.join(cands)}; add spec.exception {{reason, duration}} to ask for a time-limited exception"
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a submission is refused: the field to fix, the problem, the whole message, and the
    HTTP status (422: fix the request; 429: try again once some pending work has started)."""

    field: str
    problem: str
    message: str
    status: int = 422


def queue_refusal(queue: str, ctl: Controller | ConfigView) -> Refusal | None:
    """The queue must exist (checked before authorization, which needs the queue's place)."""
    if queue in ctl.parents:
        return None
    problem = f"queue {queue!r} does not exist"
    return Refusal("spec.queue", problem, f"spec.queue: {problem}")


def backend_refusal(name: str, submitter: str, backend: Backend) -> Refusal | None:
    """The backend cannot run this submission at all (Kubernetes: a workload gpupool's API
    received has no object whose pods it could bind): refused before anything is preempted."""
    refuses = capability(backend, Capability.REFUSES)
    why = refuses(name, submitter) if callable(refuses) else None
    if not isinstance(why, str):
        return None
    return Refusal("kind", "no Kubernetes object stands for this workload", f"kind: {why}")


def request_refusal(
    model: Workload, manifest: Mapping[str, Any], ctl: Controller | ConfigView
) -> Refusal | None:
    """The checks after authorization, in the order a user should fix them: a leaf queue, a
    pool that exists, pods some node could hold, then an exception's reason and duration or,
    without an exception, a request within the queue's limits."""
    queue = model.queue
    if not ctl.is_leaf(queue):
        kids = ", ".join(ctl.children.get(queue, []))
        msg = f"spec.queue: queue {queue!r} has child queues; submit to one of {kids}"
        return Refusal("spec.queue", "not a leaf queue", msg)
    bundle = ctl.bundle
    if model.pool is not None and model.pool not in {x.name for x in bundle.pools}:
        return Refusal("spec.pool", "no such pool", f"spec.pool: pool {model.pool!r} does not exist")
    cands = ctl.engine.candidate_pools(model) if queue in ctl.engine.quota.queues else []
    misfit = unfit(model, bundle, cands) if cands else None
    if misfit is not None:
        return Refusal(misfit[0], misfit[1], f"{misfit[0]}: {misfit[1]}")
    if not is_exception(manifest):
        why = over_limit(model, ctl)
        return None if why is None else Refusal("spec.podGroups", why, f"spec.podGroups: {why}")
    reason = manifest["spec"]["exception"].get("reason")
    if not isinstance(reason, str) or not reason.strip():
        msg = "spec.exception.reason: required, say why the exception is needed"
        return Refusal("spec.exception.reason", "required", msg)
    try:
        exception_duration_s(manifest)
    except QuantityError as exc:
        return Refusal("spec.exception.duration", str(exc), f"spec.exception.duration: {exc}")
    return None


def pending_refusal(
    name: str, model: Workload, owner: str, counter: PendingCounter, tree: QueueTree
) -> Refusal | None:
    """The queue's (or the server's default) pending limits: 429 while ``owner``'s or the
    queue's pending work is at a limit, 422 when the workload alone passes it (it never could
    be accepted). Checked last, after authorization (the counts are the queue's business), and
    on the one path the API, apply and the Kubernetes source share."""
    hit = counter.over(name, model, owner, tree)
    if hit is None:
        return None
    what = "pods" if "Pods" in hit.field else "workloads"
    where = f"queue {hit.queue}'s" + (" default" if hit.default else " spec.limits")
    whose = f"user {hit.user} has" if hit.user else f"queue {hit.queue} has"
    if hit.never:
        problem = (
            f"it has {hit.adds} {what}, more than {where} {hit.field} {hit.limit} allows pending at once"
        )
        return Refusal("spec.podGroups", problem, f"spec.podGroups: {problem}")
    problem = (
        f"{whose} {hit.current} {what} pending and {where} {hit.field} is {hit.limit}"
        f"{'' if hit.adds == 1 else f'; this workload adds {hit.adds}'}: submit again once some has started"
        " or cancel some"
    )
    return Refusal("spec.queue", problem, f"spec.queue: {problem}", status=429)


__all__ = [
    "Refusal",
    "approval_reason",
    "exception_duration_s",
    "is_exception",
    "needs_approval",
    "over_limit",
    "pending_refusal",
    "queue_refusal",
    "request_refusal",
    "unfit",
]
