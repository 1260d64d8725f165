"""The HTTP API as an ASGI application: ``create_app``, the connection pool it serves from, and
the guards in front of the routes (body limit, media type, tokens, the last-resort 500).

Endpoints are plain functions: FastAPI runs them in its thread pool, each holding one pooled
connection for the length of the request (the operations below them are synchronous psycopg).
The pool is bounded (``pool_size``) and opened on the first request that needs the database, so
the server starts, and answers ``/healthz``, while the database is down; a request that cannot
get a connection within ``POOL_WAIT`` seconds gets 503 with ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import psycopg
import psycopg_pool
from fastapi import FastAPI
from fastapi.security import HTTPAuthorizationCredentials
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobs import db
from pgjobs.app import App
from pgjobs.db.dsn import Dsn, resolve_dsn
from pgjobs.errors import ConfigurationError
from pgjobs.web import errors
from pgjobs.web.auth import Access, Tokens, load_tokens
from pgjobs.web.errors import ApiError
from pgjobs.web.metrics import QueueMetrics

logger = logging.getLogger("pgjobs.web")

API_PREFIX = "/api/v1"
#: Bytes a request body may have unless told otherwise: a batch of 1,000 jobs with small
#: payloads takes about 150 kB. Bigger payloads belong in object storage, referenced by the job;
#: raise it with ``max_body_bytes`` / ``--max-body-bytes`` (the payload limit is 16 MiB).
DEFAULT_MAX_BODY_BYTES = 1_048_576
#: Connections the server holds at most unless told otherwise.
DEFAULT_POOL_SIZE = 10
#: Seconds a request waits for a pooled connection before answering 503.
POOL_WAIT = 5.0
_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class Backend:
    """What the routes share: the database, its pool, the app's tasks and the tokens. Held in
    ``app.state.pgjobs``; ``close()`` closes the pool (the lifespan does it at shutdown)."""

    def __init__(
        self,
        app: App,
        dsn: Dsn,
        *,
        tokens: Tokens,
        app_given: bool,
        pool_size: int,
        metrics_public: bool,
    ) -> None:
        self.app = app
        self.dsn = dsn
        self.tokens = tokens
        #: Whether the server was given the user's App (unknown task names are then refused).
        self.app_given = app_given
        self.pool_size = pool_size
        self.metrics_public = metrics_public
        #: The queue metrics /metrics serves (their counters live as long as the app).
        self.metrics = QueueMetrics()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._lock = threading.Lock()

    def pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The pool, opened on first use; ``DatabaseUnavailable`` while the database cannot be
        reached (the next request tries again)."""
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                pool = db.open_pool(self.dsn, self.pool_size)
                # A request waits this long for a connection, then answers 503.
                pool.timeout = POOL_WAIT
                self._pool = pool
            return self._pool

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection, errors translated to ``pgjobs.errors``."""
        with db.pooled(self.pool(), self.dsn) as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def backend(request: Request) -> Backend:
    """The ``Backend`` of the app serving ``request`` (a FastAPI dependency)."""
    found: Backend = request.app.state.pgjobs
    return found


def check_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None, *, write: bool
) -> None:
    """Let the request through, or raise 401 (no or unknown token) / 403 (a read-only token on
    a route that writes)."""
    tokens = backend(request).tokens
    if not tokens.configured:
        return
    challenge = {"WWW-Authenticate": 'Bearer realm="pgjobs"'}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401,
            "unauthenticated",
            "this route needs a token: send the header Authorization: Bearer <token>",
            headers=challenge,
        )
    access = tokens.access(credentials.credentials)
    if access is None:
        raise ApiError(
            401,
            "unauthenticated",
            "the bearer token is not one of this server's tokens",
            headers={"WWW-Authenticate": 'Bearer realm="pgjobs", error="invalid_token"'},
        )
    if write and access is Access.READ_ONLY:
        raise ApiError(
            403,
            "forbidden",
            "this token is read-only: it may use GET routes only",
        )


class _Guards:
    """ASGI middleware in front of the routes: refuses a body larger than ``max_body_bytes``
    (413; by its Content-Length before reading, else while reading, never buffering more than
    the limit), a body that is not JSON on a method that takes one (415), and turns an
    unexpected exception into a 500 in the one error shape, logged once."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            refusal, replay = await self._read_body(scope, receive)
            if refusal is not None:
                await self._answer(send_tracked, *refusal)
                return
            await self.app(scope, replay, send_tracked)
        except Exception:
            # Nothing of the request but its method and path: headers may hold a token.
            logger.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            if not started:
                await self._answer(
                    send_tracked,
                    500,
                    "internal_error",
                    "unexpected server error; it was logged (see the server's log)",
                )

    async def _read_body(
        self, scope: Scope, receive: Receive
    ) -> tuple[tuple[int, str, str] | None, Receive]:
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        too_large = (
            413,
            "payload_too_large",
            f"the request body is larger than this server's limit of {self.max_body_bytes:,} "
            "bytes (send fewer jobs per batch, or store large data elsewhere)",
        )
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return too_large, receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None, _replay([message], receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large, receive
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if (
            body
            and scope["method"] in _METHODS_WITH_BODY
            and not _is_json(headers)
            and not _is_dashboard_form(scope, headers)
        ):
            return (
                415,
                "unsupported_media_type",
                "the request body must be JSON: send Content-Type: application/json",
            ), receive
        return None, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)

    @staticmethod
    async def _answer(send: Send, status: int, code: str, message: str) -> None:
        body = errors.error_body(code, message)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _is_json(headers: Headers) -> bool:
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _is_dashboard_form(scope: Scope, headers: Headers) -> bool:
    """An HTML form posted to the dashboard (outside /api/v1), which reads it itself."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/x-www-form-urlencoded" and not path.startswith(API_PREFIX)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then waits on the real one (for a
    disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def create_app(
    app: App | None = None,
    *,
    dsn: str | Dsn | None = None,
    tokens: Iterable[str] | None = None,
    read_only_tokens: Iterable[str] | None = None,
    insecure_no_auth: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    pool_size: int = DEFAULT_POOL_SIZE,
    metrics_public: bool | None = None,
) -> FastAPI:
    """The HTTP API (FastAPI) over pgjobs' tables, to serve with any ASGI server or mount in
    your own application.

    ``app``: your ``pgjobs.App``; its tasks' names are then the only ones accepted, and its DSN
    is used unless ``dsn`` is given. Without either, the DSN comes from $PGJOBS_DATABASE_URL,
    $DATABASE_URL or the embedded server, as for every command. ``tokens``/``read_only_tokens``
    default to the environment (see ``pgjobs.web.auth``); with no token at all the app refuses to
    be built (``ConfigurationError``) unless ``insecure_no_auth``, which it logs as a warning.
    ``metrics_public`` lets /metrics answer without a token (default: $PGJOBS_METRICS_PUBLIC=1).

    Example::

        from fastapi import FastAPI
        import pgjobs.web
        from myproject.tasks import app as pgjobs_app

        site = FastAPI()
        site.mount("/jobs", pgjobs.web.create_app(pgjobs_app))  # /jobs/api/v1/...
    """
    from pgjobs.web import api
    from pgjobs.web.dashboard import dashboard_router

    if (
        isinstance(max_body_bytes, bool)
        or not isinstance(max_body_bytes, int)
        or max_body_bytes < 1
    ):
        raise ConfigurationError(
            f"max_body_bytes must be a whole number >= 1, got {max_body_bytes!r}",
            field="max_body_bytes",
        )
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
        raise ConfigurationError(
            f"pool_size must be in 1..1000, got {pool_size!r}", field="pool_size"
        )
    loaded = load_tokens(tokens, read_only_tokens)
    if insecure_no_auth and loaded.configured:
        raise ConfigurationError(
            "API tokens are configured and insecure_no_auth (--insecure-no-auth) is set: "
            "drop one of them"
        )
    if not insecure_no_auth and not loaded.configured:
        raise ConfigurationError(
            "no API token: set $PGJOBS_API_TOKENS (comma-separated) or $PGJOBS_API_TOKENS_FILE, "
            "or pass --insecure-no-auth (insecure_no_auth=True) for local use only"
        )
    if app is not None and dsn is None:
        resolved = app.dsn
    else:
        resolved = dsn if isinstance(dsn, Dsn) else resolve_dsn(dsn)
    if metrics_public is None:
        metrics_public = api.metrics_public_from_env()
    state = Backend(
        app if app is not None else _bare_app(resolved),
        resolved,
        tokens=loaded,
        app_given=app is not None,
        pool_size=pool_size,
        metrics_public=metrics_public,
    )
    if insecure_no_auth:
        logger.warning(
            "the HTTP API runs WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who can reach "
            "it can enqueue, cancel and purge jobs; use it on a trusted machine only"
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            state.close()

    web = FastAPI(
        title="pgjobs",
        summary="A durable background-job queue backed by PostgreSQL alone.",
        version="1",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    web.state.pgjobs = state
    errors.install(web)
    web.include_router(api.health_router)
    web.include_router(api.router)
    web.include_router(
        dashboard_router(state.connection, tokens=loaded, insecure_no_auth=insecure_no_auth)
    )
    web.add_middleware(_Guards, max_body_bytes=max_body_bytes)
    return web


def _bare_app(dsn: Dsn) -> App:
    """An App without tasks (every task name accepted) on ``dsn``; the server enqueues on its
    own pooled connections, so this App never opens a pool of its own."""
    bare = App()
    bare.bind(dsn)
    return bare
