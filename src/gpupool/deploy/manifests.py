"""The chart's objects at its default values, as plain files: ``gpupool deploy manifests``.

Why: a cluster without helm (or a reviewer) applies ``deploy/manifests`` with
``kubectl apply -k``; the files are this module's output at :func:`default_values`, committed
and compared with it by the tests. The CRDs sit in their own kustomization (``crds/``) because
``kubectl`` needs them established before it can map the example pool and queue.
"""

from __future__ import annotations

from typing import Any

from gpupool.deploy.admission import cert_manager_objects, certgen_objects, mutating, validating
from gpupool.deploy.crds import all_crds, crd_file_name
from gpupool.deploy.database import bundled_objects
from gpupool.deploy.objects import (
    deployment,
    disruption_budgets,
    labels,
    meta,
    services,
    state_claims,
    values_problem,
)
from gpupool.deploy.rbac import LEASE_RULES, SCHEDULER_RULES
from gpupool.deploy.render import dump
from gpupool.deploy.values import NAMESPACE, RELEASE
from gpupool.manifests import API_VERSION, default_priority_classes

RBAC = "rbac.authorization.k8s.io/v1"


def rbac_objects(ns: str) -> list[dict[str, Any]]:
    """The scheduler's account, ClusterRole and binding, and its leader-election Role and binding."""
    subject = [{"kind": "ServiceAccount", "name": RELEASE, "namespace": ns}]
    lease = f"{RELEASE}-leader-election"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(RELEASE, ns, "scheduler")},
        {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": meta(RELEASE, None, "scheduler"),
            "rules": [r.as_dict() for r in SCHEDULER_RULES],
        },
        _binding("ClusterRoleBinding", "ClusterRole", RELEASE, None, subject),
        {
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": meta(lease, ns, "scheduler"),
            "rules": [r.as_dict() for r in LEASE_RULES],
        },
        _binding("RoleBinding", "Role", lease, ns, subject),
    ]


def _binding(
    kind: str, role_kind: str, name: str, ns: str | None, subjects: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": kind,
        "metadata": meta(name, ns, "scheduler"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": subjects,
    }


#: the example pool and queue as gpupool manifests, for the store's first start; the chart's
#: configmap.yaml holds the same text (tests/deploy/test_deploy.py compares them)
EXAMPLE_CONFIG = """\
# The example pool and queue (values examples.*), applied on the store's first start.
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: default}
spec:
  description: The GPU nodes labelled gpupool.io/managed=true
  nodeSelector: {gpupool.io/managed: "true"}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: default}
spec:
  description: The default queue
  quotas:
    - pool: default
      guarantee: {nvidia.com/gpu: GPUS}
"""


def config_map(v: dict[str, Any], ns: str) -> dict[str, Any]:
    """Manifests applied on the store's first start (``serve --config``): the example pool and
    queue (the backend does not read ResourcePool and Queue objects from the cluster yet), and
    the ``config`` value's files."""
    data = (
        {"examples.yaml": EXAMPLE_CONFIG.replace("GPUS", str(v["examples"]["gpus"]))}
        if v["examples"]["create"]
        else {}
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(f"{RELEASE}-config", ns, "scheduler"),
        "data": {**data, **v["config"]},
    }


def priority_classes(v: dict[str, Any]) -> list[dict[str, Any]]:
    """gpupool's priority classes as ``scheduling.k8s.io/v1`` PriorityClasses, so pods can name them."""
    if not v["priorityClasses"]["create"]:
        return []
    out = []
    for pc in default_priority_classes():
        m = meta(pc.name, None)
        m["annotations"] = {"gpupool.io/preemptible": "true" if pc.preemptible else "false"}
        out.append(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": m,
                "value": pc.value,
                "description": pc.description,
            }
        )
    return out


def examples(v: dict[str, Any]) -> list[dict[str, Any]]:
    """One pool over the nodes labelled ``gpupool.io/managed=true`` and one queue guaranteed part of it."""
    if not v["examples"]["create"]:
        return []
    pool = {
        "apiVersion": API_VERSION,
        "kind": "ResourcePool",
        "metadata": {"name": "default", "labels": labels()},
        "spec": {
            "description": "The GPU nodes labelled gpupool.io/managed=true",
            "nodeSelector": {"gpupool.io/managed": "true"},
        },
    }
    queue = {
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "default", "labels": labels()},
        "spec": {
            "description": "The default queue",
            "quotas": [{"pool": "default", "guarantee": {"nvidia.com/gpu": str(v["examples"]["gpus"])}}],
        },
    }
    return [pool, queue]


def chart_objects(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """Every object the chart renders at values ``v`` (no ServiceMonitor: that needs the
    Prometheus operator's CRD, which an offline render cannot see). Values the chart refuses
    (2+ replicas on their own SQLite files) raise ValueError with the chart's message."""
    problem = values_problem(v)
    if problem is not None:
        raise ValueError(problem)
    return [
        *rbac_objects(ns),
        config_map(v, ns),
        *services(v, ns),
        *state_claims(v, ns),
        deployment(v, ns),
        *disruption_budgets(v, ns),
        *bundled_objects(v, ns),
        mutating(v, ns),
        validating(v, ns),
        *certgen_objects(v, ns),
        *cert_manager_objects(v, ns),
        *priority_classes(v),
        *examples(v),
    ]


def manifest_files(v: dict[str, Any], ns: str = NAMESPACE) -> dict[str, str]:
    """``{relative path: text}`` of deploy/manifests: one file per object kind group, kustomizations."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels()}}
    objs = chart_objects(v, ns)
    groups = {
        "namespace.yaml": [namespace],
        "rbac.yaml": [
            o
            for o in objs
            if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
        ],
        "scheduler.yaml": [o for o in objs if o["kind"] in SCHEDULER_KINDS and _component(o) != "database"],
        "database.yaml": [o for o in objs if _component(o) == "database"],
        "webhooks.yaml": [
            o
            for o in objs
            if o["kind"]
            in (
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
                "Job",
                "Issuer",
                "Certificate",
            )
        ],
        "priorityclasses.yaml": [o for o in objs if o["kind"] == "PriorityClass"],
        "examples.yaml": [o for o in objs if o["kind"] in ("ResourcePool", "Queue")],
    }
    files = {name: dump(group, "manifests") for name, group in groups.items() if group}
    crds = {f"crds/{crd_file_name(c)}": dump([c], "manifests") for c in all_crds()}
    files.update(crds)
    files["crds/kustomization.yaml"] = _kustomization([n.removeprefix("crds/") for n in crds])
    files["kustomization.yaml"] = _kustomization(["crds", *groups_present(groups)])
    return files


#: the kinds of scheduler.yaml (the bundled database's objects go to database.yaml)
SCHEDULER_KINDS = ("ConfigMap", "Service", "PersistentVolumeClaim", "Deployment", "PodDisruptionBudget")


def _component(o: dict[str, Any]) -> str | None:
    return o["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def groups_present(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [name for name, group in groups.items() if group]


def _kustomization(resources: list[str]) -> str:
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources}
    return dump([body], "manifests")
