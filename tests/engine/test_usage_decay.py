"""Fair share with usage decay (issue 11, item 7c): recent use counts against a queue.

With decay off (no half-life, or no usage passed) the decisions are exactly today's; with it
on, of two equal queues the one that used much recently goes after the one that did not.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.audit import AuditEntry
from gpupool.engine import Engine, decide
from gpupool.engine.decay import DecayedUsage, decay_shares
from gpupool.manifests import ManifestError, build, parse_documents
from gpupool.manifests.convert import object_manifest
from gpupool.model import (
    QUOTA_RESOURCES,
    UNLIMITED,
    EngineConfig,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
)
from tests.test_service_support import in_process_controller, submit_to

HOUR = 3600.0


def _gpus(n: int) -> Any:
    return (n * 1000,) + (UNLIMITED,) * (len(QUOTA_RESOURCES) - 1)


def _snapshot(pending: tuple[Workload, ...], n_nodes: int = 1, **config: Any) -> Snapshot:
    """An org of 8 GPUs per node with two equal teams of half of it each, free to borrow."""
    total = n_nodes * 8
    nodes = tuple(Node(f"n{i}", "H100", 8, 81920, 128_000, 1 << 20) for i in range(n_nodes))
    queues = (
        Queue("org", quotas=(PoolQuota("gpu", _gpus(total)),)),
        Queue("a", "org", quotas=(PoolQuota("gpu", _gpus(total // 2)),)),
        Queue("b", "org", quotas=(PoolQuota("gpu", _gpus(total // 2)),)),
    )
    cfg = EngineConfig(reserve=False, **config)
    return Snapshot(nodes, (ResourcePool("gpu"),), queues, pending=pending, config=cfg)


def _job(name: str, queue: str, gpus: int, arrival: float) -> Workload:
    return Workload(name, queue, (PodGroup("m", 1, PodRequest(gpus=gpus)),), arrival=arrival)


def test_half_life_halves_and_accumulates() -> None:
    d = DecayedUsage(HOUR)
    d.advance(0.0, {})
    d.advance(HOUR, {"a": 8.0})  # 8 GPUs for one half-life
    held = 8.0 * HOUR / math.log(2) * 0.5
    assert d.usage["a"] == pytest.approx(held)
    d.advance(2 * HOUR, {})  # idle for one more: half of it is left
    assert d.usage["a"] == pytest.approx(held / 2)
    assert d.as_snapshot() == (("a", pytest.approx(held / 2)),)


def test_bad_half_life_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="usageHalfLife"):
        DecayedUsage(0.0)
    with pytest.raises(ValueError, match="usage_half_life_s"):
        Engine(_snapshot((), usage_half_life_s=-1.0))


def test_a_queue_that_used_much_recently_goes_after_an_equal_one() -> None:
    """Both heads need the whole cluster (borrowing); ``a``'s head arrived first, so without
    decay it goes first. With decay, ``a``'s recent use puts ``b`` first."""
    pending = (_job("a1", "a", 8, 0.0), _job("b1", "b", 8, 1.0))
    plain = decide(_snapshot(pending))
    assert [x.workload for x in plain.admitted] == ["a1"]
    used = DecayedUsage(HOUR)
    used.advance(0.0, {})
    used.advance(HOUR, {"a": 8.0})
    snap = replace(_snapshot(pending, usage_half_life_s=HOUR), decayed_usage=used.as_snapshot())
    assert [x.workload for x in decide(snap).admitted] == ["b1"]


def test_the_term_is_one_for_a_guarantee_held_for_ever() -> None:
    eng = Engine(_snapshot((), usage_half_life_s=HOUR))
    forever = 4 * HOUR / math.log(2)  # a's guarantee (4 GPUs) held for ever, in GPU-seconds
    terms = decay_shares(eng.quota, {"a": forever, "nobody": 5.0}, HOUR)
    assert terms["a"] == pytest.approx(1.0)
    assert terms["org"] == pytest.approx(0.5)  # the org's guarantee is twice a's
    assert "b" not in terms and "nobody" not in terms


_jobs = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4, 8]), st.integers(0, 20)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(jobs=_jobs, usage=st.dictionaries(st.sampled_from(["a", "b", "org"]), st.floats(0, 1e7)))
def test_with_decay_off_decisions_are_exactly_todays(
    jobs: list[tuple[str, int, int]], usage: dict[str, float]
) -> None:
    """Usage passed without a half-life, or a half-life without usage: today's decisions."""
    pending = tuple(_job(f"j{i}", q, g, float(t)) for i, (q, g, t) in enumerate(jobs))
    today = decide(_snapshot(pending, n_nodes=2))
    ignored = replace(_snapshot(pending, n_nodes=2), decayed_usage=tuple(sorted(usage.items())))
    assert decide(ignored) == today
    assert decide(_snapshot(pending, n_nodes=2, usage_half_life_s=HOUR)) == today


def _cluster(fair: str) -> str:
    return f"""
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata: {{name: c}}
spec:
  fairSharing: {fair}
  nodeGroups: [{{name: n, count: 1, gpu: {{model: H100, count: 8, memory: 80Gi}}, cpu: 64, memory: 512Gi}}]
"""


def test_the_half_life_is_read_from_the_cluster_and_validated() -> None:
    assert build(parse_documents(_cluster("{usageHalfLife: 1h}"), "c.yaml")).usage_half_life_s == HOUR
    assert build(parse_documents(_cluster("{}"), "c.yaml")).usage_half_life_s is None
    for bad in ("{usageHalfLife: 0}", "{usageHalfLife: soon}"):
        with pytest.raises(ManifestError) as exc:
            build(parse_documents(_cluster(bad), "c.yaml"))
        assert "spec.fairSharing.usageHalfLife" in str(exc.value)


def test_the_controller_keeps_decayed_usage_and_hands_it_to_the_engine(tmp_path: Path) -> None:
    """A Cluster with a half-life: the controller accounts what ran between cycles and the
    engine's fair-share term follows; without one it keeps nothing."""
    store, ctl, _ = in_process_controller(f"sqlite:///{tmp_path}/d.db", tmp_path)
    try:
        now = [1000.0]
        ctl.clock = lambda: now[0]
        ctl.recover()
        assert ctl.usage_decay is None and ctl.engine.quota.decay == {}
        cluster = object_manifest(store.get_object("Cluster", "demo"))
        cluster["spec"]["fairSharing"] = {"usageHalfLife": "1h"}
        store.apply_object(cluster, audit=AuditEntry("t", "cluster.apply", "Cluster", "demo"))
        ctl.reload_config()
        assert ctl.engine.config.usage_half_life_s == HOUR
        submit_to(store, ctl, "j", queue="llm-research", gpus=4, duration="10h")
        ctl.cycle()
        assert "j" in ctl.engine.running
        now[0] += HOUR
        ctl.cycle()
        assert ctl.usage_decay is not None
        assert ctl.usage_decay.usage["llm-research"] == pytest.approx(4 * HOUR / math.log(2) / 2)
        assert ctl.engine.quota.decay["llm-research"] > 0
    finally:
        store.close()
