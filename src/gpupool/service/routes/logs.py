"""A workload's logs: ``GET /v1/workloads/{name}/logs?pod=N&follow=true``.

Why here and read from the backend: only a backend that runs processes has logs (the local
backend writes each pod's output to a file under its state directory); the virtual cluster has
none and says so with a 501. Reading follows the workload's read permission: whoever may see the
workload may read its output (a 404 outside the caller's subtree, as for the workload itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse

from gpupool.service import openapi as oa
from gpupool.service.openapi import READ, doc
from gpupool.service.routes.base import ApiError, Caller, Service, Svc

router = APIRouter()
#: a plain read returns at most the last this many bytes (follow streams everything after)
MAX_READ = 4 << 20
#: a follow ends when the workload no longer runs and its log has been quiet this long
QUIET_S = 1.0
FOLLOW_POLL_S = 0.25
LOG_CONTENT: dict[str, Any] = {
    "text/plain": {"schema": {"type": "string"}, "description": "the pod's output"}
}
NO_LOGS: dict[int | str, dict[str, Any]] = {
    501: {"model": oa.ErrorBody, "description": "this backend keeps no logs (the virtual cluster)"}
}


def _log_file(svc: Service, name: str, pod: int) -> Path:
    find = getattr(svc.backend, "log_path", None)
    if not callable(find):
        raise ApiError(
            501,
            f"the {svc.backend.name} backend keeps no logs: its workloads run no processes "
            "(logs exist with gpupool serve --backend local)",
        )
    path = find(name, pod)
    if path is None:
        pods: list[int] = getattr(svc.backend, "log_pods", lambda n: [])(name)
        have = f"pods with logs: {', '.join(map(str, pods))}" if pods else "it has not started yet"
        raise ApiError(
            404,
            f"workload {name!r} has no log for pod {pod} ({have})",
            [{"field": "pod", "problem": have}],
        )
    return Path(path)


def _running(svc: Service, name: str) -> bool:
    try:
        return svc.store.get_workload(name).phase in ("Admitted", "Running")
    except Exception:  # deleted meanwhile: nothing more will be written
        return False


def _follow(svc: Service, name: str, path: Path) -> Iterator[bytes]:
    """The log from the start, then what is appended, until the workload stops and goes quiet."""
    quiet_since = time.monotonic()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(64 << 10)
            if chunk:
                quiet_since = time.monotonic()
                yield chunk
                continue
            if not _running(svc, name) and time.monotonic() - quiet_since >= QUIET_S:
                return
            time.sleep(FOLLOW_POLL_S)


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
    pod: Annotated[int, Query(ge=0, le=100_000)] = 0,
    follow: bool = False,
) -> Response:
    """The output of one pod (its rank, default 0) of the workload's latest run; ``follow``
    streams until the workload stops running."""
    svc.visible_workload(p, name)
    path = _log_file(svc, name, pod)
    if follow:
        return StreamingResponse(_follow(svc, name, path), media_type="text/plain; charset=utf-8")
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > MAX_READ:
            f.seek(size - MAX_READ)
        data = f.read(MAX_READ)
    if size > MAX_READ:
        data = f"[gpupool: the first {size - MAX_READ} bytes are left out]\n".encode() + data
    return Response(data, media_type="text/plain; charset=utf-8")
