"""The apply use-case: a set of manifests (configuration objects and workloads) applied whole
or not at all, or previewed (dry run).

Everything is validated and authorized against the configuration the set leaves before
anything is written (a new Queue and a Workload in it may come together); configuration
objects are then written in one store transaction and the workloads submitted through the
submit use-case (gpupool.service.usecases.submit). Refusals are the service's typed errors
(gpupool.service.errors) or a ManifestError with every located problem; the HTTP layer maps
them to the statuses the API documents.

Who calls it: ``POST /v1/apply`` and ``PUT /v1/config/...`` (gpupool.service.routes.config),
the onboarding use-case (its checks), and the Kubernetes configuration source
(gpupool.kube.adapters.config_source) for each ResourcePool, Queue or PriorityClass applied with
kubectl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.audit import AuditEntry, canonical_json
from gpupool.auth import Action, Principal, Resource
from gpupool.manifests import Document, ManifestError
from gpupool.manifests.convert import (
    bundle_from_manifests,
    object_manifest,
    parse_manifest,
    resource_version,
    without_server_metadata,
)
from gpupool.service import preview as pv
from gpupool.service.core import Service
from gpupool.service.errors import ApiError, Denied
from gpupool.service.usecases.scoped_names import foreign, rescoped
from gpupool.service.usecases.submit import Prepared, prepare, submit_many
from gpupool.service.view import ConfigView
from gpupool.store import WorkloadRecord

CONFIG_ACTIONS = {
    "ResourcePool": "pool",
    "Queue": "queue",
    "PriorityClass": "priorityclass",
    "Cluster": "cluster",
}

#: marks a priority class ``get`` shows that is gpupool's default, not stored; the server's
#: word, so it is not stored with an override applied from what ``get`` printed
BUILTIN_ANNOTATION = "gpupool.io/builtin"

#: workload names looked up in one query when a set is checked
NAMES_PER_READ = 500

#: the apply results as kubectl words them (the store says "updated")
RESULT_WORDS = {"updated": "configured"}


def config_resource(kind: str, name: str, manifest: Mapping[str, Any] | None, svc: Service) -> Resource:
    parent = None
    if kind == "Queue":
        spec = (manifest or {}).get("spec") or {}
        parent = spec.get("parent") if isinstance(spec, Mapping) else None
        if manifest is None:
            parent = svc.controller.parents.get(name)
    return Resource(kind, name, queue=parent)


def parse_set(items: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Document]]:
    """Every manifest of a set validated, duplicates refused: all located errors at once."""
    docs: list[tuple[dict[str, Any], Document]] = []
    errors: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    for i, m in enumerate(items):
        try:
            d = parse_manifest(m, f"items[{i}]")
        except ManifestError as exc:
            errors.extend(exc.errors)
            continue
        if d.kind == "TeamTemplate":  # a template is not stored: it drives an onboarding
            errors.append(f"{d.source}: kind: a TeamTemplate is used by `gpupool onboard` (POST /v1/onboard)")
            continue
        first = seen.setdefault((d.kind, d.name), i)
        if first != i:
            errors.append(
                f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first at items[{first}])"
            )
        body = {k: v for k, v in m.items() if k != "status"}  # status is the server's: ignored
        # a workload read back keeps no server metadata (its resubmission must equal the original)
        docs.append((without_server_metadata(body) if d.kind == "Workload" else body, d))
    if errors:
        raise ManifestError(errors)
    return docs


def check_config(svc: Service, p: Principal, docs: list[tuple[dict[str, Any], Document]]) -> ConfigView:
    """Authorize each change (a queue move where it is and where it goes) and build the
    configuration the set would leave, which must be valid as a whole."""
    denied: list[tuple[Document, Denied]] = []
    for m, d in docs:
        try:
            svc.check(p, Action.UPDATE, config_resource(d.kind, d.name, m, svc), defer=True)
            if d.kind == "Queue" and d.name in svc.controller.parents:
                # moving a queue needs authority where it is now, not only where it goes
                svc.check(p, Action.UPDATE, config_resource(d.kind, d.name, None, svc), defer=True)
        except Denied as den:
            denied.append((d, den))
    _refuse_denied(svc, denied)
    current = {(r.kind, r.name): object_manifest(r) for r in svc.store.list_objects()}
    for m, d in docs:
        current[(d.kind, d.name)] = without_server_metadata(m)
    return ConfigView(bundle_from_manifests(current.values(), skip_invalid=True))


def _check_workloads(
    svc: Service, p: Principal, docs: list[tuple[dict[str, Any], Document]], view: ConfigView | None
) -> list[Prepared]:
    """Each workload checked against the configuration the set leaves, and against the
    stored workloads (a name taken with another manifest); raises with every problem."""
    preps: list[Prepared] = []
    located: list[Document] = []
    errors: list[str] = []
    conflicts: list[dict[str, str]] = []
    denied: list[tuple[Document, Denied]] = []
    for m, d in docs:
        try:
            prep = prepare(svc, p, m, view)
        except Denied as den:
            denied.append((d, den))
            continue
        except ManifestError as exc:
            errors.extend(exc.errors)
            continue
        except ApiError as exc:
            errors.extend(f"{d.source}: {e['field']}: {e['problem']}" for e in exc.errors)
            continue
        preps.append(prep)
        located.append(d)
    _refuse_denied(svc, denied)
    if not errors:
        preps, taken = _scoped(svc, p, preps)
        for prep, d in zip(preps, located, strict=True):
            clash = _name_clash(taken.get(prep.model.name), p, prep)
            if clash:
                conflicts.append(_located(d, "metadata.name", clash))
    if errors:
        raise ManifestError(errors)
    if conflicts:
        raise ApiError(409, f"{len(conflicts)} workload name(s) taken; nothing was applied", conflicts)
    return preps


def _refuse_denied(svc: Service, denied: list[tuple[Document, Denied]]) -> None:
    """403 naming every document the caller may not write and why, each denial audited."""
    if not denied:
        return
    for _, den in denied:
        svc.store.append_audit(den.entry)
    items = [
        _located(d, "spec.queue" if d.kind == "Workload" else "metadata.name", den.message)
        for d, den in denied
    ]
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    raise ApiError(
        403,
        f"{len(items)} object(s) of the set refused; nothing was applied: {items[0]['message']}{more}",
        items,
    )


def _located(d: Document, field: str, problem: str) -> dict[str, str]:
    """An error item as a 422's are: the field, the problem, and the line naming the document."""
    return {"field": field, "problem": problem, "message": f"{d.source}: {field}: {problem}"}


def _stale(svc: Service, docs: list[tuple[dict[str, Any], Document]]) -> None:
    """409 naming every object whose ``metadata.resourceVersion`` (the version it was read at,
    sent back from a GET) is not the stored one, with the current version: all at once, before
    anything is written. The store checks again in the write's transaction (a race after this)."""
    stale: list[dict[str, str]] = []
    wanted = [(m, d, resource_version(m)) for m, d in docs]
    # one read of the stored versions, not one per object (a set may hold 10,000)
    stored = (
        {(r.kind, r.name): r.resource_version for r in svc.store.list_objects()}
        if any(w is not None for _, _, w in wanted)
        else {}
    )
    for _m, d, want in wanted:
        if want is None:
            continue  # no precondition, as kubectl apply without a resourceVersion
        now = stored.get((d.kind, d.name))
        if now == want or (now is None and want == 0):
            continue
        problem = (
            f"{d.kind} {d.name!r} no longer exists (the manifest was read at resourceVersion {want})"
            if now is None
            else f"{d.kind} {d.name!r} changed since it was read: the current resourceVersion is "
            f"{now}, the manifest has {want}"
        )
        stale.append(_located(d, "metadata.resourceVersion", problem))
    if stale:
        raise ApiError(
            409,
            f"{len(stale)} object(s) changed since they were read; nothing was applied: "
            + "; ".join(s["problem"] for s in stale),
            stale,
        )


def _stored_workloads(svc: Service, names: list[str]) -> dict[str, WorkloadRecord]:
    """The stored workloads of these names, read a chunk of names at a time (not one by one)."""
    out: dict[str, WorkloadRecord] = {}
    for i in range(0, len(names), NAMES_PER_READ):
        out.update((r.name, r) for r in svc.store.list_workloads(names=names[i : i + NAMES_PER_READ]))
    return out


def _scoped(
    svc: Service, p: Principal, preps: list[Prepared]
) -> tuple[list[Prepared], dict[str, WorkloadRecord]]:
    """The set with each workload whose name a workload unreadable to ``p`` holds moved to
    ``p``'s scoped key (gpupool.service.usecases.scoped_names), and the stored workloads its
    names then meet: a clash is only ever with a workload ``p`` can read."""
    taken = _stored_workloads(svc, [w.model.name for w in preps])
    out = [rescoped(svc, p, w) if foreign(svc, p, taken.get(w.model.name)) else w for w in preps]
    moved = [w.model.name for w, was in zip(out, preps, strict=True) if w is not was]
    if moved:
        taken.update(_stored_workloads(svc, moved))
    return out, taken


def _name_clash(rec: WorkloadRecord | None, p: Principal, prep: Prepared) -> str | None:
    if rec is None:
        return None
    if rec.owner == p.name and canonical_json(rec.manifest) == canonical_json(prep.body):
        return None
    return (
        f"workload {rec.name!r} already exists with a different manifest or owner; "
        "a resubmission must repeat the original exactly, otherwise choose another name"
    )


def _detail(svc: Service, items: list[dict[str, Any]], reason: str) -> dict[str, Any]:
    """The audit detail of an applied change: its reason, and the preview of exactly this
    change if one was made (gpupool.service.preview)."""
    out: dict[str, Any] = {"reason": reason} if reason else {}
    seen = pv.remembered(svc, items)
    if seen is not None:
        out["preview"] = seen
    return out


def preview_set(svc: Service, p: Principal, items: list[dict[str, Any]], reason: str) -> dict[str, Any]:
    """Validate and authorize as an apply does, then report what the change would do (dry run)."""
    docs = parse_set(items)
    config = [(m, d) for m, d in docs if d.kind != "Workload"]
    workloads = [(m, d) for m, d in docs if d.kind == "Workload"]
    view = check_config(svc, p, config) if config else None
    preps = _check_workloads(svc, p, workloads, view)
    _stale(svc, config)
    bundle = view.bundle if view is not None else svc.controller.bundle
    report = pv.simulate(svc, bundle, [w.model for w in preps if not w.approval])
    return pv.record(svc, p, items, report, reason)


def apply_set(
    svc: Service, p: Principal, items: list[dict[str, Any]], reason: str = ""
) -> list[dict[str, str]]:
    """Apply a set whole or not at all: everything is validated and authorized against the
    configuration the set leaves before anything is written; configuration objects are then
    written in one transaction, and the workloads submitted. Only a race lost after the
    checks (a name taken meanwhile) can fail a workload alone; its result says so."""
    docs = parse_set(items)
    config = [(m, d) for m, d in docs if d.kind != "Workload"]
    workloads = [(m, d) for m, d in docs if d.kind == "Workload"]
    ctl = svc.controller
    results: list[dict[str, str]] = []
    with ctl.lock:
        view = check_config(svc, p, config) if config else None
        preps = _check_workloads(svc, p, workloads, view)
        _stale(svc, config)
        if config:
            results = _write_config(svc, p, config, _detail(svc, items, reason))
            if any(r["result"] != "unchanged" for r in results):
                ctl.reload_config()
    results.extend(submit_many(svc, p, preps))
    return results


def _write_config(
    svc: Service, p: Principal, config: list[tuple[dict[str, Any], Document]], detail: dict[str, Any]
) -> list[dict[str, str]]:
    """Write the configuration objects in one transaction; each one's result in kubectl's words
    (created, configured, unchanged). A built-in priority class applied back as ``get`` showed
    it is unchanged and not stored; changed, it is stored as an override (configured)."""
    builtins = builtin_classes(svc)

    def as_builtin(m: dict[str, Any], d: Document) -> bool:
        b = builtins.get(d.name) if d.kind == "PriorityClass" else None
        return b is not None and _same(b, without_server_metadata(m))

    writes = [(m, d) for m, d in config if not as_builtin(m, d)]
    written = {id(m) for m, _ in writes}
    done = iter(
        svc.store.apply_objects(
            [
                (
                    _stored_form(m),
                    AuditEntry(p.name, f"{CONFIG_ACTIONS[d.kind]}.apply", d.kind, d.name, detail),
                    resource_version(m),  # sent back from a GET: 409 if stale
                )
                for m, d in writes
            ]
        )
        if writes
        else ()
    )
    results: list[dict[str, str]] = []
    for m, d in config:
        outcome = next(done)[1] if id(m) in written else "unchanged"
        if outcome == "created" and d.kind == "PriorityClass" and d.name in builtins:
            outcome = "updated"  # it existed (built in): now overridden
        results.append({"kind": d.kind, "name": d.name, "result": RESULT_WORDS.get(outcome, outcome)})
    return results


def _stored_form(m: Mapping[str, Any]) -> dict[str, Any]:
    """What is stored of an applied manifest: no server metadata, no built-in mark."""
    out = without_server_metadata(m)
    md = out.get("metadata")
    if isinstance(md, Mapping) and isinstance(md.get("annotations"), Mapping):
        annotations = {k: v for k, v in md["annotations"].items() if k != BUILTIN_ANNOTATION}
        out["metadata"] = {k: v for k, v in md.items() if k != "annotations"}
        if annotations:
            out["metadata"]["annotations"] = annotations
    return out


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two manifests say the same: spec, labels and annotations (absent is empty)."""

    def key(m: Mapping[str, Any]) -> str:
        md = m.get("metadata") or {}
        return canonical_json([m.get("spec") or {}, md.get("labels") or {}, md.get("annotations") or {}])

    return key(a) == key(b)


def builtin_classes(svc: Service) -> dict[str, dict[str, Any]]:
    """The priority classes in force that no stored object defines (gpupool's defaults), as
    the manifests ``get`` shows: they can be read, applied back unchanged, and overridden."""
    stored = {r.name for r in svc.store.list_objects("PriorityClass")}
    return {
        pc.name: {
            "apiVersion": "gpupool.io/v1alpha1",
            "kind": "PriorityClass",
            "metadata": {"name": pc.name, "annotations": {BUILTIN_ANNOTATION: "true"}},
            "spec": {"value": pc.value, "preemptible": pc.preemptible, "description": pc.description},
        }
        for pc in svc.controller.bundle.priority_classes
        if pc.name not in stored
    }
