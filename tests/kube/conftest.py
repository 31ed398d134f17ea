"""The API server fixtures shared by the Kubernetes tests.

``fake_server``: gpupool's fake API server, what most Kubernetes tests use.

``cluster``: a Kubernetes backend over two 8-GPU HAMi nodes with a kubelet
(tests/kube/cluster.py's ``Cluster``, a server-neutral object API). On the fake server by
default; a module or test marked ``both_servers`` runs on both (params ``fake`` and ``real``),
and one marked ``fake_only("reason")`` among them is skipped on the real server with that reason.
``cluster_nodes(count=, gpus=, hami=, labels=, product=, memory_mib=)`` changes the nodes (two
HAMi nodes of 8 H100 80 GB GPUs, no extra labels); ``cluster_nodes(groups=[{...}, {...}])`` builds
one group of nodes per dict of those keywords, in order (nodes of two GPU models).

``kube_api``: the same test against both servers, parametrized ``fake`` and ``real`` (issue 24);
``fake_only("reason")`` skips its real case with that reason.
The real one is etcd + kube-apiserver + kube-controller-manager built by ``make kube-bin``
(``gpupool.kube.realcluster``), started once per test session (per xdist worker: it costs about
12 s) and skipped, with the reason, when the binaries are not built. Each test gets its own
namespace and node names, so tests sharing one real server do not see each other's objects.
There is no scheduler on the real server, and a kubelet only on the nodes of
``add_kubelet_nodes`` (the node agent of ``gpupool kube cluster up``): pods stay Pending unless a
test binds them, and a pod bound to a node of ``add_gpu_nodes`` keeps the status the test writes.
"""

from __future__ import annotations

import os
import secrets
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.kube.client import KubeApi, load_config
from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake import nodes as node_builders
from gpupool.kube.nodeagent import NodeAgent
from gpupool.kube.realcluster import MissingBinaries, RealControlPlane, find_binaries


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A started ``FakeApiServer`` (controllers and kubelet on, time scaled down 100x, CRDs for
    PyTorchJob and JobSet preloaded) with a kubeconfig at ``tmp_path / 'kubeconfig'``
    (``srv.kubeconfig`` holds the path)."""
    srv = FakeApiServer(time_scale=0.01, bookmark_interval_s=0.2, preload_crds=True)
    srv.start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield srv
    finally:
        srv.stop()


BOTH = ["fake", pytest.param("real", marks=pytest.mark.realkube)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``cluster`` on both servers for the tests marked ``both_servers`` (issue 24)."""
    if "cluster" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_servers"):
        metafunc.parametrize("cluster", BOTH, indirect=True)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Two 8-GPU HAMi nodes with a kubelet and a Kubernetes backend over them
    (tests/kube/cluster.py's ``Cluster``), closed after: the backend, shrink, move,
    partial-job and pods-ready tests all start from it. On the fake it is ``fake_server``'s
    (namespace ``default``, nodes ``gpu-node-0000`` and ``-0001``); on the real server the
    test's own namespace and generated node names run by a node agent."""
    from tests.kube.cluster import Cluster

    kind = getattr(request, "param", "fake")
    shape = request.node.get_closest_marker("cluster_nodes")
    kwargs = dict(shape.kwargs) if shape else {}
    groups: list[dict[str, Any]] = []
    for group in kwargs.pop("groups", None) or [kwargs]:
        nodes: dict[str, Any] = {"count": 2, "gpus": 8, "hami": True, "labels": None}
        nodes.update(group)
        groups.append(nodes)
    if kind == "real":
        mark = request.node.get_closest_marker("fake_only")
        if mark is not None:
            pytest.skip(f"fake server only: {mark.args[0]}")
        with _target("real", request, tmp_path) as target:
            c = Cluster(target, [n for g in groups for n in target.add_kubelet_nodes(**g)])
            try:
                yield c
            finally:
                c.close()
        return
    srv: FakeApiServer = request.getfixturevalue("fake_server")
    names: list[str] = []
    for i, g in enumerate(groups):  # one group: the fake's own node names, as before
        names += srv.add_gpu_nodes(g.pop("count"), "gpu-node" if len(groups) == 1 else f"gpu-g{i}", **g)
    c = Cluster(srv, names)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def real_control_plane() -> Iterator[RealControlPlane]:
    """One real control plane for the whole session (per worker); skips when not built."""
    try:
        binaries = find_binaries()
    except MissingBinaries as exc:
        # CI builds the binaries and sets GPUPOOL_REQUIRE_KUBE=1: there a missing real tier is a
        # failure, not a quiet skip (issue 24); elsewhere the tests skip with the reason.
        if os.environ.get("GPUPOOL_REQUIRE_KUBE") == "1":
            pytest.fail(f"GPUPOOL_REQUIRE_KUBE=1 but the real API server cannot start: {exc}")
        pytest.skip(f"real API server: {exc}")
    with RealControlPlane(binaries) as cp:
        yield cp


@dataclass
class KubeTarget:
    """What a parity test needs of either server: a kubeconfig, an authenticated HTTP client,
    a namespace of its own, and simulated GPU nodes (cleaned up after the test)."""

    kind: str  # "fake" or "real"
    kubeconfig: Path
    http: httpx.Client
    namespace: str
    fake: FakeApiServer | None = None
    own_namespace: bool = True  # made for the test, and deleted after it
    _nodes: list[str] = field(default_factory=list)
    _agents: list[NodeAgent] = field(default_factory=list)

    def path(self, resource: str, name: str = "", group: str = "", version: str = "v1") -> str:
        """The URL path of a namespaced ``resource`` (``name`` may carry a ``/subresource``)."""
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        return f"{base}/namespaces/{self.namespace}/{resource}" + (f"/{name}" if name else "")

    def add_gpu_nodes(self, count: int, gpus: int = 8) -> list[str]:
        """GPU nodes as the fake builds them (capacity/allocatable with ``nvidia.com/gpu``, a
        Ready condition), created through the API on both servers: the real one keeps a Node's
        status on create, as when a kubelet registers."""
        prefix = f"gpu-{secrets.token_hex(3)}"
        for node in node_builders.gpu_nodes(count, prefix, gpus=gpus, hami=False):
            r = self.http.post("/api/v1/nodes", json=node)
            assert r.status_code == 201, r.text
            self._nodes.append(node["metadata"]["name"])
        return self._nodes[-count:] if count else []

    def add_kubelet_nodes(
        self,
        count: int,
        gpus: int = 8,
        hami: bool = True,
        labels: dict[str, str] | None = None,
        product: str | None = None,
        memory_mib: int | None = None,
        time_scale: float = 0.01,
    ) -> list[str]:
        """GPU nodes with a kubelet: on the fake, its own nodes (its simulated kubelet runs their
        pods); on the real server, the node agent of ``gpupool kube cluster up`` registers them,
        heartbeats and runs their bound pods the same way (at ``time_scale``: the fake fixtures'
        0.01 unless told; on the fake its server's own).
        ``labels`` are added to the nodes' own (a pool's node selector); ``product`` and
        ``memory_mib`` are the GPU model (GFD's product label) and its device memory (the fake's
        H100 80 GB unless told)."""
        prefix = f"kl-{secrets.token_hex(3)}"
        model: dict[str, Any] = {"gpus": gpus, "hami": hami, "labels": labels}
        if product is not None:
            model["product"] = product
        if memory_mib is not None:
            model["memory_mib"] = memory_mib
        if self.fake is not None:
            names = self.fake.add_gpu_nodes(count, prefix=prefix, **model)
        else:
            names = self._run_agent(node_builders.gpu_nodes(count, prefix, **model), time_scale)
        self._nodes += names
        return names

    def _run_agent(self, objs: list[dict[str, Any]], time_scale: float) -> list[str]:
        """A node agent registering and running these Node objects on the real server, Ready."""
        agent = NodeAgent(KubeApi(load_config(str(self.kubeconfig))), objs, time_scale=time_scale)
        self._agents.append(agent)
        agent.start()
        agent.wait_ready(60)
        return list(agent.nodes)

    def add_node_objects(self, objs: list[dict[str, Any]]) -> list[str]:
        """These Node objects (``nodes.gpu_nodes``, ``nodes.nodes_from_cluster``: their names kept)
        with a kubelet: created on the fake (its kubelet runs them), registered and run by a
        node agent on the real server (the fake's time scale, 0.01)."""
        if self.fake is not None:
            names = [self.fake.create(o)["metadata"]["name"] for o in objs]
        else:
            names = self._run_agent(objs, 0.01)
        self._nodes += names
        return names

    def set_pod_phase(self, name: str, phase: str) -> dict[str, Any]:
        """Write a bound pod's phase through the status subresource, as a kubelet would."""
        r = self.http.patch(
            self.path("pods", f"{name}/status"),
            json={"status": {"phase": phase}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def cleanup(self) -> None:
        if self._agents and self.own_namespace:
            # the namespace first, while the agents run: they remove its pods (after their grace
            # period, scaled), so no pod of this test outlives it to be seen (and adopted) by the
            # next test's backend, which watches every namespace (issue 24)
            # (the controllers and then their pods at once: the namespace controller alone takes
            # seconds to get to them)
            for group, plural in (("batch", "jobs"), ("apps", "deployments"), ("apps", "replicasets")):
                self.http.request(
                    "DELETE", self.path(plural, group=group), json={"propagationPolicy": "Background"}
                )
            self.http.request("DELETE", self.path("pods"), json={"gracePeriodSeconds": 0})
            self.http.delete(f"/api/v1/namespaces/{self.namespace}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                r = self.http.get(self.path("pods"))
                if r.status_code != 200 or not r.json().get("items"):
                    break
                time.sleep(0.2)
        for agent in self._agents:  # then: an agent re-registers a node deleted under it
            agent.stop()
            agent.api.close()
        for name in self._nodes:
            self.http.delete(f"/api/v1/nodes/{name}")
        if self.own_namespace:
            self.http.delete(f"/api/v1/namespaces/{self.namespace}")
        self.http.close()


def _wait_for_default_service_account(target: KubeTarget, timeout: float = 60.0) -> None:
    """The ServiceAccount admission plugin refuses pods until the controller has made the
    namespace's ``default`` service account; and the root-CA publisher adds the
    ``kube-root-ca.crt`` ConfigMap to every new namespace, which a test's watch of its ConfigMaps
    would see arrive in the middle of its own events on a loaded machine. Both are waited for,
    so a test starts in a settled namespace."""
    deadline = time.monotonic() + timeout
    for what in (("serviceaccounts", "default"), ("configmaps", "kube-root-ca.crt")):
        while target.http.get(target.path(*what)).status_code != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {'/'.join(what)} in {target.namespace} within {timeout:.0f} s")
            time.sleep(0.2)


def _real_target(cp: RealControlPlane) -> KubeTarget:
    http = httpx.Client(
        base_url=cp.server,
        verify=ssl.create_default_context(cafile=str(cp.ca_file)),
        headers={"Authorization": f"Bearer {cp.admin_token}"},
        timeout=30,
    )
    return KubeTarget("real", cp.kubeconfig, http, f"t-{secrets.token_hex(4)}")


@pytest.fixture(params=BOTH)
def kube_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KubeTarget]:
    """The test's server, fake or real (see the module docstring); a test marked
    ``fake_only("reason")`` is skipped on the real one with that reason, before it starts."""
    mark = request.node.get_closest_marker("fake_only")
    if request.param == "real" and mark is not None:
        pytest.skip(f"fake server only: {mark.args[0]}")
    with _target(request.param, request, tmp_path) as target:
        yield target


@contextmanager
def _target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KubeTarget]:
    """A ``KubeTarget`` with a namespace of its own on a fresh fake server or the session's
    real one, cleaned up (and the fake stopped) after."""
    srv: FakeApiServer | None = None
    if kind == "real":
        target = _real_target(request.getfixturevalue("real_control_plane"))
    else:
        srv = FakeApiServer(time_scale=0.01, bookmark_interval_s=0.2, preload_crds=True)
        srv.start()
        http = httpx.Client(base_url=srv.url, timeout=30)
        target = KubeTarget("fake", srv.write_kubeconfig(tmp_path / "kubeconfig"), http, "parity", srv)
    try:
        r = target.http.post("/api/v1/namespaces", json={"metadata": {"name": target.namespace}})
        assert r.status_code == 201, r.text
        if target.kind == "real":
            _wait_for_default_service_account(target)
        yield target
    finally:
        target.cleanup()
        if srv is not None:
            srv.stop()
