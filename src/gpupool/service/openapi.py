"""What the OpenAPI document says about the API: error answers, response bodies, content types.

Why a module of its own: the document is a contract that clients and the schemathesis fuzz
(tests/service/test_openapi_fuzz.py) check every answer against, so the declarations live together and
the routes in gpupool.service.api only name which of them apply (``**doc(...)``).

* Every error answer has the house body ``{"error": {"status", "message", "errors": [{"field",
  "problem"}]}}`` (:class:`ErrorBody`); :data:`ERRORS` holds one ``responses=`` entry per status.
* Success bodies are documented with the models below but not validated on the way out
  (``response_model=None``): the views are built as plain JSON already, and validating them
  again would cost CPU on every request without making them more correct; the fuzz test checks
  the answers against these schemas instead. The models allow extra fields, so adding a field
  to a view never makes an answer non-conforming.
* 405 answers carry ``Allow`` with every method of the path (:func:`allowed_methods`): Starlette
  only names the methods of the first route that matched the path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.routing import Match, Route

# ---------------------------------------------------------------------- errors


class ErrorItem(BaseModel):
    field: str = Field(description="the field to fix, e.g. spec.queue ('' when none applies)")
    problem: str = Field(description="what is wrong with it")


class ErrorDetail(BaseModel):
    status: int = Field(description="the HTTP status, repeated")
    message: str = Field(description="one line a person can act on")
    errors: list[ErrorItem] = Field(description="the fields at fault, one item each")


class ErrorBody(BaseModel):
    """The body of every 4xx/5xx answer."""

    error: ErrorDetail


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


ERRORS: dict[int, dict[str, Any]] = {
    400: _error("the request body could not be read (not JSON, or not in the declared encoding)"),
    401: _error("no token, or a token that is unknown or revoked"),
    403: _error("the token's role or queue subtree does not allow this; the reason is given"),
    404: _error("no such object, or a workload outside the caller's queue subtree"),
    409: _error("conflict with the stored state (in use, modified since read, already decided)"),
    413: _error("the request body is larger than the server accepts"),
    422: _error("invalid request or manifest; each field at fault is named"),
    503: _error("the store is unavailable or this replica is not the leader; retry"),
}
AUTH = (401, 503)
"""Every authenticated route: the token is checked against the store."""
READ = (*AUTH, 404)
WRITE = (*AUTH, 403, 409, 422)
BODY = (*WRITE, 400, 413)


def doc(
    ok: type[BaseModel] | None = None, *errors: int, status: int = 200, description: str = "success"
) -> dict[str, Any]:
    """Route keyword arguments declaring the success body ``ok`` and the error ``statuses``."""
    responses: dict[int | str, dict[str, Any]] = {code: ERRORS[code] for code in sorted(set(errors))}
    if ok is not None:
        responses[status] = {"model": ok, "description": description}
    return {"response_model": None, "responses": responses}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


AUDIT_EXPORT_CONTENT: dict[str, Any] = {
    "application/x-ndjson": _text("format=jsonl: one JSON audit record per line"),
    "text/csv": _text("format=csv: a header line, then one record per line"),
}
METRICS_CONTENT: dict[str, Any] = {"text/plain": _text("Prometheus text exposition format 0.0.4")}

# ---------------------------------------------------------------------- 405 and Allow


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on the request's path (HEAD with GET, as Starlette does)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)


# ---------------------------------------------------------------------- success bodies


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str = Field(description="ready or not ready (then 503)")
    problems: list[str]
    backend: dict[str, Any]


READY_DOC: dict[str, Any] = {
    "response_model": None,
    "responses": {
        200: {"model": Ready, "description": "ready"},
        503: {"model": Ready, "description": "not ready; the problems are listed"},
    },
}


class WhoAmI(BaseModel):
    name: str
    role: str
    scope: str | None


class IssuedToken(BaseModel):
    id: int
    name: str
    role: str
    scope: str | None
    token: str = Field(description="shown once; only its hash is stored")


class TokenInfo(BaseModel):
    id: int
    name: str
    role: str
    scope: str | None
    revoked: bool
    createdAt: str


class TokenList(BaseModel):
    items: list[TokenInfo]


class RevokedToken(BaseModel):
    id: int
    name: str
    revoked: bool


class ObjectMeta(BaseModel):
    name: str
    resourceVersion: str | None = Field(
        default=None, description="set by the server; sent back on PUT, a stale one answers 409"
    )
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Manifest(BaseModel):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]


class ConfigList(BaseModel):
    kind: str
    items: list[Manifest]


class ApplyResult(BaseModel):
    kind: str
    name: str
    result: str = Field(description="created, configured or unchanged")


class ApplyResults(BaseModel):
    results: list[ApplyResult]


class Deleted(BaseModel):
    kind: str
    name: str
    result: str
    resourceVersion: int


class WorkloadView(BaseModel):
    name: str = Field(description="the name its submitter wrote")
    key: str = Field(
        description="the stored key: the name, or the name and a digest of the submitter's scope "
        "when another scope already held the name"
    )
    queue: str
    priorityClass: str | None
    owner: str
    phase: str
    reason: str
    placement: dict[str, Any] | None
    submittedAt: str
    admittedAt: str | None
    finishedAt: str | None
    resourceVersion: int
    seq: int
    manifest: dict[str, Any]


class ListMeta(BaseModel):
    """Where a paged list goes on: pass ``continue`` back, unchanged, for the next page."""

    continue_: str | None = Field(
        None, alias="continue", description="token of the next page; null on the last page"
    )


class WorkloadList(BaseModel):
    items: list[WorkloadView]
    metadata: ListMeta


class Event(BaseModel):
    type: str
    reason: str
    message: str
    at: str


class EventList(BaseModel):
    items: list[Event]


class Explanation(BaseModel):
    name: str
    queue: str
    phase: str
    reason: str
    code: str | None = None
    position: int | None = None
    queueLength: int | None = None
    ahead: list[str] | None = None
    #: what the workload's type set, per field: ``{"value": ..., "from": "workload" | "queue
    #: <name>" | "cluster" | "packaged" | "none"}`` (docs/engine.md, "Task types")
    typeDefaults: dict[str, dict[str, Any]] | None = None
    #: an admitted workload's pods, and how many it asked for (partial admission admits fewer)
    admittedPods: int | None = None
    requestedPods: int | None = None
    #: a quota, capacity or topology wait (gpupool.service.holders, docs/service.md "Why a
    #: workload waits"): the scope ``{"kind": "pool" | "queue" | "cohort", "name", "pool"}``,
    #: the running work holding it (largest first; "(another team)" where the caller may not
    #: read it), the pool's and the queue's usage in one sentence, and the estimated start
    scope: dict[str, Any] | None = None
    holders: list[dict[str, Any]] | None = None
    holdersNotShown: int | None = None
    usage: str | None = None
    estimatedStart: str | None = None
    after: list[dict[str, Any]] | None = None
    estimate: str | None = None


class Approval(BaseModel):
    id: int
    workload: str
    queue: str
    state: str
    requestedBy: str
    approver: str | None
    reason: str
    requestedAt: str
    expiresAt: str


class ApprovalList(BaseModel):
    items: list[Approval]
    metadata: ListMeta


class DeviceView(BaseModel):
    index: int
    allocatedMilli: int
    workloads: list[dict[str, Any]]


class NodeView(BaseModel):
    name: str
    gpuModel: str
    gpus: int
    gpuAllocated: float
    pool: str | None
    schedulable: bool
    rack: str
    nvlinkDomain: str
    devices: list[DeviceView] | None = None


class NodeList(BaseModel):
    items: list[NodeView]


class Cordoned(BaseModel):
    name: str
    schedulable: bool


class PoolView(BaseModel):
    name: str
    gpus: float
    gpuAllocated: float
    nodes: int
    preemptible: bool
    requiresApproval: bool
    pricePerGPUHour: float | None


class ClusterView(BaseModel):
    nodes: int
    gpus: int
    pools: list[PoolView]
    pending: int
    running: int
    cycles: int
    backend: dict[str, Any]


class Resources(BaseModel):
    """A quota vector; null is ungoverned (no limit, or no guarantee of that resource).
    ``gpu`` counts the pool's accelerators of whatever kind (GPUs or NPUs)."""

    gpu: float | None
    cpu: float | None
    memoryMiB: float | None
    ephemeralStorageMiB: float | None = None
    networkMbps: float | None = None


class QuotaItem(BaseModel):
    queue: str
    pool: str
    parent: str | None
    guarantee: Resources | None
    limit: Resources | None
    used: Resources | None


class QuotaList(BaseModel):
    items: list[QuotaItem]


class AuditWitnessView(BaseModel):
    """The newest signed checkpoint of the server's audit witness, and where it is kept."""

    count: int
    headHash: str
    at: str
    server: str
    keyId: str
    signature: str
    where: str


class AuditVerify(BaseModel):
    ok: bool
    count: int
    headHash: str
    firstBadSeq: int | None
    problem: str
    witness: AuditWitnessView | None = None


class AuditRecordView(BaseModel):
    seq: int
    at: str
    actor: str
    action: str
    kind: str
    name: str
    detail: dict[str, Any]
    prev_hash: str
    hash: str


class AuditList(BaseModel):
    items: list[AuditRecordView]


class History(BaseModel):
    """The dashboard's charts: one value per instant of ``times`` in each series."""

    hours: float
    times: list[str] = Field(description="ISO 8601 instants, evenly spaced, oldest first")
    pools: dict[str, list[float]] = Field(description="GPUs allocated in each pool")
    pending: dict[str, list[int]] = Field(description="workloads pending in each queue")


# ---------------------------------------------------------------------- the bearer scheme

#: the name of the security scheme in ``components.securitySchemes``
BEARER = "bearerAuth"


def declare_bearer(schema: dict[str, Any]) -> dict[str, Any]:
    """The document with the bearer scheme declared and required by every route that answers 401.

    Why: without it a generated client has no way to send the token, and tools such as
    Swagger UI's "Authorize" button do not appear."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a gpupool API token (gpt_...) or an OIDC ID token from the configured issuer",
    }
    for item in schema.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict) and "401" in op.get("responses", {}):
                op["security"] = [{BEARER: []}]
    return schema


def install_bearer(app: Any) -> None:
    """Make ``app.openapi()`` (and so /openapi.json) declare the bearer scheme; built once."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = declare_bearer(build())
        return app.openapi_schema

    app.openapi = openapi
