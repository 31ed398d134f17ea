"""The permissions gpupool's scheduler and its certificate job hold: exactly these, no wildcards.

Why one table with a reason per rule: the chart's ClusterRole, the plain manifests and the
install guide's RBAC table all come from (or are tested against) this list, so a verb is
granted only where a line here says what needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule and why gpupool needs it."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    names: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"apiGroups": [self.group], "resources": list(self.resources)}
        if self.names:
            out["resourceNames"] = list(self.names)
        out["verbs"] = list(self.verbs)
        return out


_READ = ("get", "list", "watch")
SCHEDULER_RULES = (
    Rule("", ("nodes",), (*_READ, "patch"), "the inventory; patch takes and frees HAMi's per-node lock"),
    Rule(
        "",
        ("pods",),
        (*_READ, "patch", "delete"),
        "the pods to place; patch records the admission on a bare pod; delete preempts a pod with no suspendable owner",
    ),
    Rule("", ("pods/binding",), ("create",), "binding a pod to its node, with the device annotations"),
    Rule(
        "",
        ("pods/status",),
        ("patch",),
        "PodScheduled=False with the reason and queue position; DisruptionTarget",
    ),
    Rule(
        "", ("pods/eviction",), ("create",), "preempting serving pods through the Eviction API (honours PDBs)"
    ),
    Rule("", ("events",), ("create", "patch"), "why a workload waits, was admitted or preempted, as Events"),
    Rule(
        "",
        ("namespaces",),
        _READ,
        "the webhook reads a namespace's gpupool.io/queue label (get) to copy it onto its objects",
    ),
    Rule("batch", ("jobs",), (*_READ, "patch"), "Jobs as workloads; patch suspends and unsuspends them"),
    Rule("jobset.x-k8s.io", ("jobsets",), (*_READ, "patch"), "JobSets as workloads; patch (un)suspends"),
    Rule("kubeflow.org", ("pytorchjobs",), (*_READ, "patch"), "PyTorchJobs as workloads; patch (un)suspends"),
    Rule(
        "apps",
        ("deployments", "statefulsets"),
        (*_READ, "patch"),
        "owners of serving pods (a ReplicaSet's Deployment is found by name); patch records the admission",
    ),
    Rule(
        "scheduling.k8s.io",
        ("priorityclasses",),
        _READ,
        "a pod's priorityClassName mapped to gpupool's classes",
    ),
    Rule(
        "coordination.k8s.io",
        ("leases",),
        ("list", "watch"),
        "the backend's informers cache Leases in every namespace (writes: the namespaced Role)",
    ),
    Rule(
        "gpupool.io",
        ("resourcepools", "queues"),
        _READ,
        "pools and queues kept in the cluster (kubectl apply)",
    ),
    Rule(
        "gpupool.io",
        ("workloads",),
        (*_READ, "create", "update", "patch", "delete"),
        "the Workload mirror of each admitted or waiting workload",
    ),
    Rule(
        "gpupool.io",
        ("resourcepools/status", "queues/status", "workloads/status"),
        ("get", "update", "patch"),
        "usage, phase, position and reason written back to the objects",
    ),
)
#: in the release namespace only (a Role): the leader-election Lease
LEASE_RULES = (
    Rule(
        "coordination.k8s.io",
        ("leases",),
        ("get", "create", "update"),
        "leader election: one replica binds and evicts",
    ),
)


def certgen_rules(webhook: str) -> tuple[Rule, ...]:
    """The certificate job's cluster rule: put the CA into gpupool's two webhook configurations."""
    return (
        Rule(
            "admissionregistration.k8s.io",
            ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"),
            ("get", "patch"),
            "the certificate job writes the CA bundle into gpupool's webhook configurations",
            (webhook,),
        ),
    )


def certgen_secret_rules(secret: str) -> tuple[Rule, ...]:
    """The certificate job's namespaced rules: the Secret holding the webhook's serving certificate.
    ``create`` cannot be limited to a name (the object does not exist yet), ``get``/``update`` can."""
    return (
        Rule("", ("secrets",), ("create",), "the webhook's TLS Secret, on first install"),
        Rule("", ("secrets",), ("get", "update"), "the webhook's TLS Secret, renewed on upgrade", (secret,)),
    )
