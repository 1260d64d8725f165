"""The worker: claim -> run -> hand the outcome to the completer; signals and shutdown.

One asyncio loop owns the database connection. Async handlers run on that loop, sync handlers
in a thread pool; both occupy one of ``concurrency`` slots (``slots``). Every trip to the
database settles the outcomes buffered since the last trip and claims at most as many jobs as
there are free slots, and as many ahead as the handlers' pace allows (``pacing``), in one
pipelined round trip.

An external task's job (``App.external_task``) occupies a slot only while it is delivered to its
downstream over HTTP (``external``); once delivered it stays running under its lease until the
downstream reports. With ``WorkerConfig.http`` the worker serves its own ``/metrics``,
``/healthz``, ``/readyz`` and ``/stats`` (``http``); with ``WorkerConfig.otel_metrics`` it records
its jobs' outcomes, run time and pickup latency into OpenTelemetry instruments
(``pgjobs.instruments``); without either, nothing is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgjobs import db, instruments, migrate, queries
from pgjobs.completer import Claimed, ClaimParams, Completer
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, DatabaseUnavailable, PgjobsError, SchemaMissing
from pgjobs.maintenance import run_services
from pgjobs.tasks import Task
from pgjobs.worker import services
from pgjobs.worker.burst import BurstExit
from pgjobs.worker.config import RECONNECT_DELAYS, WorkerConfig
from pgjobs.worker.depths import QueueDepths
from pgjobs.worker.external import deliveries, describe
from pgjobs.worker.http import ProbeServer, ProbeState, address_text
from pgjobs.worker.metrics import WorkerMetrics
from pgjobs.worker.pacing import ClaimPacer, Lane
from pgjobs.worker.refusals import Refusals
from pgjobs.worker.slots import Slots

if TYPE_CHECKING:
    from pgjobs.app import App

log = logging.getLogger("pgjobs.worker")


class Worker:
    """Runs the app's tasks until stopped by a signal or ``stop()`` (or, with ``burst``, until
    idle): ``run()`` in a program's own process, ``await run_async()`` inside an event loop
    that the caller owns (a web application, a thread of its own).

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
        self.completer = Completer(
            ClaimParams.for_tasks(self.id, self.queues, self.tasks.values()),
            recheck=self.config.poll_interval,
            max_result_bytes=self.config.max_result_bytes,
        )
        otel = self.config.otel_metrics
        #: Only with --http or --otel-metrics: what the worker counts for /metrics and records
        #: into OpenTelemetry's instruments (None counts nothing).
        self.metrics = (
            WorkerMetrics(
                self.id,
                self.config.concurrency,
                self.tasks,
                instruments.JobInstruments(instruments.meter(otel)) if otel is not False else None,
            )
            if self.config.http is not None or otel is not False
            else None
        )
        self._changed = asyncio.Event()
        #: When to claim and how many jobs: the claim connections and the read-ahead.
        self.pacer = ClaimPacer(self.config, self.completer)
        #: The slots and the jobs claimed ahead that wait for one. External tasks served here
        #: (their jobs are in this worker's queues) are refused at once when left without a URL.
        self.slots = Slots(
            self.tasks,
            self.config.concurrency,
            self.completer,
            self.pacer,
            deliveries(self.tasks, self.config.external, self.queues),
            self.metrics,
            self._changed,
        )
        self.slots.reads = app._pools  # current_job().dependency_results(), batch_results()
        self.burst = BurstExit(
            self.config.burst, self.queues, self.completer, self.pacer, self.slots, self._changed
        )
        self._stop = asyncio.Event()
        # stop() was called before the loop started: the run stops as soon as it begins.
        self._stop_requested = False
        # The worker owns the process: it handles SIGTERM/SIGINT and may leave with os._exit
        # (run() in the main thread); run_async() and run() in another thread leave both to
        # the caller.
        self._owns_process = False
        # run(exit_process=True), as `pgjobs work` runs it: end the process at once when
        # handlers still run past the grace period.
        self._exit_process = False
        self._signals = 0
        self._connected = True
        self._outage = "database unreachable"  # why not connected (for /readyz)
        self._depths: QueueDepths | None = None  # for /stats, once the database is known
        #: Round trips the database refused in a row (read-only, a privilege revoked).
        self.refusals = Refusals()
        self._abandoned = 0
        #: The schema was found usable and the claim connection opened.
        self.checked = False
        self._tick: float | None = None  # loop time of the claim loop's last turn
        self._deadline: float | None = None  # after a signal, when the grace period ends
        self._http_address: tuple[str, int] | None = None

    def run(
        self, on_checked: Callable[[], None] | None = None, *, exit_process: bool = False
    ) -> int:
        """Work until stopped, in an event loop of its own; returns the process exit code (0
        after a graceful shutdown).

        From the program's main thread the worker handles SIGTERM and SIGINT (a second one
        exits at once); from any other thread it installs no signal handler and stops on
        ``stop()``. ``on_checked`` is called once the database schema has been found usable,
        before any job is claimed (`pgjobs work --processes` tells the supervisor this process
        is ready). Sync handlers still running when the grace period ends were given back, but
        their threads cannot be stopped: with ``exit_process`` (what `pgjobs work` does) the
        process then ends at once with exit code 0; without it, ``run()`` returns and the
        threads run on until their handlers return (the interpreter waits for them at exit).

        Example: ``sys.exit(Worker(app, WorkerConfig(concurrency=8)).run())``
        """
        signals = threading.current_thread() is threading.main_thread()
        self._exit_process = exit_process
        return asyncio.run(self._main(on_checked, owns_process=signals))

    async def run_async(self, on_checked: Callable[[], None] | None = None) -> int:
        """Work until ``stop()`` (or, with ``burst``, until idle) inside the running event loop,
        which the caller owns, in any thread; returns 0 after a graceful shutdown.

        The caller owns the signals: no handler is installed, and the worker never ends the
        process. Handlers run on this loop (async ones) or in the worker's thread pool (sync
        ones), so a loop that also serves requests shares its time with them. Stop it with
        ``stop()``, which lets running jobs finish within the grace period; cancelling the
        awaiting task instead leaves the jobs it runs to their leases (they run again later).

        Example (a FastAPI lifespan)::

            @contextlib.asynccontextmanager
            async def lifespan(api: FastAPI) -> AsyncIterator[None]:
                worker = Worker(app, WorkerConfig(concurrency=4))
                task = asyncio.create_task(worker.run_async())
                yield
                worker.stop()
                await task
        """
        return await self._main(on_checked, owns_process=False)

    @property
    def http_address(self) -> tuple[str, int] | None:
        """(host, port) the worker's HTTP endpoint listens on, once it does (``http``)."""
        return self._http_address

    async def _main(self, on_checked: Callable[[], None] | None, *, owns_process: bool) -> int:
        if getattr(self, "_loop", None) is not None:
            raise ConfigurationError("a Worker runs once: build a new one to run again")
        self._owns_process = owns_process
        loop = self._loop = asyncio.get_running_loop()
        # Read after _loop is set: a stop() that saw no loop set the flag before looking.
        if self._stop_requested:
            self._begin_stop("stop()")
        probe = await self._start_probe()
        try:
            return await self._run(on_checked, loop)
        finally:
            if probe is not None:
                await probe.close()

    async def _start_probe(self) -> ProbeServer | None:
        """Listen on ``config.http`` first: a port in use fails the start at once, and the
        probes answer (503, "starting") while the schema is checked."""
        if self.config.http is None or self.metrics is None:
            return None
        probe = ProbeServer(
            self.metrics, self.probe_state, self.stats, token=self.config.http_token
        )
        self._http_address = await probe.start(*self.config.http)
        log.info(
            "worker %s: serving /metrics, /healthz, /readyz and /stats on http://%s",
            self.id,
            address_text(*self._http_address),
        )
        return probe

    async def _run(
        self, on_checked: Callable[[], None] | None, loop: asyncio.AbstractEventLoop
    ) -> int:
        dsn = self.app.dsn
        if self.config.http is not None:
            self._depths = QueueDepths(dsn, self.queues)
        migrate.require_head(dsn)
        if on_checked is not None:
            on_checked()
        if self._owns_process:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        self.slots.open(loop)
        conn = await db.connect_async(dsn, hot=True)
        self.checked = True
        listen = self.app.listen_dsn
        background: list[asyncio.Task[None]] = []
        if listen is not None:
            background.append(asyncio.create_task(self._listen(listen), name="pgjobs-listen"))
        else:
            log.info(
                "worker %s: the DSN goes through a transaction-mode pooler and no --listen-dsn "
                "was given: polling every %gs for new jobs",
                self.id,
                self.config.poll_interval,
            )
        registry = services.registry(self.id, self.queues, self.config.concurrency, self.metrics)
        others = services.maintenance(self.app, self.config, self.queues, self.tasks.values())
        background.append(asyncio.create_task(run_services([registry, *others], dsn, self._stop)))
        log.info(
            "worker %s started: queues=%s concurrency=%d tasks=%d",
            self.id,
            ",".join(self.queues),
            self.config.concurrency,
            len(self.tasks),
        )
        for line in describe(self.slots.deliveries):
            log.info("external task %s", line)
        if self.config.otel_metrics is not False:
            log.info(
                "worker %s: recording OpenTelemetry metrics through %s",
                self.id,
                instruments.describe(self.config.otel_metrics),
            )
        try:
            await self._work(conn, dsn)
        except BaseException:
            self.slots.close(wait=False)  # idle threads would keep the process alive
            raise
        finally:
            self._stop.set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(PgjobsError):  # else the row goes stale and is removed
                await registry.unregister(dsn, conn)
            with contextlib.suppress(Exception):
                await conn.close()
        busy = self._abandoned > 0 or self.slots.stray_threads() > 0
        log.info("worker %s stopped", self.id)
        self.slots.close(wait=not busy)
        if busy and self._owns_process and self._exit_process:
            # Handlers still running past the grace period were given back; their threads
            # cannot be interrupted, so `pgjobs work` leaves without waiting for them. In a
            # program that runs a worker (a test suite, too), they run on until they return.
            logging.shutdown()
            os._exit(0)
        return 0

    def stop(self) -> None:
        """Stop as on SIGTERM: claim nothing more, let running jobs finish within the grace
        period, then return from ``run()`` / ``run_async()``. Callable from any thread; called
        before the run started, the run stops as soon as it begins; after it ended, it does
        nothing.

        Example: ``threading.Timer(60, worker.stop).start(); worker.run()``
        """
        # Set before looking at the loop: _main sets the loop, then reads the flag, so one of
        # the two sees the other.
        self._stop_requested = True
        loop = getattr(self, "_loop", None)
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has ended
                loop.call_soon_threadsafe(self._begin_stop, "stop()")

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now; leases will recover running jobs")
            logging.shutdown()
            os._exit(128 + signum)
        self._begin_stop(signal.Signals(signum).name)

    def _begin_stop(self, why: str) -> None:
        if self._stop.is_set():
            return
        log.info(
            "%s: finishing %d running job(s) within %.0fs, then exiting",
            why,
            self.slots.busy,
            self.config.grace,
        )
        self._stop.set()
        self._changed.set()

    async def _work(self, conn: Any, dsn: Dsn) -> None:
        """The claim loop: take the trips that landed, start their jobs, start the next trip
        when one is due (``ClaimPacer.dispatch``), sleep until something changes."""
        pacer, slots = self.pacer, self.slots
        pacer.open(conn, dsn, self._changed)
        try:
            while True:
                self._tick = self._loop.time()
                for lane in pacer.landed():
                    claimed = await self._landed(lane)
                    pacer.learn(claimed, self._loop.time())
                slots.fill()
                stopping = self._stop.is_set()
                if stopping:
                    slots.give_back_waiting()
                    if self._deadline is None:
                        self._deadline = self._loop.time() + self.config.grace
                wait = pacer.dispatch(
                    self._loop.time(),
                    in_hand=slots.in_hand,
                    fed=slots.fed,
                    left=slots.left,
                    stopping=stopping,
                )
                if not pacer.in_flight and await self._should_exit():
                    return
                await self._sleep(wait)
        finally:
            await pacer.close(keep=conn)

    async def _landed(self, lane: Lane) -> Claimed:
        """Take the result of ``lane``'s finished trip: its jobs join those waiting for a slot,
        and start as far as slots are free."""
        try:
            claimed = self.pacer.take(lane)
        except (DatabaseUnavailable, SchemaMissing) as exc:
            await self._lost_connection(lane.conn, exc)
            self.pacer.lost(lane, self._loop.time() + self._reconnect_delay(lane))
            return Claimed([], None, 0)
        lane.failures = 0
        if not self._connected:
            self._connected = True
            self.pacer.restored()
            log.warning("database connection restored")
        if claimed.refused is not None:  # a read-only database, a privilege revoked...
            now = self._loop.time()
            self.pacer.refused_until = now + self.refusals.refused(claimed.refused, now)
            return claimed
        if self.refusals.streak:
            self.refusals.accepted()
            self.pacer.refused_until = 0.0
        metrics = self.metrics
        if metrics is not None:
            metrics.trip()
            now = time.time()
            for job in claimed.jobs:
                metrics.claimed(job, now)
        self.slots.add(claimed.jobs)
        self.slots.fill()
        return claimed

    async def _should_exit(self) -> bool:
        """With no trip in flight: whether the loop is done (shutdown finished or timed out, or
        a burst found nothing left)."""
        if self._stop.is_set():
            if not self.slots.busy and not len(self.completer.outcomes):
                return True
            assert self._deadline is not None
            if self._loop.time() >= self._deadline:
                await self._abandon()
                return True
            return False
        if not self.burst.due(connected=self._connected):
            return False
        try:
            return await self.burst.done(await self.pacer.connection())
        except (DatabaseUnavailable, SchemaMissing) as exc:  # try again at the next turn
            lane = self.pacer.lanes[0]
            await self._lost_connection(lane.conn, exc)
            self.pacer.lost(lane)
            return False

    async def _abandon(self) -> None:
        """Grace period over: give running jobs back now (``Slots.abandon``) and settle that."""
        self._abandoned = self.slots.abandon()
        log.warning("grace period over: gave back %d running job(s)", self._abandoned)
        try:
            await self.pacer.trip(self.pacer.lanes[0], 0)
        except (DatabaseUnavailable, SchemaMissing) as exc:
            log.warning("could not flush outcomes (%s); leases will recover those jobs", exc)

    async def _sleep(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for something to change (a handler finished, a trip
        landed, a NOTIFY, a signal), less when the grace period or a reconnection is due."""
        now = self._loop.time()
        if self._deadline is not None:
            wait = max(0.0, min(wait, self._deadline - now))
        if not self._connected:
            wait = min(wait, self.pacer.ready_at() - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(wait, 0.0))
        self._changed.clear()

    @staticmethod
    def _reconnect_delay(lane: Lane) -> float:
        """How long ``lane`` waits before it tries again: the next step of ``RECONNECT_DELAYS``,
        counted on that lane alone (each lane's own losses, since its last trip went through)."""
        delay = RECONNECT_DELAYS[min(lane.failures, len(RECONNECT_DELAYS) - 1)]
        lane.failures += 1
        return delay

    async def _lost_connection(self, conn: Any, exc: PgjobsError) -> None:
        if self._connected:
            what = "connection lost" if isinstance(exc, DatabaseUnavailable) else "schema refused"
            log.warning(
                "database %s (%s); %d outcome(s) kept for retry; reconnecting",
                what,
                exc,
                len(self.completer.outcomes),
            )
        self._connected = False
        # What /readyz says until a trip lands again.
        self._outage = (
            "database unreachable"
            if isinstance(exc, DatabaseUnavailable)
            else "schema refused (run `pgjobs migrate`, or a migration is in progress)"
        )
        with contextlib.suppress(Exception):
            await conn.close()

    async def _listen(self, dsn: Dsn) -> None:
        """Wake the claim loop when a job is enqueued on one of this worker's queues; stop the
        handler of a job cancelled while running here (``pgjobs cancel --force``). ``dsn`` is
        the app's ``listen_dsn``: never one through a transaction-mode pooler."""
        queues = set(self.queues)
        attempt = 0
        while not self._stop.is_set():
            try:
                async for payload in db.notifications(dsn):
                    attempt = 0
                    if payload in queues:
                        self.pacer.woken = True
                        self.completer.limits_due()  # the new jobs may be limited ones
                        self._changed.set()
                    elif payload.startswith(queries.CANCEL_NOTICE):
                        cancel = cancel_notice(payload)
                        if cancel is not None:
                            self.slots.cancel(*cancel)
            except DatabaseUnavailable:
                # The claim loop reports the outage; polling covers the gap.
                attempt += 1
                self._changed.set()
                await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])

    def probe_state(self) -> ProbeState:
        """What ``/healthz`` and ``/readyz`` report: healthy while the claim loop turns and no
        round trip has been waiting for ``stuck_after`` seconds; ready once the schema was
        checked, while the claim connection is up and the worker is not stopping."""
        now = self._loop.time()
        limit = self.config.stuck_after
        unhealthy = None
        if self._tick is not None and now - self._tick > limit:
            unhealthy = f"the claim loop has not turned for {now - self._tick:.0f}s"
        else:
            waiting = self.pacer.longest_trip(now)
            if waiting is not None and waiting > limit:
                unhealthy = f"a round trip to the database has waited {waiting:.0f}s"
        if not self.checked:
            not_ready = "starting"
        elif self._stop.is_set():
            not_ready = "stopping"
        elif not self._connected:
            not_ready = self._outage
        else:
            not_ready = None
        return ProbeState(self.slots.busy, self._connected, not_ready, unhealthy)

    async def stats(self) -> dict[str, Any]:
        """What ``/stats`` answers: the worker's slots and the jobs in them (local, exact), and
        its queues' depths in all, read from the database at most once a second (``depths``);
        while that cannot be read, ``queues`` is null and ``queues_error`` says why."""
        depths = None if self._depths is None else await self._depths.read()
        concurrency, running = self.config.concurrency, self.slots.running_jobs()  # as it answers
        return {
            "worker": self.id,
            "slots": {
                "total": concurrency,
                "busy": len(running),
                "free": max(concurrency - len(running), 0),
                "claimed_ahead": len(self.slots.waiting_jobs()),
            },
            "running": [
                {"id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempts}
                for job in running
            ],
            "queues": None if depths is None else depths.queues,
            "queues_error": "starting" if depths is None else depths.error,
            "queues_age": None if depths is None else round(self._loop.time() - depths.read_at, 3),
        }


def cancel_notice(payload: str) -> tuple[int, int] | None:
    """(job id, attempt) of a ``queries.CANCEL_NOTICE`` payload; None for anything else.

    Example: ``cancel_notice("cancel\\t7\\t2") == (7, 2)``
    """
    parts = payload.split("\t")
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[1]), int(parts[2])
