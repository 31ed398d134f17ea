"""The quota tree's answers for hierarchical reclaim (Kueue's hierarchical cohorts).

Two questions the preemption rules and the borrowing rounds ask of ``state.QuotaState``: how far
up the tree an admission must reach to stay within a guarantee (``fit_depth``), and whether a
queue borrows as seen from a common ancestor (``borrowing_below``). See docs/engine.md,
"Quota and preemption semantics".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.model import ZERO, Vec, vadd, vle, vmax, vsub

if TYPE_CHECKING:
    from gpupool.engine.state.quota import QuotaState


def fit_depth(q: QuotaState, leaf: str, pool: str, vec: Vec) -> int | None:
    """How far up ``leaf``'s path an admission of ``vec`` must reach to stay within a
    guarantee: 0 when the leaf's own guarantee holds it, d when the queue d levels up is the
    lowest whose guarantee holds it (its own guarantee beyond its children's belongs to its
    subtree), None when only the cohort root could (the admission borrows from the whole
    cohort). A queue that is its own root counts as its own guarantee. ``vec`` may have
    negative parts (work to be evicted)."""
    path = q.path[leaf]
    E, R, G = q.E, q.R, q.G
    top = len(path) - 1 if len(path) > 1 else 1
    prev_old = prev_new = ZERO
    for depth in range(top):
        key = (path[depth], pool)
        old = E[key]
        if depth == 0:
            new = vadd(old, vec)
        else:
            r = R[(path[depth - 1], pool)]
            new = vadd(vsub(old, vmax(prev_old, r)), vmax(prev_new, r))
        if vle(new, G[key]):
            return depth
        prev_old, prev_new = old, new
    return None


def borrowing_below(
    q: QuotaState, leaf: str, pool: str, lca: str | None, usage: dict[tuple[str, str], Vec] | None = None
) -> bool:
    """Is ``leaf`` actively borrowing as seen from ``lca``: the leaf and every queue on its path
    below ``lca`` use more than their guarantee? A leaf within its own guarantee is never a
    reclaim source because an ancestor borrows, and a subtree within its guarantee lends among
    its own children only."""
    u = q.U if usage is None else usage
    seen = False
    for n in q.path[leaf]:
        if n == lca:
            break
        key = (n, pool)
        if vle(u[key], q.G[key]):
            return False
        seen = True
    return seen
