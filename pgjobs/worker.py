"""The worker: claim -> run -> hand the outcome to the completer; signals and shutdown.

One asyncio loop owns the database connection. Async handlers run on that loop, sync handlers
in a thread pool; both occupy one of ``concurrency`` slots. Every trip to the database settles
the outcomes buffered since the last trip and claims at most as many jobs as there are free
slots, in one pipelined round trip.

An external task's job (``App.external_task``) occupies a slot only while it is delivered to its
downstream over HTTP (``pgjobs.external``); once delivered it stays running under its lease until
the downstream reports. With ``WorkerConfig.http`` the worker serves its own ``/metrics``,
``/healthz`` and ``/readyz`` (``pgjobs.probe``); without it, nothing is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjobs import db, external, migrate, queries, tracing
from pgjobs.completer import Claimed, ClaimParams, ClaimStatus, Completer
from pgjobs.context import HandlerExit, JobContext, call_async, call_sync
from pgjobs.dsn import Dsn
from pgjobs.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    NonRetryableError,
    PgjobsError,
    SchemaMissing,
)
from pgjobs.maintenance import Service, ServiceConfig, run_services
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.maintenance.limits import LapsedLimits
from pgjobs.maintenance.partitions import ArchivePartitions
from pgjobs.maintenance.registry import Heartbeat, WorkerIdentity, WorkerRegistry
from pgjobs.maintenance.scheduler import Scheduler
from pgjobs.models import Job
from pgjobs.payloads import NEWER_VERSION_HOLD
from pgjobs.probe import ProbeServer, ProbeState, WorkerMetrics, address_text
from pgjobs.targets import ExternalTarget
from pgjobs.tasks import Task, UpgradeFailed
from pgjobs.threads import HandlerThreads, Run

if TYPE_CHECKING:
    from pgjobs.app import App

log = logging.getLogger("pgjobs.worker")
#: Expired jobs a burst worker with nothing to claim archives per statement before it exits.
BURST_EXPIRE_BATCH = 1000

#: Seconds a busy worker waits for more slots to free up before its next round trip.
BATCH_WINDOW = 0.005
#: The same while jobs claimed ahead keep its slots busy (outcomes wait at most this long).
FED_BATCH_WINDOW = 0.02
#: Seconds between reconnection attempts after the database went away: doubling, capped.
RECONNECT_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0)
#: Seconds without a turn of the claim loop (or with one round trip in flight) after which
#: `--http`'s /healthz answers 503.
STUCK_AFTER = 60.0
#: Seconds a job claimed ahead of a free slot may wait for one, at the pace the worker's
#: handlers recently finished: what bounds the read-ahead of a worker whose handlers are slow
#: (no job waits long, and a job claimed ahead can never outlive its lease).
READ_AHEAD_WAIT = 0.05
#: Jobs a worker claims ahead per slot unless told otherwise (``WorkerConfig.read_ahead``):
#: enough for round trips of a hundred jobs and more at --concurrency 32 with quick handlers.
READ_AHEAD_PER_SLOT = 8
#: The most jobs a worker may claim ahead.
MAX_READ_AHEAD = 10_000
#: Seconds an async handler cancelled at its timeout (or by `pgjobs cancel --force`) may take to
#: unwind (its ``finally`` blocks) before its slot is given back anyway.
STOP_GRACE = 5.0


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
    #: Run the lease rescuer, the expirer and the archive partitioner in this worker.
    maintenance: bool = True
    #: Seconds between lease-rescuer rounds (how soon after a lease expires its job is free).
    rescue_interval: float = LeaseRescuer.default_interval
    #: Seconds between expirer rounds.
    expire_interval: float = Expirer.default_interval
    #: (host, port) to serve /metrics, /healthz and /readyz on; None serves nothing and counts
    #: nothing. Port 0 picks a free port (logged).
    http: tuple[str, int] | None = None
    #: Defaults for external tasks: the URL, timeout and headers of the tasks that set none.
    external: ExternalTarget = field(default_factory=ExternalTarget)
    #: Seconds the claim loop may go without turning (or wait on one round trip) before
    #: /healthz reports it stuck.
    stuck_after: float = STUCK_AFTER
    #: The most jobs claimed ahead of free slots while the queues hold a backlog, started as
    #: slots free up (bigger round trips, and handlers that never wait for one); None:
    #: ``READ_AHEAD_PER_SLOT`` per slot. Held to what the worker's handlers start within
    #: ``READ_AHEAD_WAIT`` seconds at their recent pace. 0 claims only for free slots.
    read_ahead: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.read_ahead is not None and not 0 <= self.read_ahead <= MAX_READ_AHEAD:
            raise ConfigurationError(
                f"read_ahead must be 0..{MAX_READ_AHEAD}, got {self.read_ahead}",
                field="read_ahead",
            )
        if not self.poll_interval > 0:
            raise ConfigurationError(f"poll interval must be > 0 seconds, got {self.poll_interval}")
        self.rescuer_config(), self.expirer_config()  # validated as the services will take them
        if self.grace < 0:
            raise ConfigurationError(f"grace must be >= 0 seconds, got {self.grace}")
        if self.http is not None:
            host, port = self.http
            if not isinstance(host, str) or not host or not 0 <= port <= 65535:
                raise ConfigurationError(
                    f"http must be (host, port) with port 0..65535, got {self.http!r}",
                    field="http",
                )
        if not self.stuck_after > self.poll_interval:
            raise ConfigurationError(
                f"stuck_after ({self.stuck_after}s) must exceed the poll interval "
                f"({self.poll_interval}s)"
            )

    @property
    def claim_ahead(self) -> int:
        """``read_ahead`` with its default."""
        if self.read_ahead is None:
            return min(READ_AHEAD_PER_SLOT * self.concurrency, MAX_READ_AHEAD)
        return self.read_ahead

    def rescuer_config(self) -> ServiceConfig:
        return ServiceConfig(interval=self.rescue_interval)

    def expirer_config(self) -> ServiceConfig:
        return ServiceConfig(interval=self.expire_interval)


@dataclass(slots=True)
class _Pace:
    """What the claim loop remembers from one turn to the next. Times are the loop's clock."""

    idle: bool = False  # the last claim found fewer jobs than it asked for
    backlog: bool = False  # the last claim filled every slot it asked for: more jobs wait
    poll_at: float = 0.0  # while idle, when to claim again without a NOTIFY
    gathering_since: float | None = None  # since when slots are gathered for one trip
    deadline: float | None = None  # after a signal, when the grace period ends
    slot_rate: float = 0.0  # jobs/s that left their slots lately (smoothed): the read-ahead's
    rate_at: float = 0.0  # when slot_rate was last measured
    rate_count: int = 0  # jobs that had left their slots then


class _Lane:
    """One of the worker's claim connections and the round trip in flight on it."""

    __slots__ = ("asked", "conn", "ready_at", "sent_at", "trip")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.trip: asyncio.Task[Claimed] | None = None
        self.asked = 0  # slots reserved for the claim in flight
        self.ready_at = 0.0  # loop time before which no trip starts (reconnection backoff)
        self.sent_at = 0.0  # loop time the trip in flight started


class _ObservedRegistry(WorkerRegistry):
    """The worker registry, telling the worker's metrics about each heartbeat."""

    def __init__(self, identity: WorkerIdentity, metrics: WorkerMetrics) -> None:
        super().__init__(identity)
        self._metrics = metrics

    async def run_once(self, conn: Any) -> Heartbeat:
        beat = await super().run_once(conn)
        self._metrics.heartbeat()
        return beat


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
        self._completer = Completer(
            ClaimParams.for_tasks(self.id, self.queues, self.tasks.values()),
            recheck=self.config.poll_interval,
        )
        self._running: dict[int, tuple[JobContext, asyncio.Future[Any] | Run]] = {}
        # Jobs claimed and not started yet (claimed ahead of free slots), in claim order.
        self._waiting: deque[Job] = deque()
        # Jobs that left their slots so far (the pace that bounds the read-ahead).
        self._left_slots = 0
        # The timeout of each running job that has one (its task's), by job id.
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        # Sync handlers given up at their timeout whose threads may still run (Python cannot
        # stop a thread); the pool has room for as many as ``concurrency`` of them.
        self._strays: set[Run] = set()
        # Outcomes of sync handlers, appended by pool threads, collected on the loop.
        self._sync_outcomes: deque[tuple[Job, Task, Any, BaseException | None]] = deque()
        self._sync_wakeup_due = False
        self._changed = asyncio.Event()
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
        self._reconnect_attempt = 0
        self._threads: HandlerThreads | None = None
        self._abandoned = 0
        self._woken = False  # a NOTIFY arrived for one of our queues since the last claim
        # What a burst worker last said it waits for (said once until it changes).
        self._burst_waiting: tuple[int, datetime | None, int, int] | None = None
        # External tasks served here (their jobs are in this worker's queues); refused at once
        # when one is left without a URL.
        self._deliveries = external.deliveries(self.tasks, self.config.external, self.queues)
        # Only with --http: the hot path tests `is not None` and counts nothing otherwise.
        self._metrics = (
            WorkerMetrics(self.id, self.config.concurrency, self.tasks)
            if self.config.http is not None
            else None
        )
        self._checked = False  # the schema was found usable and the claim connection opened
        self._tick: float | None = None  # loop time of the claim loop's last turn
        self._lanes: list[_Lane] = []
        self._http_address: tuple[str, int] | None = None
        # Jobs whose payload version was too new for this worker, logged once each.
        self._too_new: set[int] = set()

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
        if self.config.http is None or self._metrics is None:
            return None
        probe = ProbeServer(self._metrics, self.probe_state)
        self._http_address = await probe.start(*self.config.http)
        log.info(
            "worker %s: serving /metrics, /healthz and /readyz on http://%s",
            self.id,
            address_text(*self._http_address),
        )
        return probe

    async def _run(
        self, on_checked: Callable[[], None] | None, loop: asyncio.AbstractEventLoop
    ) -> int:
        dsn = self.app.dsn
        migrate.require_head(dsn)
        if on_checked is not None:
            on_checked()
        if self._owns_process:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        if any(not t.is_async and t.external is None for t in self.tasks.values()):
            # Twice the slots: a sync handler given up at its timeout keeps its thread until it
            # returns, and the jobs started in its slot meanwhile need threads of their own.
            self._threads = HandlerThreads(2 * self.config.concurrency, "pgjobs-handler")
        conn = await db.connect_async(dsn, hot=True)
        self._checked = True
        background = [asyncio.create_task(self._listen(dsn), name="pgjobs-listen")]
        # Every worker registers itself (for `pgjobs stats`), with or without maintenance.
        identity = WorkerIdentity(
            self.id,
            socket.gethostname(),
            os.getpid(),
            self.queues,
            self.config.concurrency,
            datetime.now(UTC),
        )
        registry = (
            WorkerRegistry(identity)
            if self._metrics is None
            else _ObservedRegistry(identity, self._metrics)
        )
        services: list[Service[Any]] = [registry]
        if self.config.maintenance:
            services += [
                LeaseRescuer(self.config.rescuer_config()),
                Expirer(self.config.expirer_config()),
                ArchivePartitions(),
            ]
            unlimited = [t.name for t in self.tasks.values() if not t.limited]
            if unlimited:
                services.append(LapsedLimits(self.queues, unlimited))
            # Whatever queues this worker serves: the schedules' row locks let any number of
            # workers run it.
            if self.app.periodics:
                services.append(Scheduler(self.app.periodics.values(), self.app.enqueue_many_async))
        background.append(asyncio.create_task(run_services(services, dsn, self._stop)))
        log.info(
            "worker %s started: queues=%s concurrency=%d tasks=%d",
            self.id,
            ",".join(self.queues),
            self.config.concurrency,
            len(self.tasks),
        )
        for line in external.describe(self._deliveries):
            log.info("external task %s", line)
        try:
            await self._work(conn, dsn)
        except BaseException:
            if self._threads is not None:  # idle threads would keep the process alive
                self._threads.shutdown(wait=False)
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
        busy = self._abandoned > 0 or self._stray_threads() > 0
        log.info("worker %s stopped", self.id)
        if self._threads is not None:
            self._threads.shutdown(wait=not busy)
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
            len(self._running),
            self.config.grace,
        )
        self._stop.set()
        self._changed.set()

    async def _work(self, conn: Any, dsn: Dsn) -> None:
        """The claim loop. Round trips go over up to two connections ("lanes"): while one
        trip is in flight, slots freed meanwhile are settled and refilled over the other, so the
        handlers do not wait for the database and the database does not wait for the handlers."""
        lanes = [_Lane(conn)] + ([_Lane(None)] if self.config.concurrency > 1 else [])
        self._lanes = lanes
        pace = _Pace()
        try:
            while True:
                self._tick = self._loop.time()
                await self._take_landed(lanes, dsn, pace)
                self._fill_slots()
                if self._stop.is_set():
                    self._give_back_waiting()
                    if pace.deadline is None:
                        pace.deadline = self._loop.time() + self.config.grace
                wait = self._dispatch(lanes, dsn, pace)
                in_flight = any(lane.trip is not None for lane in lanes)
                if not in_flight and await self._should_exit(lanes, dsn, pace):
                    return
                await self._sleep(wait, lanes, pace)
        finally:
            for lane in lanes:
                if lane.trip is not None:
                    lane.trip.cancel()
                    with contextlib.suppress(BaseException):
                        await lane.trip
                if lane.conn is not None and lane.conn is not conn:
                    with contextlib.suppress(Exception):
                        await lane.conn.close()

    async def _take_landed(self, lanes: list[_Lane], dsn: Dsn, pace: _Pace) -> None:
        """Start the jobs of every trip that landed; learn from each claim how busy the
        queues are, and from its status when limits held it back."""
        for lane in lanes:
            if lane.trip is not None and lane.trip.done():
                claimed = await self._landed(lane, dsn)
                asked = claimed.asked
                if asked > 0:
                    pace.idle = len(claimed.jobs) < asked  # the queues ran dry: poll from now on
                    pace.backlog = not pace.idle
                    pace.poll_at = self._loop.time() + self.config.poll_interval
                    if claimed.status is not None:
                        self._limits_said(claimed.status, pace)

    def _limits_said(self, status: ClaimStatus, pace: _Pace) -> None:
        """Claim again sooner than the poll when limits held the claim back: at once after it
        held jobs back (the queues' other jobs lie past them), soon when another worker was
        claiming under the same limit, when a rate's bucket has a token again."""
        if status.held:
            pace.idle = False
        soon = status.retry_after()
        if soon is not None:
            pace.poll_at = min(pace.poll_at, self._loop.time() + soon)

    def _dispatch(self, lanes: list[_Lane], dsn: Dsn, pace: _Pace) -> float:
        """Start a round trip on a free lane when one is due; returns how long the loop may
        sleep before it should look again (seconds)."""
        now = self._loop.time()
        stopping = self._stop.is_set()
        reserved = sum(lane.asked for lane in lanes if lane.trip is not None)
        in_hand = len(self._running) + len(self._waiting) + reserved
        free = 0 if stopping else self.config.concurrency - in_hand
        ahead = 0 if stopping else self._ahead(pace, now) + min(free, 0)
        free, ahead = max(free, 0), max(ahead, 0)
        wait = self.config.poll_interval
        # With the queues dry, claim again only when polled or woken by a NOTIFY.
        if pace.idle and not self._woken and now < pace.poll_at:
            wait = pace.poll_at - now
            free = 0
        lane = next((x for x in lanes if x.trip is None and x.ready_at <= now), None)
        if lane is None or not (free > 0 or ahead > 0 or self._completer.pending):
            return wait
        # Under load, slots free up one after another: gather them (a few ms at most) so that
        # one round trip settles and claims a batch, not one job; while jobs claimed ahead keep
        # the slots busy, gather up to half of the slots and the read-ahead together. A lease
        # extension goes at once.
        fed = bool(self._waiting)
        gather = max(1, (self.config.concurrency + (self.config.claim_ahead if fed else 0)) // 2)
        gathering = pace.backlog and free + ahead < gather and not stopping
        if gathering and not self._completer.extensions_pending:
            if pace.gathering_since is None:
                pace.gathering_since = now
            window = FED_BATCH_WINDOW if fed else BATCH_WINDOW
            if now - pace.gathering_since < window:
                return pace.gathering_since + window - now
        pace.gathering_since = None
        if free > 0:
            self._woken = False
        lane.asked = free + ahead
        lane.sent_at = now
        lane.trip = asyncio.create_task(self._lane_trip(lane, dsn, free, ahead))
        lane.trip.add_done_callback(lambda _: self._changed.set())
        return wait

    def _ahead(self, pace: _Pace, now: float) -> int:
        """How many jobs to hold claimed ahead of free slots: none unless the queues hold a
        backlog (the last claim filled all it asked for); at most ``read_ahead``, and at most
        what the handlers start within ``READ_AHEAD_WAIT`` seconds at their recent pace."""
        cap = self.config.claim_ahead
        if not cap:
            return 0
        if now - pace.rate_at >= 0.05:  # the pace, smoothed over turns at least 50 ms apart
            done = self._left_slots
            if pace.rate_at:
                recent = (done - pace.rate_count) / (now - pace.rate_at)
                pace.slot_rate = 0.5 * (pace.slot_rate + recent) if pace.slot_rate else recent
            pace.rate_at, pace.rate_count = now, done
        if not pace.backlog:
            return 0
        return min(cap, int(pace.slot_rate * READ_AHEAD_WAIT))

    async def _should_exit(self, lanes: list[_Lane], dsn: Dsn, pace: _Pace) -> bool:
        """With no trip in flight: whether the loop is done (shutdown finished or timed out, or
        a burst found nothing left)."""
        if self._stop.is_set():
            if not self._running and not len(self._completer.outcomes):
                return True
            assert pace.deadline is not None
            if self._loop.time() >= pace.deadline:
                await self._abandon(lanes, dsn)
                return True
            return False
        if not self._burst_done(pace.idle):
            self._burst_waiting = None
            return False
        left = await self._left_for_burst(lanes, dsn)
        if left is None:  # the database is away: try again at the next turn
            return False
        expired, jobs = left[0], left[1]
        if expired:  # more may have expired than one statement archives: look again
            log.info("burst: archived %d expired job(s), unrun", expired)
            return False
        if not jobs:
            log.info("burst: no job left in %s", ",".join(self.queues))
            await self._wake_burst_peers(lanes[0])
            return True
        self._say_what_burst_waits_for(left)
        return False

    async def _wake_burst_peers(self, lane: _Lane) -> None:
        """NOTIFY this worker's queues on the way out of a burst, as an enqueue does: burst
        workers that wait for the jobs this one ran (its last settle is committed) look again
        now and exit with it, instead of at their next poll. One statement per exit, nothing
        on the hot path; a failure only leaves the others to their poll."""
        if lane.conn is None or lane.conn.closed:
            return
        with contextlib.suppress(PgjobsError):
            await db.fetch_all_async(lane.conn, queries.QUEUES_WAKE, {"queues": self.queues})

    def _say_what_burst_waits_for(self, left: tuple[Any, ...]) -> None:
        """Log once (and again when it changes) why a burst worker with nothing to claim does
        not exit yet: jobs scheduled for later, jobs of paused queues, jobs waiting for a
        concurrency limit or a rate, jobs other workers run."""
        _, jobs, scheduled, next_due, paused, running, limited = left
        if jobs > scheduled + paused + running + limited:
            # A job fell due since the last claim (or a limited task's job waits in its queue's
            # range, which only a claim under limits takes): claim now, there is nothing to say.
            self._woken = True
            self._completer.limits_due()
            self._changed.set()
            return
        waiting = (scheduled, next_due, paused, limited)
        if waiting == self._burst_waiting:
            return
        self._burst_waiting = waiting
        parts = []
        if scheduled:
            due = f"{next_due.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            parts.append(f"{scheduled} scheduled job(s), the next due at {due}")
        if paused:
            parts.append(f"{paused} job(s) of paused queues (`pgjobs queue resume`)")
        if limited:
            parts.append(f"{limited} job(s) waiting for a concurrency limit or a rate")
        if running:
            parts.append(f"{running} job(s) other workers run")
        log.info("burst: waiting for %s in %s", "; ".join(parts), ",".join(self.queues))

    async def _sleep(self, wait: float, lanes: list[_Lane], pace: _Pace) -> None:
        """Wait up to ``wait`` seconds for something to change (a handler finished, a trip
        landed, a NOTIFY, a signal), less when the grace period or a reconnection is due."""
        now = self._loop.time()
        if pace.deadline is not None:
            wait = max(0.0, min(wait, pace.deadline - now))
        if not self._connected:
            wait = min(wait, min(lane.ready_at for lane in lanes) - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(wait, 0.0))
        self._changed.clear()

    async def _lane_trip(self, lane: _Lane, dsn: Dsn, free: int, ahead: int = 0) -> Claimed:
        if lane.conn is None or lane.conn.closed:
            lane.conn = await db.connect_async(dsn, hot=True)
        return await self._completer.trip(lane.conn, free, ahead=ahead)

    async def _landed(self, lane: _Lane, dsn: Dsn) -> Claimed:
        """Take the result of ``lane``'s finished trip: its jobs join those waiting for a slot,
        and start as far as slots are free."""
        assert lane.trip is not None
        trip = lane.trip
        lane.trip, lane.asked = None, 0
        try:
            claimed = trip.result()
        except (DatabaseUnavailable, SchemaMissing) as exc:
            await self._lost_connection(lane.conn, exc)
            lane.conn = None
            lane.ready_at = asyncio.get_running_loop().time() + self._reconnect_delay()
            return Claimed([], None, 0)
        if not self._connected:
            self._connected = True
            self._reconnect_attempt = 0
            log.warning("database connection restored")
        metrics = self._metrics
        if metrics is not None:
            metrics.trip()
            now = time.time()
            for job in claimed.jobs:
                metrics.claimed(job, now)
        self._waiting.extend(claimed.jobs)
        self._fill_slots()
        return claimed

    def _fill_slots(self) -> None:
        """Start jobs claimed ahead while slots are free (a job that cannot run here, an
        unknown task or a payload that does not fit, leaves its slot free for the next)."""
        waiting, concurrency = self._waiting, self.config.concurrency
        while waiting and len(self._running) < concurrency:
            self._start(waiting.popleft())

    def _give_back_waiting(self) -> None:
        """Stopping: the jobs claimed ahead go back to the queue, their attempt refunded (they
        never started)."""
        if not self._waiting:
            return
        for job in self._waiting:
            self._completer.outcomes.release(job, refund=True)
            if self._metrics is not None:
                self._metrics.not_run(job)
        log.info("gave back %d job(s) claimed ahead, not started", len(self._waiting))
        self._waiting.clear()

    def _reconnect_delay(self) -> float:
        return RECONNECT_DELAYS[min(self._reconnect_attempt, len(RECONNECT_DELAYS) - 1)]

    async def _lost_connection(self, conn: Any, exc: PgjobsError) -> None:
        if self._connected:
            what = "connection lost" if isinstance(exc, DatabaseUnavailable) else "schema refused"
            log.warning(
                "database %s (%s); %d outcome(s) kept for retry; reconnecting",
                what,
                exc,
                len(self._completer.outcomes),
            )
        self._connected = False
        # What /readyz says until a trip lands again.
        self._outage = (
            "database unreachable"
            if isinstance(exc, DatabaseUnavailable)
            else "schema refused (run `pgjobs migrate`, or a migration is in progress)"
        )
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
            and not self._waiting
            and not len(self._completer.outcomes)
        )

    async def _left_for_burst(self, lanes: list[_Lane], dsn: Dsn) -> tuple[Any, ...] | None:
        """``queries.QUEUES_LEFT_FOR_BURST`` for this worker's queues: the expired jobs archived
        (a burst worker leaves none behind), then what is left; None when the database is
        away."""
        lane = lanes[0]
        try:
            if lane.conn is None or lane.conn.closed:
                lane.conn = await db.connect_async(dsn, hot=True)
            rows = await db.fetch_all_async(
                lane.conn,
                queries.QUEUES_LEFT_FOR_BURST,
                {"queues": self.queues, "limit": BURST_EXPIRE_BATCH},
            )
        except (DatabaseUnavailable, SchemaMissing) as exc:
            await self._lost_connection(lane.conn, exc)
            lane.conn = None
            return None
        return rows[0]

    def _start(self, job: Job) -> None:
        task = self.tasks.get(job.task)
        if task is None:
            self._completer.unknown_task(job)
            self._not_run(job)
            return
        payload = job.payload
        if (job.payload_version or 1) != task.version:
            upgraded = self._upgraded(job, task)
            if upgraded is None:
                self._not_run(job)
                return
            payload = upgraded
        problem = task.check_payload(payload)
        if problem is None and task.model is not None:
            payload, problem = task.arguments(payload)  # {parameter: the model's instance}
        if problem is not None:
            self._completer.invalid_payload(job, problem)
            self._not_run(job)
            return
        context = JobContext(job, self._request_extension)
        fn = task.fn
        if task.external is None and tracing.enabled():  # a delivery is not a handler run
            fn = tracing.process(fn, job, is_async=task.is_async)
        if task.external is not None:
            self._deliver(context, task)
        elif task.is_async:
            future = self._loop.create_task(call_async(context, fn, payload))
            self._running[job.id] = (context, future)
            future.add_done_callback(functools.partial(self._async_finished, job, task))
        else:
            assert self._threads is not None
            self._running[job.id] = (
                context,
                self._threads.submit(self._run_sync, context, task, fn, payload),
            )
        if task.timeout is not None and task.external is None:
            self._deadlines[job.id] = self._loop.call_later(
                task.timeout, self._timed_out, context, task
            )

    def _upgraded(self, job: Job, task: Task) -> dict[str, Any] | None:
        """``job``'s payload upgraded to ``task``'s version, or None when it cannot run here:
        a payload newer than this worker's task goes back to the queue (attempt refunded), held
        back ``NEWER_VERSION_HOLD`` seconds so that this worker does not claim it again at once
        while an up-to-date one may; one that cannot be upgraded goes to dead_letter."""
        version = job.payload_version or 1
        if version > task.version:
            self._completer.outcomes.release(job, refund=True, hold=NEWER_VERSION_HOLD)
            if job.id not in self._too_new:
                if len(self._too_new) >= 10_000:  # a memory of log lines, not of jobs
                    self._too_new.clear()
                self._too_new.add(job.id)
                log.warning(
                    "job %d (%s): its payload is version %d and this worker's task knows "
                    "versions up to %d; released for another worker (deploy the newer code), "
                    "held back %.0fs",
                    job.id,
                    job.task,
                    version,
                    task.version,
                    NEWER_VERSION_HOLD,
                )
            return None
        try:
            return task.upgrade(job.payload, version)
        except UpgradeFailed as exc:
            self._completer.finished(job, task, None, exc)
        except ValueError as exc:  # no upgrade from that version is declared any more
            self._completer.invalid_payload(job, str(exc))
        return None

    def _not_run(self, job: Job) -> None:
        if self._metrics is not None:
            self._metrics.not_run(job)
        self._changed.set()

    def _deliver(self, context: JobContext, task: Task) -> None:
        """Start delivering ``context``'s job to its downstream, in a slot (on this loop)."""
        job = context.job
        delivery = self._deliveries.get(job.task)
        if delivery is None:  # a job of a task whose queue this worker does not serve
            coroutine: Any = _fail(
                external.DeliveryFailed(
                    f"external task {job.task!r} has no URL in this worker: declare it with "
                    "url=... or run the worker with --external-url"
                )
            )
        else:
            coroutine = external.deliver(delivery, job)
        future = asyncio.ensure_future(coroutine)
        self._running[job.id] = (context, future)
        future.add_done_callback(functools.partial(self._async_finished, job, task))

    def _async_finished(self, job: Job, task: Task, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._finished(job, task, None, None, cancelled=True)
        else:
            exc = future.exception()
            if isinstance(exc, HandlerExit):
                exc = exc.original
            self._finished(job, task, None if exc else future.result(), exc)

    def _run_sync(
        self, context: JobContext, task: Task, fn: Callable[..., Any], arguments: dict[str, Any]
    ) -> None:
        """In a pool thread: run a sync handler (``fn``: the task's, traced or not) with
        ``arguments``, then hand its outcome to the loop. Outcomes are collected in batches:
        one wake-up of the loop for however many handlers finished meanwhile, rather than one
        per job."""
        outcome: tuple[Job, Task, Any, BaseException | None]
        try:
            outcome = (context.job, task, call_sync(context, fn, arguments), None)
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
        entry = self._running.get(job.id)
        if entry is None or entry[0].job is not job:
            return  # already given back (shutdown, or a stopped run that ended late)
        del self._running[job.id]
        self._left_slots += 1
        self._changed.set()
        if task.limited or self._completer.limited:
            # Its slot under a limit is free again: claim with the trip that settles it,
            # rather than at the next poll (the claim itself tells whether the limit allows).
            self._woken = True
            if task.limited:
                self._completer.limits_due()
        deadline = self._deadlines.pop(job.id, None)
        if deadline is not None:
            deadline.cancel()
        if entry[0].stopped is not None:
            # Stopped at its timeout (the failure is recorded already) or force-cancelled (the
            # cancel archived the job): whatever the handler did after that does not count.
            log.debug("job %d: stopped (%s); its handler ended", job.id, entry[0].stopped)
            return
        if self._metrics is not None:
            self._metrics.finished(job, _outcome(job, task, exc, cancelled))
        if cancelled:
            self._completer.cancelled(job)
            return
        if exc is None and task.external is not None:
            # The downstream took the job: it stays running under its lease, which the
            # downstream's report (or the lease's expiry) ends. Nothing to settle here.
            log.debug("job %d (%s): delivered on attempt %d", job.id, job.task, job.attempts)
            return
        try:
            self._completer.finished(job, task, result, exc)
        except Exception as problem:  # the outcome of one job never stops the others
            log.exception("job %d: its outcome could not be recorded", job.id)
            self._completer.finished(job, task, None, problem)

    def _request_extension(self, context: JobContext, seconds: float) -> None:
        """Called from any thread: extend ``context``'s lease on the next trip."""
        self._loop.call_soon_threadsafe(self._queue_extension, context, seconds)

    def _queue_extension(self, context: JobContext, seconds: float) -> None:
        if context.job.id in self._running and not context.cancelled:
            self._completer.extend(context, seconds)
            self._changed.set()

    async def _abandon(self, lanes: list[_Lane], dsn: Dsn) -> None:
        """Grace period over: give running jobs back now (their attempt stays used) rather than
        leave them to their leases; at-most-once jobs go to dead_letter, never to run again."""
        for deadline in self._deadlines.values():
            deadline.cancel()
        self._deadlines.clear()
        for context, future in list(self._running.values()):
            if context.stopped is not None:  # its outcome is decided already
                future.cancel()
                continue
            task = self.tasks.get(context.job.task)
            at_most_once = task is not None and task.at_most_once
            self._completer.interrupted(context.job, at_most_once=at_most_once)
            if self._metrics is not None:
                self._metrics.finished(context.job, "dead" if at_most_once else "released")
            future.cancel()
        self._abandoned = len(self._running)
        log.warning("grace period over: gave back %d running job(s)", self._abandoned)
        self._running.clear()
        try:
            await self._lane_trip(lanes[0], dsn, 0)
        except (DatabaseUnavailable, SchemaMissing) as exc:
            log.warning("could not flush outcomes (%s); leases will recover those jobs", exc)

    def _timed_out(self, context: JobContext, task: Task) -> None:
        """``context``'s run reached its task's timeout: the attempt fails now (retried or sent
        to dead_letter with reason timeout) and the handler is stopped: an async one cancelled
        (its slot given back once it ends, or ``STOP_GRACE`` seconds later), a sync one told
        through ``context.cancelled`` and its thread abandoned (its slot given back now)."""
        job = context.job
        self._deadlines.pop(job.id, None)
        entry = self._running.get(job.id)
        if entry is None or entry[0] is not context:
            return
        context.cancelled = True
        if context.stopped is None:  # a force-cancelled job's record is the cancel's
            context.stopped = "timeout"
            assert task.timeout is not None
            outcome = self._completer.timed_out(job, task, task.timeout)
            if self._metrics is not None:
                self._metrics.finished(job, outcome)
            self._changed.set()
        self._stop_run(context, entry[1])

    def _stop_run(self, context: JobContext, future: asyncio.Future[Any] | Run) -> None:
        """Stop a run whose outcome is decided: cancel an async handler and give its slot back
        once it ended (or after ``STOP_GRACE``); give a sync handler's slot back at once."""
        if isinstance(future, asyncio.Future):
            if not future.done():
                future.cancel()
                self._loop.call_later(STOP_GRACE, self._give_back, context)
        else:
            self._give_back(context)

    def _give_back(self, context: JobContext) -> None:
        """Free the slot of a stopped run that has not ended: its handler runs on, unheeded."""
        job = context.job
        entry = self._running.get(job.id)
        if entry is None or entry[0] is not context:
            return  # it ended meanwhile
        del self._running[job.id]
        deadline = self._deadlines.pop(job.id, None)
        if deadline is not None:
            deadline.cancel()
        self._changed.set()
        future = entry[1]
        if isinstance(future, asyncio.Future):
            log.warning(
                "job %d (%s): its async handler did not end within %.0fs of being cancelled "
                "(it catches CancelledError?); its slot is given back, the handler left running",
                job.id,
                job.task,
                STOP_GRACE,
            )
            return
        if not future.done():
            self._strays.add(future)
        strays = self._stray_threads()
        if strays >= self.config.concurrency:
            log.warning(
                "%d sync handler(s) stopped at their timeout still hold their threads (Python "
                "cannot stop a thread; a handler should return once current_job().cancelled "
                "is True): once %d do, new sync jobs wait for a thread",
                strays,
                self.config.concurrency,
            )

    def _stray_threads(self) -> int:
        """Threads of sync handlers given up at their timeout that still run."""
        self._strays = {future for future in self._strays if not future.done()}
        return len(self._strays)

    def _cancel_requested(self, notice: str) -> None:
        """A running job was cancelled with ``pgjobs cancel --force`` (the cancel archived it):
        stop its handler here if this worker runs that attempt. An async handler is cancelled;
        a sync one is told through ``current_job().cancelled`` and keeps its slot until it
        returns or its timeout passes."""
        parsed = _cancel_notice(notice)
        if parsed is None:
            return
        job_id, attempt = parsed
        entry = self._running.get(job_id)
        if entry is None:
            self._cancel_waiting(job_id, attempt)
            return
        if entry[0].job.attempts != attempt or entry[0].stopped is not None:
            return
        context, future = entry
        context.stopped = "cancel"
        context.cancelled = True
        self._completer.forget(context.job)
        if self._metrics is not None:
            self._metrics.finished(context.job, "released")
        is_async = isinstance(future, asyncio.Future)
        log.info(
            "job %d (%s): cancelled (by pgjobs cancel --force) on attempt %d; %s",
            job_id,
            context.job.task,
            attempt,
            "its handler is cancelled"
            if is_async
            else "its sync handler is told through current_job().cancelled",
        )
        if is_async:
            self._stop_run(context, future)

    def _cancel_waiting(self, job_id: int, attempt: int) -> None:
        """A job claimed ahead (not started) was cancelled: it never starts here."""
        for job in self._waiting:
            if job.id == job_id and job.attempts == attempt:
                self._waiting.remove(job)
                self._completer.forget(job)
                if self._metrics is not None:
                    self._metrics.not_run(job)
                log.info(
                    "job %d (%s): cancelled (by pgjobs cancel --force) before it started",
                    job_id,
                    job.task,
                )
                return

    async def _listen(self, dsn: Dsn) -> None:
        """Wake the claim loop when a job is enqueued on one of this worker's queues; stop the
        handler of a job cancelled while running here (``pgjobs cancel --force``)."""
        queues = set(self.queues)
        attempt = 0
        while not self._stop.is_set():
            try:
                async for payload in db.notifications(dsn):
                    attempt = 0
                    if payload in queues:
                        self._woken = True
                        self._completer.limits_due()  # the new jobs may be limited ones
                        self._changed.set()
                    elif payload.startswith(queries.CANCEL_NOTICE):
                        self._cancel_requested(payload)
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
            waiting = [now - lane.sent_at for lane in self._lanes if lane.trip is not None]
            if waiting and max(waiting) > limit:
                unhealthy = f"a round trip to the database has waited {max(waiting):.0f}s"
        if not self._checked:
            not_ready = "starting"
        elif self._stop.is_set():
            not_ready = "stopping"
        elif not self._connected:
            not_ready = self._outage
        else:
            not_ready = None
        return ProbeState(len(self._running), self._connected, not_ready, unhealthy)


def _outcome(job: Job, task: Task, exc: BaseException | None, cancelled: bool) -> str:
    """How the metrics count a job that left its slot (the completer decides the same way)."""
    if cancelled:
        return "released"
    if exc is None:
        return "delivered" if task.external is not None else "succeeded"
    if isinstance(exc, NonRetryableError) or job.is_last_attempt:
        return "dead"
    return "retried"


def _cancel_notice(payload: str) -> tuple[int, int] | None:
    """(job id, attempt) of a ``queries.CANCEL_NOTICE`` payload; None for anything else."""
    parts = payload.split("\t")
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[1]), int(parts[2])


async def _fail(exc: BaseException) -> Any:
    raise exc
