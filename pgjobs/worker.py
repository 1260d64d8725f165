"""The worker: claim -> run -> hand the outcome to the completer; signals and shutdown.

One asyncio loop owns the database connection. Async handlers run on that loop, sync handlers
in a thread pool; both occupy one of ``concurrency`` slots. Every trip to the database settles
the outcomes buffered since the last trip and claims at most as many jobs as there are free
slots, in one pipelined round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgjobs import db, queries
from pgjobs.completer import Outcomes, result_json
from pgjobs.errors import ConfigurationError, DatabaseUnavailable, NonRetryableError, SchemaMissing
from pgjobs.maintenance import run_services
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.models import Job
from pgjobs.tasks import DEFAULT_LEASE, Task

if TYPE_CHECKING:
    from pgjobs.app import App

log = logging.getLogger("pgjobs.worker")

#: Longest error text kept in last_error (characters); the full traceback goes to dead_letter.
MAX_ERROR_LENGTH = 2000
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

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.poll_interval > 0:
            raise ConfigurationError(f"poll interval must be > 0 seconds, got {self.poll_interval}")
        if self.grace < 0:
            raise ConfigurationError(f"grace must be >= 0 seconds, got {self.grace}")


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
        self._running: dict[int, tuple[Job, asyncio.Future[Any]]] = {}
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._signals = 0
        self._connected = True
        self._lease_tasks = list(self.tasks)
        self._lease_seconds = [t.lease for t in self.tasks.values()]
        self._executor: ThreadPoolExecutor | None = None
        self._abandoned = 0

    def run(self) -> int:
        """Work until stopped; returns the process exit code (0 after a graceful shutdown)."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        dsn = self.app.dsn
        with db.connect(dsn) as probe:
            revision = db.schema_revision(probe)
        if revision is None:
            raise SchemaMissing(
                f"the pgjobs tables are missing in {dsn.redacted}: run `pgjobs migrate`"
            )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if any(not t.is_async for t in self.tasks.values()):
            self._executor = ThreadPoolExecutor(self.config.concurrency, "pgjobs-handler")
        conn = await db.connect_async(dsn)
        background = [asyncio.create_task(self._listen(dsn), name="pgjobs-listen")]
        if self.config.maintenance:
            services = [LeaseRescuer(), Expirer()]
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

    async def _work(self, conn: Any, dsn: db.Dsn) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        idle = False
        while True:
            stopping = self._stop.is_set()
            if stopping and deadline is None:
                deadline = loop.time() + self.config.grace
            free = 0 if stopping else self.config.concurrency - len(self._running)
            if free > 0 or len(self._outcomes):
                try:
                    if not self._connected:
                        conn = await db.connect_async(dsn)
                        self._connected = True
                        log.warning("database connection restored")
                    claimed = await self._trip(conn, free)
                except DatabaseUnavailable as exc:
                    claimed = []
                    await self._lost_connection(conn, exc)
                for job in claimed:
                    self._start(job)
                idle = free > 0 and not claimed
            if stopping:
                if not self._running and not len(self._outcomes):
                    return
                assert deadline is not None
                if loop.time() >= deadline:
                    await self._abandon(conn)
                    return
            elif self._burst_done(idle) and not await self._queues_have_jobs(conn):
                log.info("burst: no job left in %s", ",".join(self.queues))
                return
            timeout = self.config.poll_interval
            if deadline is not None:
                timeout = max(0.0, min(timeout, deadline - loop.time()))
            if not self._connected:
                timeout = min(timeout, self._reconnect_delay())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
            self._changed.clear()

    async def _trip(self, conn: Any, free: int) -> list[Job]:
        settle: dict[str, Any] | None = None
        settled: list[int] = []
        if len(self._outcomes):
            settle, settled = self._outcomes.drain()
        claim = None
        if free > 0:
            claim = {
                "owner": self.id,
                "queues": self.queues,
                "limit": free,
                "lease": DEFAULT_LEASE,
                "lease_tasks": self._lease_tasks,
                "lease_seconds": self._lease_seconds,
            }
        try:
            applied, jobs = await db.settle_and_claim(conn, settle, claim)
        except Exception:
            if settle is not None:
                self._outcomes.restore(settle)
            raise
        if len(applied) != len(settled):
            stale = sorted(set(settled) - applied)
            log.warning(
                "outcome of job(s) %s not applied: the lease was lost (expired and the job was "
                "rescued or claimed elsewhere), so this worker's result is discarded",
                ",".join(map(str, stale)),
            )
        self._reconnect_attempt = 0
        return jobs

    _reconnect_attempt = 0

    def _reconnect_delay(self) -> float:
        return RECONNECT_DELAYS[min(self._reconnect_attempt, len(RECONNECT_DELAYS) - 1)]

    async def _lost_connection(self, conn: Any, exc: DatabaseUnavailable) -> None:
        if self._connected:
            log.warning(
                "database connection lost (%s); %d outcome(s) kept for retry; reconnecting",
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

    async def _queues_have_jobs(self, conn: Any) -> bool:
        try:
            rows = await db.fetch_all_async(conn, queries.QUEUES_HAVE_JOBS, {"queues": self.queues})
        except DatabaseUnavailable as exc:
            await self._lost_connection(conn, exc)
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
        future: asyncio.Future[Any]
        if task.is_async:
            future = asyncio.ensure_future(task.fn(**job.payload))
        else:
            loop = asyncio.get_running_loop()
            call = functools.partial(task.fn, **job.payload)
            future = loop.run_in_executor(self._executor, call)
        self._running[job.id] = (job, future)
        future.add_done_callback(functools.partial(self._finished, job, task))

    def _finished(self, job: Job, task: Task, future: asyncio.Future[Any]) -> None:
        if self._running.pop(job.id, None) is None:
            return  # already given back by _abandon
        self._changed.set()
        if future.cancelled():
            self._outcomes.release(job, refund=False)
            return
        exc = future.exception()
        if exc is None:
            self._outcomes.succeed(job, result_json(future.result()))
            return
        error = _one_line(exc)
        where = f"job {job.id} ({job.task}) failed on attempt {job.attempts}/{job.max_attempts}"
        if isinstance(exc, NonRetryableError) or job.is_last_attempt:
            reason = "non_retryable" if isinstance(exc, NonRetryableError) else "exhausted"
            error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
            trace = "".join(traceback.format_exception(exc))
            self._outcomes.bury(job, reason, error, error_type, trace)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, reason)
        else:
            delay = task.retry.delay(job.attempts)
            self._outcomes.retry(job, delay, error)
            log.warning("%s: %s; retry in %.1fs", where, error, delay)

    async def _abandon(self, conn: Any) -> None:
        """Grace period over: give running jobs back (their attempt stays used) and flush."""
        for job, future in list(self._running.values()):
            self._outcomes.release(job, refund=False)
            future.cancel()
        self._abandoned = len(self._running)
        log.warning("grace period over: gave back %d running job(s) to the queue", self._abandoned)
        self._running.clear()
        if self._connected:
            try:
                await self._trip(conn, 0)
            except DatabaseUnavailable as exc:
                log.warning("could not flush outcomes (%s); leases will recover those jobs", exc)

    async def _listen(self, dsn: db.Dsn) -> None:
        """Wake the claim loop when a job is enqueued on one of this worker's queues."""
        queues = set(self.queues)
        attempt = 0
        while not self._stop.is_set():
            try:
                async for queue in db.notifications(dsn, queries.NOTIFY_CHANNEL):
                    attempt = 0
                    if queue in queues:
                        self._changed.set()
            except DatabaseUnavailable:
                # The claim loop reports the outage; polling covers the gap.
                attempt += 1
                self._changed.set()
                await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])


def _one_line(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"
