"""The controller's parts alone (gpupool.service.controller): each made with a context over
fakes and the other parts it calls replaced by recorders, as the ``Controller`` would pass them.

Why: a part is a class with its own state and a narrow interface; these tests read that
interface (what the cycle calls in which order and how often, what it keeps of a workload the
engine fails on, what the pending set takes in and writes back) without a store or a backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from gpupool.engine import Decisions, Engine, Pending, PendingCode
from gpupool.model import (
    PodGroup,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Snapshot,
    Workload,
    devices_only,
)
from gpupool.service.adoption import Adoption
from gpupool.service.backends import Capability
from gpupool.service.controller.context import Context, CycleStats, _Queued
from gpupool.service.controller.cycle import Cycle
from gpupool.service.controller.pending import PendingSet
from gpupool.service.view import QueueTree


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeStore:
    """The few store calls the parts under test make themselves."""

    def __init__(self, pending: dict[str, str] | None = None) -> None:
        self.pending = pending or {}  # name -> stored reason
        self.audits: list[Any] = []
        self.reason_writes: list[dict[str, str]] = []

    def append_audit(self, entry: Any, at: datetime) -> None:
        self.audits.append(entry)

    def pending_reasons(self, names: Sequence[str] | None = None) -> dict[str, str]:
        return {n: r for n, r in self.pending.items() if names is None or n in names}

    def list_workloads(self, **_: Any) -> list[Any]:
        return []

    def set_pending_reasons(self, changed: dict[str, str]) -> None:
        self.reason_writes.append(dict(changed))
        self.pending.update(changed)


def _context(store: FakeStore, clock: Clock) -> tuple[Context, list[CycleStats]]:
    seen: list[CycleStats] = []
    ctx = Context(store, SimpleNamespace(), clock)  # type: ignore[arg-type]
    ctx.hooks.on_cycle = seen.append
    return ctx, seen


def _w(name: str) -> Workload:
    return Workload(name, "q", (PodGroup("main", 1, PodRequest(gpus=1)),))


def _queued(name: str, seq: int) -> _Queued:
    return _Queued(name, seq, "q", "o", 0.0, _w(name))


class Recorder:
    """Stands in for the parts the cycle sequences; every call is logged by name."""

    def __init__(self, log: list[str], pending: dict[str, _Queued] | None = None) -> None:
        self.log = log
        self.pending = pending or {}
        self.reasons: dict[str, Pending] = {}
        self.usage_decay = None
        self.exceptions: dict[str, float] = {}
        self.committed: list[tuple[Decisions, list[str]]] = []
        self.rebuild = lambda: None

    def process_finished(self, now: float) -> int:
        self.log.append("finish")
        return 0

    def expire(self, now: float) -> None:
        self.log.append("expire")

    def sync(self, now: float) -> None:
        self.log.append("sync")

    def refresh_nodes(self, now: float) -> None:
        self.log.append("refresh")

    def node_faults(self, now: float) -> None:
        self.log.append("faults")

    def store_reasons(self) -> None:
        self.log.append("reasons")

    def commit(self, d: Decisions, models: Sequence[Workload], now: float, stats: CycleStats) -> None:
        self.log.append("commit")
        self.committed.append((d, [w.name for w in models]))

    def rebuild_engine(self) -> None:
        self.rebuild()

    def queue_path(self, queue: str) -> list[str]:
        return [queue]


def _cycle(ctx: Context, part: Recorder, **kw: Any) -> Cycle:
    return Cycle(
        ctx,
        pending=part,  # type: ignore[arg-type]
        config=part,  # type: ignore[arg-type]
        commit=part,  # type: ignore[arg-type]
        finishing=part,  # type: ignore[arg-type]
        approvals=part,  # type: ignore[arg-type]
        adoption=Adoption(),
        **kw,
    )


def test_the_cycle_runs_its_steps_in_order_and_expires_and_writes_reasons_at_most_once_an_interval() -> None:
    clock, log = Clock(100.0), []
    ctx, seen = _context(FakeStore(), clock)
    part = Recorder(log)
    cycle = _cycle(ctx, part, tick_s=1.0, reason_interval_s=1.0)
    for t in (100.0, 100.5, 101.2):
        clock.t = t
        cycle.run()
    assert log == [
        *("finish", "expire", "sync", "refresh", "faults", "reasons"),
        *("finish", "sync", "refresh", "faults"),  # within the tick and the reasons' interval
        *("finish", "expire", "sync", "refresh", "faults", "reasons"),
    ]
    assert cycle.cycles == 3 and cycle.last_cycle_at == 101.2 and len(seen) == 3
    assert "commit" not in log  # nothing pending: nothing decided


def test_a_workload_the_engine_fails_on_is_isolated_and_the_rest_is_committed() -> None:
    clock = Clock(10.0)
    store = FakeStore()
    ctx, _ = _context(store, clock)
    part = Recorder([], {"good": _queued("good", 1), "bad": _queued("bad", 2)})

    def engine() -> Engine:
        eng = Engine(Snapshot((), (), ()))
        real = eng.cycle

        def cycle(pending: Sequence[Workload], *a: Any, **k: Any) -> Decisions:
            if any(w.name == "bad" for w in pending):
                raise OverflowError("boom")
            return real(pending, *a, **k)

        eng.cycle = cycle  # type: ignore[method-assign]
        return eng

    def rebuild() -> None:
        ctx.engine = engine()

    part.rebuild = rebuild
    rebuild()
    cycle = _cycle(ctx, part)
    cycle.run()
    assert cycle.isolated == {"bad": "OverflowError: boom"}
    why = part.reasons["bad"]
    assert why.code == PendingCode.INVALID and "OverflowError: boom" in why.reason
    assert [(a.action, a.name) for a in store.audits] == [("workload.isolate", "bad")]
    assert len(part.committed) == 1
    # the good one was decided without it; the isolated one is held out of the next cycles
    assert part.committed[0][0].pending and all(p.workload != "bad" for p in part.committed[0][0].pending)
    clock.t = 11.0
    cycle.run()
    assert part.committed[1][1] == ["good"]


def test_the_pending_set_takes_in_only_what_is_still_pending_and_stores_only_changed_reasons() -> None:
    store = FakeStore({"a": "", "b": "QuotaExceeded: q is at its limit"})
    ctx, _ = _context(store, Clock(0.0))
    ps = PendingSet(ctx, resync_s=60.0)
    ps.resync_due = False  # the inbox alone
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for name, seq in (("a", 1), ("b", 2), ("gone", 3)):  # "gone" was cancelled before the cycle
        rec = SimpleNamespace(name=name, seq=seq, queue="q", owner="o", submitted_at=at, manifest={})
        ps.submitted(rec, _w(name))  # type: ignore[arg-type]
    assert ctx.wake.is_set() and len(ps.inbox) == 3
    ps.sync(1.0)
    assert list(ps.pending) == ["a", "b"] and not ps.inbox
    assert ps.pending["b"].model.arrival == 2.0  # its submit order, from the store's sequence
    ps.reasons["a"] = Pending("a", "q", PendingCode.QUOTA, "q is at its limit")
    ps.reasons["b"] = Pending("b", "q", PendingCode.QUOTA, "q is at its limit")  # as stored
    ps.store_reasons()
    ps.store_reasons()  # nothing changed since: no second write
    assert store.reason_writes == [{"a": "QuotaExceeded: q is at its limit"}]
    ps.forget("a")
    assert "a" not in ps.pending and "a" not in ps.reasons and "a" not in ps.stored_reasons


def test_the_context_marks_a_workload_its_backend_cannot_move() -> None:
    """``Capability.MOVABLE``: the model the engine gets says whether a consolidation move is
    possible, so none is planned that the backend would turn into a stop and requeue."""
    manifest = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "w", "annotations": {"pinned": "yes"}},
        "spec": {"queue": "q", "podGroups": [{"resources": {"nvidia.com/gpu": 1}}]},
    }
    pinned = SimpleNamespace(
        capabilities=frozenset({Capability.MOVABLE}),
        movable=lambda m: "pinned" not in m["metadata"]["annotations"],
    )
    ctx = Context(FakeStore(), pinned, Clock(0.0))  # type: ignore[arg-type]
    assert ctx.model_of(manifest, 1).movable is False
    manifest["metadata"]["annotations"] = {}  # type: ignore[index]
    assert ctx.model_of(manifest, 1).movable is True
    plain = Context(FakeStore(), SimpleNamespace(capabilities=frozenset()), Clock(0.0))  # type: ignore[arg-type]
    assert plain.model_of(manifest, 1).movable is True


def test_the_queue_tree_answers_its_lookups_and_caches_limits_per_configuration() -> None:
    qs = [
        Queue("org", quotas=(PoolQuota("p", devices_only(8000)),)),
        Queue(
            "team",
            parent="org",
            quotas=(PoolQuota("p", devices_only(2000), borrowing_limit=devices_only(1000)),),
        ),
    ]
    calls: list[int] = []
    eng = Engine(Snapshot((), (ResourcePool("p"),), tuple(qs)))

    def engine() -> Engine:
        calls.append(1)
        return eng

    tree = QueueTree(qs, engine)
    assert tree.is_in_subtree("team", "org") and not tree.is_in_subtree("org", "team")
    assert tree.queue_path("team") == ["team", "org"] and tree.is_leaf("team") and not tree.is_leaf("org")
    limit = tree.queue_limit_gpu_milli("team", "p")
    assert limit == tree.queue_limit_gpu_milli("team", "p") and len(calls) == 1  # cached
