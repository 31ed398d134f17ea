"""What the real server fills in on create, for the kinds whose clients read those defaults.

Why only these: a scheduler reads a pod's phase, schedulerName, grace period and tolerations,
and the Job controller its parallelism/completions/backoffLimit; anything else is stored as
sent. Two admission plugins of the real server are here too, as they change what a pod reads
back: ServiceAccount (``default``) and DefaultTolerationSeconds (the NoExecute tolerations of
``not-ready`` and ``unreachable``, 300 s); the service account's token volume is not added.
"""

from __future__ import annotations

from typing import Any

from gpupool.kube.fake import errors

Obj = dict[str, Any]


def _pod(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    name = obj["metadata"].get("name", "")
    if not spec.get("containers"):
        raise errors.invalid("Pod", name, "spec.containers", "Required value")
    for i, c in enumerate(spec["containers"]):
        if not isinstance(c, dict) or not c.get("name"):
            raise errors.invalid("Pod", name, f"spec.containers[{i}].name", "Required value")
    for field in ("containers", "initContainers"):
        for c in spec.get(field) or []:
            _requests_from_limits(c)
    spec.setdefault("schedulerName", "default-scheduler")
    spec["serviceAccountName"] = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccount"] = spec["serviceAccountName"]  # the deprecated field mirrors it
    _default_tolerations(spec)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("restartPolicy", "Always")
    status = obj.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", "BestEffort")


#: the taints DefaultTolerationSeconds tolerates for a while on every pod
DEFAULT_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _default_tolerations(spec: Obj) -> None:
    """Each taint of ``DEFAULT_TOLERATED`` that no toleration of the pod covers (its key or an
    empty one, effect NoExecute or none) is tolerated for 300 s, appended in that order."""
    own = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    added = []
    for key in DEFAULT_TOLERATED:
        covered = any(
            t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None) for t in own
        )
        if not covered:
            added.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    if added:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *added]


def admit_pod_update(pod: Obj) -> None:
    """DefaultTolerationSeconds runs on an update too: a patch that replaces a pod's
    tolerations gets the default ones back (so the update only adds tolerations)."""
    if isinstance(pod.get("spec"), dict):
        pod["spec"] = dict(pod["spec"])
        _default_tolerations(pod["spec"])


def _requests_from_limits(container: Any) -> None:
    """The real server's pod defaulting: a resource with a limit and no request is requested
    at its limit (so readers of ``requests`` see what the container is given)."""
    res = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(res, dict) or not isinstance(res.get("limits"), dict):
        return
    limits = res["limits"]
    requests = res.get("requests")
    if not isinstance(requests, dict):
        requests = res["requests"] = {}
    for key, value in limits.items():
        requests.setdefault(key, value)


def _job(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    name = obj["metadata"].get("name", "")
    if not isinstance(spec.get("template"), dict):
        raise errors.invalid("Job", name, "spec.template", "Required value")
    if spec.get("parallelism") is None:
        spec["parallelism"] = 1
    if spec.get("completions") is None and spec.get("completionMode") != "Indexed":
        spec["completions"] = spec["parallelism"] if "completions" in spec else 1
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    uid = obj["metadata"]["uid"]
    labels = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    tmd = spec["template"].setdefault("metadata", {})
    tmd["labels"] = {**(tmd.get("labels") or {}), **labels}
    spec["template"].setdefault("spec", {}).setdefault("restartPolicy", "Never")
    obj.setdefault("status", {})


def _replicated(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    if spec.get("replicas") is None:
        spec["replicas"] = 1
    if not isinstance(spec.get("template"), dict):
        raise errors.invalid(
            obj.get("kind", "object"), obj["metadata"].get("name", ""), "spec.template", "Required value"
        )
    # the controllers restart their pods in place: the real server takes only Always (issue 24)
    tspec = spec["template"].setdefault("spec", {})
    policy = tspec.setdefault("restartPolicy", "Always")
    if policy != "Always":
        raise errors.invalid(
            f"{obj.get('kind', 'object')}.apps",
            obj["metadata"].get("name", ""),
            "spec.template.spec.restartPolicy",
            f'Unsupported value: "{policy}": supported values: "Always"',
        )
    obj.setdefault("status", {})


def _namespace(obj: Obj) -> None:
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj.setdefault("status", {"phase": "Active"})
    obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]


DEFAULTERS = {
    "pods": _pod,
    "jobs.batch": _job,
    "deployments.apps": _replicated,
    "replicasets.apps": _replicated,
    "statefulsets.apps": _replicated,
    "namespaces": _namespace,
}


def apply_defaults(key: str, obj: Obj) -> None:
    fn = DEFAULTERS.get(key)
    if fn is not None:
        fn(obj)


_TEMPLATED = {"jobs.batch", "deployments.apps", "replicasets.apps", "statefulsets.apps"}


def _quantity(value: Any) -> Any:
    """A number written as a quantity (``nvidia.com/gpu: 1``) as the real server stores it: a
    string (``"1"``, ``0.5`` as ``"500m"``); strings are kept as sent."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _canonical(resources: Any) -> None:
    if isinstance(resources, dict):
        for key, value in resources.items():
            resources[key] = _quantity(value)


def canonical_quantities(key: str, obj: Obj) -> None:
    """Resource quantities of built-in kinds as strings, on every write (in place).

    Why: the real server decodes them into its quantity type and encodes them back as strings,
    so ``kubectl apply`` of a manifest with ``nvidia.com/gpu: 1`` reads ``configured`` again on
    a second apply (its patch sends the number, the object holds ``"1"``), and clients reading
    the object see strings. Custom resources keep what was sent, as their schema says."""
    if key == "nodes":
        status = obj.get("status") or {}
        _canonical(status.get("capacity"))
        _canonical(status.get("allocatable"))
        return
    spec = obj.get("spec")
    if key in _TEMPLATED and isinstance(spec, dict):
        spec = (spec.get("template") or {}).get("spec")
    elif key != "pods":
        return
    if not isinstance(spec, dict):
        return
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            if isinstance(container, dict) and isinstance(container.get("resources"), dict):
                _canonical(container["resources"].get("limits"))
                _canonical(container["resources"].get("requests"))
