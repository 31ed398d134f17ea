"""QuotaState's read view (``keys``, ``figures``): what the service shows of the quota tree.

Why: the service's read model, preview and pending-reason text read guarantee, limit and use
through this view instead of the engine's internal G/U maps, so the engine may change how it
keeps them; the view must say what those maps say.
"""

from __future__ import annotations

from gpupool.engine.state.quota import QuotaFigures, QuotaState
from gpupool.model import NO_LIMIT, ZERO, PoolQuota, Queue, devices_only

POOL = "p"
TEN_GPUS = (10000, 0, 0, 0, 0)


def _tree() -> QuotaState:
    """org (16) -> team-a (8, may borrow 4) and team-b (8)."""
    qs = [
        Queue("org", quotas=(PoolQuota(POOL, devices_only(16000)),)),
        Queue(
            "team-a", "org", quotas=(PoolQuota(POOL, devices_only(8000), borrowing_limit=devices_only(4000)),)
        ),
        Queue("team-b", "org", quotas=(PoolQuota(POOL, devices_only(8000)),)),
    ]
    return QuotaState(qs, [POOL], {POOL: devices_only(16000)})


def test_the_view_says_what_the_tree_holds() -> None:
    q = _tree()
    q.add("team-a", POOL, TEN_GPUS)
    assert set(q.keys()) == {("org", POOL), ("team-a", POOL), ("team-b", POOL)}
    a = q.figures("team-a", POOL)
    assert a == QuotaFigures(devices_only(8000), devices_only(12000), TEN_GPUS)
    assert q.figures("org", POOL) == QuotaFigures(devices_only(16000), devices_only(16000), TEN_GPUS)
    b = q.figures("team-b", POOL)
    assert b is not None and b.used == ZERO and b.limit == NO_LIMIT
    assert q.figures("nobody", POOL) is None and q.figures("team-a", "other-pool") is None
