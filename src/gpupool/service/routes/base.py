"""What every route module shares: the Service the endpoints work with, the ApiError every
refusal becomes, the JSON error handlers, and the Caller/Svc dependencies.

Why these conventions:
* Every error is JSON ``{"error": {"status", "message", "errors": [{"field", "problem"}]}}`` with
  a 4xx status that says what to fix; no request can produce a traceback.
* Workloads outside a caller's queue subtree are answered 404 for every verb (read, cancel,
  approve...), so a tenant cannot even learn that another team's workload exists; acting on a
  queue the caller may see but not use (submit to another team's queue, manage config without
  the role) is 403 with the reason from gpupool.auth.
* Every mutation is written with its audit record in the same store transaction; denied
  mutations are audited too.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.auth import Principal, parse_bearer
from gpupool.manifests import ManifestError
from gpupool.manifests.convert import (
    error_items,
)
from gpupool.service import openapi as oa
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.store import StoreError

log = logging.getLogger("gpupool.api")

#: the detail of the 400 FastAPI raises when it cannot read a JSON body (see ``install_errors``)
FASTAPI_BODY_ERROR = "There was an error parsing the body"
#: the largest id or sequence number any store column holds (a signed 64-bit integer)
MAX_ID = 2**63 - 1


def _err(
    status: int, message: str, errors: list[dict[str, str]] | None = None, extra: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"status": status, "message": message, "errors": errors or []}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if extra:
        headers = {**(headers or {}), **extra}
    return JSONResponse(body, status_code=status, headers=headers)


async def principal(request: Request) -> Principal:
    svc: Service = request.app.state.svc
    header = request.headers.get("authorization")
    token = parse_bearer(header)
    if token is not None:
        hit = svc.cached_principal(token)
        if hit is not None:
            return hit
    return await run_in_threadpool(svc.authenticate, header)


async def _svc(request: Request) -> Service:
    svc: Service = request.app.state.svc
    return svc


Caller = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(_svc)]


#: what a request body that is absent or not a JSON object is told, on every route
BODY_MISSING = "the request body must be a JSON object; none was sent"
BODY_NOT_OBJECT = "the request body must be a JSON object"


def body_error(problem: str) -> ApiError:
    """The 422 for a request body that is not a JSON object: located at ``body``."""
    return ApiError(422, f"invalid request: body: {problem}", [{"field": "body", "problem": problem}])


def undecodable(exc: BaseException | None) -> str:
    """What is wrong with a body that could not even be read as JSON text."""
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"{BODY_NOT_OBJECT} in UTF-8; byte 0x{exc.object[exc.start]:02x} at character "
            f"{exc.start} is not UTF-8"
        )
    return f"{BODY_NOT_OBJECT}; it could not be read ({type(exc).__name__ if exc else 'unreadable'})"


def json_object(raw: bytes, content_type: str | None = None) -> dict[str, Any]:
    """A JSON object request body, or the 422 located at ``body`` that every route gives."""
    try:
        value = json.loads(raw) if raw else None
    except UnicodeDecodeError as exc:
        raise body_error(undecodable(exc)) from None
    except ValueError as exc:
        if content_type and "json" not in content_type.lower():  # as FastAPI's routes say it
            raise body_error(_not_object(raw)) from None
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else 0
        raise body_error(f"invalid JSON at character {pos}") from None
    if not isinstance(value, dict):
        raise body_error(BODY_MISSING if value is None and not raw else _not_object(value))
    return value


#: pydantic's error types for a body that is absent or not a JSON object at all
_WHOLE_BODY = frozenset({"missing", "dict_type", "model_type", "model_attributes_type"})


def _not_object(value: Any) -> str:
    if isinstance(value, bytes | bytearray):  # not read as JSON: no JSON content type was sent
        return f"{BODY_NOT_OBJECT} sent with content-type application/json"
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value))
    return f"{BODY_NOT_OBJECT}, not {kind or 'a number'}"


def install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return _err(exc.status, exc.message, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        items = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":  # its loc is ("body", offset): the field is the body
                where = e.get("loc", ("body", "?"))[-1]
                items.append({"field": "body", "problem": f"invalid JSON at character {where}"})
                continue
            # the body as a whole is absent or not an object (not a check of the whole model:
            # a model-level validator's own message is kept below)
            if tuple(e.get("loc", ())) == ("body",) and e.get("type") in _WHOLE_BODY:
                missing = e.get("type") == "missing"
                problem = BODY_MISSING if missing else _not_object(e.get("input"))
                items.append({"field": "body", "problem": problem})
                continue
            loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "path", "header")]
            items.append(
                {"field": ".".join(loc) or str((e.get("loc") or ["body"])[0]), "problem": str(e.get("msg"))}
            )
        msg = "invalid request: " + "; ".join(f"{i['field']}: {i['problem']}" for i in items)
        return _err(422, msg, items)

    @app.exception_handler(ManifestError)
    async def _manifest(_: Request, exc: ManifestError) -> JSONResponse:
        items = error_items(exc)
        return _err(422, f"{len(items)} problem(s) in the manifest; nothing was applied", items)

    @app.exception_handler(StoreError)
    async def _store(_: Request, exc: StoreError) -> JSONResponse:
        return _err(exc.status_code, str(exc), [{"field": exc.field, "problem": exc.problem}])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
            # FastAPI's answer when the body is not even JSON text (not UTF-8, say): it named
            # nothing; located at the body like every other body error
            e = body_error(undecodable(exc.__cause__))
            return _err(e.status, e.message, e.errors)
        msg = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404:
            msg = "no such endpoint; see /docs or /openapi.json"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette's Allow names only the first matching route's methods
            headers["Allow"] = ", ".join(oa.allowed_methods(request))
            msg = f"method {request.method} is not allowed on {request.url.path}; use {headers['Allow']}"
        resp = _err(exc.status_code, msg)
        resp.headers.update(headers)
        return resp

    @app.exception_handler(Exception)
    async def _any(_: Request, exc: Exception) -> JSONResponse:  # last resort: never a traceback
        log.exception("unhandled error")
        return _err(500, f"internal error ({type(exc).__name__}); the request was not applied")
