"""API errors as the real server reports them: a ``Status`` object with code, reason and message.

Why exact: client libraries branch on ``reason`` and ``code`` (lightkube raises ApiError with
``status.code``; kubectl prints ``Error from server (NotFound): ...`` from ``reason``/``message``).
"""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """An error the HTTP layer turns into a ``Status`` body with the same code."""

    def __init__(self, code: int, message: str, reason: str = "", details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        """The error as a ``kind: Status`` object."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        }
        if self.reason:  # the real server omits an unknown (empty) reason
            out["reason"] = self.reason
        if self.details is not None:
            out["details"] = self.details
        return out


def unwrapped(message: str) -> ApiError:
    """An error the real server's storage returns as a plain Go error, not a ``StatusError``
    (the binding subresource's field validation): it reaches the client as a 500 with no reason
    and the bare message."""
    err = ApiError(500, message)
    err.reason = ""
    return err


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    res = f"{resource}.{group}" if group else resource
    return ApiError(
        404, f'{res} "{name}" not found', "NotFound", {"name": name, "group": group, "kind": resource}
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    res = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        f'{res} "{name}" already exists',
        "AlreadyExists",
        {"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, name: str, why: str, group: str = "") -> ApiError:
    res = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {res} "{name}": {why}',
        "Conflict",
        {"name": name, "group": group, "kind": resource},
    )


def invalid(kind: str, name: str, field: str, why: str) -> ApiError:
    return ApiError(
        422,
        f'{kind} "{name}" is invalid: {field}: {why}',
        "Invalid",
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def success(name: str = "", kind: str = "", code: int = 200) -> dict[str, Any]:
    """A success ``Status`` (what binding, eviction and delete-collection return)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
        "details": {"name": name, "kind": kind},
    }
