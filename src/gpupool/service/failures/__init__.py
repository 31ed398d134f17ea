"""Failures in the live service: failed runs, node faults and the workloads a cycle fails on.

Map, one idea a module:

- ``policy``: the pure parts: what a workload's retry policy is (``RetryPolicy``, ``policy_for``),
  what a fault is (``Fault``, ``FaultState``), the run hints and the annotations they read
- ``record``: recording failed runs (``record_failures``): a requeue after its backoff, an
  at-once requeue (a platform fault) or the final Failed; the backoffs restored after a restart
- ``nodes``: node faults and device health: which running work a removed node, an untolerated
  ``NoExecute`` taint, a failed node, a drain or an unhealthy device displaces, and the
  evictions that follow
- ``culprits``: the workloads a scheduling cycle fails on, found and held out so that one bad
  submission never stops the rest

A stored ``RunFailed`` event read back is ``gpupool.store.failure_events``; the REST verbs are
``gpupool.service.routes.faults`` over the use-cases ``usecases.drain`` and
``usecases.device_health``.

Why apart from the controller: the controller owns every phase change, but what to do with a
failed run (how long to back off, when to give up, what to record) and which running work a
node fault must displace are policies; keeping them here keeps the controller's cycle readable
and lets the policy be tested on its own.

Durability: every failure is one transaction that changes the phase (``Running -> Pending`` for a
retry, ``-> Failed`` when the retries are spent) and appends a ``RunFailed`` event and an audit
record. The event's message ends with a machine-readable tail (``[exit-code=137 retry-at=...]``),
so the attempt history and the backoff's "not before" are derived from stored events after a
restart: nothing about a backoff lives only in memory.

Node faults: a node removed from the configuration, a ``NoExecute`` taint a workload does not
tolerate and a drain are *evictions* (requeued at once, not counted against ``maxRetries``); a
node failure reported by the backend and an unhealthy device are *failures* of the run recorded
as such, but faults of the platform: requeued at once, not counted against ``maxRetries`` (up to
``MAX_PLATFORM_REQUEUES`` of them). Evictions are write-ahead like preemptions:
``Preempted`` with the reason is committed, the backend stops the run, then it is requeued.
"""
