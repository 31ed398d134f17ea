"""What an admission writes on its owner object, and takes back (``OwnerAdmission``).

``admit`` records the admission on the owner (``gpupool.io/admission``: the workload, its
placement, start, duration and decision) and unsuspends it; a Job admitted with fewer pods than
it asks for (Kueue's partial admission, ``translate/partial.py``) first has its parallelism
(and completions) lowered to the admitted count while still suspended, so its controller never
starts more pods than are placed. ``restore`` gives a re-suspended Job its counts back;
``release`` clears the record when a run ends (a failed one re-suspended, so its controller
starts no pod that no one will bind).

Why a part of its own, held by ``KubernetesBackend`` as ``admission``: these are the writes of
one record's life on one object, with nothing of the backend's runs, locks or binds; the backend
decides when (admit on ``start``, restore on ``stop``, release on ``forget``), this says what.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupool.kube.adapters.runs import KubeRun
from gpupool.kube.outcomes import owner_outcome
from gpupool.kube.runtime.evictor import Evictor
from gpupool.kube.translate import partial as translate_partial

log = logging.getLogger("gpupool.kube.backend")


class OwnerAdmission:
    """The admission record on an owner and a partial admission's counts (see the module)."""

    def __init__(self, evictor: Evictor) -> None:
        self.evictor = evictor

    def admit(self, run: KubeRun, obj: Mapping[str, Any]) -> None:
        """Record ``run``'s admission on its owner and unsuspend it (raises when it cannot)."""
        record = {
            "workload": run.name,
            "placement": run.placement,
            "startedAt": run.started_at,
            "durationS": run.duration_s,
            "decision": run.decision,
        }
        self._reduce(run, obj, record)
        self.evictor.admit(obj, record)

    def _reduce(self, run: KubeRun, obj: Mapping[str, Any], record: dict[str, Any]) -> None:
        """A partially admitted Job's counts lowered to the admitted pods (the counts go into
        the record); nothing for a Job admitted whole, or for another kind."""
        admitted = len(run.placement.get("pods") or ())
        patch = translate_partial.admit_patch(obj, admitted) if run.top[0] == "Job" else {}
        if not patch:
            return
        self.evictor.patch_owner(obj, patch)
        run.restore = translate_partial.restore_patch(patch)  # {} when the patch was a restore
        if run.restore and run.kw is not None:
            record.update(admittedPods=admitted, requestedPods=run.kw.pod_count)
            msg = f"admitted with {admitted} of {run.kw.pod_count} pods (partial admission)"
            self.evictor.event(obj, "PartiallyAdmitted", msg)

    def restore(self, run: KubeRun, obj: Mapping[str, Any]) -> None:
        """Give a suspended Job back the counts partial admission reduced (as Kueue does), so a
        later admission may run all its pods. Best effort: the translation reads the originals
        from the annotations either way."""
        try:
            if patch := run.restore or translate_partial.restore_patch(obj):
                self.evictor.patch_owner(obj, patch)
                run.restore = None
        except Exception:
            log.warning("restoring the parallelism of %s failed", run.name, exc_info=True)

    def release(self, run: KubeRun, obj: Mapping[str, Any]) -> None:
        """A finished run's owner forgets its admission (a failed one is re-suspended, so its
        controller does not start pods that no one will bind). Best effort, logged."""
        failed = run.outcome is not None and run.outcome.outcome == "Failed"
        suspend = failed and owner_outcome(obj) is None
        try:
            self.evictor.release(obj, suspend=suspend)
        except Exception:
            log.warning("clearing the admission of %s failed", run.name, exc_info=True)
            return
        if suspend:
            self.restore(run, obj)


__all__ = ["OwnerAdmission"]
