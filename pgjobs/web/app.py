"""The HTTP API as an ASGI application: ``create_app`` checks its settings, builds the server's
``Backend`` and assembles the API's routes, the dashboard's and the guards in front of them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Scope

from pgjobs import instruments
from pgjobs.app import App
from pgjobs.db.dsn import Dsn, normalize_dsn, resolve_dsn
from pgjobs.errors import ConfigurationError
from pgjobs.web import api, docs, errors, events_api, results, routes_queues, routes_schedules
from pgjobs.web.auth import Tokens, load_tokens
from pgjobs.web.backend import Backend, metrics_public_from_env
from pgjobs.web.dashboard import dashboard_router
from pgjobs.web.dashboard.security import SESSION_COOKIE
from pgjobs.web.dashboard.sessions import Sessions
from pgjobs.web.edits import edits_router
from pgjobs.web.express import ExpressEnqueue
from pgjobs.web.guards import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, Guards
from pgjobs.web.health import health_router
from pgjobs.web.hosted import HostSignIn
from pgjobs.web.paths import TextOnly
from pgjobs.web.principal import (
    PRINCIPAL_STATE,
    HostAuth,
    check_auth,
    check_sign_in_url,
    principal_of,
)

logger = logging.getLogger("pgjobs.web")

#: Connections the server holds at most unless told otherwise.
DEFAULT_POOL_SIZE = 10


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
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    read_dsn: str | Dsn | None = None,
    otel_metrics: object = None,
    auth: HostAuth | None = None,
    sign_in_url: str | None = None,
) -> FastAPI:
    """The HTTP API (FastAPI) over pgjobs' tables, to serve with any ASGI server or mount in
    your own application.

    ``app``: your ``pgjobs.App``; its tasks' names are then the only ones accepted, and its DSN
    is used unless ``dsn`` is given. Without either, the DSN comes from $PGJOBS_DATABASE_URL,
    $DATABASE_URL or the embedded server, as for every command. ``tokens``/``read_only_tokens``
    default to the environment (see ``pgjobs.web.auth``); with no token at all the app refuses to
    be built (``ConfigurationError``) unless ``insecure_no_auth``, which it logs as a warning.
    ``metrics_public`` lets /metrics answer without a token (default: $PGJOBS_METRICS_PUBLIC=1).
    ``body_timeout``: seconds a request's body may take to arrive (408 after them).
    ``read_dsn`` (default: ``app.read_dsn``): a standby the statistics, listings, dashboard
    pages and /metrics read from; writes and actions go to the primary, and the pages, the
    verbose statistics and /metrics say how far behind the standby is.
    ``auth``: the host application's sign-in instead of pgjobs' tokens (``pgjobs.web.hosted``):
    a callable taking the request and returning a ``Principal(name, role)``, role "read" or
    "operate", or None for nobody signed in (401 from the API; the dashboard sends the browser
    to ``sign_in_url`` with ``?next=``, or answers 401 without one). It takes the place of
    ``tokens``, ``read_only_tokens`` and ``insecure_no_auth`` (given with it: refused).
    ``otel_metrics`` (default: $PGJOBS_OTEL_METRICS=1): the queue gauges of /metrics as
    OpenTelemetry observable gauges (``pgjobs.instruments.QueueGauges``), True through the global
    meter provider, or a ``MeterProvider``; one server of a deployment is enough.

    Example::

        from fastapi import FastAPI
        import pgjobs.web
        from myproject.tasks import app as pgjobs_app

        site = FastAPI()
        site.mount("/jobs", pgjobs.web.create_app(pgjobs_app))  # /jobs/api/v1/...
    """
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
    if (
        isinstance(body_timeout, bool)
        or not isinstance(body_timeout, int | float)
        or not (body_timeout > 0)
    ):
        raise ConfigurationError(
            f"body_timeout must be a number of seconds > 0, got {body_timeout!r}",
            field="body_timeout",
        )
    loaded = _tokens(tokens, read_only_tokens, insecure_no_auth, auth, sign_in_url)
    if app is not None and dsn is None:
        resolved = app.dsn
    else:
        resolved = dsn if isinstance(dsn, Dsn) else resolve_dsn(dsn)
    if metrics_public is None:
        metrics_public = metrics_public_from_env()
    state = Backend(
        app if app is not None else _bare_app(resolved),
        resolved,
        tokens=loaded,
        app_given=app is not None,
        pool_size=pool_size,
        metrics_public=metrics_public,
        read_dsn=_read_dsn(read_dsn, app),
        hosted=auth is not None,
    )
    if insecure_no_auth:
        logger.warning(
            "the HTTP API runs WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who can reach "
            "it can enqueue, cancel and purge jobs; use it on a trusted machine only"
        )

    gauges = _queue_gauges(state, otel_metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if gauges is not None:
                gauges.close()
            state.close()
            await state.aclose()  # the waiters of ``?wait`` and their pools

    web = FastAPI(
        title="pgjobs",
        summary="A durable background-job queue backed by PostgreSQL alone.",
        version="1",
        openapi_url=docs.OPENAPI_PATH,
        # Served by docs_router from the package's own files, not from a CDN.
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        # A path with a trailing slash that a route has without one answers 404 in the one
        # error shape, naming the route (errors.install), not a bodiless 307 redirect.
        redirect_slashes=False,
    )
    web.state.pgjobs = state
    #: The dashboard's signed-in browsers (in this process's memory).
    web.state.sessions = sessions = Sessions()
    errors.install(web)
    web.include_router(health_router)
    web.include_router(api.router)
    web.include_router(results.router)
    web.include_router(events_api.router)
    web.include_router(routes_queues.router)
    web.include_router(routes_schedules.router)
    web.include_router(edits_router)
    web.include_router(docs.docs_router())
    web.include_router(
        dashboard_router(
            state.connection,
            reading=state.reading if state.read_dsn is not None else None,
            tokens=loaded,
            insecure_no_auth=insecure_no_auth,
            sessions=sessions,
            throttle=state.throttle,
            group_limits=state.group_limits,
            ordered_tasks=state.ordered_tasks,
            hosted=auth is not None,
            sign_in_url=sign_in_url,
            tasks=state.app.tasks if state.app_given else None,
        )
    )
    # Inside the guards: the token, the body's size and type are checked, the body read.
    web.add_middleware(ExpressEnqueue, backend=state)
    web.add_middleware(
        Guards,
        max_body_bytes=max_body_bytes,
        backend=state,
        body_timeout=body_timeout,
        signed_in=lambda scope: _signed_in(scope, sessions, insecure_no_auth),
    )
    if auth is not None:  # who the request is, asked before the guards read a body
        web.add_middleware(HostSignIn, auth=auth)
    web.add_middleware(TextOnly)  # outermost: nothing reads a path that is not text
    return web


def _tokens(
    tokens: Iterable[str] | None,
    read_only_tokens: Iterable[str] | None,
    insecure_no_auth: bool,
    auth: HostAuth | None,
    sign_in_url: str | None,
) -> Tokens:
    """The tokens the server accepts (none under the application's sign-in, ``auth``, which
    takes their place), or ``ConfigurationError`` for settings that do not go together."""
    check_sign_in_url(sign_in_url)
    if auth is not None:
        check_auth(auth)
        if tokens is not None or read_only_tokens is not None or insecure_no_auth:
            raise ConfigurationError(
                "auth (the application's sign-in) takes the place of tokens, read_only_tokens "
                "and insecure_no_auth: drop them",
                field="auth",
            )
        return Tokens((), ())  # the environment's tokens are not used either
    if sign_in_url is not None:
        raise ConfigurationError("sign_in_url goes with auth: give both", field="sign_in_url")
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
    return loaded


def _signed_in(scope: Scope, sessions: Sessions, insecure_no_auth: bool) -> bool:
    """Whether a dashboard request may be someone: a bearer header (the page checks it), a live
    session's cookie, or a server without tokens."""
    if PRINCIPAL_STATE in scope.get("state", {}):  # the application's sign-in decides
        return principal_of(scope) is not None
    request = Request(scope)
    if insecure_no_auth or "authorization" in request.headers:
        return True
    cookie = request.cookies.get(SESSION_COOKIE)
    return cookie is not None and sessions.get(cookie) is not None


def _queue_gauges(state: Backend, provider: object) -> instruments.QueueGauges | None:
    """The queue gauges on ``provider``'s meter (None: $PGJOBS_OTEL_METRICS decides; False:
    none), read as /metrics reads them (the same reading, at most once per its ttl for both)."""
    if provider is None:
        provider = instruments.enabled_from_env()
    if instruments.check_provider(provider) is False:
        return None

    def read() -> instruments.QueueFigures | None:
        return state.metrics.figures(
            state.read_pool(), state.read_dsn or state.dsn, replica=state.read_dsn is not None
        )

    return instruments.QueueGauges(instruments.meter(provider), read)


def _read_dsn(read_dsn: str | Dsn | None, app: App | None) -> Dsn | None:
    if isinstance(read_dsn, Dsn):
        return read_dsn
    if read_dsn:
        return normalize_dsn(read_dsn, "read_dsn")
    return app.read_dsn if app is not None else None


def _bare_app(dsn: Dsn) -> App:
    """An App without tasks (every task name accepted) on ``dsn``; the server enqueues on its
    own pooled connections, so this App never opens a pool of its own."""
    bare = App()
    bare.bind(dsn)
    return bare
