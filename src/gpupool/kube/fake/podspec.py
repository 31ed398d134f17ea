"""Which changes the real API server allows to a pod's spec after creation.

Why the fake checks it: a client that works against the fake only because the fake let it grow
a pod's container list (or move it to a node without ``pods/binding``) would fail on a cluster.
The rule is the real server's (``ValidatePodUpdate``): images of containers and init
containers, ``activeDeadlineSeconds`` (set, or shortened: never lengthened nor removed),
``terminationGracePeriodSeconds`` only from a negative value to 1, additions to
``tolerations``, removals from ``schedulingGates``, and, while the pod is still gated,
``nodeSelector`` and ``affinity`` (scheduling directives may be narrowed before scheduling).
A running pod's grace period is fixed at creation: the fake once let it change, and a test
that relied on that failed on the real server (issue 24).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

MESSAGE = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
    "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)

_FREE = ("activeDeadlineSeconds",)


def _without_images(containers: Any) -> Any:
    if not isinstance(containers, list):
        return containers
    return [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in containers]


def _comparable(spec: Obj, gated: bool, old_grace: Any = None) -> Obj:
    out = {k: v for k, v in spec.items() if k not in _FREE and k not in ("tolerations", "schedulingGates")}
    if isinstance(old_grace, int) and old_grace < 0 and out.get("terminationGracePeriodSeconds") == 1:
        out["terminationGracePeriodSeconds"] = old_grace  # the one change allowed
    for field in ("containers", "initContainers"):
        if field in out:
            out[field] = _without_images(out[field])
    if gated:
        out.pop("nodeSelector", None)
        out.pop("affinity", None)
    return out


CONTAINERS_MESSAGE = "Forbidden: pod updates may not add or remove containers"


def containers_kept(old: Obj, new: Obj) -> bool:
    """Whether the update keeps the pod's containers (the same names, in order)."""
    names = [[c.get("name") for c in s.get("containers") or [] if isinstance(c, dict)] for s in (old, new)]
    return names[0] == names[1]


def update_allowed(old: Obj, new: Obj) -> bool:
    """Whether a pod whose spec is ``old`` may be updated to ``new``."""
    old_tol, new_tol = old.get("tolerations") or [], new.get("tolerations") or []
    if any(t not in new_tol for t in old_tol):
        return False
    old_gates, new_gates = old.get("schedulingGates") or [], new.get("schedulingGates") or []
    if any(g not in old_gates for g in new_gates):
        return False
    grace = old.get("terminationGracePeriodSeconds")
    return _comparable(old, bool(old_gates)) == _comparable(new, bool(old_gates), grace)


def deadline_refusal(old: Obj, new: Obj) -> str | None:
    """Why ``activeDeadlineSeconds`` may not change from ``old``'s to ``new``'s (the real
    server's words after ``spec.activeDeadlineSeconds: ``), or None when it may."""
    was, now = old.get("activeDeadlineSeconds"), new.get("activeDeadlineSeconds")
    if now is None:
        return 'Invalid value: "null": must not update from a positive integer to nil value' if was else None
    if not isinstance(now, int) or now < 0 or now > 2**31 - 1:
        return f"Invalid value: {now}: must be between 0 and 2147483647, inclusive"
    if isinstance(was, int) and was < now:
        return f"Invalid value: {now}: must be less than or equal to previous value"
    return None
