"""The App: its declarations (``pgjobs.registry``) plus enqueueing and job actions on pgjobs'
own pool or the caller's connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

# admin, batches and schedules are imported where they are used: `pgjobs enqueue` and a worker
# need none of them (admin brings the completer's reports).
from pgjobs import enqueue, results
from pgjobs.db.dsn import APP_SOURCE, Dsn, normalize_dsn, resolve_dsn
from pgjobs.db.pooler import Pooler, parse_pooler
from pgjobs.errors import ConfigurationError
from pgjobs.operator import Operator
from pgjobs.pools import Pools
from pgjobs.registry import Registry
from pgjobs.retention_policy import RetentionPolicy, retention_policy
from pgjobs.submission import JobOptions, JobSpec
from pgjobs.tasks import Task

if TYPE_CHECKING:
    from pgjobs import batches, schedules

#: How messages name a DSN given to ``App``.
DSN_SOURCE = APP_SOURCE
READ_DSN_SOURCE = "App(read_dsn=...)"


class App(Registry, Operator):
    """Registers tasks and enqueues jobs.

    ``dsn`` is a ``postgresql://`` URL or a libpq ``key=value`` string (``"host=127.0.0.1
    dbname=app user=postgres"``), checked here (``ConfigurationError``); it may be omitted:
    pgjobs then looks on first use as the CLI does: $PGJOBS_DATABASE_URL, the variable
    ``[tool.pgjobs] dsn`` names in the nearest pyproject.toml, $DATABASE_URL, else the embedded
    server (said on stderr, with its folder). The pool opens on first use too, or ahead of it
    with ``open()``. With ``check_task_names`` (the default) and at least one task registered,
    enqueueing an unknown task name raises ``UnknownTask``. ``read_dsn`` names a standby (or any
    server) that ``pgjobs serve`` reads its statistics, listings and metrics from when it serves
    this app; every write still goes to ``dsn``. ``pooler="transaction"`` (else
    ``$PGJOBS_POOLER``) is for a DSN through a transaction-mode pooler such as PgBouncer, with
    ``listen_dsn`` a direct DSN that workers LISTEN on (else they poll): see the manual's "Behind
    PgBouncer". ``retention`` (``{"archive": "30d", "dead_letter": "90d"}``, the keys of
    ``[tool.pgjobs.retention]``) is what the workers' retention service removes: see the manual's
    "Retention".

    Example::

        app = pgjobs.App("postgresql://postgres@127.0.0.1/app")

        @app.task(queue="emails", max_attempts=3)
        def send_welcome(user_id: int) -> None: ...

        app.enqueue("send_welcome", {"user_id": 42}, run_in=60)
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        check_task_names: bool = True,
        pool_size: int = 10,
        read_dsn: str | None = None,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        retention: RetentionPolicy | Mapping[str, object] | None = None,
    ) -> None:
        if pool_size < 1:
            raise ConfigurationError(f"pool_size must be >= 1, got {pool_size}")
        super().__init__(check_task_names=check_task_names)
        # A DSN given here is checked at once; the environment and the embedded server are
        # looked at on first use.
        mode = parse_pooler(pooler, "App(pooler=...)") if pooler else None
        listen = resolve_dsn(listen_dsn, source="App(listen_dsn=...)") if listen_dsn else None
        self._pools = Pools(
            resolve_dsn(dsn, source=DSN_SOURCE) if dsn else None, pool_size, mode, listen
        )
        self._read_dsn = normalize_dsn(read_dsn, READ_DSN_SOURCE) if read_dsn else None
        #: What the retention service of this app's workers removes (``pgjobs.retention_policy``:
        #: e.g. ``{"archive": "30d", "dead_letter": "90d"}``); None: nothing, unless
        #: ``[tool.pgjobs.retention]`` or `pgjobs work --retain-*` say so.
        self.retention = retention_policy(retention, "App(retention=...)")
        #: The waiters of ``wait`` / ``wait_async`` and their one LISTEN connection.
        self._waiters = results.Waiters(self._pools)
        # One-job enqueues on the app's pool that arrive together go in as one statement and
        # one commit (pgjobs.enqueue.coalescing); the async one belongs to the loop that made it.
        self._sender = enqueue.Sender(self._pools)

    def _workflow_pools(self) -> Pools:
        return self._pools

    def _workflow_app(self) -> App:
        return self

    @property
    def dsn(self) -> Dsn:
        """The database this app uses, resolved on first use."""
        return self._pools.dsn

    @property
    def read_dsn(self) -> Dsn | None:
        """The server reads may go to (``App(read_dsn=...)``, ``pgjobs serve --read-dsn``)."""
        return self._read_dsn

    @property
    def settled_dsn(self) -> Dsn | None:
        """The database the app holds without looking for one: given to ``App(dsn=...)`` or
        ``bind``, or found on an earlier use; None while it would still look at the environment
        on first use (the CLI then binds the one it resolves).

        Example: ``pgjobs.App().settled_dsn is None``
        """
        return self._pools.known_dsn

    def bind(
        self, dsn: Dsn | str, *, pooler: Pooler | None = None, listen_dsn: Dsn | None = None
    ) -> None:
        """Use ``dsn`` from now on (the CLI's ``--dsn``, with ``--pooler`` and ``--listen-dsn``);
        closes a pool opened on another one. A string is checked as ``App(dsn=...)`` checks it
        (``ConfigurationError``).

        Example: ``app.bind("postgresql://postgres@127.0.0.1/app")``
        """
        if isinstance(dsn, str):
            dsn = resolve_dsn(dsn, source=DSN_SOURCE)
        self._pools.bind(dsn, pooler=pooler, listen=listen_dsn)

    @property
    def listen_dsn(self) -> Dsn | None:
        """Where workers LISTEN for new jobs; None through a transaction-mode pooler without a
        ``listen_dsn``: they poll."""
        return self._pools.listen_dsn

    def run_schedule(self, name: str) -> schedules.ScheduleRun:
        """Enqueue one job of periodic schedule ``name`` now, as its occurrences are, outside
        its cadence. See ``pgjobs.schedules.run_now``.

        Example: ``app.run_schedule("reports.hourly").job_id``
        """
        from pgjobs import schedules

        return self._on_pool(schedules.run_now, name, self.periodics, self.enqueue_many)

    def enqueue(
        self,
        task: str | Task,
        payload: dict[str, Any] | None = None,
        *,
        connection: Any = None,
        **options: Unpack[JobOptions],
    ) -> int:
        """Enqueue one job and return its id: the existing job's id when ``idempotency_key``
        is already taken, or when a job of the task not started yet holds ``unique_key`` (kept,
        replaced or debounced as ``on_conflict`` says). The options (``queue``, ``priority``,
        ``run_at`` or ``run_in``, ``max_attempts``, ``expires_at`` or ``expires_in``,
        ``idempotency_key``, ``group``, ``unique_key``, ``on_conflict``, ``debounce``,
        ``after``) are those of ``JobSpec``. With ``after=[id, ...]`` the job waits until every
        one of those jobs has succeeded, and goes to ``dead_letter`` unrun (reason
        ``dependency_failed``) when one does not (see ``pgjobs.enqueue.waiting``).

        With ``connection`` (a psycopg ``Connection`` or a SQLAlchemy ``Connection``) the job is
        written in the caller's transaction and commits or rolls back with it.

        Example: ``app.enqueue("send_welcome", {"user_id": 42}, connection=conn)``
        """
        row = self._prepare_one(task, payload, options, "enqueue")
        return self._sender.insert([row], connection)[0]

    async def enqueue_async(
        self,
        task: str | Task,
        payload: dict[str, Any] | None = None,
        *,
        connection: Any = None,
        **options: Unpack[JobOptions],
    ) -> int:
        """``enqueue`` for asyncio applications: the same options and validation, without
        blocking the event loop.

        With ``connection`` (a psycopg ``AsyncConnection`` or a SQLAlchemy ``AsyncConnection``)
        the job is written in the caller's transaction. Without one, the app's async pool is
        used: it belongs to the event loop that opened it; close it with ``await app.aclose()``
        (or ``async with app:``) before that loop ends.

        Example: ``job_id = await app.enqueue_async("send_welcome", {"user_id": 42})``
        """
        row = self._prepare_one(task, payload, options, "enqueue_async")
        return (await self._sender.insert_async([row], connection))[0]

    def enqueue_many(
        self, jobs: Iterable[JobSpec], *, connection: Any = None, batch: batches.Batch | None = None
    ) -> list[int]:
        """Enqueue many jobs in one statement; returns their ids in order. All or nothing. Jobs
        of one task with the same unique key act as if enqueued one after the other. With
        ``batch`` (made by ``App.batch``, not written yet) they are its members, written with
        it in one transaction (``batch.id`` is its id afterwards). A job's ``after`` may name
        a job listed before it in the same call by ``pgjobs.Ref(position)``: a whole graph goes
        in at once, or nothing does.

        Example: ``app.enqueue_many(JobSpec("resize", {"image": n}) for n in range(1000))``
        """
        if batch is not None:
            batch.add(jobs)
            self._write_batch(batch, connection or batch.connection)
            return batch.ids
        rows = enqueue.prepare_many(jobs, self._known_tasks)
        return self._sender.insert(rows, connection, many=True)

    def batch(
        self, on_complete: batches.OnComplete = None, *, connection: Any = None
    ) -> batches.Batch:
        """A batch: jobs enqueued together (``batch.enqueue``, or ``enqueue_many(...,
        batch=...)``) and a callback enqueued once when every one of them has ended (succeeded,
        dead, cancelled or expired), with ``{"batch": {"id", "total", "succeeded", "dead",
        "cancelled"}}`` added to its payload. ``on_complete``: a task, a (task, payload) pair, a
        ``JobSpec`` for its queue, priority or max_attempts, or None (no callback). With
        ``connection``, the batch is written in the caller's transaction. See
        ``pgjobs.batches``.

        Example::

            with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
                for page in range(40):
                    batch.enqueue("reports.render", {"page": page})
        """
        from pgjobs import batches

        callback = batches.callback(on_complete, self._known_tasks)
        return batches.Batch(
            callback, self._known_tasks, self._write_batch, connection, self._write_batch_async
        )

    def _write_batch(self, batch: batches.Batch, connection: Any) -> None:
        from pgjobs import batches

        batch.written(*self._sender.write_batch(batches.params(batch), batch.rows, connection))

    async def _write_batch_async(self, batch: batches.Batch, connection: Any) -> None:
        from pgjobs import batches

        written = await self._sender.write_batch_async(
            batches.params(batch), batch.rows, connection
        )
        batch.written(*written)

    async def enqueue_many_async(
        self, jobs: Iterable[JobSpec], *, connection: Any = None, batch: batches.Batch | None = None
    ) -> list[int]:
        """``enqueue_many`` for asyncio applications (see ``enqueue_async``), ``batch`` too.

        Example: ``await app.enqueue_many_async(JobSpec("resize", {"image": n}) for n in ids)``
        """
        if batch is not None:
            batch.add(jobs)
            await self._write_batch_async(batch, connection or batch.connection)
            return batch.ids
        rows = enqueue.prepare_many(jobs, self._known_tasks)
        return await self._sender.insert_async(rows, connection, many=True)

    def wait(self, job_id: int, *, timeout: float = 30) -> Any:
        """Wait for job ``job_id`` to end and return its result (None when its handler
        returned none). Raises ``JobFailed`` for a job in dead_letter, ``JobCancelled`` for one
        cancelled (``JobExpired``, a subclass, for one expired), ``WaitTimeout`` when it has not
        ended within ``timeout`` seconds, ``JobNotFound`` for an unknown id. A job that ended
        before the call answers at once. Woken by a notification: every waiter of the app
        shares one LISTEN connection (see ``pgjobs.results``).

        Example: ``total = app.wait(app.enqueue("add", {"a": 1, "b": 2}), timeout=10)``
        """
        job_id, seconds = results.check_wait(job_id, timeout)
        return self._waiters.wait(job_id, seconds)

    async def wait_async(self, job_id: int, *, timeout: float = 30) -> Any:
        """``wait`` for asyncio applications, without blocking the event loop.

        Example: ``total = await app.wait_async(job_id, timeout=10)``
        """
        job_id, seconds = results.check_wait(job_id, timeout)
        return await self._waiters.wait_async(job_id, seconds)

    async def aclose(self) -> None:
        """Close the app's async pool (opened by ``enqueue_async``) and its sync pool.

        Example: ``await app.aclose()`` in a FastAPI lifespan's shutdown.
        """
        await asyncio.to_thread(self._waiters.close)
        await self._pools.aclose()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def open(self) -> App:
        """Open the connection pool now rather than at the first enqueue, so that a database
        that cannot be reached fails here (``DatabaseUnavailable``) and the first enqueue does
        not wait for connections. Returns the app; opening an open app does nothing.

        Example::

            with app.open():  # closed at the end of the block
                app.enqueue("send_welcome", {"user_id": 42})
        """
        self._pools.sync()
        return self

    async def open_async(self) -> App:
        """``open()`` for ``enqueue_async``: open the running event loop's pool now (a
        FastAPI lifespan's start-up), failing with ``DatabaseUnavailable``. Returns the app.

        Example::

            @contextlib.asynccontextmanager
            async def lifespan(api: FastAPI) -> AsyncIterator[None]:
                async with await app.open_async():
                    yield
        """
        await self._pools.running_loop()
        return self

    def close(self) -> None:
        """Close the app's connection pool (a later enqueue opens a new one)."""
        self._waiters.close()
        self._pools.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
