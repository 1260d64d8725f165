"""One error shape for every answer that is not a success:
``{"error": {"code": str, "message": str, "field": str | null}}``.

pgjobs' own errors map by type (bad input 422, unknown job 404, conflicts 409, the database down
503 with ``Retry-After``); FastAPI's request validation (422, or 400 for malformed JSON) and
routing (404, 405) answer in the same shape; a path that a route has without its trailing slash
is a 404 naming that route (no redirect).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from pgjobs.errors import (
    BatchNotFound,
    ConfigurationError,
    DatabaseUnavailable,
    DependencyFailed,
    InvalidPayload,
    JobNotFound,
    JobStateConflict,
    LockTimeout,
    NotExternal,
    PgjobsError,
    PoolerMismatch,
    QueryFailed,
    QueueNotFound,
    ScheduleNotDeclared,
    ScheduleNotFound,
    SchemaMissing,
    StaleOutcome,
    UnknownDependency,
    UnknownTask,
)
from pgjobs.web.models import ErrorResponse

logger = logging.getLogger("pgjobs.web")

#: Seconds a client is told to wait (``Retry-After``) when the database cannot serve it.
RETRY_AFTER = 5

# pgjobs' errors by type, most specific first: (status, code).
_PGJOBS_ERRORS: tuple[tuple[type[PgjobsError], int, str], ...] = (
    (UnknownTask, 422, "unknown_task"),
    (UnknownDependency, 422, "unknown_dependency"),
    (DependencyFailed, 422, "dependency_failed"),
    (InvalidPayload, 422, "invalid_payload"),
    (ScheduleNotFound, 404, "schedule_not_found"),
    (QueueNotFound, 404, "queue_not_found"),
    (ConfigurationError, 422, "invalid_value"),
    (JobNotFound, 404, "job_not_found"),
    (BatchNotFound, 404, "batch_not_found"),
    (StaleOutcome, 409, "stale_outcome"),
    (NotExternal, 409, "not_external"),
    (JobStateConflict, 409, "job_state_conflict"),
    (ScheduleNotDeclared, 409, "schedule_not_declared"),
    (DatabaseUnavailable, 503, "database_unavailable"),
    (LockTimeout, 503, "lock_timeout"),
    (SchemaMissing, 503, "schema_missing"),
    # The server is behind a transaction-mode pooler it was not told about: its operator's to fix.
    (PoolerMismatch, 503, "pooler_mismatch"),
    (QueryFailed, 500, "query_failed"),
)

# Names of pgjobs' Python API that the HTTP API spells differently.
_FIELD_NAMES = {"run_in": "delay"}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


class ApiError(Exception):
    """An error the API answers as is (auth, limits, confirmations)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one error shape, as a response."""
    body = {"error": {"code": code, "message": message, "field": field}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def error_body(code: str, message: str, field: str | None = None) -> bytes:
    """The one error shape, as bytes (for the middleware that answers before any route)."""
    return bytes(error_response(500, code, message, field).body)


def api_field(field: str | None) -> str | None:
    """A pgjobs error's field as the API names it (``jobs[3].run_in`` -> ``jobs[3].delay``)."""
    if field is None:
        return None
    head, dot, last = field.rpartition(".")
    return f"{head}{dot}{_FIELD_NAMES.get(last, last)}"


def pgjobs_error_response(exc: PgjobsError) -> JSONResponse:
    """``exc`` in the one shape, its status chosen by its type."""
    status, code = 500, "internal_error"
    for kind, kind_status, kind_code in _PGJOBS_ERRORS:
        if isinstance(exc, kind):
            status, code = kind_status, kind_code
            break
    headers = {"Retry-After": str(RETRY_AFTER)} if status == 503 else None
    if status >= 500:
        # pgjobs' messages carry no secret: DSNs are redacted where they are built.
        logger.warning("%s: %s", code, exc)
    return error_response(status, code, str(exc), api_field(exc.field), headers)


def _validation_field(location: tuple[Any, ...]) -> str | None:
    """``("body", "jobs", 3, "priority")`` -> ``jobs[3].priority``; ``("query", "limit")`` ->
    ``limit``."""
    field = ""
    for part in location[1:]:
        if isinstance(part, int):
            field += f"[{part}]"
        else:
            field += f".{part}" if field else str(part)
    return field or None


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """FastAPI's request validation in the one shape: the first problem, naming its field;
    malformed JSON is a 400."""
    errors = exc.errors()
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    if first["type"] == "json_invalid":
        context = first.get("ctx")
        reason = context.get("error", "") if isinstance(context, dict) else ""
        return error_response(
            400, "malformed_json", f"the request body is not valid JSON: {reason}".rstrip(": ")
        )
    location = tuple(first.get("loc", ()))
    field = _validation_field(location)
    if first["type"] == "missing" and location == ("body",):
        return error_response(422, "validation_error", "a JSON request body is required")
    message = str(first.get("msg", "invalid value"))
    if field:
        message = f"{field}: {message}"
    more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return error_response(422, "validation_error", message, field)


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    """Routing and HTTP errors (404 no such route, 405) in the one shape."""
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 400 and message == "There was an error parsing the body":
        # FastAPI's words when its JSON parser raised something else than a syntax error.
        code = "malformed_json"
        message = "the request body could not be read as JSON (nested too deeply, or not UTF-8)"
    if exc.status_code == 404 and message == "Not Found":
        message = "no such route: see /api/v1/openapi.json for the API's routes"
    elif exc.status_code == 405:
        message = "method not allowed on this route"
    return error_response(exc.status_code, code, message, headers=exc.headers)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)

    async def on_pgjobs_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PgjobsError)
        return pgjobs_error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in (404, 405):
            route = _route_without_slash(app, request)
            if route is not None:
                return error_response(
                    404,
                    "not_found",
                    f"no such route: {request.url.path} ends with a slash; the route is {route}",
                )
        return http_error_response(exc)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(PgjobsError, on_pgjobs_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)


def _route_without_slash(app: FastAPI, request: Request) -> str | None:
    """The path of ``request`` without its trailing slashes, when a route answers its method
    there."""
    path = str(request.scope["path"])
    bare = path.rstrip("/")
    if not path.endswith("/") or not bare:
        return None
    scope = {**request.scope, "path": bare}
    if any(route.matches(scope)[0] is Match.FULL for route in app.router.routes):
        return str(request.scope.get("root_path", "")) + bare
    return None


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the error answers ``statuses``, all in the one shape."""
    described = {
        400: "Malformed JSON",
        401: "No bearer token, or an unknown one",
        403: "A read-only token on a route that writes",
        404: "No such job (or route)",
        408: "The request body did not arrive within the server's body timeout",
        409: "The job's state does not allow it, a stale outcome report, or a report for a job not delivered to an external worker",
        413: "The request body is larger than the server's limit",
        415: "The request body is not JSON",
        422: "Invalid input: the field at fault is named",
        429: "Too many failed tokens from this address; retry after Retry-After seconds",
        500: "An unexpected error (logged by the server)",
        503: "The database is unreachable or not migrated; retry after Retry-After seconds",
    }
    return {
        status: {"model": ErrorResponse, "description": described[status]} for status in statuses
    }
