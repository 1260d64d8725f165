"""The App: a task registry plus enqueueing on pgjobs' own pool or the caller's connection."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack, overload

import psycopg

from pgjobs import admin, producer, queues
from pgjobs.db.dsn import Dsn, normalize_dsn, resolve_dsn
from pgjobs.db.pooler import Pooler, parse_pooler
from pgjobs.errors import ConfigurationError
from pgjobs.models import JobHistory
from pgjobs.periodic import DEFAULT_CATCH_UP, DEFAULT_TIMEZONE, Periodic, ScheduleOptions
from pgjobs.pools import Pools
from pgjobs.rates import Rate
from pgjobs.submission import JobOptions, JobSpec, check_name
from pgjobs.targets import ExternalTarget, check_headers
from pgjobs.tasks import HandlerOptions, Task, TaskOptions, make_task, refuse_unknown

P = ParamSpec("P")
R = TypeVar("R")

#: How messages name a DSN given to ``App``.
DSN_SOURCE = "App(dsn=...)"
READ_DSN_SOURCE = "App(read_dsn=...)"


class App:
    """Registers tasks and enqueues jobs.

    ``dsn`` is a ``postgresql://`` URL or a libpq ``key=value`` string (``"host=127.0.0.1
    dbname=app user=postgres"``), checked here (``ConfigurationError``); it may be omitted:
    pgjobs then reads $PGJOBS_DATABASE_URL, $DATABASE_URL, or starts the embedded server, on
    first use. The pool opens on first use too, or ahead of it with ``open()``. With
    ``check_task_names`` (the default) and at least one task registered, enqueueing an unknown
    task name raises ``UnknownTask``. ``read_dsn`` names a standby (or any server) that
    ``pgjobs serve`` reads its statistics, listings and metrics from when it serves this app;
    every write still goes to ``dsn``. ``pooler="transaction"`` (else ``$PGJOBS_POOLER``) is for
    a DSN through a transaction-mode pooler such as PgBouncer, with ``listen_dsn`` a direct DSN
    that workers LISTEN on (else they poll): see the manual's "Behind PgBouncer".

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
    ) -> None:
        if pool_size < 1:
            raise ConfigurationError(f"pool_size must be >= 1, got {pool_size}")
        # A DSN given here is checked at once; the environment and the embedded server are
        # looked at on first use.
        mode = parse_pooler(pooler, "App(pooler=...)") if pooler else None
        listen = resolve_dsn(listen_dsn, source="App(listen_dsn=...)") if listen_dsn else None
        self._pools = Pools(
            resolve_dsn(dsn, source=DSN_SOURCE) if dsn else None, pool_size, mode, listen
        )
        self._read_dsn = normalize_dsn(read_dsn, READ_DSN_SOURCE) if read_dsn else None
        self._tasks: dict[str, Task] = {}
        self._periodics: dict[str, Periodic] = {}
        self._check_task_names = check_task_names

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks by name (read-only)."""
        return MappingProxyType(self._tasks)

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

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(
        self, fn: None = None, /, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self, fn: Callable[..., Any] | None = None, /, **options: Unpack[HandlerOptions]
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler; it receives the job's JSON payload keys as keyword arguments.

        ``name`` defaults to ``module.function``; set it explicitly so that renaming or moving the
        function does not orphan queued jobs. ``retry_base``/``retry_cap`` (seconds) shape the
        backoff between attempts; ``lease`` (seconds) is how long one run may take before the job
        counts as lost and is run again: set it above the handler's longest expected run, or
        call ``pgjobs.current_job().extend_lease(seconds)`` from a long handler. An
        ``at_most_once`` task is never run twice: when its lease expires (the worker died or
        hung), the job goes to ``dead_letter`` instead of running again.

        ``timeout`` (seconds, shorter than ``lease``) bounds one run: past it the worker stops
        the handler (an async one is cancelled; a sync one, which Python cannot stop, is
        abandoned in its thread and sees ``pgjobs.current_job().cancelled`` become True) and the
        attempt fails with reason timeout: retried with backoff while attempts remain, else sent
        to ``dead_letter`` with reason ``timeout`` (an at-most-once task's at once).

        Annotated parameters (``int``, ``float``, ``str``, ``bool``, ``None``, unions,
        ``list[X]``, ``dict[str, X]``, ``Literal``) are checked at enqueue (``InvalidPayload``
        naming ``payload.<name>``) and again when a worker starts the job (``dead_letter``,
        ``invalid_payload``); a handler taking one pydantic model or dataclass receives it built
        from the payload. ``version`` is the version of the payloads the handler takes, stored
        with each job; ``upgrade`` maps each older version to a function returning the payload
        of the next version, which a worker applies, in order, to the jobs enqueued before.

        ``concurrency`` caps the jobs of this task running at once across every worker and
        host; ``rate`` ("100/s", "10/m", "5/10s") caps how many start per period (a token
        bucket holding one period's jobs). Both are enforced by the claim itself: jobs held
        back stay ready, and other tasks of the queue are claimed past them. Declare them the
        same in every worker that runs the task (a worker enforces what its code declares).

        The options and their defaults are those of ``pgjobs.tasks.HandlerOptions``.

        Example: ``@app.task(name="billing.charge", queue="billing", max_attempts=10)``

        Example: ``@app.task(name="crm.sync", concurrency=5, rate="100/m")``

        Example: ``@app.task(name="reports.build", timeout=30, lease=120)``

        Example::

            def to_cents(payload: dict[str, Any]) -> dict[str, Any]:
                return {"cents": round(payload["amount"] * 100)}

            @app.task(name="billing.charge", version=2, upgrade={1: to_cents})
            def charge(cents: int) -> None: ...
        """
        refuse_unknown(options, HandlerOptions, "App.task")

        def register(fn: Callable[..., Any]) -> Task:
            return self._register(make_task(fn, **options))

        return register(fn) if fn is not None else register

    def external_task(
        self,
        name: str,
        *,
        url: str | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task:
        """Register a task whose jobs are not run by a Python handler: a worker delivers each
        job to a downstream HTTP service (a JSON ``POST`` to ``url``), which reports the outcome
        later with ``POST /api/v1/jobs/{id}/outcome`` (``pgjobs serve``) or
        ``App.report_outcome``.

        A 2xx answer to the delivery leaves the job running: ``lease`` (seconds) is the
        downstream's deadline to report, delivery included; without a report by then the lease
        rules apply (delivered again on a later attempt, or ``dead_letter`` for an
        ``at_most_once`` task or on the last attempt). Any other answer, a timeout or an
        unreachable host is a failed attempt, retried with backoff. ``timeout`` (seconds) bounds
        one delivery and must be shorter than ``lease``; ``headers`` are sent with every
        delivery (their values are never logged). ``url``, ``timeout`` and headers left out come
        from the worker (`pgjobs work --external-url ... --external-timeout ...
        --external-header ...`, or ``$PGJOBS_EXTERNAL_TOKEN`` for a bearer token).
        ``concurrency`` caps the jobs the downstream holds at once (delivered and not yet
        reported), ``rate`` the deliveries per period, as for ``task``; the other options
        and their defaults are those of ``pgjobs.tasks.TaskOptions``.

        Example::

            charge = app.external_task(
                "billing.charge",
                url="https://billing.internal/jobs",
                headers={"Authorization": "Bearer " + os.environ["BILLING_TOKEN"]},
                lease=600,
            )
            app.enqueue(charge, {"order": 42})
        """
        refuse_unknown(options, TaskOptions, "App.external_task")
        name = check_name("task", name)

        def not_callable(**payload: Any) -> Any:
            raise ConfigurationError(
                f"task {name!r} is external: a worker delivers its jobs over HTTP; "
                f"enqueue it (app.enqueue({name!r}, payload)) instead of calling it"
            )

        not_callable.__qualname__ = not_callable.__name__ = name
        target = ExternalTarget(url, timeout, check_headers("headers", headers))
        task = make_task(not_callable, external=target, name=name, **options)
        return self._register(task)

    @property
    def periodics(self) -> Mapping[str, Periodic]:
        """The periodic schedules declared with ``periodic``, by name (read-only)."""
        return MappingProxyType(self._periodics)

    @overload
    def periodic(
        self, cron: str | None = None, /, *, task: str | Task, **options: Unpack[ScheduleOptions]
    ) -> Periodic: ...

    @overload
    def periodic(
        self, cron: str | None = None, /, *, task: None = None, **options: Unpack[ScheduleOptions]
    ) -> Callable[[Task | Callable[..., Any]], Task]: ...

    def periodic(
        self,
        cron: str | None = None,
        /,
        *,
        task: str | Task | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> Periodic | Callable[[Task | Callable[..., Any]], Task]:
        """Enqueue a task on a schedule: a cron expression (5 fields, or 6 with seconds first)
        read in ``timezone``, or ``every`` (a ``timedelta`` of whole seconds, counted from the
        Unix epoch). Stacked on ``@app.task`` it schedules that task and returns it; with
        ``task=`` it schedules a task by name and returns the ``Periodic``.

        Workers that run maintenance enqueue each occurrence once, however many run, with
        ``run_at`` the scheduled instant. ``catch_up`` says what to do with occurrences missed
        while no worker ran: ``"last"`` (default) runs the latest one, ``"skip"`` none, ``N`` the
        latest N. ``name`` (default: the task's name) identifies the schedule in the database:
        keep it when changing the expression. See ``pgjobs.periodic`` for DST. The options and
        their defaults are those of ``pgjobs.periodic.ScheduleOptions``.

        Example::

            @app.periodic("0 7 * * mon-fri", name="reports.daily", timezone="Europe/Berlin")
            @app.task(queue="reports")
            def daily_report() -> None: ...

            app.periodic(every=timedelta(minutes=5), task="cache.refresh", payload={"all": True})
        """
        refuse_unknown(options, ScheduleOptions, "App.periodic")

        def declare(target: str | Task) -> Periodic:
            task_name = target.name if isinstance(target, Task) else target
            payload, name = options.get("payload"), options.get("name")
            # The task's defaults (queue, attempts) and the payload checked as enqueue checks them.
            job: JobOptions = {
                "queue": options.get("queue"),
                "priority": options.get("priority", 0),
                "max_attempts": options.get("max_attempts"),
            }
            prepared = self._prepare_one(task_name, payload, job, "periodic")
            schedule = Periodic(
                name if name is not None else task_name,
                task_name,
                payload or {},
                cron=cron,
                every=options.get("every"),
                timezone=options.get("timezone", DEFAULT_TIMEZONE),
                catch_up=options.get("catch_up", DEFAULT_CATCH_UP),
                queue=prepared.queue,
                priority=prepared.priority,
                max_attempts=prepared.max_attempts,
            )
            if schedule.name in self._periodics:
                raise ConfigurationError(
                    f"a schedule named {schedule.name!r} is already declared; give each "
                    "schedule of a task its own name=",
                    field="name",
                )
            self._periodics[schedule.name] = schedule
            return schedule

        if task is not None:
            return declare(task)

        def decorate(target: Task | Callable[..., Any]) -> Task:
            if not isinstance(target, Task):
                target = self.task(target)
            declare(target)
            return target

        return decorate

    def pause_queue(self, name: str, *, reason: str | None = None) -> queues.Change:
        """Pause queue ``name``: no worker claims its jobs from its next claim on (they stay
        ready); running jobs finish. See ``pgjobs.queues.pause``.

        Example: ``app.pause_queue("emails", reason="SMTP outage")``
        """
        return self._on_pool(queues.pause, name, reason=reason)

    def resume_queue(self, name: str) -> queues.Change:
        """Resume queue ``name``; idle workers serving it claim its jobs at once.

        Example: ``app.resume_queue("emails")``
        """
        return self._on_pool(queues.resume, name)

    def limit_queue(
        self,
        name: str,
        *,
        concurrency: int | None = queues.KEEP,
        rate: str | Rate | None = queues.KEEP,
    ) -> queues.Change:
        """Set queue ``name``'s concurrency limit and rate (None removes one; one not given
        stays), obeyed by every worker from its next claim on. See ``pgjobs.queues.limit``.

        Example: ``app.limit_queue("emails", concurrency=10, rate="100/s")``
        """
        return self._on_pool(queues.limit, name, concurrency=concurrency, rate=rate)

    def _register(self, task: Task) -> Task:
        if task.name in self._tasks:
            raise ConfigurationError(
                f"a task named {task.name!r} is already registered", field="task"
            )
        self._tasks[task.name] = task
        return task

    def enqueue(
        self,
        task: str | Task,
        payload: dict[str, Any] | None = None,
        *,
        connection: Any = None,
        **options: Unpack[JobOptions],
    ) -> int:
        """Enqueue one job and return its id (the existing job's id when ``idempotency_key``
        is already taken). The options (``queue``, ``priority``, ``run_at`` or ``run_in``,
        ``max_attempts``, ``expires_at`` or ``expires_in``, ``idempotency_key``) are those of
        ``JobSpec``.

        With ``connection`` (a psycopg ``Connection`` or a SQLAlchemy ``Connection``) the job is
        written in the caller's transaction and commits or rolls back with it.

        Example: ``app.enqueue("send_welcome", {"user_id": 42}, connection=conn)``
        """
        return self._insert([self._prepare_one(task, payload, options, "enqueue")], connection)[0]

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
        return (await self._insert_async([row], connection))[0]

    def _prepare_one(
        self, task: str | Task, payload: dict[str, Any] | None, options: JobOptions, caller: str
    ) -> producer.PreparedJob:
        """The job ``enqueue`` and ``enqueue_async`` (the ``caller``) write: their arguments as
        a ``JobSpec``, prepared."""
        try:
            spec = JobSpec(task.name if isinstance(task, Task) else task, payload, **options)
        except TypeError:  # an unknown option: named as Python names an unknown argument
            refuse_unknown(options, JobOptions, f"App.{caller}")
            raise
        return producer.prepare(spec, self._tasks if self._check_task_names else None)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, connection: Any = None) -> list[int]:
        """Enqueue many jobs in one statement; returns their ids in order. All or nothing.

        Example: ``app.enqueue_many(JobSpec("resize", {"image": n}) for n in range(1000))``
        """
        rows = producer.prepare_many(jobs, self._tasks if self._check_task_names else None)
        return self._insert(rows, connection)

    async def enqueue_many_async(
        self, jobs: Iterable[JobSpec], *, connection: Any = None
    ) -> list[int]:
        """``enqueue_many`` for asyncio applications (see ``enqueue_async``).

        Example: ``await app.enqueue_many_async(JobSpec("resize", {"image": n}) for n in ids)``
        """
        rows = producer.prepare_many(jobs, self._tasks if self._check_task_names else None)
        return await self._insert_async(rows, connection)

    async def _insert_async(self, rows: list[producer.PreparedJob], connection: Any) -> list[int]:
        if connection is not None:
            return await producer.insert_async(connection, rows)
        return await self._pools.run_async(lambda conn, dsn: producer.insert_async(conn, rows, dsn))

    async def aclose(self) -> None:
        """Close the app's async pool (opened by ``enqueue_async``) and its sync pool.

        Example: ``await app.aclose()`` in a FastAPI lifespan's shutdown.
        """
        await self._pools.aclose()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _insert(self, rows: list[producer.PreparedJob], connection: Any) -> list[int]:
        if connection is not None:
            return producer.insert(connection, rows)
        # Not db.pooled: insert translates errors itself.
        return self._pools.run(lambda conn, dsn: producer.insert(conn, rows, dsn, pooled=True))

    def job(self, job_id: int) -> JobHistory:
        """A job wherever it is (queued, archived or dead), with its whole record.

        Example: ``app.job(42).status``; raises ``JobNotFound`` for an unknown id.
        """
        return self._on_pool(admin.job, job_id)

    def cancel(self, job_id: int, *, force: bool = False) -> JobHistory:
        """Archive a queued job as cancelled, unrun. A running job is refused
        (``JobStateConflict``) unless ``force``: it is then cancelled at once, its handler asked
        to stop (an async one is cancelled, a sync one sees ``current_job().cancelled``) and
        its outcome discarded (see ``pgjobs.admin.cancel``).

        Example: ``app.cancel(42)``
        """
        return self._on_pool(admin.cancel, job_id, force=force)

    def replay(
        self,
        job_id: int,
        *,
        expires_at: datetime | None = None,
        expires_in: float | timedelta | None = None,
    ) -> int:
        """Enqueue a finished or dead job again as a new job linked to it; returns the new id.
        The copy of an expired job is archived at once as expired unless a new expiry is given
        (see ``pgjobs.admin.replay``).

        Example: ``new_id = app.replay(42, expires_in=600)``
        """
        return self._on_pool(admin.replay, job_id, expires_at=expires_at, expires_in=expires_in)

    def report_outcome(
        self,
        job_id: int,
        *,
        attempt: int,
        status: str,
        retryable: bool = True,
        error: str | None = None,
        result: Any = None,
    ) -> JobHistory:
        """Record the outcome an external worker reports for attempt ``attempt`` of a running
        job (``"succeeded"`` or ``"failed"``); the job's own task's retry policy applies when
        this app registers it. ``StaleOutcome`` when that attempt no longer holds the job (see
        ``pgjobs.admin.report_outcome``).

        Example: ``app.report_outcome(42, attempt=1, status="failed", error="card declined")``
        """

        def report(conn: psycopg.Connection[Any]) -> JobHistory:
            task = self._tasks.get(admin.job(conn, job_id).task)
            return admin.report_outcome(
                conn,
                job_id,
                attempt=attempt,
                status=status,
                retryable=retryable,
                error=error,
                result=result,
                retry=task.retry if task is not None else None,
                external=task.external is not None if task is not None else None,
            )

        return self._on_pool(report)

    def redrive(
        self,
        *ids: int,
        queue: str | None = None,
        task: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        error: str | None = None,
        fingerprint: str | None = None,
        everything: bool = False,
        batch_size: int = admin.DEFAULT_BATCH_SIZE,
    ) -> int:
        """Move dead jobs back to the queue with fresh attempts; returns how many moved.

        Pass ids, or filters (as ``pgjobs dead redrive``), or ``everything=True`` for every dead
        job. Named ids must all be dead, else ``JobNotFound`` and nothing moves.

        Example: ``app.redrive(task="images.resize", error="timeout")``
        """
        where = admin.DeadFilter(
            ids=ids or None,
            queue=queue,
            task=task,
            since=since,
            until=until,
            error=error,
            fingerprint=fingerprint,
        )
        if where.matches_all and not everything:
            raise ConfigurationError(
                "redrive needs job ids or a filter; pass everything=True to redrive every dead job"
            )
        return self._on_pool(admin.redrive, where, batch_size=batch_size)

    def _on_pool(
        self,
        operation: Callable[Concatenate[psycopg.Connection[Any], P], R],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``operation(conn, *args, **kwargs)`` on a connection of the app's pool, errors
        translated: how the admin and queue operations below run."""
        with self._pools.connection() as conn:
            return operation(conn, *args, **kwargs)

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
        self._pools.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
