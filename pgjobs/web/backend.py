"""What the API's routes share: the server's ``Backend`` (database pool, the app's tasks, tokens,
metrics), the FastAPI dependency that finds it, and the token check.

Endpoints are plain functions: FastAPI runs them in its thread pool, each holding one pooled
connection for the length of the request (the operations below them are synchronous psycopg).
The pool is bounded (``pool_size``) and opened on the first request that needs the database, so
the server starts, and answers ``/healthz``, while the database is down; a request that cannot
get a connection within ``POOL_WAIT`` seconds gets 503 with ``Retry-After``.

Failed tokens are counted per client address (``pgjobs.web.throttle``): after a few, the client
gets 429 with ``Retry-After`` whatever it presents.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import psycopg
import psycopg_pool
from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import Request

from pgjobs import db, groups
from pgjobs.app import App
from pgjobs.db.dsn import Dsn
from pgjobs.models import ReplicaStatus
from pgjobs.web.auth import READ_METHODS, Access, Tokens
from pgjobs.web.enqueuing import Enqueuer
from pgjobs.web.errors import ApiError
from pgjobs.web.principal import principal_of
from pgjobs.web.throttle import SignInThrottle, client_address, too_many_message

if TYPE_CHECKING:
    from pgjobs.web.metrics import QueueMetrics

API_PREFIX = "/api/v1"
#: Seconds a request waits for a pooled connection before answering 503.
POOL_WAIT = 5.0
ENV_METRICS_PUBLIC = "PGJOBS_METRICS_PUBLIC"


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
        read_dsn: Dsn | None = None,
        hosted: bool = False,
    ) -> None:
        self.app = app
        self.dsn = dsn
        #: Where the statistics, listings, pages and metrics are read (a standby), if not ``dsn``.
        self.read_dsn = read_dsn
        self.tokens = tokens
        #: Whether the host application signs requests in (``create_app(auth=...)``,
        #: ``pgjobs.web.hosted``) instead of pgjobs' tokens.
        self.hosted = hosted
        #: Whether the server was given the user's App (unknown task names are then refused).
        self.app_given = app_given
        self.pool_size = pool_size
        self.metrics_public = metrics_public
        #: The tasks' own group limits (``groups.task_limits``): which groups are at their limit.
        self.group_limits = groups.task_limits(app.tasks.values())
        #: The ordered tasks (``groups.ordered_tasks``): what holds their groups.
        self.ordered_tasks = groups.ordered_tasks(app.tasks.values())
        self._metrics: QueueMetrics | None = None
        #: Failed tokens per client address, for the API and the dashboard's login alike.
        self.throttle = SignInThrottle()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._read_pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._lock = threading.Lock()
        #: The App of ``waiting_app`` when the server's is bound elsewhere.
        self._waiting: App | None = None
        #: The one-job enqueues of POST /jobs, several requests' jobs in one commit.
        self.enqueuer = Enqueuer(self.connection)

    def pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The pool, opened on first use; ``DatabaseUnavailable`` while the database cannot be
        reached (the next request tries again)."""
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                self._pool = _opened(self.dsn, self.pool_size)
            return self._pool

    @property
    def metrics(self) -> QueueMetrics:
        """The queue metrics /metrics serves, made by the first scrape (their counters then live
        as long as the app; they count from the first scrape either way). prometheus_client and
        what it imports (~2 MiB resident) wait for it: a server nobody scrapes never loads them."""
        metrics = self._metrics
        if metrics is not None:
            return metrics
        from pgjobs.web.metrics import QueueMetrics

        with self._lock:
            if self._metrics is None:
                self._metrics = QueueMetrics(group_limits=self.group_limits)
            return self._metrics

    def read_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The pool of the read DSN (the primary's pool without one), opened on first use."""
        if self.read_dsn is None:
            return self.pool()
        pool = self._read_pool
        if pool is not None:
            return pool
        with self._lock:
            if self._read_pool is None:
                self._read_pool = _opened(self.read_dsn, self.pool_size)
            return self._read_pool

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection, errors translated to ``pgjobs.errors``."""
        with db.pooled(self.pool(), self.dsn) as conn:
            yield conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for reads that may lag (statistics, listings, pages, metrics):
        to the read DSN when there is one. Its outage is an outage of those reads (503 naming
        the read DSN); writes and actions still go to the primary."""
        with db.pooled(self.read_pool(), self.read_dsn or self.dsn) as conn:
            yield conn

    def replica(self, conn: psycopg.Connection[Any]) -> ReplicaStatus | None:
        """How far behind the read DSN is, read on ``conn`` (one of ``reading()``); None
        without a read DSN."""
        return None if self.read_dsn is None else db.replica_status(conn)

    def waiting_app(self) -> App:
        """The App whose ``wait_async`` serves ``GET /jobs/{id}?wait=``: the server's when it
        uses the server's database, else one bound to that database (created on first use)."""
        if self.app.settled_dsn == self.dsn:
            return self.app
        with self._lock:
            if self._waiting is None or self._waiting.settled_dsn != self.dsn:
                self._waiting = App()
                self._waiting.bind(self.dsn)
            return self._waiting

    async def aclose(self) -> None:
        """Close what ``?wait`` opened: the waiters' LISTEN connection and async pools."""
        for app in {id(a): a for a in (self.app, self._waiting) if a is not None}.values():
            await app.aclose()

    def close(self) -> None:
        with self._lock:
            pools, self._pool, self._read_pool = (self._pool, self._read_pool), None, None
        for pool in pools:
            if pool is not None:
                pool.close()


def _opened(dsn: Dsn, size: int) -> psycopg_pool.ConnectionPool[Any]:
    pool = db.open_pool(dsn, size)
    # A request waits this long for a connection, then answers 503.
    pool.timeout = POOL_WAIT
    return pool


def backend(request: Request) -> Backend:
    """The ``Backend`` of the app serving ``request``."""
    found: Backend = request.app.state.pgjobs
    return found


async def _server(request: Request) -> Backend:
    """``backend`` as a FastAPI dependency: a coroutine, so that FastAPI calls it on the event
    loop, not through its thread pool (a hop per request, for a dictionary lookup)."""
    return backend(request)


_bearer = HTTPBearer(
    auto_error=False,
    description="A token of $PGJOBS_API_TOKENS (or a read-only one, for GET routes).",
)
#: A route's parameter that receives the request's bearer token, if any.
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
#: A route's parameter that receives the server's ``Backend``.
Server = Annotated[Backend, Depends(_server)]


#: Where ``authenticate`` leaves what the request's token may do (the scope's state).
ACCESS_STATE = "pgjobs_access"


def authenticate(server: Backend, authorization: str | None, client: str) -> Access:
    """What the request's ``Authorization`` header may do; ``ApiError`` 401 for no token or an
    unknown one, 429 (with ``Retry-After``) for a client that failed too often. Called before
    the request's body is read (``Guards``) and by the routes' dependency."""
    tokens = server.tokens
    if server.hosted:
        # ``HostSignIn`` found nobody signed in (else the access is in the scope's state).
        raise ApiError(401, "unauthenticated", "sign in to the application first")
    if not tokens.configured:
        return Access.FULL
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            401,
            "unauthenticated",
            "this route needs a token: send the header Authorization: Bearer <token>",
            headers={"WWW-Authenticate": 'Bearer realm="pgjobs"'},
        )
    wait = server.throttle.wait(client)
    if wait is None:
        access = tokens.access(token)
        if access is not None:
            server.throttle.succeeded(client)
            return access
        wait = server.throttle.failed(client)
        if wait is None:
            raise ApiError(
                401,
                "unauthenticated",
                "the bearer token is not one of this server's tokens",
                headers={"WWW-Authenticate": 'Bearer realm="pgjobs", error="invalid_token"'},
            )
    raise ApiError(
        429, "too_many_requests", too_many_message(wait), headers={"Retry-After": str(wait)}
    )


def check_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None, *, write: bool
) -> None:
    """Let the request through, or raise 401 (no or unknown token), 429 (too many failures) or
    403 (a read-only token on a route that writes). ``credentials`` is FastAPI's reading of the
    header (for the OpenAPI document); the header itself is checked."""
    access = request.scope.get("state", {}).get(ACCESS_STATE)
    if not isinstance(access, Access):
        access = authenticate(
            backend(request),
            request.headers.get("authorization"),
            client_address(request.scope.get("client")),
        )
    if write and access is Access.READ_ONLY:
        raise ApiError(
            403,
            "forbidden",
            "your role is read: it may use GET routes only"
            if backend(request).hosted
            else "this token is read-only: it may use GET routes only",
        )


async def authorize(request: Request, credentials: Credentials) -> None:
    """The dependency of every /api/v1 router: a token, and a full one unless the method only
    reads (``READ_METHODS``)."""
    check_token(request, credentials, write=request.method not in READ_METHODS)


def actor(request: Request) -> str | None:
    """Who the request acts as, to record (``paused_by``): the host's principal's name under
    ``create_app(auth=...)``, else None (pgjobs' tokens name nobody)."""
    found = principal_of(request.scope)
    return found.name if found is not None else None


def recorded_actor(request: Request) -> str:
    """Who an action of the API is recorded as (``paused_by``), as the dashboard does: the host's
    principal (``actor``), else ``api (client address)``."""
    return actor(request) or f"api ({client_address(request.scope.get('client'))})"


def metrics_public_from_env() -> bool:
    """Whether $PGJOBS_METRICS_PUBLIC lets /metrics answer without a token."""
    return os.environ.get(ENV_METRICS_PUBLIC, "").strip().lower() in ("1", "true", "yes")
