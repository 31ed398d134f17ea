"""The verbs: create, update, patch, delete (finalizers, grace, cascading) with the real server's
rules, shared by the HTTP layer and the in-process API.

Why one place: a test that writes in-process and a client that writes over HTTP must see the
same resourceVersions, conflicts and watch events.
"""

from __future__ import annotations

import re
import time
from typing import Any

from gpupool.kube.fake import errors, podspec
from gpupool.kube.fake.defaults import admit_pod_update, apply_defaults, canonical_quantities
from gpupool.kube.fake.patch import apply_patch
from gpupool.kube.fake.resources import BUILTINS, ResourceType, from_crd
from gpupool.kube.fake.storage import Obj, Store, new_metadata, now_rfc3339

#: metadata fields clients cannot change by update
_SERVER_OWNED = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "namespace",
    "name",
)
APPLY = "application/apply-patch+yaml"
BUILTIN_KEYS = frozenset(rt.key for rt in BUILTINS)
_STALE = "the object has been modified; please apply your changes to the latest version and try again"


class Ops:
    """The write verbs over one ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._policy: dict[str, str] = {}  # uid -> propagation policy of a pending delete

    # -- create --------------------------------------------------------------------------
    def create(self, rt: ResourceType, ns: str, obj: Obj) -> Obj:
        """Create ``obj`` (taken over, not copied) in ``ns``; 404 when the namespace is missing."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the request body must be a JSON object")
        md = obj.get("metadata")
        if not isinstance(md, dict):
            md = obj["metadata"] = {}
        if rt.namespaced:
            if md.get("namespace") and ns and md["namespace"] != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            ns = ns or md.get("namespace") or "default"
        if obj.get("kind") not in (None, rt.kind):
            raise errors.bad_request(f"the kind {obj.get('kind')!r} does not match resource {rt.key!r}")
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        if rt.key == "events.events.k8s.io":  # named as a DNS subdomain there (core events are not)
            _check_subdomain_prefix(rt.kind, md.get("generateName"))
        with self.store.lock:
            if rt.namespaced and self.store.find(self.store.types["namespaces"], "", ns) is None:
                raise errors.not_found("namespaces", ns)
            new_metadata(md, ns, rt.namespaced)
            if self.store.find(rt, ns, md["name"]) is not None:
                raise errors.already_exists(rt.plural, md["name"], rt.group)
            apply_defaults(rt.key, obj)
            canonical_quantities(rt.key, obj)
            if rt.key == "pods":
                self._admit_priority(obj)
            if rt.key == "customresourcedefinitions.apiextensions.k8s.io" and not self.store.dry_run:
                self._register_crd(obj)
            out = self.store.commit(rt, "ADDED", obj)
            if rt.key == "events.events.k8s.io":
                self._mirror_event(out)
            return out

    def _admit_priority(self, pod: Obj) -> None:
        """The Priority admission plugin: ``spec.priority`` (and ``preemptionPolicy``) from the
        pod's PriorityClass, or from the global default class, else 0; 403 for a class that does
        not exist or a priority the pod sets itself that disagrees."""
        spec, name = pod["spec"], pod["metadata"]["name"]
        classes = self.store.objects["priorityclasses.scheduling.k8s.io"]
        cls_name = spec.get("priorityClassName")
        if cls_name:
            cls = classes.get(("", cls_name))
            if cls is None:
                raise errors.ApiError(
                    403,
                    f'pods "{name}" is forbidden: no PriorityClass with name {cls_name} was found',
                    "Forbidden",
                    {"name": name, "kind": "pods"},
                )
        else:
            cls = next((c for c in classes.values() if c.get("globalDefault")), None)
        value = int(cls.get("value", 0)) if cls else 0
        if spec.get("priority") is not None and int(spec["priority"]) != value:
            raise errors.ApiError(
                403,
                f'pods "{name}" is forbidden: the integer value of priority ({spec["priority"]}) '
                f"must not be provided in pod spec; priority admission controller computed "
                f"{value} from the given PriorityClass name",
                "Forbidden",
                {"name": name, "kind": "pods"},
            )
        spec["priority"] = value
        if cls is not None:
            spec["priorityClassName"] = cls["metadata"]["name"]
            spec.setdefault("preemptionPolicy", cls.get("preemptionPolicy", "PreemptLowerPriority"))

    def _mirror_event(self, ev: Obj) -> None:
        """An events.k8s.io/v1 Event also as a core v1 Event: on a real cluster they are one
        object seen through two APIs, and ``kubectl describe`` reads the core one."""
        md = ev["metadata"]
        when = ev.get("eventTime") or md["creationTimestamp"]
        core = {
            "metadata": {"name": md["name"], "namespace": md["namespace"]},
            "involvedObject": ev.get("regarding") or {},
            "reason": ev.get("reason", ""),
            "message": ev.get("note", ""),
            "type": ev.get("type", "Normal"),
            "action": ev.get("action", ""),
            "source": {"component": ev.get("reportingController", "")},
            "reportingComponent": ev.get("reportingController", ""),
            "reportingInstance": ev.get("reportingInstance", ""),
            "firstTimestamp": when,
            "lastTimestamp": when,
            "eventTime": ev.get("eventTime"),
            "count": int((ev.get("series") or {}).get("count", 1)),
        }
        rt = self.store.types["events"]
        if self.store.find(rt, md["namespace"], md["name"]) is None:
            self.store.commit(
                rt,
                "ADDED",
                {
                    **core,
                    "kind": "Event",
                    "apiVersion": "v1",
                    "metadata": new_metadata(core["metadata"], md["namespace"], True),
                },
            )

    def _register_crd(self, crd: Obj) -> None:
        try:
            types = from_crd(crd)
        except ValueError as exc:
            raise errors.invalid(
                "CustomResourceDefinition", crd["metadata"]["name"], "spec", str(exc)
            ) from exc
        expect = f"{types[0].plural}.{types[0].group}"
        if crd["metadata"]["name"] != expect:
            raise errors.invalid(
                "CustomResourceDefinition",
                crd["metadata"]["name"],
                "metadata.name",
                f"must be spec.names.plural+'.'+spec.group ({expect!r})",
            )
        for rt in types:
            self.store.register(rt)
        names = crd["spec"]["names"]
        crd["status"] = {
            "acceptedNames": dict(names),
            "storedVersions": [types[0].version],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "lastTransitionTime": now_rfc3339(), "message": ""}
                for t, r in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))
            ],
        }

    # -- update / patch ------------------------------------------------------------------
    def update(self, rt: ResourceType, ns: str, name: str, obj: Obj, sub: str = "") -> Obj:
        """PUT: 409 on a stale resourceVersion; ``sub='status'`` changes only the status."""
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise errors.bad_request("the request body must be an object with metadata")
        if obj["metadata"].get("name") not in (None, name):
            raise errors.bad_request("the name of the object does not match the name on the URL")
        with self.store.lock:
            cur = self.store.get(rt, ns, name)
            rv = obj["metadata"].get("resourceVersion")
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, _STALE, rt.group)
            return self._write(rt, cur, obj, sub)

    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, body: Any, sub: str = "") -> Obj:
        """PATCH of the three kinds; a resourceVersion in the patch is a precondition.

        Server-side apply (``application/apply-patch+yaml``) is served simply: it creates the
        object when absent, else merges the applied fields in (strategic merge for built-in
        kinds, JSON merge for custom ones); field managers and apply conflicts are not tracked."""
        if content_type.split(";")[0].strip() == APPLY:
            return self._apply(rt, ns, name, body, sub)
        with self.store.lock:
            cur = self.store.get(rt, ns, name)
            new = apply_patch(content_type, cur, body)
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise errors.invalid(rt.kind, name, "metadata", "the patch removed the object's metadata")
            if new["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, _STALE, rt.group)
            return self._write(rt, cur, new, sub)

    def _apply(self, rt: ResourceType, ns: str, name: str, body: Any, sub: str) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("server-side apply: the body must be an object")
        if not body.get("apiVersion") or not body.get("kind"):  # the real server's words
            raise errors.bad_request(
                f"invalid object type: {body.get('apiVersion') or '/'}, Kind={body.get('kind') or ''}"
            )
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise errors.bad_request("server-side apply: the name of the object does not match the URL")
        with self.store.lock:
            cur = self.store.find(rt, ns, name)
            if cur is None:
                if sub:
                    raise errors.not_found(rt.plural, name, rt.group)
                body.setdefault("metadata", {})["name"] = name
                return self.create(rt, ns, body)
            ctype = (
                "application/strategic-merge-patch+json"
                if rt.key in BUILTIN_KEYS
                else "application/merge-patch+json"
            )
            md = body.get("metadata") or {}
            md.pop("resourceVersion", None)
            new = apply_patch(ctype, cur, body)
            return self._write(rt, cur, new, sub)

    def _write(self, rt: ResourceType, cur: Obj, new: Obj, sub: str) -> Obj:
        canonical_quantities(rt.key, new)
        if sub == "status":
            new = {**cur, "status": new.get("status", {})}
        else:
            md = dict(new["metadata"])
            for f in _SERVER_OWNED:
                if f in cur["metadata"]:
                    md[f] = cur["metadata"][f]
                else:
                    md.pop(f, None)
            new = {**new, "metadata": md, "kind": rt.kind, "apiVersion": rt.api_version}
            if "status" in rt.subresources:
                new["status"] = cur.get("status", {})
            if rt.key == "pods":
                admit_pod_update(new)
            self._check_immutable(rt, cur, new)
            if new.get("spec") != cur.get("spec"):
                md["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        if new == cur:
            return cur
        nmd = new["metadata"]
        if (
            nmd.get("deletionTimestamp")
            and not nmd.get("finalizers")
            and not nmd.get("deletionGracePeriodSeconds")
        ):
            return self._remove(rt, new, cur)
        return self.store.commit(rt, "MODIFIED", new, cur)

    @staticmethod
    def _check_immutable(rt: ResourceType, cur: Obj, new: Obj) -> None:
        if rt.key != "pods":
            return
        old_spec, new_spec = cur.get("spec") or {}, new.get("spec") or {}
        if new_spec.get("nodeName") != old_spec.get("nodeName"):  # the same words, and the way out
            why = podspec.MESSAGE + " (spec.nodeName is set through pods/binding)"
            raise errors.invalid("Pod", cur["metadata"]["name"], "spec", why)
        if not podspec.containers_kept(old_spec, new_spec):
            raise errors.invalid(
                "Pod", cur["metadata"]["name"], "spec.containers", podspec.CONTAINERS_MESSAGE
            )
        deadline = podspec.deadline_refusal(old_spec, new_spec)
        if deadline is not None:
            raise errors.invalid("Pod", cur["metadata"]["name"], "spec.activeDeadlineSeconds", deadline)
        if not podspec.update_allowed(old_spec, new_spec):
            raise errors.invalid("Pod", cur["metadata"]["name"], "spec", podspec.MESSAGE)

    # -- delete --------------------------------------------------------------------------
    def delete(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        grace: int | None = None,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
    ) -> Obj:
        """DELETE: graceful for bound pods, held by finalizers, then cascades to owned objects."""
        with self.store.lock:
            cur = self.store.get(rt, ns, name)
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
                raise errors.conflict(
                    rt.plural,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {cur['metadata']['uid']}",
                    rt.group,
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, _STALE, rt.group)
            policy = propagation or ("Orphan" if rt.key == "jobs.batch" else "Background")
            if policy not in ("Orphan", "Background", "Foreground"):
                raise errors.bad_request(
                    f"propagationPolicy {policy!r} must be Orphan, Background or Foreground"
                )
            self._policy[cur["metadata"]["uid"]] = policy
            grace = self._pod_grace(cur, grace) if rt.key == "pods" else 0
            md = dict(cur["metadata"])
            finalizers = list(md.get("finalizers") or [])
            if (
                policy == "Foreground"
                and self.store.owned_by(md["uid"])
                and "foregroundDeletion" not in finalizers
            ):
                finalizers.append("foregroundDeletion")
            if grace > 0 or finalizers:
                return self._mark_deleting(rt, cur, md, finalizers, grace)
            return self._remove(rt, cur, cur)

    @staticmethod
    def _pod_grace(pod: Obj, grace: int | None) -> int:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        current = pod["metadata"].get("deletionGracePeriodSeconds")
        return min(grace, int(current)) if current is not None else grace

    def _mark_deleting(self, rt: ResourceType, cur: Obj, md: Obj, finalizers: list[str], grace: int) -> Obj:
        if not md.get("deletionTimestamp") or md.get("deletionGracePeriodSeconds", 0) != grace:
            md["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            md["deletionGracePeriodSeconds"] = grace
        md["finalizers"] = finalizers
        if not finalizers:
            md.pop("finalizers")
        new = {**cur, "metadata": md}
        if "foregroundDeletion" in finalizers:
            self._cascade(md["uid"], "Foreground")
        return new if new == cur else self.store.commit(rt, "MODIFIED", new, cur)

    def _remove(self, rt: ResourceType, obj: Obj, old: Obj) -> Obj:
        out = self.store.commit(rt, "DELETED", obj, old)
        uid = obj["metadata"]["uid"]
        self._cascade(uid, self._policy.pop(uid, "Background"))
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            spec = obj.get("spec") or {}
            self.store.unregister(spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        elif rt.key == "namespaces":
            self._empty_namespace(obj["metadata"]["name"])
        self._release_foreground_owners(obj)
        return out

    def _cascade(self, uid: str, policy: str) -> None:
        for key, (ns, name) in self.store.owned_by(uid):
            dep_rt = self.store.types.get(key)
            dep = self.store.find(dep_rt, ns, name) if dep_rt else None
            if dep_rt is None or dep is None or dep["metadata"].get("deletionTimestamp"):
                continue
            if policy == "Orphan":
                refs = [r for r in dep["metadata"].get("ownerReferences", []) if r.get("uid") != uid]
                self._write(
                    dep_rt, dep, {**dep, "metadata": {**dep["metadata"], "ownerReferences": refs}}, ""
                )
            else:
                self.delete(dep_rt, ns, name, None, "Foreground" if policy == "Foreground" else "Background")

    def _release_foreground_owners(self, obj: Obj) -> None:
        """A dependent went away: an owner waiting in foreground deletion may now go too."""
        for ref in obj["metadata"].get("ownerReferences") or ():
            if self.store.owned_by(ref.get("uid", "")):
                continue
            for rt in list(self.store.types.values()):
                if rt.kind != ref.get("kind") or rt.api_version != ref.get("apiVersion"):
                    continue
                owner = self.store.find(rt, obj["metadata"].get("namespace", ""), ref.get("name", ""))
                fins = (owner or {}).get("metadata", {}).get("finalizers") or []
                if owner is not None and "foregroundDeletion" in fins:
                    md = {**owner["metadata"], "finalizers": [f for f in fins if f != "foregroundDeletion"]}
                    self._write(rt, owner, {**owner, "metadata": md}, "")

    def _empty_namespace(self, ns: str) -> None:
        for rt in list(self.store.types.values()):
            if rt.namespaced:
                for ons, name in [k for k in self.store.objects.get(rt.key, {}) if k[0] == ns]:
                    self.delete(rt, ons, name, 0)


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _check_subdomain_prefix(kind: str, prefix: Any) -> None:
    """A ``generateName`` must be a DNS subdomain once a trailing '-' is masked (the real
    server's check: ``p.`` is refused, ``p-`` and ``p.x`` are taken)."""
    if not isinstance(prefix, str) or not prefix:
        return
    masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
    if len(prefix) > 253 or not _SUBDOMAIN.fullmatch(masked):
        raise errors.invalid(
            kind,
            prefix,
            "metadata.generateName",
            f'Invalid value: "{prefix}": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        )
