"""Queue-level Prometheus metrics for `pgjobs serve`'s ``/metrics``, read from the tables.

Gauges (jobs by state, dead letters, the oldest ready job's age, workers, orphaned leases, groups
at their limit) are read whole at each refresh: ``queued_jobs`` is small, ``dead_letter`` holds
what humans have yet to triage, and the groups are read within caps (``pgjobs.groups``).
Counters and histograms (jobs finished by outcome, run time, pickup latency) grow from what
entered ``archived_jobs`` and ``dead_letter`` since the previous refresh, read by an index range
behind an in-process cursor, never by scanning the archive: they start at 0 when
the server starts, as Prometheus counters may (``rate()`` and ``increase()`` handle restarts).

A row's ``finished_at`` (``failed_at``) is the start of the transaction that wrote it, so a row
may commit after rows with later times were already read. Rows are read once they are ``hold``
seconds old, which leaves such rows time to commit; a row that commits later still, within
``overlap`` seconds, is found by counting the window behind the cursor, and counted once (the
ids of the window are remembered). Each refresh reads at most ``batch`` new rows per table,
so a scrape after a burst of a million jobs stays cheap and the counters catch up over the next
refreshes (``pgjobs_metrics_catching_up`` is 1 meanwhile).

A refresh runs at most once per ``ttl`` seconds however many scrapes arrive (one at a time:
the web framework answers scrapes from several threads). When the database cannot be read,
the scrape still answers 200 with the last values read, ``pgjobs_metrics_up 0`` and
``pgjobs_metrics_scrape_errors_total`` one higher: Prometheus keeps the series, and an alert on
``pgjobs_metrics_up == 0`` says why they stopped moving (a 503 would drop every series at once).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg_pool
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector, CollectorRegistry

from pgjobs import db, groups, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.instruments import QueueFigures
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import ArchivedStatus, JobStatus, OrphanedLeases, ReplicaStatus, WorkerInfo
from pgjobs.web import gauges

#: Seconds a reading is served before the next scrape refreshes it.
DEFAULT_TTL = 5.0
#: Rows read per table and refresh, at most.
DEFAULT_BATCH = 10_000
#: Seconds behind the cursor in which a late-committing row is still found.
DEFAULT_OVERLAP = 30.0
#: Seconds a finished row waits before it is read (late commits are rare after that).
DEFAULT_HOLD = 1.0

#: The classic text format, which every Prometheus version reads (the metric names are plain
#: ASCII, so nothing of the newer 1.0.0 format is needed).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: Upper bounds (seconds) of the run-time and pickup-latency histograms' buckets: from a
#: no-op job to an hour.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0
)  # fmt: skip

#: The outcomes of pgjobs_jobs_finished_total.
OUTCOMES = (*ArchivedStatus, JobStatus.DEAD)
#: The states of pgjobs_jobs.
STATES = (JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RUNNING)

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
#: Larger than any job id: the cursor of a reader that starts at a moment, after every row of it.
_AFTER_ALL_IDS = 2**63 - 1


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


# -- reading what entered a table since the last refresh ----------------------------------------


@dataclass(frozen=True, slots=True)
class _Finished:
    """A row of the METRICS_*_NEXT / METRICS_*_WINDOW statements."""

    id: int
    at: datetime
    queue: str
    task: str
    outcome: str
    #: Seconds from the start of the job's last attempt to its end, and from its run_at to that
    #: start; None when it never started (or ``started_at`` was not recorded).
    run_seconds: float | None
    pickup_seconds: float | None


class _Seen:
    """The ids read in the window behind a cursor, with their times (microseconds), sorted by
    time: two arrays, 16 bytes a row, so that tens of thousands of rows a second stay small."""

    def __init__(self) -> None:
        self.at = array("q")
        self.ids = array("q")

    def add(self, at: int, job_id: int) -> None:
        if not self.at or at >= self.at[-1]:
            self.at.append(at)
            self.ids.append(job_id)
        else:  # a late row: rare
            i = bisect.bisect_right(self.at, at)
            self.at.insert(i, at)
            self.ids.insert(i, job_id)

    def after(self, at: int) -> tuple[int, int, int]:
        """How many rows are later than ``at``, the sum of their ids and of their times."""
        i = bisect.bisect_right(self.at, at)
        return len(self.at) - i, sum(self.ids[i:]), sum(self.at[i:])

    def forget_until(self, at: int) -> None:
        """Forget the rows at ``at`` or earlier."""
        i = bisect.bisect_right(self.at, at)
        del self.at[:i]
        del self.ids[:i]

    def keys(self) -> set[tuple[int, int]]:
        """(id, time) of every row: a dead job redriven and dead again is a new row, same id."""
        return set(zip(self.ids, self.at, strict=True))


@dataclass
class _Reader:
    """What entered one table (``archived_jobs`` or ``dead_letter``) since ``floor``, each row
    once, in (time, id) order behind ``cursor``."""

    following: str
    window_count: str
    window: str
    #: Rows at or before it are never read: the counters start at the first refresh.
    floor: datetime
    cursor: tuple[datetime, int]
    seen: _Seen = field(default_factory=_Seen)
    #: Whether the last read stopped at ``batch`` rows, with more to read.
    behind: bool = False

    @classmethod
    def starting_at(cls, statements: tuple[str, str, str], moment: datetime) -> _Reader:
        return cls(*statements, floor=moment, cursor=(moment, _AFTER_ALL_IDS))

    def read(
        self, conn: psycopg.Connection[Any], *, batch: int, overlap: float, hold: float
    ) -> _Advance:
        """The rows that entered the table since the last read (late ones included), and where
        the cursor goes once they are counted; changes nothing itself (see ``apply``)."""
        after, after_id = self.cursor
        page = [
            _Finished(*row)
            for row in db.fetch_all(
                conn,
                self.following,
                {"after": after, "after_id": after_id, "hold": hold, "limit": batch},
            )
        ]
        cursor = (page[-1].at, page[-1].id) if page else self.cursor
        lower = max(cursor[0] - timedelta(seconds=overlap), self.floor)
        window = {"lower": lower, "upper": cursor[0], "upper_id": cursor[1]}
        lower_us = _micros(lower)
        # The window as remembered (rows counted before, and this page's) against the table:
        # the number of rows, the sum of their ids and of their times.
        count, ids, times = self.seen.after(lower_us)
        in_window = [(r.id, _micros(r.at)) for r in page if r.at > lower]
        expected = (
            count + len(in_window),
            ids + sum(i for i, _ in in_window),
            times + sum(t for _, t in in_window),
        )
        ((present, present_ids, present_times),) = db.fetch_all(conn, self.window_count, window)
        late: list[_Finished] = []
        if (present, int(present_ids), int(present_times)) != expected:
            # Rows that committed after the cursor passed their time (or rows since deleted:
            # a redrive empties dead_letter). Read the window and keep the rows never counted.
            known = self.seen.keys() | {(r.id, _micros(r.at)) for r in page}
            rows = db.fetch_all(conn, self.window, {**window, "limit": expected[0] + batch})
            late = [
                f for f in (_Finished(*row) for row in rows) if (f.id, _micros(f.at)) not in known
            ]
        return _Advance(page + late, cursor, lower_us, behind=len(page) == batch)

    def apply(self, advance: _Advance) -> None:
        for row in advance.rows:
            self.seen.add(_micros(row.at), row.id)
        self.cursor = advance.cursor
        self.seen.forget_until(advance.forget_until)
        self.behind = advance.behind


@dataclass(frozen=True, slots=True)
class _Advance:
    rows: list[_Finished]
    cursor: tuple[datetime, int]
    forget_until: int
    behind: bool


# -- what a refresh reads, and what the process has counted -------------------------------------


@dataclass(frozen=True, slots=True)
class _QueuedCounts:
    queue: str
    task: str
    ready: int
    scheduled: int
    running: int
    oldest_ready_age: float | None


@dataclass(frozen=True, slots=True)
class _Reading:
    """The gauges of one refresh."""

    queued: list[_QueuedCounts]
    dead_letter: dict[tuple[str, str], int]
    workers: list[WorkerInfo]
    orphaned: OrphanedLeases
    #: Per queue that holds grouped jobs, its groups at their limit.
    groups_at_limit: dict[str, int]


class _Histogram:
    """Bucket counts (not cumulative), sum and count of observed seconds."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # the last one: +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        bounds = [*(repr(b) for b in DURATION_BUCKETS), "+Inf"]
        running, out = 0, []
        for bound, n in zip(bounds, self.buckets, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


@dataclass
class _Totals:
    """The counters and histograms, since the server started."""

    finished: defaultdict[tuple[str, str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    run: defaultdict[tuple[str, str], _Histogram] = field(
        default_factory=lambda: defaultdict(_Histogram)
    )
    pickup: defaultdict[tuple[str, str], _Histogram] = field(
        default_factory=lambda: defaultdict(_Histogram)
    )

    def count(self, rows: Iterable[_Finished]) -> None:
        for row in rows:
            self.finished[(row.queue, row.task, row.outcome)] += 1
            # Only successes: a cancelled or expired job never ran, or ran to no end.
            if row.outcome != ArchivedStatus.SUCCEEDED:
                continue
            if row.run_seconds is not None and row.run_seconds >= 0:
                self.run[(row.queue, row.task)].observe(row.run_seconds)
            # Negative when the job started before its run_at was last moved (a redrive).
            if row.pickup_seconds is not None and row.pickup_seconds >= 0:
                self.pickup[(row.queue, row.task)].observe(row.pickup_seconds)


# -- the collector -------------------------------------------------------------------------------


class QueueMetrics:
    """Queue-level metrics of one database, in Prometheus' text format, on a registry of their
    own (two apps in one process never share a series).

    ``ttl``: seconds a reading is served before a scrape refreshes it (0: every scrape reads).
    ``batch``: rows of archived_jobs (and of dead_letter) read per refresh, at most.
    ``overlap``: seconds behind the cursor in which a late-committing row is still counted.
    ``hold``: seconds a finished row waits before it is read.

    Example::

        metrics = QueueMetrics(ttl=5.0)
        body, content_type = metrics.render(pool)  # a psycopg_pool.ConnectionPool
    """

    def __init__(
        self,
        ttl: float = DEFAULT_TTL,
        *,
        batch: int = DEFAULT_BATCH,
        overlap: float = DEFAULT_OVERLAP,
        hold: float = DEFAULT_HOLD,
        clock: Callable[[], float] = time.monotonic,
        group_limits: Mapping[str, int] | None = None,
    ) -> None:
        for name, value in (("ttl", ttl), ("overlap", overlap), ("hold", hold)):
            if not value >= 0:  # NaN too
                raise ConfigurationError(f"{name} must be >= 0 seconds, got {value}", field=name)
        if batch < 1:
            raise ConfigurationError(f"batch must be >= 1, got {batch}", field="batch")
        self.ttl, self.batch, self.overlap, self.hold = ttl, batch, overlap, hold
        self._clock = clock
        self._lock = threading.Lock()
        self._readers: tuple[_Reader, _Reader] | None = None
        self._totals = _Totals()
        self._last: _Reading | None = None
        #: (queue, task) pairs ever seen in queued_jobs, and in dead_letter: their gauges read 0
        #: once they empty, instead of vanishing from the graphs.
        self._known: set[tuple[str, str]] = set()
        self._known_dead: set[tuple[str, str]] = set()
        #: Queues ever seen with grouped jobs; the tasks' own group limits (groups.task_limits).
        self._known_grouped: set[str] = set()
        self._group_limits = dict(group_limits or {})
        self._up = False
        self._errors = 0
        self._replica: ReplicaStatus | None = None
        self._scrape_seconds = 0.0
        self._refreshed_at: float | None = None
        self._body = b""
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))

    def render(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        dsn: Dsn | None = None,
        *,
        replica: bool = False,
    ) -> tuple[bytes, str]:
        """The metrics as Prometheus' text exposition (body, content type), read from the
        database of ``pool`` when the last reading is older than ``ttl`` seconds. ``dsn`` names
        the database in error messages (default: the pool's URL, password hidden). ``replica``:
        ``pool`` reads a read DSN (a standby), whose lag the metrics then include."""
        with self._lock:
            if self._refreshed_at is None or self._clock() - self._refreshed_at >= self.ttl:
                self._refresh(pool, dsn or _pool_dsn(pool), replica)
            return self._body, CONTENT_TYPE

    def figures(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        dsn: Dsn | None = None,
        *,
        replica: bool = False,
    ) -> QueueFigures | None:
        """The queue gauges of ``render`` (depth, oldest ready age, dead letters, groups at their
        limit) as figures, from the same reading: refreshed as ``render`` would, at most once
        per ``ttl`` seconds for both. None until the database was read once.

        Example: ``figures = metrics.figures(pool)``
        """
        with self._lock:
            if self._refreshed_at is None or self._clock() - self._refreshed_at >= self.ttl:
                self._refresh(pool, dsn or _pool_dsn(pool), replica)
            return self._figures()

    # -- under the lock ---------------------------------------------------------------------

    def _refresh(self, pool: psycopg_pool.ConnectionPool[Any], dsn: Dsn, replica: bool) -> None:
        started = time.perf_counter()
        try:
            with db.pooled(pool, dsn) as conn, conn.transaction():
                # One snapshot: the jobs of each state and the rows read add up.
                conn.execute(queries.STATS_SNAPSHOT)
                reading, advances = self._read(conn)
                self._replica = db.replica_status(conn) if replica else None
        except PgjobsError as exc:
            if self._up or not self._errors:  # once per outage, not at every refresh
                log.warning(
                    "queue metrics: cannot read the database, serving the last values: %s", exc
                )
            self._up = False
            self._errors += 1
        else:
            if not self._up and self._errors:
                log.warning("queue metrics: the database can be read again")
            assert self._readers is not None
            for reader, advance in zip(self._readers, advances, strict=True):
                reader.apply(advance)
                self._totals.count(advance.rows)
            self._last = reading
            self._known.update((q.queue, q.task) for q in reading.queued)
            self._known_dead.update(reading.dead_letter)
            self._known_grouped.update(reading.groups_at_limit)
            self._up = True
        self._scrape_seconds = time.perf_counter() - started
        # A failed refresh is kept for ttl too: a database that is down is not asked again by
        # every scrape, each waiting for a connection.
        self._refreshed_at = self._clock()
        self._body = generate_latest(self._registry)

    def _read(self, conn: psycopg.Connection[Any]) -> tuple[_Reading, list[_Advance]]:
        if self._readers is None:
            ((now,),) = db.fetch_all(conn, queries.METRICS_NOW)
            self._readers = (
                _Reader.starting_at(
                    (
                        queries.METRICS_ARCHIVED_NEXT,
                        queries.METRICS_ARCHIVED_WINDOW_COUNT,
                        queries.METRICS_ARCHIVED_WINDOW,
                    ),
                    now,
                ),
                _Reader.starting_at(
                    (
                        queries.METRICS_DEAD_NEXT,
                        queries.METRICS_DEAD_WINDOW_COUNT,
                        queries.METRICS_DEAD_WINDOW,
                    ),
                    now,
                ),
            )
        stale = {"stale_after": STALE_AFTER}
        (orphaned,) = db.fetch_all(conn, queries.LEASES_WITHOUT_LIVE_WORKER, stale)
        reading = _Reading(
            queued=[_QueuedCounts(*row) for row in db.fetch_all(conn, queries.METRICS_QUEUED)],
            dead_letter={
                (queue, task): jobs
                for queue, task, jobs in db.fetch_all(conn, queries.METRICS_DEAD_LETTER)
            },
            workers=db.live_workers(conn, STALE_AFTER),
            orphaned=db.orphaned_leases_from_row(orphaned),
            groups_at_limit={
                q.queue: q.at_limit for q in groups.load(conn, limits=self._group_limits, top=0)
            },
        )
        advances = [
            reader.read(conn, batch=self.batch, overlap=self.overlap, hold=self.hold)
            for reader in self._readers
        ]
        return reading, advances

    # -- for the collector, under the lock ----------------------------------------------------

    def families(self) -> Iterator[Metric]:
        yield from self._gauges()
        yield from self._counters()
        yield from self._meta()

    def _figures(self) -> QueueFigures | None:
        """The gauges of the last reading; every (queue, task) ever seen reads 0 once empty."""
        reading = self._last
        if reading is None:
            return None
        by_pair = {(q.queue, q.task): q for q in reading.queued}
        depth: list[tuple[str, str, str, int]] = []
        oldest: dict[str, float] = {}
        for queue, task in sorted(self._known):
            q = by_pair.get((queue, task))
            counts = (q.ready, q.scheduled, q.running) if q else (0, 0, 0)
            for state, jobs in zip(STATES, counts, strict=True):
                depth.append((queue, task, str(state), jobs))
            seconds = q.oldest_ready_age if q and q.oldest_ready_age is not None else 0.0
            oldest[queue] = max(oldest.get(queue, 0.0), seconds)
        return QueueFigures(
            depth=depth,
            oldest_ready_age=sorted(oldest.items()),
            dead_letter=[
                (queue, task, reading.dead_letter.get((queue, task), 0))
                for queue, task in sorted(self._known_dead)
            ],
            groups_at_limit=[
                (queue, reading.groups_at_limit.get(queue, 0))
                for queue in sorted(self._known_grouped)
            ],
        )

    def _gauges(self) -> Iterator[Metric]:
        reading, figures = self._last, self._figures()
        if reading is None or figures is None:
            return
        yield from gauges.queued(figures)
        yield from gauges.workers(reading.workers, reading.orphaned)
        yield gauges.groups_at_limit(dict(figures.groups_at_limit))

    def _counters(self) -> Iterator[Metric]:
        if self._readers is None:
            return
        totals = self._totals
        finished = CounterMetricFamily(
            "pgjobs_jobs_finished",
            "Jobs that left queued_jobs since the server started, by outcome "
            "(succeeded, cancelled, expired, dead).",
            labels=["queue", "task", "outcome"],
        )
        for (queue, task, outcome), n in sorted(totals.finished.items()):
            finished.add_metric([queue, task, outcome], n)
        yield finished
        for name, doc, histograms in (
            (
                "pgjobs_job_run_duration_seconds",
                "Run time of succeeded jobs (finished_at - started_at of their last attempt), "
                "since the server started.",
                totals.run,
            ),
            (
                "pgjobs_job_pickup_latency_seconds",
                "Wait of succeeded jobs between run_at and the start of their last attempt, "
                "since the server started.",
                totals.pickup,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=["queue", "task"])
            for (queue, task), histogram in sorted(histograms.items()):
                family.add_metric([queue, task], histogram.cumulative(), histogram.total)
            yield family

    def _meta(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "pgjobs_metrics_up",
            "1 when the last refresh read the database, 0 when it failed (the values shown "
            "are then the last ones read).",
            value=1 if self._up else 0,
        )
        yield CounterMetricFamily(
            "pgjobs_metrics_scrape_errors",
            "Refreshes of these metrics that failed to read the database.",
            value=self._errors,
        )
        yield GaugeMetricFamily(
            "pgjobs_metrics_scrape_duration_seconds",
            "Seconds the last refresh of these metrics took (its SQL included).",
            value=self._scrape_seconds,
        )
        behind = self._readers is not None and any(r.behind for r in self._readers)
        yield GaugeMetricFamily(
            "pgjobs_metrics_catching_up",
            "1 while the finished-job counters are still reading a backlog (more rows "
            "finished since the last refresh than one refresh reads).",
            value=1 if behind else 0,
        )
        if self._replica is not None and self._replica.lag_seconds is not None:
            yield GaugeMetricFamily(
                "pgjobs_replica_lag_seconds",
                "How far behind the primary the standby these metrics are read from was (served "
                "with --read-dsn): 0 when it had replayed all it received.",
                value=self._replica.lag_seconds,
            )


def _pool_dsn(pool: psycopg_pool.ConnectionPool[Any]) -> Dsn:
    """The database of ``pool``, for messages (a pool may take its conninfo from a function)."""
    return Dsn(pool.conninfo if isinstance(pool.conninfo, str) else "", "the server's pool")


class _Collector(Collector):
    """Hands the last reading of a ``QueueMetrics`` to its private registry."""

    def __init__(self, metrics: QueueMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self._metrics.families())
