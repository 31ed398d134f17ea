"""The onboard use-case: a team from a TeamTemplate — its queues and tokens in one atomic step,
previewed first, recorded as one audit entry.

Why through the same checks as an apply (gpupool.service.usecases.apply): the queues a
template renders are validated against the configuration they join (a guarantee the parent
cannot give is refused naming the field) and previewed on the work running now; only then does
one store transaction create the queues, issue the tokens and record the OIDC group grants
(gpupool.store.onboarding).

Who calls it: ``POST /v1/onboard`` (gpupool.service.routes.onboard), which ``gpupool onboard``
(gpupool.cli.onboard) calls over HTTP.
"""

from __future__ import annotations

from typing import Any

from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests import Bundle, Document, build
from gpupool.manifests.convert import parse_manifest
from gpupool.manifests.templates import Onboarding, TeamTemplateSpec, TemplateError, render
from gpupool.service import preview as pv
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.usecases.apply import check_config, parse_set


def _render(template: dict[str, Any], team: str, params: dict[str, str]) -> tuple[str, Onboarding]:
    doc_ = parse_manifest(template, "template")
    if doc_.kind != "TeamTemplate":
        raise ApiError(
            422,
            f"template: expected a TeamTemplate, got {doc_.kind}",
            [{"field": "template.kind", "problem": "not a TeamTemplate"}],
        )
    spec: TeamTemplateSpec = doc_.spec
    try:
        return doc_.name, render(spec, team, params)
    except TemplateError as exc:
        raise ApiError(422, str(exc), [{"field": "set", "problem": str(exc)}]) from exc


def onboard_team(
    svc: Service,
    p: Principal,
    template: dict[str, Any],
    team: str,
    params: dict[str, str],
    dry_run: bool = False,
    reason: str = "",
) -> dict[str, Any]:
    """Create ``team``'s queues and tokens from ``template`` (``params``: its ``--set`` values),
    whole or not at all (platform-admin); with ``dry_run``, the preview and what would be made."""
    svc.check(p, Action.MANAGE_TOKENS, Resource("Token", team))
    name, plan = _render(template, team, params)
    ctl = svc.controller
    with ctl.lock:
        docs = parse_set(plan.queues)
        taken = [d.name for _, d in docs if d.name in ctl.parents]
        if taken:
            raise ApiError(
                409,
                f"queue {taken[0]!r} already exists; team {team!r} may be onboarded already",
                [{"field": "team", "problem": "queue exists"}],
            )
        _oversubscribed(ctl.bundle, team, [d for _, d in docs])
        view = check_config(svc, p, docs)
        report = pv.simulate(svc, view.bundle)
        if dry_run:
            out = pv.record(svc, p, plan.queues, report, reason)
            return {
                **out,
                "objects": plan.queues,
                "tokens": [list(t) for t in plan.tokens],
                **_groups(svc, plan),
            }
        detail = {"template": name, "team": team, "set": params, "preview": pv.summary(report)}
        if reason:
            detail["reason"] = reason
        recs, issued = svc.store.onboard_team(
            plan.queues,
            plan.tokens,
            AuditEntry(p.name, "team.onboard", "Team", team, detail),
            groups=plan.groups,
        )
        ctl.reload_config()
        if plan.groups and svc.oidc is not None:
            svc.oidc.forget_grants()  # the team's groups may sign in at once
    return {
        "team": team,
        "template": name,
        "created": [{"kind": r.kind, "name": r.name} for r in recs],
        "tokens": [
            {"name": t.record.name, "role": t.record.role, "scope": t.record.scope, "token": t.token}
            for t in issued
        ],
        **_groups(svc, plan),
        "preview": report,
    }


def _oversubscribed(current: Bundle, team: str, docs: list[Document]) -> None:
    """422 when the team's queues ask a parent for more guarantee than it has left on a pool,
    naming the parent, the pool, the queues asking and the numbers: the guarantee asked, the
    parent's own guarantee there (its capacity to give), what it has already promised to its
    other children, and the pool's GPUs. Why apart from the general check: that one names only
    the parent and a total, and an operator onboarding a team needs to know what to lower."""
    new = {d.name for d in docs}
    queues = build(docs, current, references=False).queues
    by_name = {q.name: q for q in queues}
    errors: list[dict[str, str]] = []
    parents = {p for q in queues if q.name in new and (p := q.parent) is not None and p in by_name}
    for parent in sorted(parents):
        kids = [q for q in queues if q.parent == parent]
        for own in by_name[parent].quotas:
            share = {q.name: g.guarantee[0] for q in kids if (g := q.quota(own.pool)) is not None}
            asked = sum(v for n, v in share.items() if n in new)
            promised = sum(v for n, v in share.items() if n not in new)
            if asked and asked + promised > own.guarantee[0]:
                errors.append(_over(team, parent, own.pool, share, new, own.guarantee[0], current))
    if errors:
        message = "; ".join(e["problem"] for e in errors) + "; nothing was created"
        raise ApiError(422, message, errors)


def _over(
    team: str, parent: str, pool: str, share: dict[str, int], new: set[str], capacity: int, b: Bundle
) -> dict[str, str]:
    """One over-subscribed parent on one pool, with the numbers (GPUs; quotas are in milli)."""

    def gpus(milli: int) -> str:
        return f"{milli / 1000:g}"

    asked = {n: v for n, v in share.items() if n in new}
    others = {n: v for n, v in share.items() if n not in new and v}
    promised = sum(others.values())
    in_pool = sum(n.gpu_count for n in b.nodes if any(p.name == pool and p.selects(n) for p in b.pools))
    to_whom = ", ".join(f"{n} {gpus(v)}" for n, v in sorted(others.items())) or "no other queue"
    problem = (
        f"queue {parent!r} is over-subscribed on pool {pool}: team {team!r} asks a guarantee of "
        f"{gpus(sum(asked.values()))} GPUs ({', '.join(f'{n} {gpus(v)}' for n, v in sorted(asked.items()))}); "
        f"{parent} guarantees {gpus(capacity)} GPUs there and has already promised {gpus(promised)} "
        f"({to_whom}), leaving {gpus(max(0, capacity - promised))}; the pool has {in_pool} GPUs"
    )
    first = min(asked)
    return {
        "field": f"spec.quotas (pool {pool}).guarantee",
        "problem": problem,
        "message": f"Queue/{first}: spec.quotas (pool {pool}).guarantee: {problem}",
    }


def _groups(svc: Service, plan: Onboarding) -> dict[str, Any]:
    """The OIDC group grants, and a note when single sign-on is off (they wait for it)."""
    if not plan.groups:
        return {}
    out: dict[str, Any] = {"oidcGroups": [{"group": g, "role": r, "scope": sc} for g, r, sc in plan.groups]}
    if svc.oidc is None:
        out["note"] = (
            "single sign-on is off (GPUPOOL_OIDC_CONFIG unset): the group grants apply once it is on"
        )
    return out
