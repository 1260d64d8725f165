"""The worker: claim -> run -> hand the outcome to the completer; signals and shutdown.

One asyncio loop owns the database connection. Async handlers run on that loop, sync handlers
in a thread pool; both occupy one of ``concurrency`` slots. Every trip to the database settles
the outcomes buffered since the last trip and claims at most as many jobs as there are free
slots, in one pipelined round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import signal
import socket
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjobs import db, migrate, queries
from pgjobs.completer import Outcomes, result_json
from pgjobs.dsn import Dsn
from pgjobs.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    NonRetryableError,
    PgjobsError,
    QueryFailed,
    SchemaMissing,
)
from pgjobs.maintenance import Service, ServiceConfig, run_services
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.maintenance.partitions import ArchivePartitions
from pgjobs.maintenance.registry import WorkerIdentity, WorkerRegistry
from pgjobs.models import Job
from pgjobs.tasks import DEFAULT_LEASE, Task

if TYPE_CHECKING:
    from pgjobs.app import App

log = logging.getLogger("pgjobs.worker")

#: Longest error text kept in last_error (characters); the full traceback goes to dead_letter.
MAX_ERROR_LENGTH = 2000
#: Seconds a busy worker waits for more slots to free up before its next round trip.
BATCH_WINDOW = 0.005
#: Seconds between reconnection attempts after the database went away: doubling, capped.
RECONNECT_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs. Times are in seconds."""

    concurrency: int = 8
    #: Queues to work; None means every queue the app's tasks name.
    queues: Sequence[str] | None = None
    #: Longest wait between claims when no NOTIFY arrives (the polling fallback).
    poll_interval: float = 1.0
    #: After SIGTERM/SIGINT, how long running handlers may take to finish.
    grace: float = 30.0
    #: Exit once the worker's queues hold no job (ready, scheduled or running).
    burst: bool = False
    #: Run the lease rescuer and expirer in this worker.
    maintenance: bool = True
    #: Seconds between lease-rescuer rounds (how soon after a lease expires its job is free).
    rescue_interval: float = 15.0
    #: Seconds between expirer rounds.
    expire_interval: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.poll_interval > 0:
            raise ConfigurationError(f"poll interval must be > 0 seconds, got {self.poll_interval}")
        if not self.rescue_interval > 0 or not self.expire_interval > 0:
            raise ConfigurationError("maintenance intervals must be > 0 seconds")
        if self.grace < 0:
            raise ConfigurationError(f"grace must be >= 0 seconds, got {self.grace}")


class JobContext:
    """The running job as its handler sees it, from ``pgjobs.current_job()``."""

    __slots__ = ("_worker", "job", "lease_lost")

    def __init__(self, job: Job, worker: Worker) -> None:
        self.job = job
        self._worker = worker
        #: True once the worker learned that this job's lease is no longer held: the job may be
        #: running elsewhere, and this run's outcome will be discarded.
        self.lease_lost = False

    def extend_lease(self, seconds: float) -> None:
        """Hold this job's lease until ``seconds`` from now. Returns at once: the worker sends
        the extension on its next round trip (within milliseconds), from sync and async handlers
        alike. Call it periodically from long handlers, well before the lease runs out.

        Example: ``pgjobs.current_job().extend_lease(600)``
        """
        if not seconds > 0:
            raise ConfigurationError(f"extend_lease takes seconds > 0, got {seconds}")
        self._worker._request_extension(self, float(seconds))


_current_job: contextvars.ContextVar[JobContext] = contextvars.ContextVar("pgjobs_current_job")


def current_job() -> JobContext:
    """The job the calling handler runs for; only inside a handler run by a pgjobs worker.

    Example::

        @app.task(lease=60)
        def crunch(path: str) -> None:
            for chunk in read_chunks(path):
                process(chunk)
                pgjobs.current_job().extend_lease(60)
    """
    try:
        return _current_job.get()
    except LookupError:
        raise PgjobsError(
            "current_job() works only inside a handler run by a pgjobs worker"
        ) from None


def _call_sync(context: JobContext, fn: Callable[..., Any], payload: dict[str, Any]) -> Any:
    token = _current_job.set(context)
    try:
        return fn(**payload)
    finally:
        _current_job.reset(token)


async def _call_async(context: JobContext, fn: Callable[..., Any], payload: dict[str, Any]) -> Any:
    _current_job.set(context)  # the task runs in a copy of the context: nothing leaks out
    return await fn(**payload)


def _without_nul(text: str) -> str:
    """PostgreSQL text cannot hold NUL characters."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


class _Lane:
    """One of the worker's claim connections and the round trip in flight on it."""

    __slots__ = ("asked", "conn", "ready_at", "trip")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.trip: asyncio.Task[list[Job]] | None = None
        self.asked = 0  # slots reserved for the claim in flight
        self.ready_at = 0.0  # loop time before which no trip starts (reconnection backoff)


class Worker:
    """Runs the app's tasks until stopped by a signal (or, with ``burst``, until idle).

    Example::

        Worker(app, WorkerConfig(concurrency=8, queues=["emails"])).run()
    """

    def __init__(self, app: App, config: WorkerConfig | None = None) -> None:
        self.app = app
        self.config = config or WorkerConfig()
        self.tasks: dict[str, Task] = dict(app.tasks)
        if not self.tasks:
            raise ConfigurationError("the app registers no tasks: decorate handlers with @app.task")
        queues = self.config.queues or sorted({t.queue for t in self.tasks.values()})
        self.queues = list(dict.fromkeys(queues))
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._outcomes = Outcomes(self.id)
        self._running: dict[int, tuple[JobContext, asyncio.Future[Any] | Future[Any]]] = {}
        # Outcomes of sync handlers, appended by pool threads, collected on the loop.
        self._sync_outcomes: deque[tuple[Job, Task, Any, BaseException | None]] = deque()
        self._sync_wakeup_due = False
        self._extensions: dict[int, tuple[JobContext, float]] = {}
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._signals = 0
        self._connected = True
        self._reconnect_attempt = 0
        self._executor: ThreadPoolExecutor | None = None
        self._abandoned = 0
        self._woken = False  # a NOTIFY arrived for one of our queues since the last claim
        # JOB_CLAIM's parameters but its limit.
        self._claim_params: dict[str, Any] = {
            "owner": self.id,
            "queues": self.queues,
            "lease": DEFAULT_LEASE,
            "lease_tasks": [t.name for t in self.tasks.values()],
            "lease_seconds": [t.lease for t in self.tasks.values()],
            "at_most_once_tasks": [t.name for t in self.tasks.values() if t.at_most_once],
        }

    def run(self, on_checked: Callable[[], None] | None = None) -> int:
        """Work until stopped; returns the process exit code (0 after a graceful shutdown).

        ``on_checked`` is called once the database schema has been found usable, before any
        job is claimed (`pgjobs work --processes` tells the supervisor this process is ready).
        """
        return asyncio.run(self._main(on_checked))

    async def _main(self, on_checked: Callable[[], None] | None) -> int:
        dsn = self.app.dsn
        migrate.require_head(dsn)
        if on_checked is not None:
            on_checked()
        loop = self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if any(not t.is_async for t in self.tasks.values()):
            self._executor = ThreadPoolExecutor(self.config.concurrency, "pgjobs-handler")
        conn = await db.connect_async(dsn, generic_plans=True)
        background = [asyncio.create_task(self._listen(dsn), name="pgjobs-listen")]
        # Every worker registers itself (for `pgjobs stats`), with or without maintenance.
        registry = WorkerRegistry(
            WorkerIdentity(
                self.id,
                socket.gethostname(),
                os.getpid(),
                self.queues,
                self.config.concurrency,
                datetime.now(UTC),
            )
        )
        services: list[Service] = [registry]
        if self.config.maintenance:
            services += [
                LeaseRescuer(ServiceConfig(interval=self.config.rescue_interval)),
                Expirer(ServiceConfig(interval=self.config.expire_interval)),
                ArchivePartitions(),
            ]
        background.append(asyncio.create_task(run_services(services, dsn, self._stop)))
        log.info(
            "worker %s started: queues=%s concurrency=%d tasks=%d",
            self.id,
            ",".join(self.queues),
            self.config.concurrency,
            len(self.tasks),
        )
        try:
            await self._work(conn, dsn)
        finally:
            self._stop.set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await conn.close()
            with contextlib.suppress(PgjobsError):  # else the row goes stale and is removed
                await registry.unregister(dsn)
        busy = self._abandoned > 0
        log.info("worker %s stopped", self.id)
        if self._executor is not None:
            self._executor.shutdown(wait=not busy, cancel_futures=True)
        if busy:
            # Handlers still running past the grace period were given back; their threads
            # cannot be interrupted, so leave without waiting for them.
            logging.shutdown()
            os._exit(0)
        return 0

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now; leases will recover running jobs")
            logging.shutdown()
            os._exit(128 + signum)
        log.info(
            "%s: finishing %d running job(s) within %.0fs, then exiting",
            signal.Signals(signum).name,
            len(self._running),
            self.config.grace,
        )
        self._stop.set()
        self._changed.set()

    async def _work(self, conn: Any, dsn: Dsn) -> None:
        """The claim loop. Round trips go over up to two connections ("lanes"): while one
        trip is in flight, slots freed meanwhile are settled and refilled over the other, so the
        handlers do not wait for the database and the database does not wait for the handlers."""
        loop = asyncio.get_running_loop()
        lanes = [_Lane(conn)] + ([_Lane(None)] if self.config.concurrency > 1 else [])
        deadline: float | None = None
        idle = False  # the last claim found fewer jobs than it asked for
        backlog = False  # the last claim filled every slot it asked for: more jobs are waiting
        poll_at = 0.0
        gathering_since: float | None = None
        gather = max(1, self.config.concurrency // 2)
        try:
            while True:
                for landed in lanes:
                    if landed.trip is not None and landed.trip.done():
                        claimed, asked = await self._landed(landed, dsn)
                        if asked > 0:
                            idle = len(claimed) < asked  # the queues ran dry: poll from now on
                            backlog = not idle
                            poll_at = loop.time() + self.config.poll_interval
                stopping = self._stop.is_set()
                if stopping and deadline is None:
                    deadline = loop.time() + self.config.grace
                in_flight = [x for x in lanes if x.trip is not None]
                reserved = sum(x.asked for x in in_flight)
                free = 0 if stopping else self.config.concurrency - len(self._running) - reserved
                wait = self.config.poll_interval
                # With the queues dry, claim again only when polled or woken by a NOTIFY.
                if idle and not self._woken and loop.time() < poll_at:
                    wait = poll_at - loop.time()
                    free = 0
                lane = next(
                    (x for x in lanes if x.trip is None and x.ready_at <= loop.time()), None
                )
                due = lane is not None and bool(free > 0 or len(self._outcomes) or self._extensions)
                if due and backlog and free < gather and not stopping and not self._extensions:
                    # Under load, slots free up one after another: gather them (a few ms at
                    # most) so that one round trip settles and claims a batch, not one job.
                    now = loop.time()
                    gathering_since = gathering_since if gathering_since is not None else now
                    if now - gathering_since < BATCH_WINDOW:
                        due = False
                        wait = gathering_since + BATCH_WINDOW - now
                if due and lane is not None:
                    gathering_since = None
                    if free > 0:
                        self._woken = False
                    lane.asked = max(free, 0)
                    lane.trip = asyncio.create_task(self._lane_trip(lane, dsn, lane.asked))
                    lane.trip.add_done_callback(lambda _: self._changed.set())
                    in_flight.append(lane)
                if not in_flight:
                    if stopping:
                        if not self._running and not len(self._outcomes):
                            return
                        assert deadline is not None
                        if loop.time() >= deadline:
                            await self._abandon(lanes, dsn)
                            return
                    elif self._burst_done(idle) and not await self._queues_have_jobs(lanes, dsn):
                        log.info("burst: no job left in %s", ",".join(self.queues))
                        return
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - loop.time()))
                if not self._connected:
                    wait = min(wait, min(x.ready_at for x in lanes) - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), max(wait, 0.0))
                self._changed.clear()
        finally:
            for lane in lanes:
                if lane.trip is not None:
                    lane.trip.cancel()
                    with contextlib.suppress(BaseException):
                        await lane.trip
                if lane.conn is not None and lane.conn is not conn:
                    with contextlib.suppress(Exception):
                        await lane.conn.close()

    async def _lane_trip(self, lane: _Lane, dsn: Dsn, free: int) -> list[Job]:
        if lane.conn is None or lane.conn.closed:
            lane.conn = await db.connect_async(dsn, generic_plans=True)
        return await self._trip(lane.conn, free)

    async def _landed(self, lane: _Lane, dsn: Dsn) -> tuple[list[Job], int]:
        """Take the result of ``lane``'s finished trip: start the jobs it claimed."""
        assert lane.trip is not None
        trip, asked = lane.trip, lane.asked
        lane.trip, lane.asked = None, 0
        try:
            claimed = trip.result()
        except (DatabaseUnavailable, SchemaMissing) as exc:
            await self._lost_connection(lane.conn, exc)
            lane.conn = None
            lane.ready_at = asyncio.get_running_loop().time() + self._reconnect_delay()
            return [], 0
        if not self._connected:
            self._connected = True
            self._reconnect_attempt = 0
            log.warning("database connection restored")
        for job in claimed:
            self._start(job)
        return claimed, asked

    async def _trip(self, conn: Any, free: int) -> list[Job]:
        """Settle buffered outcomes, extend requested leases and claim up to ``free`` jobs,
        in one round trip. Outcomes that could not be sent stay buffered for the next trip."""
        settle: dict[str, Any] | None = None
        settled: list[int] = []
        if len(self._outcomes):
            settle, settled = self._outcomes.drain()
        extend = None
        extensions, self._extensions = self._extensions, {}
        if extensions:
            contexts = list(extensions.values())
            extend = {
                "owner": self.id,
                "ids": [c.job.id for c, _ in contexts],
                "attempts": [c.job.attempts for c, _ in contexts],
                "seconds": [seconds for _, seconds in contexts],
            }
        claim = {**self._claim_params, "limit": free}
        try:
            applied, kept, jobs = await db.settle_and_claim(conn, settle, extend, claim)
        except (DatabaseUnavailable, SchemaMissing):
            # SchemaMissing here means the schema changed under a running worker (a migration
            # in progress): keep everything and try again, as after a lost connection.
            if settle is not None:
                self._outcomes.restore(settle)
            self._extensions = {**extensions, **self._extensions}
            raise
        except QueryFailed as exc:
            # Not a connection problem, so sending the same batch again would fail again. Leave
            # these jobs to their leases: the rescuer makes them claimable when the leases expire.
            log.error(
                "%s; outcome(s) of job(s) %s dropped, their leases will recover them",
                exc,
                ",".join(map(str, settled)) or "-",
            )
            return []
        if len(applied) != len(settled):
            stale = sorted(set(settled) - applied)
            log.warning(
                "outcome of job(s) %s not applied: the lease was lost (expired and the job was "
                "rescued or claimed elsewhere), so this worker's result is discarded",
                ",".join(map(str, stale)),
            )
        for job_id, (context, _) in extensions.items():
            if job_id not in kept:
                context.lease_lost = True
                log.warning("job %d: lease extension refused, the lease was already lost", job_id)
        return jobs

    def _reconnect_delay(self) -> float:
        return RECONNECT_DELAYS[min(self._reconnect_attempt, len(RECONNECT_DELAYS) - 1)]

    async def _lost_connection(self, conn: Any, exc: PgjobsError) -> None:
        if self._connected:
            what = "connection lost" if isinstance(exc, DatabaseUnavailable) else "schema refused"
            log.warning(
                "database %s (%s); %d outcome(s) kept for retry; reconnecting",
                what,
                exc,
                len(self._outcomes),
            )
        self._connected = False
        self._reconnect_attempt += 1
        with contextlib.suppress(Exception):
            await conn.close()

    def _burst_done(self, idle: bool) -> bool:
        """In burst mode: nothing to claim, nothing running, nothing left to flush."""
        return (
            self.config.burst
            and idle
            and self._connected
            and not self._running
            and not len(self._outcomes)
        )

    async def _queues_have_jobs(self, lanes: list[_Lane], dsn: Dsn) -> bool:
        lane = lanes[0]
        try:
            if lane.conn is None or lane.conn.closed:
                lane.conn = await db.connect_async(dsn, generic_plans=True)
            rows = await db.fetch_all_async(
                lane.conn, queries.QUEUES_HAVE_JOBS, {"queues": self.queues}
            )
        except (DatabaseUnavailable, SchemaMissing) as exc:
            await self._lost_connection(lane.conn, exc)
            lane.conn = None
            return True
        return bool(rows[0][0])

    def _start(self, job: Job) -> None:
        task = self.tasks.get(job.task)
        if task is None:
            self._outcomes.bury(
                job,
                "unknown_task",
                f"no task named {job.task!r} is registered with this worker's app",
            )
            log.warning("job %d: unknown task %r, sent to dead_letter", job.id, job.task)
            self._changed.set()
            return
        problem = task.check_payload(job.payload)
        if problem is not None:
            self._outcomes.bury(job, "invalid_payload", problem)
            log.warning("job %d (%s): %s, sent to dead_letter", job.id, job.task, problem)
            self._changed.set()
            return
        context = JobContext(job, self)
        if task.is_async:
            future = asyncio.ensure_future(_call_async(context, task.fn, job.payload))
            self._running[job.id] = (context, future)
            future.add_done_callback(functools.partial(self._async_finished, job, task))
        else:
            assert self._executor is not None
            self._running[job.id] = (context, self._executor.submit(self._run_sync, context, task))

    def _async_finished(self, job: Job, task: Task, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._finished(job, task, None, None, cancelled=True)
        else:
            exc = future.exception()
            self._finished(job, task, None if exc else future.result(), exc)

    def _run_sync(self, context: JobContext, task: Task) -> None:
        """In a pool thread: run a sync handler, then hand its outcome to the loop. Outcomes
        are collected in batches: one wake-up of the loop for however many handlers finished
        meanwhile, rather than one per job."""
        outcome: tuple[Job, Task, Any, BaseException | None]
        try:
            outcome = (context.job, task, _call_sync(context, task.fn, context.job.payload), None)
        except BaseException as exc:  # whatever the handler raised is its job's outcome
            outcome = (context.job, task, None, exc)
        # Append before looking at the flag, which the loop clears before it collects: every
        # outcome is either collected by a wake-up already due or schedules one.
        self._sync_outcomes.append(outcome)
        if not self._sync_wakeup_due:
            self._sync_wakeup_due = True
            self._loop.call_soon_threadsafe(self._collect_sync_outcomes)

    def _collect_sync_outcomes(self) -> None:
        self._sync_wakeup_due = False
        while self._sync_outcomes:
            self._finished(*self._sync_outcomes.popleft())

    def _finished(
        self,
        job: Job,
        task: Task,
        result: Any,
        exc: BaseException | None,
        *,
        cancelled: bool = False,
    ) -> None:
        if self._running.pop(job.id, None) is None:
            return  # already given back by _abandon
        self._extensions.pop(job.id, None)
        self._changed.set()
        if cancelled:
            self._outcomes.release(job, refund=False)
            return
        if exc is None:
            self._outcomes.succeed(job, result_json(result))
            return
        error = _one_line(exc)
        where = f"job {job.id} ({job.task}) failed on attempt {job.attempts}/{job.max_attempts}"
        if isinstance(exc, NonRetryableError) or job.is_last_attempt:
            reason = "non_retryable" if isinstance(exc, NonRetryableError) else "exhausted"
            error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
            trace = _without_nul("".join(traceback.format_exception(exc)))
            self._outcomes.bury(job, reason, error, error_type, trace)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, reason)
        else:
            delay = task.retry.delay(job.attempts)
            self._outcomes.retry(job, delay, error)
            log.warning("%s: %s; retry in %.1fs", where, error, delay)

    def _request_extension(self, context: JobContext, seconds: float) -> None:
        """Called from any thread: extend ``context``'s lease on the next trip."""
        self._loop.call_soon_threadsafe(self._queue_extension, context, seconds)

    def _queue_extension(self, context: JobContext, seconds: float) -> None:
        if context.job.id in self._running:
            self._extensions[context.job.id] = (context, seconds)
            self._changed.set()

    async def _abandon(self, lanes: list[_Lane], dsn: Dsn) -> None:
        """Grace period over: give running jobs back now (their attempt stays used) rather than
        leave them to their leases; at-most-once jobs go to dead_letter, never to run again."""
        for context, future in list(self._running.values()):
            job = context.job
            task = self.tasks.get(job.task)
            if task is not None and task.at_most_once:
                self._outcomes.bury(
                    job, "interrupted", "worker shut down while the at-most-once job was running"
                )
            else:
                self._outcomes.release(job, refund=False)
            future.cancel()
        self._abandoned = len(self._running)
        log.warning("grace period over: gave back %d running job(s)", self._abandoned)
        self._running.clear()
        try:
            await self._lane_trip(lanes[0], dsn, 0)
        except (DatabaseUnavailable, SchemaMissing) as exc:
            log.warning("could not flush outcomes (%s); leases will recover those jobs", exc)

    async def _listen(self, dsn: Dsn) -> None:
        """Wake the claim loop when a job is enqueued on one of this worker's queues."""
        queues = set(self.queues)
        attempt = 0
        while not self._stop.is_set():
            try:
                async for queue in db.notifications(dsn):
                    attempt = 0
                    if queue in queues:
                        self._woken = True
                        self._changed.set()
            except DatabaseUnavailable:
                # The claim loop reports the outage; polling covers the gap.
                attempt += 1
                self._changed.set()
                await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])


def _one_line(exc: BaseException) -> str:
    text = _without_nul(" ".join(f"{type(exc).__name__}: {exc}".split()))
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"
