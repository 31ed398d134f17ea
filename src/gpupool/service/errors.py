"""The service's own typed errors: what a use-case (gpupool.service.usecases) or the Service
raises when a request cannot be carried out. Each carries the HTTP status and the located
problems that the HTTP layer (gpupool.service.routes.base.install_errors) turns into the JSON
error body; the CLI's direct paths, the Kubernetes source and the backends read the same
message and items. Why the status lives on the error: every caller outside HTTP still needs to
tell "not found" from "forbidden" from "invalid", and one number says it without a mapping that
could drift from the API's.
"""

from __future__ import annotations

from gpupool.audit import AuditEntry
from gpupool.service.admission import Refusal


class ApiError(Exception):
    """An error the client can act on; becomes the JSON error body."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []
        self.headers = headers  # e.g. Retry-After of a 429


class Denied(ApiError):
    """A 403 whose audit record the caller still has to write."""

    def __init__(self, message: str, entry: AuditEntry) -> None:
        super().__init__(403, message)
        self.entry = entry


def refusal_error(r: Refusal) -> ApiError:
    return ApiError(r.status, r.message, [{"field": r.field, "problem": r.problem}])
