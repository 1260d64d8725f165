"""When a worker claims, and how many jobs: the claim pacer, its lanes (the claim connections and
the round trip in flight on each) and the read-ahead (jobs claimed ahead of free slots)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Iterator
from typing import Any

from pgjobs import db, queries
from pgjobs.completer import Claimed, ClaimStatus, Completer
from pgjobs.db.dsn import Dsn
from pgjobs.errors import QueryFailed
from pgjobs.worker.config import BATCH_WINDOW, FED_BATCH_WINDOW, READ_AHEAD_WAIT, WorkerConfig

#: The most wake-ups (jobs put back for later) a pacer remembers.
MAX_DUES = 10_000


class Lane:
    """One of the worker's claim connections and the round trip in flight on it."""

    __slots__ = ("asked", "conn", "due_in", "failures", "ready_at", "sent_at", "trip")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.trip: asyncio.Task[Claimed] | None = None
        self.asked = 0  # slots reserved for the claim in flight
        self.ready_at = 0.0  # loop time before which no trip starts (reconnection backoff)
        self.failures = 0  # trips lost in a row on this lane: its step in the reconnection backoff
        self.sent_at = 0.0  # loop time the trip in flight started
        #: Seconds after the trip's settle until the first job it put back for later (a retry,
        #: a snooze) falls due; None: it put back none so.
        self.due_in: float | None = None


class ClaimPacer:
    """What the claim loop remembers from one turn to the next and decides from it: whether a
    round trip is due, on which lane, for how many jobs. Round trips go over up to two lanes:
    while one trip is in flight, slots freed meanwhile are settled and refilled over the other,
    so the handlers do not wait for the database and the database does not wait for the
    handlers. Times are the event loop's clock, in seconds.

    Example::

        pacer = ClaimPacer(WorkerConfig(concurrency=4), completer)
        pacer.open(conn, dsn, changed)
        wait = pacer.dispatch(loop.time(), in_hand=0, fed=False, left=0, stopping=False)
    """

    def __init__(self, config: WorkerConfig, completer: Completer) -> None:
        self.concurrency = config.concurrency
        self.claim_ahead = config.claim_ahead
        self.poll_interval = config.poll_interval
        self.completer = completer
        self.lanes: list[Lane] = []
        self.idle = False  # the last claim found fewer jobs than it asked for
        self.backlog = False  # the last claim filled every slot it asked for: more jobs wait
        self.poll_at = 0.0  # while idle, when to claim again without a NOTIFY
        #: The soonest ``Lane.due_in`` of the trips taken since the last ``learn``.
        self._due_in: float | None = None
        #: When the jobs this worker put back for later fall due (a heap of loop times), so
        #: that a claim goes out then however many polls come in between (a workflow's sleep
        #: of a minute resumes on time, not at the poll after it).
        self._dues: list[float] = []
        #: The database refused the last trip: no trip before then unless woken (a NOTIFY
        #: means it takes writes again). A lost connection ends it (the next may differ), and so
        #: does a trip it accepts again (0.0: no refusal in force).
        self.refused_until = 0.0
        #: Claim on the next trip, even while idle: a NOTIFY arrived for one of the worker's
        #: queues, or a slot under a limit was freed, since the last claim.
        self.woken = False
        #: Jobs/s that left their slots lately (smoothed): what bounds the read-ahead.
        self.slot_rate = 0.0
        self._rate_at = 0.0  # when slot_rate was last measured
        self._rate_count = 0  # jobs that had left their slots then
        self._gathering_since: float | None = None  # since when slots are gathered for one trip
        self._dsn: Dsn | None = None
        self._changed: asyncio.Event | None = None

    def open(self, conn: Any, dsn: Dsn, changed: asyncio.Event) -> None:
        """Claim over ``conn`` and, with more than one slot, a second connection to ``dsn``
        (opened by its first trip); set ``changed`` whenever a trip lands."""
        self._dsn, self._changed = dsn, changed
        self.lanes = [Lane(conn)] + ([Lane(None)] if self.concurrency > 1 else [])

    async def close(self, keep: Any) -> None:
        """Cancel the trips in flight and close the lanes' connections except ``keep``."""
        for lane in self.lanes:
            if lane.trip is not None:
                lane.trip.cancel()
                with contextlib.suppress(BaseException):
                    await lane.trip
            if lane.conn is not None and lane.conn is not keep:
                with contextlib.suppress(Exception):
                    await lane.conn.close()

    @property
    def in_flight(self) -> bool:
        """A round trip is on its way on some lane."""
        return any(lane.trip is not None for lane in self.lanes)

    def landed(self) -> Iterator[Lane]:
        """The lanes whose trip has finished (its result not taken yet), each looked at as the
        iteration reaches it."""
        for lane in self.lanes:
            if lane.trip is not None and lane.trip.done():
                yield lane

    def take(self, lane: Lane) -> Claimed:
        """The result of ``lane``'s finished trip, which frees the lane; raises what the trip
        raised (``DatabaseUnavailable``, ``SchemaMissing``: see ``lost``)."""
        assert lane.trip is not None
        trip = lane.trip
        lane.trip, lane.asked = None, 0
        claimed = trip.result()
        if lane.due_in is not None and (self._due_in is None or lane.due_in < self._due_in):
            self._due_in = lane.due_in
        return claimed

    def lost(self, lane: Lane, ready_at: float | None = None) -> None:
        """``lane``'s connection is gone: reconnect on its next trip (not before ``ready_at``,
        when given)."""
        lane.conn = None
        self.refused_until = 0.0
        if ready_at is not None:
            lane.ready_at = ready_at

    def restored(self) -> None:
        """A trip went through after lost ones: the server answers again, so every lane may try
        at once, and the next outage starts its backoff from the first step."""
        for lane in self.lanes:
            lane.failures = 0
            lane.ready_at = 0.0

    def ready_at(self) -> float:
        """The earliest time a lane may start a trip (after a reconnection backoff)."""
        return min(lane.ready_at for lane in self.lanes)

    def longest_trip(self, now: float) -> float | None:
        """Seconds the oldest trip in flight has waited; None with none in flight."""
        waits = [now - lane.sent_at for lane in self.lanes if lane.trip is not None]
        return max(waits) if waits else None

    async def connection(self) -> Any:
        """The first lane's connection, opened again when it was lost."""
        lane = self.lanes[0]
        if lane.conn is None or lane.conn.closed:
            assert self._dsn is not None
            lane.conn = await db.connect_async(self._dsn, hot=True)
        return lane.conn

    async def trip(self, lane: Lane, free: int, ahead: int = 0, *, poll: bool = False) -> Claimed:
        """One round trip on ``lane``: settle what the completer holds, claim ``free`` jobs for
        free slots and ``ahead`` more to hold claimed ahead. A ``poll`` (an idle worker's, with
        nothing to send) first asks whether the queues hold a ready job at all, and claims only
        when they may: most polls find nothing, and the question costs the server a third of
        a claim (``queries.JOB_READY_IN_QUEUES``)."""
        if lane.conn is None or lane.conn.closed:
            assert self._dsn is not None
            lane.conn = await db.connect_async(self._dsn, hot=True)
        lane.due_in = None
        if poll and not self.completer.pending and not await self._ready(lane.conn):
            return Claimed([], None, free + ahead)
        # Read just before the trip takes the outcomes (nothing runs in between).
        lane.due_in = self.completer.outcomes.due_in()
        return await self.completer.trip(lane.conn, free, ahead=ahead)

    async def _ready(self, conn: Any) -> bool:
        """Whether the worker's queues may hold a job to claim; true when the database refuses
        to say (the claim then tells what it refuses, and why)."""
        queues = self.completer.claim.queues
        try:
            rows = await db.fetch_all_async(conn, queries.JOB_READY_IN_QUEUES, {"queues": queues})
        except QueryFailed:
            return True
        return bool(rows[0][0])

    def learn(self, claimed: Claimed, now: float) -> None:
        """Learn from a landed claim how busy the queues are, from its status when limits held
        it back, and from the trip's settle when the worker put a job back for later: no NOTIFY
        says when it falls due, so the worker claims again then rather than at its poll."""
        asked = claimed.asked
        if asked > 0:
            self.idle = len(claimed.jobs) < asked  # the queues ran dry: poll from now on
            self.backlog = not self.idle
            self.poll_at = now + self.poll_interval
            if claimed.status is not None:
                self._limits_said(claimed.status, now)
        dues = self._dues
        if self._due_in is not None:
            # The run_at written is the server's now() in the trip (before it landed) plus
            # the delay: due by now + the delay.
            heapq.heappush(dues, now + self._due_in)
            self._due_in = None
            if len(dues) > MAX_DUES:  # a memory of wake-ups, not of jobs: the latest go
                dues[:] = heapq.nsmallest(MAX_DUES // 2, dues)
        while dues and dues[0] <= now:
            heapq.heappop(dues)
        if dues:
            self.poll_at = min(self.poll_at, dues[0])

    def _limits_said(self, status: ClaimStatus, now: float) -> None:
        """Claim again sooner than the poll when limits held the claim back: at once after it
        held jobs back (the queues' other jobs lie past them), soon when another worker was
        claiming under the same limit, when a rate's bucket has a token again."""
        if status.held:
            self.idle = False
        soon = status.retry_after()
        if soon is not None:
            self.poll_at = min(self.poll_at, now + soon)

    def read_ahead(self, now: float, left: int) -> int:
        """How many jobs to hold claimed ahead of free slots, ``left`` jobs having left their
        slots so far: none unless the queues hold a backlog (the last claim filled all it asked
        for); at most ``read_ahead``, and at most what the handlers start within
        ``READ_AHEAD_WAIT`` seconds at their recent pace.

        Example: after 2,000 jobs left their slots in one second, ``read_ahead(now, 2000)`` is
        ``min(read_ahead, 100)`` while ``backlog`` holds.
        """
        cap = self.claim_ahead
        if not cap:
            return 0
        if now - self._rate_at >= 0.05:  # the pace, smoothed over turns at least 50 ms apart
            if self._rate_at:
                recent = (left - self._rate_count) / (now - self._rate_at)
                self.slot_rate = 0.5 * (self.slot_rate + recent) if self.slot_rate else recent
            self._rate_at, self._rate_count = now, left
        if not self.backlog:
            return 0
        return min(cap, int(self.slot_rate * READ_AHEAD_WAIT))

    def dispatch(self, now: float, *, in_hand: int, fed: bool, left: int, stopping: bool) -> float:
        """Start a round trip on a free lane when one is due, ``in_hand`` jobs running or
        waiting for a slot (``fed``: some wait), ``left`` jobs having left their slots so far;
        returns how long the loop may sleep before it should look again (seconds)."""
        completer = self.completer
        reserved = sum(lane.asked for lane in self.lanes if lane.trip is not None)
        free = 0 if stopping else self.concurrency - in_hand - reserved
        ahead = 0 if stopping else self.read_ahead(now, left) + min(free, 0)
        free, ahead = max(free, 0), max(ahead, 0)
        wait = self.poll_interval
        # With the queues dry, claim again only when polled or woken by a NOTIFY.
        if self.idle and not self.woken and now < self.poll_at:
            wait = self.poll_at - now
            free = 0
        if now < self.refused_until and not self.woken:
            return min(wait, self.refused_until - now)
        lane = next((x for x in self.lanes if x.trip is None and x.ready_at <= now), None)
        if lane is None or not (free > 0 or ahead > 0 or completer.pending):
            return wait
        # Under load, slots free up one after another: gather them (a few ms at most) so that
        # one round trip settles and claims a batch, not one job; while jobs claimed ahead keep
        # the slots busy, gather up to half of the slots and the read-ahead together. A lease
        # extension goes at once.
        gather = max(1, (self.concurrency + (self.claim_ahead if fed else 0)) // 2)
        gathering = self.backlog and free + ahead < gather and not stopping
        if gathering and not completer.extensions_pending:
            if self._gathering_since is None:
                self._gathering_since = now
            window = FED_BATCH_WINDOW if fed else BATCH_WINDOW
            if now - self._gathering_since < window:
                return self._gathering_since + window - now
        self._gathering_since = None
        # The queues ran dry and nothing since said otherwise (no NOTIFY, no refusal to clear).
        poll = self.idle and not self.woken and not self.refused_until and free > 0
        if free > 0:
            self.woken = False
        lane.asked = free + ahead
        lane.sent_at = now
        lane.trip = asyncio.create_task(self.trip(lane, free, ahead, poll=poll))
        changed = self._changed
        assert changed is not None
        lane.trip.add_done_callback(lambda _: changed.set())
        return wait
