"""The connection to the API server: a lightkube ``Client`` for configuration, and ``KubeApi``,
plain-dict requests over the same configuration.

Why lightkube: it is httpx-based like the rest of gpupool, small, typed, reads kubeconfig and
in-cluster service accounts, and treats CRDs as generic resources; the official client is heavy
and needs a workaround for ``pods/binding``. Why ``KubeApi`` beside it: objects cross gpupool's
module boundaries as the dicts the server returns (the translation layer needs no client
types), the informer needs watch bookmarks (lightkube's watch does not ask for them), and the
binder's hot path should not build and then serialize models for every request.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import lightkube
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import KubeConfig, SingleConfig


class KubeConfigError(ValueError):
    """No usable connection configuration (names what is missing)."""


def load_config(kubeconfig: str | None = None, context: str | None = None) -> SingleConfig:
    """The connection settings: the kubeconfig file (``context`` or its current one), else the
    pod's service account when running in a cluster, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    try:
        if kubeconfig is not None:
            conf = KubeConfig.from_file(kubeconfig).get(context)
        elif context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            conf = KubeConfig.from_service_account().get()
        else:
            path = os.environ.get("KUBECONFIG", os.path.expanduser("~/.kube/config"))
            conf = KubeConfig.from_file(path).get(context)
    except (OSError, KeyError, lightkube.ConfigError) as exc:
        where = kubeconfig or ("in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "default")
        raise KubeConfigError(f"kubeconfig ({where}): {exc}") from exc
    if conf is None:
        raise KubeConfigError("kubeconfig: no context selected and none current")
    return conf


def make_client(kubeconfig: str | None = None, context: str | None = None) -> lightkube.Client:
    """A lightkube client (in-cluster config when neither argument is given and
    ``KUBERNETES_SERVICE_HOST`` is set)."""
    return lightkube.Client(load_config(kubeconfig, context), trust_env=False)


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API (the path pieces a request needs)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The collection, object or subresource path (all namespaces when ``namespace`` is None)."""
        p = self.prefix
        if self.namespaced and namespace:
            p += f"/namespaces/{namespace}"
        p += f"/{self.plural}"
        if name is not None:
            p += f"/{name}"
        if sub is not None:
            p += f"/{sub}"
        return p


#: the kinds the backend reads or writes (CRDs: PyTorchJob, JobSet, served only when installed)
RESOURCES: dict[str, Resource] = {
    "nodes": Resource("", "v1", "nodes", "Node", namespaced=False),
    "pods": Resource("", "v1", "pods", "Pod"),
    "events": Resource("", "v1", "events", "Event"),
    "jobs": Resource("batch", "v1", "jobs", "Job"),
    "pytorchjobs": Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    "jobsets": Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
    "deployments": Resource("apps", "v1", "deployments", "Deployment"),
    "statefulsets": Resource("apps", "v1", "statefulsets", "StatefulSet"),
    "replicasets": Resource("apps", "v1", "replicasets", "ReplicaSet"),
    "leases": Resource("coordination.k8s.io", "v1", "leases", "Lease"),
}

BY_KIND: dict[str, Resource] = {r.kind: r for r in RESOURCES.values()}


class ApiError(RuntimeError):
    """A request the server answered with an error status (``code`` 404, 409, 410, 5xx ...)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"{code} {reason}: {message}")


MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class KubeApi:
    """Plain-dict requests to the API server a lightkube client (or a SingleConfig) points at.

    Thread-safe: one httpx connection pool shared by the informers and the binder's threads."""

    def __init__(self, source: lightkube.Client | SingleConfig, *, pool: int = 64, timeout_s: float = 30.0):
        config = source.config if isinstance(source, lightkube.Client) else source
        params = ConnectionParams(timeout=httpx2.Timeout(timeout_s), trust_env=False).httpx_params(config)
        limits = httpx2.Limits(max_connections=pool, max_keepalive_connections=pool)
        self._http = httpx2.Client(**params, limits=limits)
        #: requests sent, by verb (for the benchmark's requests-per-bind)
        self.requests: dict[str, int] = {}

    @classmethod
    def of(cls, client: KubeApi | lightkube.Client | SingleConfig) -> KubeApi:
        return client if isinstance(client, KubeApi) else cls(client)

    def close(self) -> None:
        self._http.close()

    # -- one request ------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send one request; the decoded body, or ApiError with the server's Status."""
        self.requests[method] = self.requests.get(method, 0) + 1
        content = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type} if content is not None else None
        try:
            resp = self._http.request(
                method, path, params=dict(params or {}), content=content, headers=headers
            )
        except httpx2.HTTPError as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        return _decoded(resp, method, path)

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return self.request("GET", res.path(namespace, name))

    def list(
        self, res: Resource, namespace: str | None = None, *, params: Mapping[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object (following ``continue``) and the list's resourceVersion."""
        query = dict(params or {})
        query.setdefault("limit", 500)
        items: list[dict[str, Any]] = []
        while True:
            page = self.request("GET", res.path(namespace), params=query)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            query["continue"] = meta["continue"]

    def create(self, res: Resource, namespace: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", res.path(namespace), body=obj)

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        sub: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        return self.request("PATCH", res.path(namespace, name, sub), body=patch, content_type=content_type)

    def delete(
        self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return self.request("DELETE", res.path(namespace, name), body=body)

    def post_sub(self, res: Resource, namespace: str, name: str, sub: str, body: Any) -> dict[str, Any]:
        """POST to a subresource (``pods/{name}/binding``, ``pods/{name}/eviction``)."""
        return self.request("POST", res.path(namespace, name, sub), body=body)

    def served(self, res: Resource) -> bool:
        """Whether the server serves this kind now (a CRD may not be installed)."""
        try:
            listing = self.request("GET", res.prefix)
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return any(r.get("name") == res.plural for r in listing.get("resources") or [])

    # -- a watch stream ---------------------------------------------------------------------
    def watch(
        self,
        res: Resource,
        namespace: str | None,
        params: Mapping[str, Any],
        on_open: Any = None,
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch request (``{"type", "object"}``), until the server ends it.
        ``on_open(response)`` receives the open response so another thread can close it."""
        self.requests["WATCH"] = self.requests.get("WATCH", 0) + 1
        query = {**params, "watch": "true"}
        timeout = httpx2.Timeout(10.0, read=None)
        try:
            with self._http.stream("GET", res.path(namespace), params=query, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _decoded(resp, "WATCH", res.path(namespace))
                if on_open is not None:
                    on_open(resp)
                for line in resp.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx2.HTTPError as exc:
            raise ApiError(0, "ConnectionError", f"watch {res.plural}: {exc}") from exc


def _decoded(resp: httpx2.Response, method: str, path: str) -> dict[str, Any]:
    try:
        data = resp.json() if resp.content else {}
    except ValueError:
        data = {"message": resp.text[:200]}
    if resp.status_code >= 400:
        raise ApiError(
            resp.status_code,
            str(data.get("reason", "")) if isinstance(data, dict) else "",
            f"{method} {path}: {data.get('message', '') if isinstance(data, dict) else data}",
        )
    return data if isinstance(data, dict) else {"value": data}


__all__ = [
    "BY_KIND",
    "JSON_PATCH",
    "MERGE_PATCH",
    "RESOURCES",
    "STRATEGIC_PATCH",
    "ApiError",
    "KubeApi",
    "KubeConfigError",
    "Resource",
    "load_config",
    "make_client",
]
