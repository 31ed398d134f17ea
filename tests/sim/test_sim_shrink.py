"""The simulator carries an elastic shrink out (issue 27 item 5): the removed pods' work alone
is lost, the gang keeps running and finishes when it would have, and its queue's usage counts
the removed pods only until the shrink."""

from __future__ import annotations

import pytest

from gpupool.manifests import default_priority_classes
from gpupool.model import Node, PoolQuota, Queue, ResourcePool, devices_only
from gpupool.sim.scenario import Faults, Scenario, Variant
from gpupool.sim.simulator import simulate
from gpupool.sim.sources import JobSpec, Trace


def _run(min_replicas: int | None) -> tuple[dict[str, object], dict[str, float]]:
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 64000, 524288) for i in range(2))
    queues = (Queue("org", quotas=(PoolQuota("gpu", devices_only(16000)),)), Queue("a", "org"))
    variant = Variant("base", nodes, (ResourcePool("gpu"),), queues, tuple(default_priority_classes()))
    jobs = [
        # 4 pods x 4 GPUs for 1000 s, the whole cluster; at t=100 a 4-GPU training job arrives
        JobSpec("elastic", "a", 0.0, 1000.0, gpus=4, replicas=4, priority_class="experiment",
                min_replicas=min_replicas),
        JobSpec("urgent", "a", 100.0, 50.0, gpus=4, priority_class="training"),
    ]  # fmt: skip
    sc = Scenario("shrink", "test", [variant], Trace(jobs=jobs), Faults(), None, 1, ["gpupool"])
    sc.check_invariants = True
    res = simulate(sc, "gpupool")
    assert res.violations == []
    recs = {j.spec.name: j for j in res.jobs}
    return {"lost": recs["elastic"].lost_gpu_s, "preempted": recs["elastic"].preempted,
            "end": recs["elastic"].finish, "events": [e.kind for e in res.events]}, res.queue_usage_gpu_s  # fmt: skip


def test_a_shrink_loses_only_the_removed_pods_work() -> None:
    got, usage = _run(min_replicas=2)
    # one pod of 4 GPUs ran 100 s before it went: 400 GPU-seconds lost, not the whole job's
    assert got["lost"] == pytest.approx(400.0)
    assert got["preempted"] == 0 and "shrunk" in got["events"]
    assert got["end"] == pytest.approx(1000.0)  # it kept running with 3 pods
    # 16 GPUs for 100 s, 12 for the remaining 900 s, and the urgent job's 4 GPUs for 50 s
    assert usage["a"] == pytest.approx(16 * 100 + 12 * 900 + 4 * 50)


def test_a_rigid_gang_is_evicted_whole_and_loses_everything() -> None:
    got, _ = _run(min_replicas=None)
    assert got["lost"] == pytest.approx(1600.0) and got["preempted"] == 1
