"""Simulated controllers: Job, ReplicaSet, Deployment, StatefulSet (and, in ``training``,
PyTorchJob and JobSet). Each reconciles one owner when it or one of its children changes.

Why reconcile-on-event rather than a resync loop: a scheduler under test sees pods appear as
soon as a Job is unsuspended, as on a real cluster, and an idle cluster costs nothing.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod

from gpupool.kube.fake import owners
from gpupool.kube.fake.ops import Ops
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.storage import Obj, now_rfc3339

JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


class Reconciler(ABC):
    """Calls ``reconcile(owner)`` for an owner kind when it or a child of it changes."""

    key = ""
    kind = ""
    child_keys: tuple[str, ...] = ("pods",)

    def __init__(self, ops: Ops) -> None:
        self.ops = ops

    @property
    def rt(self) -> ResourceType:
        return self.ops.store.types[self.key]

    def on_owner(self, _rt: ResourceType, etype: str, obj: Obj, _old: Obj | None) -> None:
        if etype != "DELETED":
            self._run(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])

    def on_child(self, _rt: ResourceType, _etype: str, obj: Obj, _old: Obj | None) -> None:
        ref = owners.controller_of(obj, self.kind)
        if ref is not None:
            self._run(*ref)

    def _run(self, ns: str, name: str) -> None:
        if self.key not in self.ops.store.types:
            return
        obj = self.ops.store.find(self.rt, ns, name)
        if obj is not None and not obj["metadata"].get("deletionTimestamp"):
            self.reconcile(obj)

    @abstractmethod
    def reconcile(self, obj: Obj) -> None:
        """Bring the owner's children (and status) in line with its spec."""


class JobController(Reconciler):
    """batch/v1 Job: suspend, parallelism, completions (NonIndexed and Indexed), backoffLimit.

    A pod deleted before it ended counts as a failure, as on a real cluster (issue 24), unless
    the Job was suspended or had finished (its own deletions) or a ``podFailurePolicy`` rule
    ignores it (``action: Ignore`` on a condition it has, such as ``DisruptionTarget``); the
    fake once replaced such a pod without counting it, which hid a backend that failed Jobs
    on a real cluster by deleting their pods."""

    key, kind = "jobs.batch", "Job"

    def __init__(self, ops: Ops) -> None:
        super().__init__(ops)
        self.lost: dict[str, set[str]] = {}  # Job uid -> its pods deleted before they ended

    def on_child(self, rt: ResourceType, etype: str, obj: Obj, old: Obj | None) -> None:
        ref = owners.controller_of(obj, self.kind)
        md = obj["metadata"]
        ended = (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if ref is not None and (etype == "DELETED" or md.get("deletionTimestamp")) and not ended:
            job = self.ops.store.find(self.rt, *ref) if self.key in self.ops.store.types else None
            if (
                job is not None
                and not job["spec"].get("suspend")
                and not (owners.has_condition(job, "Complete") or owners.has_condition(job, "Failed"))
                and not _ignored(job, obj)
                and not _out_of_range(job, obj)
            ):
                self.lost.setdefault(job["metadata"]["uid"], set()).add(md["uid"])
        super().on_child(rt, etype, obj, old)

    def reconcile(self, job: Obj) -> None:
        spec, status = job["spec"], dict(job.get("status") or {})
        pods = owners.owned(self.ops, job, "pods")
        live = owners.active(pods)
        succeeded = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        failed_now = {
            p["metadata"]["uid"]
            for p in pods
            if p["status"].get("phase") == "Failed" and not _ignored(job, p)
        }
        failed = len(failed_now | self.lost.get(job["metadata"]["uid"], set()))
        conds = list(status.get("conditions") or [])
        finished = owners.has_condition(job, "Complete") or owners.has_condition(job, "Failed")
        if spec.get("suspend") or finished:
            owners.delete_all(self.ops, "pods", live)
            live = []
            if spec.get("suspend") and not finished:
                conds = owners.condition(conds, "Suspended", True, "JobSuspended", "Job suspended")
                status.pop("startTime", None)
        else:
            if owners.has_condition(job, "Suspended"):
                conds = owners.condition(conds, "Suspended", False, "JobResumed", "Job resumed")
            status.setdefault("startTime", now_rfc3339())
            conds, live = self._progress(job, conds, live, succeeded, failed)
        status.update(
            active=len(live),
            succeeded=len(succeeded),
            failed=failed,
            ready=sum(1 for p in live if owners.is_ready(p)),
            conditions=conds,
        )
        if spec.get("completionMode") == "Indexed":
            status["completedIndexes"] = ",".join(sorted({_index(p) for p in succeeded}, key=int))
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conds):
            status.setdefault("completionTime", now_rfc3339())
        owners.set_status(self.ops, self.rt, job, status)

    def _progress(
        self, job: Obj, conds: list[Obj], live: list[Obj], succeeded: list[Obj], failed: int
    ) -> tuple[list[Obj], list[Obj]]:
        spec = job["spec"]
        if failed > int(spec.get("backoffLimit", 6)):
            owners.delete_all(self.ops, "pods", live)
            conds = owners.condition(conds, "FailureTarget", True, "BackoffLimitExceeded", "")
            return owners.condition(
                conds, "Failed", True, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            ), []
        parallelism, completions = int(spec.get("parallelism", 1)), spec.get("completions")
        if (completions is not None and len(succeeded) >= int(completions)) or (
            completions is None and succeeded and not live
        ):
            conds = owners.condition(conds, "SuccessCriteriaMet", True, "CompletionsReached", "")
            return owners.condition(conds, "Complete", True, "CompletionsReached", ""), live
        if spec.get("completionMode") == "Indexed":
            done = {_index(p) for p in succeeded} | {_index(p) for p in live}
            todo = [str(i) for i in range(int(completions or parallelism)) if str(i) not in done]
            for idx in todo[: max(0, parallelism - len(live))]:
                pod = self._create_pod(job, idx)
                if pod is not None:
                    live.append(pod)
            return conds, live
        want = parallelism if completions is None else min(parallelism, int(completions) - len(succeeded))
        for _ in range(max(0, want - len(live))):
            pod = self._create_pod(job, None)
            if pod is not None:
                live.append(pod)
        return conds, live

    def _create_pod(self, job: Obj, index: str | None) -> Obj | None:
        name = job["metadata"]["name"]
        extra = {COMPLETION_INDEX: index} if index is not None else {}
        return owners.create_child(
            self.ops,
            "pods",
            self.rt,
            job,
            job["spec"]["template"],
            generate_name=f"{name}-{index}-" if index is not None else f"{name}-",
            labels=extra,
            annotations=extra,
        )


def _ignored(job: Obj, pod: Obj) -> bool:
    """Whether the Job's ``podFailurePolicy`` ignores this pod's failure (an ``Ignore`` rule on
    a condition the pod has)."""
    have = {
        (c.get("type"), c.get("status"))
        for c in (pod.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    }
    for rule in ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []:
        if not isinstance(rule, dict) or rule.get("action") != "Ignore":
            continue
        for cond in rule.get("onPodConditions") or []:
            if isinstance(cond, dict) and (cond.get("type"), cond.get("status", "True")) in have:
                return True
    return False


def _out_of_range(job: Obj, pod: Obj) -> bool:
    """An Indexed Job's pod whose index its (lowered) completions no longer has: the real
    controller removes it and counts nothing."""
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed" or spec.get("completions") is None:
        return False
    try:
        return int(_index(pod)) >= int(spec["completions"])
    except ValueError:
        return False


def _index(pod: Obj) -> str:
    return (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX, "0")


class ReplicaSetController(Reconciler):
    """apps/v1 ReplicaSet: keeps ``replicas`` live pods."""

    key, kind = "replicasets.apps", "ReplicaSet"

    def reconcile(self, rs: Obj) -> None:
        pods = owners.owned(self.ops, rs, "pods")
        live = owners.active(pods)
        want = int(rs["spec"].get("replicas", 1))
        for _ in range(want - len(live)):
            pod = owners.create_child(
                self.ops,
                "pods",
                self.rt,
                rs,
                rs["spec"]["template"],
                generate_name=rs["metadata"]["name"] + "-",
            )
            if pod is not None:
                live.append(pod)
        if len(live) > want:
            extra = sorted(live, key=lambda p: (bool(p["spec"].get("nodeName")), p["metadata"]["name"]))
            owners.delete_all(self.ops, "pods", extra[: len(live) - want])
            live = extra[len(live) - want :]
        ready = sum(1 for p in live if owners.is_ready(p))
        owners.set_status(
            self.ops,
            self.rt,
            rs,
            {
                "replicas": len(live),
                "fullyLabeledReplicas": len(live),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": rs["metadata"].get("generation", 1),
            },
        )


class DeploymentController(Reconciler):
    """apps/v1 Deployment: one ReplicaSet per pod template (older ones scaled to zero)."""

    key, kind = "deployments.apps", "Deployment"
    child_keys = ("replicasets.apps",)

    def reconcile(self, dep: Obj) -> None:
        template = dep["spec"]["template"]
        h = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        name = f"{dep['metadata']['name']}-{h}"
        rss = owners.owned(self.ops, dep, "replicasets.apps")
        replicas = int(dep["spec"].get("replicas", 1))
        rs_rt = self.ops.store.types["replicasets.apps"]
        for rs in rss:
            if rs["metadata"]["name"] != name and rs["spec"].get("replicas") != 0:
                self.ops.patch(
                    rs_rt,
                    rs["metadata"]["namespace"],
                    rs["metadata"]["name"],
                    "application/merge-patch+json",
                    {"spec": {"replicas": 0}},
                )
        cur = next((rs for rs in rss if rs["metadata"]["name"] == name), None)
        if cur is None:
            tmd = template.get("metadata") or {}
            tpl = {
                **template,
                "metadata": {**tmd, "labels": {**(tmd.get("labels") or {}), "pod-template-hash": h}},
            }
            cur = owners.create_child(
                self.ops,
                "replicasets.apps",
                self.rt,
                dep,
                {"metadata": tpl["metadata"], "spec": {}},
                name=name,
                spec_extra={"replicas": replicas, "template": tpl, "selector": dep["spec"].get("selector")},
            )
        elif cur["spec"].get("replicas") != replicas:
            cur = self.ops.patch(
                rs_rt,
                cur["metadata"]["namespace"],
                name,
                "application/merge-patch+json",
                {"spec": {"replicas": replicas}},
            )
        st = (cur or {}).get("status") or {}
        ready = int(st.get("readyReplicas", 0))
        conds = owners.condition(
            list((dep.get("status") or {}).get("conditions") or []),
            "Available",
            ready >= replicas,
            "MinimumReplicasAvailable" if ready >= replicas else "MinimumReplicasUnavailable",
            "",
        )
        owners.set_status(
            self.ops,
            self.rt,
            dep,
            {
                "replicas": int(st.get("replicas", 0)),
                "updatedReplicas": int(st.get("replicas", 0)),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": dep["metadata"].get("generation", 1),
                "conditions": conds,
            },
        )


class StatefulSetController(Reconciler):
    """apps/v1 StatefulSet: pods ``<name>-0..n-1`` (created together: Parallel pod management)."""

    key, kind = "statefulsets.apps", "StatefulSet"

    def reconcile(self, sts: Obj) -> None:
        name = sts["metadata"]["name"]
        want = int(sts["spec"].get("replicas", 1))
        pods = {p["metadata"]["name"]: p for p in owners.owned(self.ops, sts, "pods")}
        for i in range(want):
            pname = f"{name}-{i}"
            if pname not in pods:
                labels = {"statefulset.kubernetes.io/pod-name": pname, "apps.kubernetes.io/pod-index": str(i)}
                pod = owners.create_child(
                    self.ops,
                    "pods",
                    self.rt,
                    sts,
                    sts["spec"]["template"],
                    name=pname,
                    labels=labels,
                    spec_extra={"hostname": pname, "subdomain": sts["spec"].get("serviceName", "")},
                )
                if pod is not None:
                    pods[pname] = pod
        extra = [p for n, p in pods.items() if int(n.rsplit("-", 1)[1]) >= want]
        owners.delete_all(self.ops, "pods", owners.active(extra))
        live = [p for p in owners.active(list(pods.values())) if p not in extra]
        ready = sum(1 for p in live if owners.is_ready(p))
        owners.set_status(
            self.ops,
            self.rt,
            sts,
            {
                "replicas": len(live),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": len(live),
                "updatedReplicas": len(live),
                "observedGeneration": sts["metadata"].get("generation", 1),
            },
        )
