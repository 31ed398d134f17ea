"""Simulated controllers for the training CRDs: Kubeflow PyTorchJob and JobSet.

Why they matter to a scheduler: gpupool reads a PyTorchJob's replicas (or a JobSet's replicated
jobs) as one gang, and the pods these controllers make carry the labels it groups them by.
They act only once the CRD is registered.
"""

from __future__ import annotations

from gpupool.kube.fake import owners
from gpupool.kube.fake.controllers import Reconciler
from gpupool.kube.fake.storage import Obj

PT_JOB = "training.kubeflow.org/job-name"
PT_TYPE = "training.kubeflow.org/replica-type"
PT_INDEX = "training.kubeflow.org/replica-index"
JS_NAME = "jobset.sigs.k8s.io/jobset-name"
JS_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JS_INDEX = "jobset.sigs.k8s.io/job-index"


class PyTorchJobController(Reconciler):
    """kubeflow.org/v1 PyTorchJob: ``<job>-<type>-<i>`` pods per replica spec; runPolicy.suspend."""

    key, kind = "pytorchjobs.kubeflow.org", "PyTorchJob"

    def reconcile(self, job: Obj) -> None:
        spec = job.get("spec") or {}
        specs = spec.get("pytorchReplicaSpecs") or {}
        pods = owners.owned(self.ops, job, "pods")
        status = dict(job.get("status") or {})
        conds = owners.condition(
            list(status.get("conditions") or []),
            "Created",
            True,
            "PyTorchJobCreated",
            f"PyTorchJob {job['metadata']['name']} is created.",
        )
        done = owners.has_condition(job, "Succeeded") or owners.has_condition(job, "Failed")
        if (spec.get("runPolicy") or {}).get("suspend") or done:
            owners.delete_all(self.ops, "pods", owners.active(pods))
            if not done:
                conds = owners.condition(conds, "Suspended", True, "PyTorchJobSuspended", "")
        else:
            if owners.has_condition(job, "Suspended"):
                conds = owners.condition(conds, "Suspended", False, "PyTorchJobResumed", "")
            self._create_missing(
                job,
                specs,
                {p["metadata"]["name"] for p in owners.active(pods) or []}
                | {p["metadata"]["name"] for p in pods},
            )
            conds = self._conditions(conds, specs, pods)
        status["conditions"] = conds
        status["replicaStatuses"] = {
            rtype: {
                "active": sum(1 for p in owners.active(pods) if _rtype(p) == rtype.lower()),
                "succeeded": sum(1 for p in pods if _rtype(p) == rtype.lower() and _phase(p) == "Succeeded"),
                "failed": sum(1 for p in pods if _rtype(p) == rtype.lower() and _phase(p) == "Failed"),
            }
            for rtype in specs
        }
        owners.set_status(self.ops, self.rt, job, status)

    def _create_missing(self, job: Obj, specs: dict[str, Obj], existing: set[str]) -> None:
        name = job["metadata"]["name"]
        for rtype, rspec in specs.items():
            for i in range(int(rspec.get("replicas", 1))):
                pname = f"{name}-{rtype.lower()}-{i}"
                if pname in existing:
                    continue
                labels = {
                    PT_JOB: name,
                    PT_TYPE: rtype.lower(),
                    PT_INDEX: str(i),
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                }
                if rtype.lower() == "master":
                    labels["training.kubeflow.org/job-role"] = "master"
                owners.create_child(
                    self.ops,
                    "pods",
                    self.rt,
                    job,
                    rspec.get("template") or {},
                    name=pname,
                    labels=labels,
                    spec_extra={
                        "restartPolicy": rspec.get("restartPolicy", "Never")
                        if rspec.get("restartPolicy") != "ExitCode"
                        else "Never"
                    },
                )

    @staticmethod
    def _conditions(conds: list[Obj], specs: dict[str, Obj], pods: list[Obj]) -> list[Obj]:
        if any(_phase(p) == "Failed" for p in pods):
            return owners.condition(conds, "Failed", True, "PyTorchJobFailed", "a replica failed")
        lead = "master" if any(t.lower() == "master" for t in specs) else "worker"
        leads = [p for p in pods if _rtype(p) == lead]
        if leads and all(_phase(p) == "Succeeded" for p in leads):
            return owners.condition(conds, "Succeeded", True, "PyTorchJobSucceeded", "")
        want = sum(int(s.get("replicas", 1)) for s in specs.values())
        if want and sum(1 for p in pods if _phase(p) == "Running") == want:
            return owners.condition(conds, "Running", True, "PyTorchJobRunning", "")
        return conds


def _rtype(pod: Obj) -> str:
    return (pod["metadata"].get("labels") or {}).get(PT_TYPE, "")


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


class JobSetController(Reconciler):
    """jobset.x-k8s.io/v1alpha2 JobSet: child Jobs ``<js>-<rjob>-<i>``; suspend reaches the Jobs."""

    key, kind = "jobsets.jobset.x-k8s.io", "JobSet"
    child_keys = ("jobs.batch",)

    def reconcile(self, js: Obj) -> None:
        spec = js.get("spec") or {}
        suspend = bool(spec.get("suspend"))
        jobs = {j["metadata"]["name"]: j for j in owners.owned(self.ops, js, "jobs.batch")}
        jobs_rt = self.ops.store.types["jobs.batch"]
        name = js["metadata"]["name"]
        rstatus = []
        for rj in spec.get("replicatedJobs") or []:
            tpl = rj.get("template") or {}
            mine = []
            for i in range(int(rj.get("replicas", 1))):
                jname = f"{name}-{rj['name']}-{i}"
                labels = {
                    JS_NAME: name,
                    JS_RJOB: rj["name"],
                    JS_INDEX: str(i),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(rj.get("replicas", 1)),
                }
                job = jobs.get(jname)
                if job is None:
                    job_spec = dict(tpl.get("spec") or {})
                    pod_tpl = dict(job_spec.get("template") or {})
                    pmd = dict(pod_tpl.get("metadata") or {})
                    pmd["labels"] = {**(pmd.get("labels") or {}), **labels}
                    job_spec["template"] = {**pod_tpl, "metadata": pmd}
                    job = owners.create_child(
                        self.ops,
                        "jobs.batch",
                        self.rt,
                        js,
                        {"metadata": tpl.get("metadata"), "spec": job_spec},
                        name=jname,
                        labels=labels,
                        spec_extra={"suspend": suspend},
                    )
                elif bool(job["spec"].get("suspend")) != suspend:
                    job = self.ops.patch(
                        jobs_rt,
                        job["metadata"]["namespace"],
                        jname,
                        "application/merge-patch+json",
                        {"spec": {"suspend": suspend}},
                    )
                if job is not None:
                    mine.append(job)
            rstatus.append(
                {
                    "name": rj["name"],
                    "ready": 0,
                    "active": sum(int((j.get("status") or {}).get("active", 0)) for j in mine),
                    "suspended": len(mine) if suspend else 0,
                    "succeeded": sum(1 for j in mine if owners.has_condition(j, "Complete")),
                    "failed": sum(1 for j in mine if owners.has_condition(j, "Failed")),
                }
            )
        self._status(js, suspend, list(jobs.values()), rstatus)

    def _status(self, js: Obj, suspend: bool, jobs: list[Obj], rstatus: list[Obj]) -> None:
        status = dict(js.get("status") or {})
        conds = list(status.get("conditions") or [])
        conds = owners.condition(
            conds, "Suspended", suspend, "SuspendedJobs" if suspend else "ResumeJobs", ""
        )
        want = sum(int(rj.get("replicas", 1)) for rj in (js.get("spec") or {}).get("replicatedJobs") or [])
        if any(owners.has_condition(j, "Failed") for j in jobs):
            conds = owners.condition(conds, "Failed", True, "FailedJobs", "a child job failed")
        elif want and sum(1 for j in jobs if owners.has_condition(j, "Complete")) >= want:
            conds = owners.condition(conds, "Completed", True, "AllJobsCompleted", "")
        status.update(conditions=conds, replicatedJobsStatus=rstatus)
        owners.set_status(self.ops, self.rt, js, status)
