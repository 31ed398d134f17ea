"""Elastic shrink: a running elastic gang gives up only its pods above ``gang.minMember``.

Why: Volcano (the gang plugin's ``minAvailable``: "pods above minAvailable can be preempted")
and KAI (elastic workloads keep their minimum) preempt the extra pods of an elastic job before
the job itself; evicting the whole gang turns a two-pod loss into a whole-job loss.

How the search sees it: each candidate whose gang runs above its minimum is split in two, its
*extras* (the pods above ``gang_min``, the last of its placement) and its *rest* (the pods that
stay). Within a run of candidates of one tier, priority and cost (``victim_cost``) every extras
part goes before any whole workload or rest: taking extras loses less than killing a job. A rest
is taken only after its extras (together they are the whole workload, recorded as an eviction);
extras taken alone are a ``Shrink`` decision, trimmed to the fewest pods that still make room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import groupby
from typing import TYPE_CHECKING

from gpupool.engine.preemption.victim_cost import cost_key
from gpupool.model import PodPlacement, Running

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.session import Session
    from gpupool.model import EngineConfig

EXTRAS = "extras"
REST = "rest"


def extra_pods(r: Running) -> int:
    """How many pods ``r`` runs above its gang's minimum (0: not elastic, or at its minimum)."""
    w = r.workload
    if w.gang_min is None:
        return 0
    return max(0, len(r.admission.pods) - w.min_pods)


def with_pods(r: Running, pods: Sequence[PodPlacement]) -> Running:
    """``r`` with only ``pods`` (a part of its placement)."""
    return Running(r.workload, replace(r.admission, pods=tuple(pods)))


def split(cfg: EngineConfig, now: float, cands: list[Candidate]) -> list[Candidate]:
    """The candidates with every elastic gang above its minimum split into extras and rest;
    within each run of one (tier, priority, cost) the extras first, the order kept otherwise."""
    if not any(extra_pods(c.running) for c in cands):
        return cands
    out: list[Candidate] = []
    for _, group in groupby(cands, key=lambda c: _tie(c, cfg, now)):
        head: list[Candidate] = []
        tail: list[Candidate] = []
        for c in group:
            k = extra_pods(c.running)
            if k == 0 or c.part is not None:
                tail.append(c)
                continue
            r, pods = c.running, c.running.admission.pods
            head.append(replace(c, running=with_pods(r, pods[-k:]), part=EXTRAS, full=r))
            tail.append(replace(c, running=with_pods(r, pods[:-k]), part=REST, full=r))
        out += head + tail
    return out


def _tie(c: Candidate, cfg: EngineConfig, now: float) -> tuple[object, ...]:
    """What makes candidates alike for the search: tier, priority and (cost model on) cost."""
    v = c.running.workload
    cost = cost_key(c.running, now) if cfg.preemption_cost else None
    return (v.queue == c.preemptor.queue, v.priority, cost)


def release(ssn: Session, c: Candidate) -> None:
    """Take ``c`` off the state: the whole workload, or only its part."""
    if c.part is None:
        ssn.discharge(c.running)
    else:
        ssn.discharge_part(c.running)


def restore(ssn: Session, c: Candidate) -> None:
    """Put ``c`` back (the reverse of ``release``)."""
    if c.part is None:
        ssn.charge(c.running)
    else:
        assert c.full is not None
        ssn.charge_part(c.running, c.full)


def rest_too_early(c: Candidate, removed: Sequence[Candidate]) -> bool:
    """Is ``c`` a rest whose extras are not taken (the gang would fall below its minimum)?"""
    return c.part == REST and not any(x.part == EXTRAS and x.full is c.full for x in removed)


def pinned(c: Candidate, kept: Sequence[Candidate]) -> bool:
    """Are ``c`` extras whose rest is taken too (then they go with it: the whole workload)?"""
    return c.part == EXTRAS and any(x.part == REST and x.full is c.full for x in kept)


def whole_and_shrunk(victims: Sequence[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    """The victims as whole evictions (a rest stands for its whole workload; its extras drop
    out) and shrinks (extras without their rest)."""
    whole: list[Candidate] = []
    shrunk: list[Candidate] = []
    for c in victims:
        if c.part is None:
            whole.append(c)
        elif c.part == REST:
            assert c.full is not None
            whole.append(replace(c, running=c.full, part=None, full=None))
        elif not pinned(c, victims):
            shrunk.append(c)
    return whole, shrunk
