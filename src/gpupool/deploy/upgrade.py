"""``gpupool deploy crds --apply``: bring the cluster's gpupool CRDs to this release's schemas.

Why a command in the image: Helm installs a chart's ``crds/`` once and never upgrades them, so a
``helm upgrade`` alone would leave the old schemas in place (and the API server would prune the
fields a newer gpupool writes). The chart's pre-upgrade hook runs this with the new image, whose
schemas are generated from that release's models: the CRDs and the scheduler always agree.
"""

from __future__ import annotations

from typing import Any

from gpupool.deploy.crds import all_crds
from gpupool.kube.client import ApiError, KubeApi, Resource

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


def apply_crds(api: KubeApi, crds: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """Create missing CRDs and replace changed ones; (name, created|updated|unchanged) each."""
    out = []
    for crd in crds if crds is not None else all_crds():
        name = crd["metadata"]["name"]
        try:
            current = api.get(CRDS, None, name)
        except ApiError as exc:
            if exc.code != 404:
                raise
            api.create(CRDS, None, crd)
            out.append((name, "created"))
            continue
        if current.get("spec") == crd["spec"] and _labels(current) == _labels(crd):
            out.append((name, "unchanged"))
            continue
        body = {
            **crd,
            "metadata": {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        api.request("PUT", CRDS.path(None, name), body=body)
        out.append((name, "updated"))
    return out


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})
