"""``FakeApiServer``: the store, the verbs, the ASGI app, uvicorn in a thread and the simulators.

Why uvicorn in a background thread: tests and the benchmark drive the server over real HTTP
from the same process, and the simulated controllers and kubelet share its store directly.
"""

from __future__ import annotations

import asyncio
import builtins
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
import yaml

from gpupool.kube.fake import nodes as node_builders
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.fake.http import FakeApp
from gpupool.kube.fake.ops import Ops
from gpupool.kube.fake.storage import Obj, Stats, Store, deep_copy
from gpupool.kube.fake.subresources import bind, evict

T = TypeVar("T")
CRD_DIR = Path(__file__).parent / "crds"
BOOT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
BOOT_PRIORITY_CLASSES = (("system-cluster-critical", 2000000000), ("system-node-critical", 2000001000))


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (a third more requests per second), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class FakeApiServer:
    """An in-memory Kubernetes API server served over HTTP (see the package docstring)."""

    def __init__(
        self,
        controllers: bool = True,
        kubelet: bool = True,
        time_scale: float = 1.0,
        history_size: int = 10_000,
        bookmark_interval_s: float = 1.0,
        preload_crds: bool = False,
        hami: bool = True,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.store = Store(history_size)
        self.ops = Ops(self.store)
        self.app = FakeApp(self.store, self.ops, FaultConfig(), bookmark_interval_s)
        self.time_scale = time_scale
        self.url = ""
        self.kubeconfig: Path | None = None
        self.thread_native_id = 0  # the serving thread (its CPU time is the server's cost)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        for ns in BOOT_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for pc, value in BOOT_PRIORITY_CLASSES:  # every real cluster has these two
            self.create(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": pc},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                }
            )
        if preload_crds:
            self.load_crds()
        from gpupool.kube.fake.runtime import Runtime

        self.runtime = Runtime(self, controllers=controllers, kubelet=kubelet, hami=hami)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in a background thread; returns the base URL (also ``self.url``)."""
        if self._server is not None:
            return self.url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=1,
            backlog=2048,
            timeout_keep_alive=60,
        )
        self._server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            assert self._server is not None
            loop = _new_loop()
            asyncio.set_event_loop(loop)
            self.runtime.start(loop, threading.get_ident())
            self.thread_native_id = threading.get_native_id()
            loop.call_soon(started.set)
            loop.run_until_complete(self._server.serve(sockets=[sock]))
            loop.close()

        self._thread = threading.Thread(target=serve, name="fake-apiserver", daemon=True)
        self._thread.start()
        started.wait(10)
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    def stop(self) -> None:
        """Stop serving and the simulators (open watches end)."""
        self.runtime.stop()
        if self._server is not None:
            self.app.close_streams()
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
        self._server = self._thread = None

    def write_kubeconfig(self, path: str | Path, context: str = "fake") -> Path:
        """A kubeconfig pointing at this server (bearer token ``fake``; any token is accepted)."""
        if not self.url:
            raise RuntimeError("write_kubeconfig: start() the server first")
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": context,
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": "fake"}}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
            ],
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all: a client started beside ``kube fake &`` never reads half a file
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
        tmp.replace(p)
        self.kubeconfig = p
        return p

    # -- faults and stats ----------------------------------------------------------------
    @property
    def faults(self) -> FaultConfig:
        return self.app.faults

    @faults.setter
    def faults(self, cfg: FaultConfig) -> None:
        self.app.faults = cfg

    @property
    def stats(self) -> Stats:
        return self.store.stats

    # -- in-process access ---------------------------------------------------------------
    def create(self, obj: Mapping[str, Any], resource: str | None = None) -> Obj:
        """Create an object (resource from ``resource`` or from its apiVersion/kind)."""
        body = deep_copy(dict(obj))
        rt = self.store.type_of(resource or self.resource_of(body))
        ns = (body.get("metadata") or {}).get("namespace") or ("default" if rt.namespaced else "")
        return deep_copy(self.ops.create(rt, ns, body))

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        """A copy of one object; raises ``ApiError`` (404) when it is absent."""
        return deep_copy(self.store.get(self.store.type_of(resource), namespace, name))

    def list(
        self, resource: str, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> list[Obj]:
        """Copies of the objects of a resource (all namespaces when ``namespace`` is '')."""
        from gpupool.kube.fake.selectors import combine
        from gpupool.kube.fake.selectors import field_selector as fs
        from gpupool.kube.fake.selectors import label_selector as ls

        items, _ = self.store.list(
            self.store.type_of(resource), namespace, combine(ls(label_selector), fs(field_selector))
        )
        return [deep_copy(o) for o in items]

    def delete(
        self,
        resource: str,
        namespace: str,
        name: str,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
    ) -> Obj:
        return deep_copy(
            self.ops.delete(
                self.store.type_of(resource), namespace, name, grace_period_seconds, propagation_policy
            )
        )

    def update(self, resource: str, obj: Mapping[str, Any], subresource: str = "") -> Obj:
        body = deep_copy(dict(obj))
        md = body.get("metadata") or {}
        return deep_copy(
            self.ops.update(
                self.store.type_of(resource), md.get("namespace", ""), md.get("name", ""), body, subresource
            )
        )

    def patch(
        self,
        resource: str,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str = "application/merge-patch+json",
        subresource: str = "",
    ) -> Obj:
        return deep_copy(
            self.ops.patch(
                self.store.type_of(resource), namespace, name, content_type, deep_copy(patch), subresource
            )
        )

    def bind(self, namespace: str, name: str, node: str, annotations: Mapping[str, str] | None = None) -> Obj:
        body = {
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "target": {"kind": "Node", "name": node},
        }
        return bind(self.ops, namespace, name, body)

    def evict(self, namespace: str, name: str) -> Obj:
        return evict(self.ops, namespace, name, {})

    def resource_of(self, obj: Mapping[str, Any]) -> str:
        """The resource key of an object from its apiVersion and kind (``Job`` -> ``jobs.batch``)."""
        api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for rt in self.store.types.values():
            if rt.kind == kind and rt.api_version == api and rt.plural != "bindings":
                return rt.key
        raise ValueError(f"no served resource for apiVersion={api!r} kind={kind!r}")

    # -- cluster builders ----------------------------------------------------------------
    def add_gpu_nodes(self, count: int, prefix: str = "gpu-node", **kw: Any) -> builtins.list[str]:
        """Create ``count`` GPU nodes (see ``nodes.gpu_nodes`` for the keywords); returns their names."""
        return [self.create(n)["metadata"]["name"] for n in node_builders.gpu_nodes(count, prefix, **kw)]

    def add_nodes_from_cluster_manifest(self, docs: Iterable[Mapping[str, Any]]) -> builtins.list[str]:
        return [self.create(n)["metadata"]["name"] for n in node_builders.nodes_from_cluster(docs)]

    def set_node_ready(self, name: str, ready: bool) -> Obj:
        """Flip a node's Ready condition (a NotReady node's pods stop progressing)."""
        with self.store.lock:
            node = self.store.get(self.store.types["nodes"], "", name)
            status = dict(node.get("status") or {})
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
            status["conditions"] = [*conds, node_builders.ready_condition(ready)]
            return deep_copy(
                self.ops.update(self.store.types["nodes"], "", name, {**node, "status": status}, "status")
            )

    def load_crds(self, names: Iterable[str] = ("pytorchjobs", "jobsets")) -> None:
        """Register the CRD manifests shipped in ``crds/`` (PyTorchJob, JobSet)."""
        for name in names:
            for doc in yaml.safe_load_all((CRD_DIR / f"{name}.yaml").read_text()):
                if (
                    doc
                    and self.store.find(
                        self.store.type_of("customresourcedefinitions.apiextensions.k8s.io"),
                        "",
                        doc["metadata"]["name"],
                    )
                    is None
                ):
                    self.create(doc)

    def wait_for(self, fn: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
        """Poll ``fn`` until it returns something truthy (the simulators run asynchronously);
        raises TimeoutError naming ``what`` (and any simulator errors) when it never does."""
        deadline = time.monotonic() + timeout
        while True:
            got = fn()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"fake server: gave up waiting for {what or fn} after {timeout}s "
                    f"(simulator errors: {self.runtime.errors or 'none'})"
                )
            time.sleep(0.01)

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
