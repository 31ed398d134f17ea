"""The binder's requests: one Binding per pod; HAMi's node lock only where HAMi runs (a node with
the ``hami.io/node-nvidia-register`` annotation), taken on the cached node (no GET); the next
bind on a HAMi node starts when the watch shows the device plugin released the lock. What the
binder does runs on both servers (issue 24); its request counts are the fake's own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube import annotations as kube_ann
from gpupool.kube.fake import FakeApiServer
from gpupool.service.backends import RunSpec
from tests.kube.cluster import Cluster, bound, job, known, placement, pods_of, wait_for

NODE0 = "gpu-node-0000"  # the fake-only tests' node
both = pytest.mark.both_servers


def _requests(c: Cluster) -> dict[str, int]:
    """The fake's request counts (empty on the real server, which counts none for us)."""
    return dict(c.fake.stats.requests) if c.fake is not None else {}


def _delta(before: dict[str, int], after: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def _four_on_node0(c: Cluster, name: str) -> tuple[str, dict[str, int]]:
    """A backend, a Job of four one-GPU pods placed on the first node, the request counts before
    binding."""
    be = c.fresh()
    c.create(job(name, pods=4, run_s=100_000))
    wl = c.workload("job", name)
    wait_for(lambda: known(be, wl), what="the Job in the cache")
    wait_for(lambda: len(pods_of(c, f"job-name={name}")) == 0, what="suspended: no pods")
    before = _requests(c)
    be.start([RunSpec(wl, placement(*(("main", i, c.nodes[0], [i]) for i in range(4))))])
    return wl, before


@both
@pytest.mark.cluster_nodes(hami=False)  # without HAMi's register (the NVIDIA device plugin alone)
def test_a_node_without_hami_gets_no_lock_and_no_node_request(cluster: Cluster) -> None:
    srv, node0 = cluster, cluster.nodes[0]
    _, before = _four_on_node0(cluster, "plain")
    wait_for(lambda: len(bound(pods_of(srv, "job-name=plain"))) == 4, what="all four bound")
    after = _requests(srv)
    if srv.fake is not None:  # the requests made: the fake counts them
        assert _delta(before, after, "create pods/binding") == 4
        assert _delta(before, after, "patch nodes") == 0  # no HAMi lock where HAMi does not run
        assert _delta(before, after, "get nodes") == 0
    assert kube_ann.HAMI_NODE_LOCK not in (srv.get("nodes", "", node0)["metadata"].get("annotations") or {})
    pods = pods_of(srv, "job-name=plain")
    assert sorted(p["metadata"]["annotations"][kube_ann.GPU_INDICES] for p in pods) == ["0", "1", "2", "3"]


@both
def test_a_hami_node_takes_the_lock_per_bind_with_no_get(cluster: Cluster) -> None:
    srv = cluster
    _, before = _four_on_node0(cluster, "locked")
    wait_for(lambda: len(bound(pods_of(srv, "job-name=locked"))) == 4, what="all four bound")
    wait_for(
        lambda: all(p["status"].get("phase") == "Running" for p in pods_of(srv, "job-name=locked")),
        what="all four admitted by the HAMi stand-in",
    )
    after = _requests(srv)
    if srv.fake is not None:  # the requests made: the fake counts them
        assert _delta(before, after, "create pods/binding") == 4
        assert _delta(before, after, "patch nodes") == 4  # one lock per bind: nothing retried
        assert _delta(before, after, "get nodes") == 0  # the cached node's version, never a GET
        assert _delta(before, after, "get pods") == 0  # the holder is known: no staleness check
    assert all(
        p["metadata"]["annotations"][kube_ann.HAMI_BIND_PHASE] == "success"
        for p in pods_of(srv, "job-name=locked")
    )
    assert kube_ann.HAMI_NODE_LOCK not in (
        srv.get("nodes", "", srv.nodes[0])["metadata"].get("annotations") or {}
    )  # each released by the device plugin
    assert srv.violations() == []  # the stand-in saw each pod allocated under its own lock


def test_the_next_bind_waits_for_the_plugin_to_release_the_lock(tmp_path: Path) -> None:
    """No kubelet: nothing releases the lock, so the second pod on the node waits (and its
    pass gives up after lock_wait_s, retried later); releasing the lock by hand lets it bind."""
    with FakeApiServer(kubelet=False, time_scale=0.01, bookmark_interval_s=0.2) as srv:
        srv.write_kubeconfig(tmp_path / "kubeconfig")
        srv.add_gpu_nodes(1, gpus=8, hami=True)
        c = Cluster(srv)
        try:
            be = c.fresh(bind_deadline_s=60.0)
            be.binder.lock_wait_s = 0.3
            srv.create(job("two", pods=2, run_s=100_000))
            wait_for(lambda: known(be, "default.job.two"), what="the Job in the cache")
            be.start(
                [RunSpec("default.job.two", placement(("main", 0, NODE0, [0]), ("main", 1, NODE0, [1])))]
            )
            wait_for(lambda: len(bound(pods_of(srv, "job-name=two"))) == 1, what="the first bound")
            wait_for(lambda: be.binder.stats["lockWaits"] >= 1, what="the second told the node is locked")
            assert len(bound(pods_of(srv, "job-name=two"))) == 1
            holder = srv.get("nodes", "", NODE0)["metadata"]["annotations"][kube_ann.HAMI_NODE_LOCK]
            assert holder.split(",")[1:] == ["default", next(iter(bound(pods_of(srv, "job-name=two"))))]
            srv.patch("nodes", "", NODE0, {"metadata": {"annotations": {kube_ann.HAMI_NODE_LOCK: None}}})
            wait_for(lambda: len(bound(pods_of(srv, "job-name=two"))) == 2, what="the second bound")
        finally:
            c.close()


def test_the_lock_alone_does_not_rebuild_the_node_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binder's lock and the plugin's release are two node events per bind on a HAMi node;
    a rebuild scans every cached pod, so these two must not cause one (a label change must)."""
    from gpupool.kube import inventory, nodes
    from gpupool.kube.fake.nodes import gpu_node

    calls: list[str] = []
    real = inventory.node_inventory

    def counting(obj: dict[str, Any], *a: Any, **kw: Any) -> Any:
        calls.append(obj["metadata"]["name"])
        return real(obj, *a, **kw)

    monkeypatch.setattr(nodes.inventory, "node_inventory", counting)
    listeners: list[Any] = []

    class _Cache:
        def __init__(self) -> None:
            self.objs: dict[str, dict[str, Any]] = {}

        def items(self) -> list[dict[str, Any]]:
            return list(self.objs.values())

        def get(self, _ns: str, name: str) -> dict[str, Any] | None:
            return self.objs.get(name)

        def add_listener(self, fn: Any) -> None:
            listeners.append(fn)

    class _Informers:
        nodes = _Cache()
        pods = _Cache()

    infs = _Informers()
    view = nodes.NodeView(infs, inventory.InventoryOptions())  # type: ignore[arg-type]
    node = gpu_node(NODE0, gpus=8)
    node["metadata"]["resourceVersion"] = "1"

    def event(obj: dict[str, Any]) -> None:
        infs.nodes.objs[NODE0] = obj
        for fn in listeners:
            fn("MODIFIED", obj)

    event(node)
    view.refresh()
    assert calls == [NODE0]
    locked = {**node, "metadata": {**node["metadata"], "resourceVersion": "2"}}
    locked["metadata"]["annotations"] = {**node["metadata"]["annotations"], kube_ann.HAMI_NODE_LOCK: "x"}
    event(locked)
    event({**node, "metadata": {**node["metadata"], "resourceVersion": "3"}})  # released
    view.refresh()
    assert calls == [NODE0]  # no rebuild for the lock
    relabelled = {**node, "metadata": {**node["metadata"], "labels": {"rack": "r9"}, "resourceVersion": "4"}}
    event(relabelled)
    view.refresh()
    assert calls == [NODE0, NODE0]


@both
def test_a_fraction_only_pod_ends_its_handshake_and_leaves_no_lock(cluster: Cluster) -> None:
    """A pod with only KAI's gpu-fraction (no container GPU resource) is never allocated by
    HAMi's device plugin, which is what releases the node lock: the bind takes no lock and ends
    the handshake itself, so the next bind on the node does not wait (issue 23)."""
    srv, node0 = cluster, cluster.nodes[0]
    frac_name, next_name = cluster.workload("job", "frac"), cluster.workload("job", "next")
    be = cluster.fresh()
    be.binder.lock_wait_s = 30.0  # a held lock would hold the next bind far past the check below
    frac = job("frac", pods=1, run_s=100_000, gpus=0)
    frac["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    frac["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] = "0.5"
    srv.create(frac)
    srv.create(job("next", pods=1, run_s=100_000))
    wait_for(lambda: known(be, frac_name) and known(be, next_name), what="both in the cache")
    be.start([RunSpec(frac_name, placement(("main", 0, node0, [0]), milli=500))])
    wait_for(lambda: len(bound(pods_of(srv, "job-name=frac"))) == 1, what="the fraction bound")
    pod = pods_of(srv, "job-name=frac")[0]
    assert pod["metadata"]["annotations"][kube_ann.HAMI_BIND_PHASE] == "success"
    assert kube_ann.HAMI_NODE_LOCK not in (srv.get("nodes", "", node0)["metadata"].get("annotations") or {})
    t0 = time.monotonic()
    be.start([RunSpec(next_name, placement(("main", 0, node0, [1])))])
    wait_for(lambda: len(bound(pods_of(srv, "job-name=next"))) == 1, what="the next bind on the node")
    assert time.monotonic() - t0 < 10.0 and be.binder.stats["lockWaits"] == 0
    assert srv.violations() == []
