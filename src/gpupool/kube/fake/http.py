"""The ASGI app: parses Kubernetes API paths, applies faults, dispatches to the verbs.

Why a bare ASGI callable rather than a router: one path parser serves every resource,
including CRDs registered at run time, and a bind costs a few dict lookups, not a route scan
(the benchmark drives thousands of binds a second through here).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from gpupool.kube.fake import discovery, errors, subresources, tables
from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.fake.ops import APPLY, Ops
from gpupool.kube.fake.resources import BUILTINS, ResourceType
from gpupool.kube.fake.selectors import combine, field_selector, label_selector
from gpupool.kube.fake.storage import Event, Obj, Store
from gpupool.kube.fake.watch import WatchStream

_BUILTIN_KEYS = frozenset(rt.key for rt in BUILTINS)
_TYPE_META = ("kind", "apiVersion")

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
_JSON = [(b"content-type", b"application/json")]


@dataclass(slots=True)
class Target:
    """A parsed resource path: ``/api[s]/<gv>/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]``."""

    rt: ResourceType
    ns: str
    name: str
    sub: str


class FakeApp:
    """The ASGI application over one store. ``faults`` may be replaced at any time."""

    def __init__(
        self, store: Store, ops: Ops, faults: FaultConfig | None = None, bookmark_interval_s: float = 1.0
    ) -> None:
        self.store, self.ops = store, ops
        self.faults = faults or FaultConfig()
        self.bookmark_interval_s = bookmark_interval_s
        self.streams: set[WatchStream] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        try:
            await self._serve(scope, receive, send)
        except ApiError as exc:
            await _respond(send, exc.code, exc.status())
        except Exception as exc:  # a fake-server bug: a Status the client can show, and a record for tests
            self.store.stats.server_errors.append(
                f"fake server error on {scope['method']} {scope['path']}: {exc!r}"
            )
            await _respond(
                send, 500, ApiError(500, f"fake server error: {type(exc).__name__}: {exc}").status()
            )

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        faults = self.faults
        if faults.latency_s:
            await asyncio.sleep(faults.latency_s)
        method: str = scope["method"]
        if faults.active:
            err = faults.injected_error(method)
            if err is not None:
                self.store.stats.faults_injected += 1
                raise err
        path: str = scope["path"]
        q = {k: v[-1] for k, v in parse_qs(scope["query_string"].decode()).items()}
        doc = self._discovery(path)
        if doc is not None:
            return await _respond(send, 200, doc)
        tgt = self._parse(path)
        if method == "GET" and not tgt.name and q.get("watch") in ("1", "true"):
            table = "as=Table" in dict(scope["headers"]).get(b"accept", b"").decode()
            return await self._watch(tgt, q, receive, send, table)
        body = await _read_body(receive) if method in ("POST", "PUT", "PATCH", "DELETE") else None
        if tgt.rt.kind == "SelfSubjectAccessReview":
            body = body if isinstance(body, dict) else {}  # kubectl sends these as protobuf
        elif isinstance(body, bytes):
            raise ApiError(
                415,
                "the fake API server takes JSON (or YAML for apply), not protobuf",
                "UnsupportedMediaType",
            )
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if "dryRun" in q and method != "GET":
            code, out = self._dry_run(method, tgt, q, body, headers.get("content-type", ""))
        else:
            code, out = self._dispatch(method, tgt, q, body, headers.get("content-type", ""))
        if method == "GET" and "as=Table" in headers.get("accept", "") and not tgt.sub:
            out = self._table(tgt, out)
        await _respond(send, code, out)

    def _dry_run(self, method: str, t: Target, q: dict[str, str], body: Any, ctype: str) -> tuple[int, Any]:
        """``dryRun=All``: every check and default of the write, nothing stored or sent to watches."""
        with self.store.lock:
            self.store.dry_run = True
            try:
                return self._dispatch(method, t, q, body, ctype)
            finally:
                self.store.dry_run = False

    def _table(self, t: Target, out: Obj) -> Obj:
        """kubectl's ``as=Table`` view of a list or of one object."""
        if t.name:
            return tables.table(t.rt, [out], {"resourceVersion": out["metadata"].get("resourceVersion", "")})
        return tables.table(t.rt, out["items"], out["metadata"])

    def _discovery(self, path: str) -> dict[str, Any] | None:
        parts = [p for p in path.split("/") if p]
        if path in ("/version", "/version/"):
            return discovery.VERSION
        if parts == ["api"]:
            return discovery.core_versions()
        if parts == ["apis"]:
            return discovery.group_list(self.store)
        if len(parts) == 2 and parts[0] == "api":
            return _or_404(discovery.resource_list(self.store, "", parts[1]))
        if len(parts) == 2 and parts[0] == "apis":
            return _or_404(discovery.group(self.store, parts[1]))
        if len(parts) == 3 and parts[0] == "apis":
            return _or_404(discovery.resource_list(self.store, parts[1], parts[2]))
        if parts[:2] == ["openapi", "v3"]:
            if len(parts) == 2:
                return discovery.openapi_index(self.store)
            return _or_404(discovery.openapi_gv(self.store, "/".join(parts[2:])))
        if parts and parts[0] == "openapi":
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if parts and parts[0] in ("healthz", "livez", "readyz"):
            return {"status": "ok"}
        return None

    def _parse(self, path: str) -> Target:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        ns = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            ns, rest = rest[1], rest[2:]
        rt = self.store.by_path.get((group, version, rest[0]))
        if rt is None or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        name, sub = (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
        if sub and sub not in rt.subresources:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if ns and not rt.namespaced:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return Target(rt, ns, name, sub)

    def _dispatch(self, method: str, t: Target, q: dict[str, str], body: Any, ctype: str) -> tuple[int, Any]:
        rt, stats = t.rt, self.store.stats
        if not t.name:
            verb = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}.get(method, method.lower())
            stats.count(f"{verb} {rt.key}")
            if method == "GET":
                return 200, self._list(t, q)
            if method == "POST" and rt.plural == "bindings":
                name = ((body or {}).get("metadata") or {}).get("name", "")
                return 201, subresources.bind(self.ops, t.ns, name, body)
            if method == "POST" and rt.kind == "SelfSubjectAccessReview":
                # no RBAC here: every token may do everything (``kubectl auth can-i`` says so)
                return 201, {
                    **(body or {}),
                    "status": {"allowed": True, "reason": "the fake server allows all"},
                }
            if method == "POST":
                # As the real server's create strategies: a kind with a status subresource
                # starts from an empty status (a pod is Pending whatever the client sent);
                # Nodes keep theirs, the status a kubelet registers with.
                if isinstance(body, dict) and "status" in rt.subresources and rt.kind != "Node":
                    body.pop("status", None)
                obj = self.ops.create(rt, t.ns, body)
                return 201, obj
            if method == "DELETE":
                return 200, self._delete_collection(t, q)
            raise ApiError(405, f"method {method} is not allowed on a collection", "MethodNotAllowed")
        verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}.get(
            method, ""
        )
        stats.count(f"{verb} {rt.key}{'/' + t.sub if t.sub else ''}")
        if t.sub == "binding" and method == "POST":
            return 201, subresources.bind(self.ops, t.ns, t.name, body)
        if t.sub == "eviction" and method == "POST":
            return 201, subresources.evict(self.ops, t.ns, t.name, body)
        if t.sub == "scale" and method in ("GET", "PUT", "PATCH"):
            return 200, subresources.scale(self.ops, rt, t.ns, t.name, method, ctype, body)
        if method == "GET":
            return 200, self.store.get(rt, t.ns, t.name)
        if method == "PUT":
            return 200, self.ops.update(rt, t.ns, t.name, body, t.sub)
        if method == "PATCH":
            if ctype.split(";")[0].strip() != APPLY:
                return 200, self.ops.patch(rt, t.ns, t.name, ctype, body, t.sub)
            if not q.get("fieldManager"):  # as the real server: apply needs its manager named
                raise errors.invalid(
                    "PatchOptions.meta.k8s.io",
                    "",
                    "fieldManager",
                    "Required value: is required for apply patch",
                )
            created = self.store.find(rt, t.ns, t.name) is None
            return 201 if created else 200, self.ops.patch(rt, t.ns, t.name, ctype, body, t.sub)
        if method == "DELETE" and not t.sub:
            opts = body if isinstance(body, dict) else {}
            grace = q.get("gracePeriodSeconds", opts.get("gracePeriodSeconds"))
            return 200, self.ops.delete(
                rt,
                t.ns,
                t.name,
                None if grace is None else _int(str(grace), "gracePeriodSeconds"),
                q.get("propagationPolicy", opts.get("propagationPolicy")),
                opts.get("preconditions"),
            )
        raise ApiError(405, f"method {method} is not allowed here", "MethodNotAllowed")

    def _selector(self, q: dict[str, str]) -> Any:
        return combine(label_selector(q.get("labelSelector")), field_selector(q.get("fieldSelector")))

    def _list(self, t: Target, q: dict[str, str]) -> Obj:
        """A list as the real server writes it: ``kind``/``apiVersion`` on the list, and on the
        items only of custom resources (built-in items are encoded without their type)."""
        items, rv = self.store.list(t.rt, t.ns, self._selector(q))
        md: dict[str, Any] = {"resourceVersion": str(rv)}
        if q.get("continue"):
            try:
                tok = json.loads(base64.urlsafe_b64decode(q["continue"].encode()))
                after = (tok["ns"], tok["name"])
                md["resourceVersion"] = str(tok["rv"])
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.bad_request("invalid continue token") from exc
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        limit = _int(q.get("limit") or "0", "limit")
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            tok = {"rv": int(md["resourceVersion"]), "ns": last.get("namespace", ""), "name": last["name"]}
            md["continue"] = base64.urlsafe_b64encode(json.dumps(tok).encode()).decode()
            md["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if t.rt.key in _BUILTIN_KEYS:  # the real server types the list, not its items (issue 24)
            items = [{k: v for k, v in o.items() if k not in _TYPE_META} for o in items]
        return {"kind": f"{t.rt.kind}List", "apiVersion": t.rt.api_version, "metadata": md, "items": items}

    def _delete_collection(self, t: Target, q: dict[str, str]) -> Obj:
        items, _ = self.store.list(t.rt, t.ns, self._selector(q))
        for o in items:
            self.ops.delete(
                t.rt,
                o["metadata"].get("namespace", ""),
                o["metadata"]["name"],
                _int(q["gracePeriodSeconds"], "gracePeriodSeconds") if "gracePeriodSeconds" in q else None,
                q.get("propagationPolicy"),
            )
        return {"kind": f"{t.rt.kind}List", "apiVersion": t.rt.api_version, "metadata": {}, "items": items}

    async def _watch(self, t: Target, q: dict[str, str], receive: Receive, send: Send, table: bool) -> None:
        self.store.stats.count(f"watch {t.rt.key}")
        rv = q.get("resourceVersion", "")
        initial = q.get("sendInitialEvents") == "true"
        since = None if rv in ("", "0") or initial else _int(rv, "resourceVersion")
        opts = {
            "timeout": _int(q.get("timeoutSeconds") or "1800", "timeoutSeconds"),
            "bookmarks": q.get("allowWatchBookmarks") in ("1", "true"),
            "initial_events_end": initial,
            "bookmark_interval": self.bookmark_interval_s,
            "drop_after": self.faults.drop_watches_after_s,
        }
        stream = WatchStream(self.store, t.rt, asyncio.get_running_loop())
        if table:
            stream.encode = functools.partial(_table_event, t.rt)
        self.streams.add(stream)
        try:
            await stream.run(send, receive, t.ns, self._selector(q), since, opts)
        finally:
            self.streams.discard(stream)

    def close_streams(self) -> None:
        for s in list(self.streams):
            s.close()


def _table_event(rt: ResourceType, ev: Event) -> bytes:
    """A watch event whose object is a one-row Table (what ``kubectl get -w`` asks for)."""
    obj = (
        ev.obj
        if ev.type in ("BOOKMARK", "ERROR")
        else tables.table(rt, [ev.obj], {"resourceVersion": ev.obj["metadata"].get("resourceVersion", "")})
    )
    return json.dumps({"type": ev.type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _int(v: str, name: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise errors.bad_request(f"{name}: {v!r} is not an integer") from None


def _or_404(doc: dict[str, Any] | None) -> dict[str, Any]:
    if doc is None:
        raise ApiError(404, "the server could not find the requested resource", "NotFound")
    return doc


async def _read_body(receive: Receive) -> Any:
    """The request body as JSON (or YAML, for server-side apply); a protobuf body is kept as
    the raw bytes, which only the access-review stub accepts."""
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    raw = b"".join(chunks)
    if not raw:
        return None
    if raw[:4] == b"k8s\x00":  # Kubernetes' protobuf envelope
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        if raw.lstrip()[:1] not in (b"{", b"["):
            try:
                import yaml

                return yaml.safe_load(raw)
            except yaml.YAMLError:
                pass
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None


async def _respond(send: Send, code: int, obj: Any) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": code, "headers": _JSON})
    await send({"type": "http.response.body", "body": body})
