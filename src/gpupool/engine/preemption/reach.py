"""What a preemption search could remove at most: its removal sequence, run on quota alone.

Why: ``Preemptor._remove_until_fits`` evicts candidates one by one (each a release on
the cluster, the quota tree and the running set) and skips a candidate of another queue once
that queue no longer borrows. On the Philly replay most failing searches evict every candidate
they may and still fall short, because the borrowing queues stop borrowing long before their
work is gone; each then rolls everything back. The sequence of removals depends only on the
quota tree's usage, so it can be run first on a copy of the usage of the queues involved, and
the search's own cheap bounds (free GPU milli, whole free devices) applied to the workloads it
would remove: when they fail, the search could not succeed, and it is not run. Nothing else
changes: where the bound passes, the real search runs exactly as before.

Fair-sharing victims (``Candidate.sides``) are not simulated: whether one stays removed depends
on shares after it is gone, and one put back keeps its queue borrowing for later candidates;
with any of them among the candidates the bound is not applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.engine.decisions import PreemptRule
from gpupool.engine.preemption.floor import floored
from gpupool.model import Running, Vec

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.state.quota import QuotaState


def reachable(q: QuotaState, pool: str, cands: list[Candidate]) -> list[Running] | None:
    """The workloads the search would remove, in order, if no placement trial ever succeeded
    (so it went through every candidate): its rule, each candidate of another queue skipped
    unless that queue still borrows below the common ancestor (``cohorts.borrowing_below``)
    after the removals before it. None when a candidate is a fair-sharing victim or of a queue
    under a guarantee floor (``floor``)."""
    U, G, path = q.U, q.G, q.path
    usage: dict[tuple[str, str], Vec] = {}  # the usage changed by the removals so far
    gone: list[Running] = []
    within = PreemptRule.WITHIN_QUEUE
    for c in cands:
        if c.sides is not None or (c.rule is not within and floored(q, c.running.workload.queue)):
            return None  # a fair-sharing victim, or a guarantee floor the simulation does not know
        r = c.running
        nodes = path[r.workload.queue]
        if c.rule is not within and not _borrowing(nodes, pool, c.lca, U, G, usage):
            continue
        gone.append(r)
        g, cpu, mem, sto, net = r.admission.quota_vec()
        for n in nodes:
            key = (n, pool)
            u = usage.get(key) or U[key]
            usage[key] = (u[0] - g, u[1] - cpu, u[2] - mem, u[3] - sto, u[4] - net)
    return gone


def _borrowing(
    nodes: tuple[str, ...],
    pool: str,
    lca: str | None,
    U: dict[tuple[str, str], Vec],
    G: dict[tuple[str, str], Vec],
    usage: dict[tuple[str, str], Vec],
) -> bool:
    """``cohorts.borrowing_below`` on the usage after the simulated removals."""
    seen = False
    for n in nodes:
        if n == lca:
            break
        key = (n, pool)
        u = usage.get(key) or U[key]
        g = G[key]
        if u[0] <= g[0] and u[1] <= g[1] and u[2] <= g[2] and u[3] <= g[3] and u[4] <= g[4]:
            return False
        seen = True
    return seen
