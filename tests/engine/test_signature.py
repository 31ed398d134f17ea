"""The one scheduling signature (``engine/signature.py``) and its three users: the engine's
fail cache, the simulator's window classes and the controller's window classes."""

from __future__ import annotations

from dataclasses import fields, replace

from gpupool.engine import Engine
from gpupool.engine.signature import (
    IDENTITY,
    PLACEMENT,
    SIGNATURE_FIELDS,
    placement_signature,
    scheduling_signature,
)
from gpupool.model import (
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
    devices_only,
)
from gpupool.sim.pending import PendingSet


def _w(name: str = "w", queue: str = "a", **kw: object) -> Workload:
    req = PodRequest(gpus=1, cpu_milli=1000, memory_mib=1024)
    return Workload(name, queue, (PodGroup("main", 1, req),), **kw)  # type: ignore[arg-type]


def test_every_field_but_name_and_arrival_is_part_of_the_signature() -> None:
    """Derived from the model: a field added to ``Workload`` is in it without anyone adding it."""
    names = [f.name for f in fields(Workload)]
    assert list(SIGNATURE_FIELDS) == [n for n in names if n not in IDENTITY]
    assert set(PLACEMENT) <= set(SIGNATURE_FIELDS)
    w = _w(expected_duration_s=10.0)
    assert scheduling_signature(w) == scheduling_signature(replace(w, name="other", arrival=9.0))
    assert scheduling_signature(w) != scheduling_signature(replace(w, priority_class="hi"))


def test_by_band_keeps_only_the_band_of_the_duration() -> None:
    # bands are thirds of a decade: [4.64, 10) is one, 10 starts the next, at every power of ten
    for k in (0.001, 1.0, 1000.0):
        a, b, c = (_w(expected_duration_s=d * k) for d in (5.0, 9.5, 10.0))
        assert scheduling_signature(a) != scheduling_signature(b)
        assert scheduling_signature(a, duration="band") == scheduling_signature(b, duration="band")
        assert scheduling_signature(b, duration="band") != scheduling_signature(c, duration="band")
        assert len(scheduling_signature(a, duration="band")) == len(SIGNATURE_FIELDS)


def test_the_simulator_keeps_workloads_apart_that_prefer_other_pools() -> None:
    """The simulator's classes are the signature's: two workloads alike but for their preferred
    pools (which the engine tries in another order) are not one class. (Its own list of fields
    left ``preferred_pools``, the task type and the priority class out.)"""
    pend = PendingSet()
    pend.add(_w("x", preferred_pools=("p0",)))
    pend.add(_w("y", preferred_pools=("p1",)))
    pend.add(_w("z", preferred_pools=("p1",), arrival=1.0))
    assert pend.backlog.cls_of["x"] != pend.backlog.cls_of["y"] == pend.backlog.cls_of["z"]


def test_the_fail_cache_keys_a_shape_by_placement_only() -> None:
    """Placement does not read the queue or priority: one key per pool and placement shape."""
    nodes = (Node("n0", "A", 8, 81920, 64000, 524288, labels=(("pool", "p0"),)),)
    pools = (ResourcePool("p0", (("pool", "p0"),)),)
    queues = tuple(Queue(q, quotas=(PoolQuota("p0", devices_only(8000)),)) for q in ("a", "b"))
    eng = Engine(Snapshot(nodes, pools, queues))
    x, y = _w("x", "a"), _w("y", "b", priority=5)
    assert placement_signature(x) == placement_signature(y)
    assert eng.facts.of(x)[2] == eng.facts.of(y)[2] != eng.facts.of(_w("z", "a", gang_min=1))[2]


def test_without_the_duration_only_the_duration_is_left_out() -> None:
    a, b = _w(expected_duration_s=5.0), _w(expected_duration_s=5000.0)
    assert scheduling_signature(a, duration="none") == scheduling_signature(b, duration="none")
    assert scheduling_signature(a, duration="none") != scheduling_signature(
        replace(b, priority_class="hi"), duration="none"
    )
    assert len(scheduling_signature(a, duration="none")) == len(SIGNATURE_FIELDS) - 1
