"""Which placement slot (pod group, index) a pod of each kind fills, from the labels its
controller sets on it.

Why slots: the engine places pods by (group, index); binding the pod that its controller
numbered ``i`` into slot ``i`` keeps ranks and devices aligned (worker 2 of a PyTorchJob gets
worker 2's devices) and lets a restart match bound pods to placements exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

#: (group, index)
Slot = tuple[str, int]

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
PYTORCH_TYPE = "training.kubeflow.org/replica-type"
PYTORCH_INDEX = "training.kubeflow.org/replica-index"
STATEFULSET_INDEX = "apps.kubernetes.io/pod-index"
JOBSET_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
_ORDINAL = re.compile(r"-(\d+)$")


def _index(marks: Mapping[str, Any], key: str) -> int | None:
    value = marks.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _job_slot(marks: Mapping[str, Any], name: str, parallelism: Mapping[str, int]) -> Slot | None:
    i = _index(marks, COMPLETION_INDEX)
    return None if i is None else ("main", i)


def _pytorch_slot(marks: Mapping[str, Any], name: str, parallelism: Mapping[str, int]) -> Slot | None:
    rtype, i = marks.get(PYTORCH_TYPE), _index(marks, PYTORCH_INDEX)
    return (rtype.lower(), i) if isinstance(rtype, str) and i is not None else None


def _statefulset_slot(marks: Mapping[str, Any], name: str, parallelism: Mapping[str, int]) -> Slot | None:
    """The ordinal: the ``apps.kubernetes.io/pod-index`` label, else the name's ``-N`` suffix."""
    i = _index(marks, STATEFULSET_INDEX)
    if i is None and (m := _ORDINAL.search(name)):
        i = int(m.group(1))
    return None if i is None else ("main", i)


def _jobset_slot(marks: Mapping[str, Any], name: str, parallelism: Mapping[str, int]) -> Slot | None:
    """job index x the child Job's parallelism + the completion index, in the replicated job's group."""
    rjob, job = marks.get(JOBSET_JOB), _index(marks, JOBSET_INDEX)
    if not isinstance(rjob, str) or job is None:
        return None
    per_job = parallelism.get(rjob, 1)
    done = _index(marks, COMPLETION_INDEX)
    if done is None and per_job != 1:
        return None
    return (rjob, job * per_job + (done or 0))


_KIND_SLOT: dict[str, Callable[[Mapping[str, Any], str, Mapping[str, int]], Slot | None]] = {
    "Job": _job_slot,
    "PyTorchJob": _pytorch_slot,
    "StatefulSet": _statefulset_slot,
    "JobSet": _jobset_slot,
}


def slot_of(kind: str, marks: Mapping[str, Any], name: str, parallelism: Mapping[str, int]) -> Slot | None:
    """The slot of a pod of ``kind`` (its labels and annotations in ``marks``), or None when the
    kind numbers none; ``parallelism`` is each group's pods per child Job (JobSet)."""
    reader = _KIND_SLOT.get(kind)
    return reader(marks, name, parallelism) if reader is not None else None
