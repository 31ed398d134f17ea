"""Preemption, one idea per module (as Kueue's ``pkg/scheduler/preemption/``):

- ``ordering``: who goes first (``candidate_order``) and the within-queue and threshold rules;
- ``candidates``: who may be evicted for a workload, by which rule (``CandidateFinder``);
- ``bounds``: the cheap checks that show no order of the candidates makes room;
- ``reach``: what a search could remove at most, run on quota alone;
- ``slots``: whole free devices by count, a necessary condition for a placement;
- ``fair_sharing``: fair-sharing preemption between the sides of a cohort;
- ``victim_cost``: the cost model (lost work, waiting for work about to end, cooldown);
- ``search``: the ``Preemptor``, which removes candidates until the workload fits, gives back
  every victim not needed and admits it.
"""
