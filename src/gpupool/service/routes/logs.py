"""A workload's logs, of any attempt: ``GET /v1/workloads/{name}/logs`` and ``.../logs/attempts``.

Why here and read from the backend: only a backend keeps output. It offers ``run_logs``
(gpupool.service.backends.run_logs): the local backend one file per pod and attempt under its
state directory, the virtual cluster a synthetic line per attempt; a backend without it (the
Kubernetes one: read the pods with kubectl) answers 501. Attempts are numbered from 1 as the
workload's history counts its starts; ``previous`` is the one before the latest, as ``kubectl
logs --previous``. Reading follows the workload's read permission: whoever may see the workload
may read its output (a 404 outside the caller's subtree, as for the workload itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import IO, Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from gpupool.service import openapi as oa
from gpupool.service.backends import Capability, capability
from gpupool.service.backends.run_logs import AttemptLog, RunLogs, last_lines
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.openapi import READ, doc
from gpupool.service.routes.base import Caller, Svc

router = APIRouter()
#: a plain read returns at most the last this many bytes (follow streams everything after)
MAX_READ = 4 << 20
#: a follow ends when its attempt is over and its log has been quiet this long
QUIET_S = 1.0
FOLLOW_POLL_S = 0.25
TEXT = "text/plain; charset=utf-8"
#: the response header that says which attempt a read shows
ATTEMPT_HEADER = "X-Gpupool-Attempt"
LOG_CONTENT: dict[str, Any] = {
    "text/plain": {"schema": {"type": "string"}, "description": "the pod's output"}
}
NO_LOGS: dict[int | str, dict[str, Any]] = {
    501: {"model": oa.ErrorBody, "description": "this backend keeps no logs (Kubernetes: kubectl logs)"}
}


class AttemptItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    attempt: int = Field(description="1 for the first run, as the workload's history counts")
    pods: list[int] = Field(description="the ranks with output in this attempt")


class LogAttempts(BaseModel):
    model_config = ConfigDict(extra="allow")
    workload: str
    latest: int | None = Field(description="the latest attempt with logs (None: none yet)")
    items: list[AttemptItem]


def _source(svc: Service) -> RunLogs:
    logs: RunLogs | None = capability(svc.backend, Capability.RUN_LOGS)
    if logs is None:
        raise ApiError(
            501,
            f"the {svc.backend.name} backend keeps no logs (with gpupool serve --backend local each "
            "attempt's output is kept; on Kubernetes read the pods with kubectl logs)",
        )
    return logs


def _choose(name: str, have: list[AttemptLog], attempt: int | None, previous: bool) -> AttemptLog:
    """The attempt a read asks for (the latest by default), or a 404 naming the parameter."""
    if attempt is not None and previous:
        why = "give attempt or previous, not both"
        raise ApiError(422, why, [{"field": "previous", "problem": why}])
    if attempt is not None:
        field, what, found = "attempt", f"attempt {attempt}", [a for a in have if a.attempt == attempt]
    elif previous:
        field, what, found = "previous", "previous attempt", have[-2:-1]
    else:
        field, what, found = "attempt", "logs", have[-1:]
    if found:
        return found[0]
    listing = (
        f"attempts with logs: {', '.join(str(a.attempt) for a in have)}" if have else "it has not started yet"
    )
    raise ApiError(
        404, f"workload {name!r} has no {what} ({listing})", [{"field": field, "problem": listing}]
    )


def _pod(name: str, chosen: AttemptLog, pod: int) -> None:
    if pod not in chosen.pods:
        have = f"pods with logs: {', '.join(map(str, chosen.pods))}"
        raise ApiError(
            404,
            f"workload {name!r} has no log for pod {pod} in attempt {chosen.attempt} ({have})",
            [{"field": "pod", "problem": have}],
        )


def _running(svc: Service, name: str) -> bool:
    try:
        return svc.store.get_workload(name).phase in ("Admitted", "Running")
    except Exception:  # deleted meanwhile: nothing more will be written
        return False


def _over(svc: Service, logs: RunLogs, name: str, attempt: int) -> bool:
    """An attempt is over once a later one exists or the workload no longer runs."""
    later = any(a.attempt > attempt for a in logs.attempts(name))
    return later or not _running(svc, name)


def _follow(svc: Service, logs: RunLogs, name: str, at: tuple[int, int], tail: int | None) -> Iterator[bytes]:
    """The log from the start (or its last ``tail`` lines), then what is appended, until the
    attempt is over and its log has gone quiet."""
    attempt, pod = at
    quiet_since = time.monotonic()
    with logs.open(name, attempt, pod) as f:
        if tail is not None:
            yield last_lines(f, tail)
        while True:
            chunk = f.read(64 << 10)
            if chunk:
                quiet_since = time.monotonic()
                yield chunk
                continue
            if _over(svc, logs, name, attempt) and time.monotonic() - quiet_since >= QUIET_S:
                return
            time.sleep(FOLLOW_POLL_S)


def _read(f: IO[bytes], tail: int | None) -> bytes:
    """The log's last ``MAX_READ`` bytes, or its last ``tail`` lines within as many."""
    if tail is not None:
        data = last_lines(f, tail, MAX_READ)
        cut = "[gpupool: the start of these lines is left out]\n" if len(data) > MAX_READ else ""
        return cut.encode() + data[-MAX_READ:] if cut else data
    size = f.seek(0, 2)
    f.seek(max(0, size - MAX_READ))
    data = f.read(MAX_READ)
    if size > MAX_READ:
        data = f"[gpupool: the first {size - MAX_READ} bytes are left out]\n".encode() + data
    return data


@router.get("/v1/workloads/{name}/logs/attempts", tags=["workloads"], **doc(LogAttempts, *READ, 422))
def workload_log_attempts(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
    """Which attempts of the workload have logs, and for which pods (oldest first)."""
    name = svc.visible_workload(p, name).name  # the stored key
    have = _source(svc).attempts(name)
    return {"workload": name, "latest": have[-1].attempt if have else None, "items": [a.view() for a in have]}


@router.get(
    "/v1/workloads/{name}/logs",
    tags=["workloads"],
    response_class=Response,
    responses={200: {"content": LOG_CONTENT}, **doc(None, *READ, 422)["responses"], **NO_LOGS},
)
def workload_logs(
    name: str,
    p: Caller,
    svc: Svc,
    pod: Annotated[int, Query(ge=0, le=100_000, description="the pod's rank")] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=1_000_000, description="1-based; default the latest")
    ] = None,
    previous: Annotated[bool, Query(description="the attempt before the latest")] = False,
    tail_lines: Annotated[int | None, Query(alias="tailLines", ge=0, le=10_000_000)] = None,
    follow: bool = False,
) -> Response:
    """The output of one pod (its rank, default 0) of one attempt (default the latest);
    ``follow`` streams until that attempt is over. The answer's ``X-Gpupool-Attempt`` says which."""
    name = svc.visible_workload(p, name).name  # the stored key
    logs = _source(svc)
    chosen = _choose(name, logs.attempts(name), attempt, previous)
    _pod(name, chosen, pod)
    headers = {ATTEMPT_HEADER: str(chosen.attempt)}
    if follow:
        stream = _follow(svc, logs, name, (chosen.attempt, pod), tail_lines)
        return StreamingResponse(stream, media_type=TEXT, headers=headers)
    with logs.open(name, chosen.attempt, pod) as f:
        return Response(_read(f, tail_lines), media_type=TEXT, headers=headers)
