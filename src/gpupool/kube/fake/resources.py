"""The resource types the fake server serves: built-ins plus those CRDs register.

Why one table: discovery, routing, storage keys and kubectl's short names all read the same
``ResourceType``, so a CRD applied at run time becomes routable and discoverable in one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource. ``key`` is ``plural`` for the core group, else ``plural.group``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    singular: str = ""
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = field(default=())

    @property
    def key(self) -> str:
        return self.plural if not self.group else f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"


def _r(
    gv: str,
    plural: str,
    kind: str,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
) -> ResourceType:
    group, _, version = gv.rpartition("/")
    return ResourceType(group, version, plural, kind, namespaced, short, sub, kind.lower())


BUILTINS: tuple[ResourceType, ...] = (
    _r("v1", "namespaces", "Namespace", False, ("ns",), ("status",)),
    _r("v1", "nodes", "Node", False, ("no",), ("status",)),
    _r("v1", "pods", "Pod", True, ("po",), ("status", "binding", "eviction")),
    _r("v1", "bindings", "Binding", True),
    _r("v1", "events", "Event", True, ("ev",)),
    _r("v1", "configmaps", "ConfigMap", True, ("cm",)),
    _r("v1", "services", "Service", True, ("svc",), ("status",)),
    _r("v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    _r("events.k8s.io/v1", "events", "Event", True, ("ev",)),
    _r("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    _r("coordination.k8s.io/v1", "leases", "Lease", True),
    _r("batch/v1", "jobs", "Job", True, (), ("status",)),
    _r("apps/v1", "deployments", "Deployment", True, ("deploy",), ("status", "scale")),
    _r("apps/v1", "replicasets", "ReplicaSet", True, ("rs",), ("status", "scale")),
    _r("apps/v1", "statefulsets", "StatefulSet", True, ("sts",), ("status", "scale")),
    _r("authorization.k8s.io/v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
    _r("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",)),
    _r(
        "apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("crd", "crds"),
        ("status",),
    ),
)

#: group -> preferred version, for the groups that exist before any CRD
GROUP_ORDER = (
    "",
    "apps",
    "events.k8s.io",
    "batch",
    "policy",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "apiextensions.k8s.io",
    "authorization.k8s.io",
)


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves (one per served version).

    Raises ValueError naming the field when the manifest lacks what the server needs."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for fld, val in (
        ("spec.group", spec.get("group")),
        ("spec.names.plural", names.get("plural")),
        ("spec.names.kind", names.get("kind")),
    ):
        if not isinstance(val, str) or not val:
            raise ValueError(f"CustomResourceDefinition: {fld} is required")
    group, plural, kind = str(spec["group"]), str(names["plural"]), str(names["kind"])
    scope = spec.get("scope", "Namespaced")
    if scope not in ("Namespaced", "Cluster"):
        raise ValueError("CustomResourceDefinition: spec.scope must be Namespaced or Cluster")
    out = []
    for ver in spec.get("versions") or []:
        if not ver.get("served", True):
            continue
        subs = tuple(s for s in ("status", "scale") if s in (ver.get("subresources") or {}))
        cols = tuple(ver.get("additionalPrinterColumns") or ())
        out.append(
            ResourceType(
                group,
                ver["name"],
                plural,
                kind,
                scope == "Namespaced",
                tuple(names.get("shortNames") or ()),
                subs,
                names.get("singular") or kind.lower(),
                tuple(names.get("categories") or ()),
                cols,
            )
        )
    if not out:
        raise ValueError("CustomResourceDefinition: spec.versions needs at least one served version")
    return out
