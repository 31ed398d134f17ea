"""The connection to the API server: a lightkube ``Client`` for configuration, and ``KubeApi``,
plain-dict requests over the same configuration.

Why lightkube: it is httpx-based like the rest of gpupool, small, typed, reads kubeconfig and
in-cluster service accounts, and treats CRDs as generic resources; the official client is heavy
and needs a workaround for ``pods/binding``. Why ``KubeApi`` beside it: objects cross gpupool's
module boundaries as the dicts the server returns (the translation layer needs no client
types), the informer needs watch bookmarks (lightkube's watch does not ask for them), and the
binder's hot path should not build and then serialize models for every request. Requests and
watches go over the standard library's HTTP connections (``_Connections``: a fifth of httpx's
CPU per request); lightkube provides the configuration (TLS context, credentials).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import lightkube
import orjson
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
        self._conns = _Connections(params["base_url"], params["verify"], params["auth"], timeout_s, pool)
        #: requests sent, by verb (for the benchmark's requests-per-bind)
        self.requests: dict[str, int] = {}

    @classmethod
    def of(cls, client: KubeApi | lightkube.Client | SingleConfig) -> KubeApi:
        return client if isinstance(client, KubeApi) else cls(client)

    def close(self) -> None:
        self._conns.close()

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
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            status, data = self._conns.send(method, path + _query(params), content, content_type)
        except (http.client.HTTPException, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        return _decoded(status, data, method, path)

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return self.request("GET", res.path(namespace, name))

    def list(
        self, res: Resource, namespace: str | None = None, *, params: Mapping[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object (following ``continue``) and the list's resourceVersion. Each item gets
        its ``kind`` and ``apiVersion``: the real server writes them on the list only, not on
        built-in items, and readers of the caches (the evictor's patches, the workload
        translation) go by an object's kind (issue 24: a Job listed at start-up could not be
        suspended on a real cluster)."""
        query = dict(params or {})
        query.setdefault("limit", 500)
        items: list[dict[str, Any]] = []
        while True:
            page = self.request("GET", res.path(namespace), params=query)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", res.kind)
                items.append(item)
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
        ``on_open(stream)`` receives something whose ``close()`` ends the stream from another
        thread. Why its own connection, read line by line with ``http.client``: every pod and
        node change of the cluster comes through here, and httpx's streaming layers cost more
        CPU per event than decoding the event itself."""
        self.requests["WATCH"] = self.requests.get("WATCH", 0) + 1
        path = res.path(namespace)
        try:
            conn, resp = self._conns.open_stream(path + _query({**params, "watch": "true"}))
        except (http.client.HTTPException, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"watch {res.plural}: {exc}") from exc
        stream = _Stream(conn)
        try:
            if resp.status >= 400:
                _decoded(resp.status, resp.read(), "WATCH", path)
            if on_open is not None:
                on_open(stream)
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield orjson.loads(line)
        except (http.client.HTTPException, OSError, ValueError, AttributeError) as exc:
            if stream.closed:
                return  # closed on purpose (the informer stops)
            raise ApiError(0, "ConnectionError", f"watch {res.plural}: {exc}") from exc
        finally:
            stream.close()


class _Connections:
    """Keep-alive HTTP/1.1 connections (the standard library's ``http.client``) for unary requests.

    Why not httpx for these: the binder's hot path is two small requests per pod, and on a busy
    machine the client's own CPU per request is the bind rate's limit. Measured against the fake
    server on the development machine: httpx 0.63 ms of CPU per GET, ``http.client`` 0.12 ms.
    TLS (the cluster's CA, client certificates) comes as the ``ssl.SSLContext`` lightkube builds
    from the kubeconfig; credentials as the Authorization header lightkube's auth produces (a
    token file or exec plugin is asked again after a 401). Watches stay on httpx (long-lived
    streams, few of them)."""

    def __init__(self, base_url: str, verify: Any, auth: Any, timeout_s: float, size: int) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeConfigError(f"kubeconfig: cluster.server {base_url!r} is not an http(s) URL")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.prefix = url.path.rstrip("/")
        self.base_url = base_url
        self.ctx = _ssl_context(verify) if self.https else None
        self.timeout_s = timeout_s
        self.size = size
        self.auth = auth
        self._authorization = self._auth_header(None)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _auth_header(self, unauthorized: bool | None) -> str:
        """The Authorization value lightkube's auth sets ('' without credentials); after a 401
        (``unauthorized``), the value its flow sends on the retry (a token file read again)."""
        if self.auth is None:
            return ""
        req = httpx2.Request("GET", self.base_url)
        flow = self.auth.sync_auth_flow(req)
        sent = next(flow)
        if unauthorized:
            with contextlib.suppress(StopIteration):  # an auth that cannot refresh keeps its value
                sent = flow.send(httpx2.Response(401, request=sent))
        return str(sent.headers.get("Authorization", ""))

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def send(self, method: str, target: str, content: bytes | None, ctype: str) -> tuple[int, bytes]:
        """(status, body) of one request; a 401 is retried once with fresh credentials."""
        status, body = self._send(method, target, content, ctype)
        if status == 401 and self.auth is not None:
            self._authorization = self._auth_header(True)
            status, body = self._send(method, target, content, ctype)
        return status, body

    def _send(self, method: str, target: str, content: bytes | None, ctype: str) -> tuple[int, bytes]:
        """Why one retry on a reused connection: the server may have closed it while idle (its
        keep-alive timeout), and then the request never reached it. A fresh connection that
        fails is an error."""
        headers = {"Accept": "application/json", "User-Agent": "gpupool"}
        if content is not None:
            headers["Content-Type"] = ctype
        if self._authorization:
            headers["Authorization"] = self._authorization
        while True:
            conn, reused = self._connection()
            try:
                conn.request(method, self.prefix + target, body=content, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                if reused:
                    continue
                raise ConnectionError(str(exc) or type(exc).__name__) from exc
            except (http.client.HTTPException, OSError):
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                self._release(conn)
            return resp.status, data

    def open_stream(self, target: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A GET on a connection of its own (a watch), its headers read; no read timeout after
        that (a quiet watch waits for the server's own timeout or a bookmark)."""
        conn = self._new()
        headers = {"Accept": "application/json", "User-Agent": "gpupool"}
        if self._authorization:
            headers["Authorization"] = self._authorization
        try:
            conn.request("GET", self.prefix + target, headers=headers)
            resp = conn.getresponse()
            if resp.status == 401 and self.auth is not None:  # the informer's retry sends the new one
                self._authorization = self._auth_header(True)
            if conn.sock is not None:
                conn.sock.settimeout(None)
        except BaseException:
            conn.close()
            raise
        return conn, resp

    def _new(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self.ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Stream:
    """A watch's connection, closable from another thread: shutting the socket down wakes the
    thread blocked reading it (closing the file alone would not)."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.closed = False

    def close(self) -> None:
        self.closed = True
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def _ssl_context(verify: Any) -> ssl.SSLContext:
    """lightkube's verify setting as a context (it builds one from the kubeconfig)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    ctx = ssl.create_default_context()
    if verify is False:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _query(params: Mapping[str, Any] | None) -> str:
    """The query string as httpx writes it (booleans lowercase)."""
    if not params:
        return ""
    pairs = [(k, ("true" if v else "false") if isinstance(v, bool) else str(v)) for k, v in params.items()]
    return "?" + urllib.parse.urlencode(pairs)


def _decoded(status: int, content: bytes, method: str, path: str) -> dict[str, Any]:
    try:
        data = orjson.loads(content) if content else {}
    except ValueError:
        data = {"message": content[:200].decode(errors="replace")}
    if status >= 400:
        raise ApiError(
            status,
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
