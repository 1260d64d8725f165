"""Group a: enqueue throughput, one job per call and 1,000 per call, beside raw INSERT and COPY:
on pgjobs' own ``queued_jobs``, and on the narrowest table that holds a job (``benchmarks/raw.py``'s
narrow reference: COPY, INSERT … unnest, one autocommit INSERT).

Each call is timed from the application's side (building the jobs included). A run starts on an
empty ``queued_jobs`` and interleaves the ways in small chunks (200 single jobs, or one batch),
their order turning at every chunk: this machine's speed drifts by tens of percent over seconds,
and a run of one way then a run of the other would measure the drift as much as the difference.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from benchmarks import raw
from benchmarks.harness import Context, say
from benchmarks.report import Figure, Row, ratio_target
from benchmarks.tasks import app
from pgjobs import JobSpec
from pgjobs.enqueue import statements

#: What each round empties: the jobs, and what the every-option jobs wrote beside them.
_TRUNCATE = (
    "TRUNCATE queued_jobs, narrow.queued_jobs, pgjobs_waiting, pgjobs_dependencies, "
    "pgjobs_group_states"
)
BATCH = 1_000
#: Single jobs per chunk of a run (each way enqueues this many before the next way's turn).
CHUNK = 200
#: ``enqueue_many`` against the narrow COPY (performance round 3's target).
NARROW_GOAL = 0.85
#: Producers calling ``app.enqueue`` at once (threads of one process, or tasks of one loop), and
#: the jobs each enqueues per chunk; together against one connection's autocommitted INSERTs.
PRODUCERS = 32
PER_PRODUCER = 20
#: Many producers against one connection (performance round 3's target).
PRODUCERS_GOAL = 3.0


#: Keys of the every-option jobs, fresh for each (none is held by an earlier one).
_KEYS = itertools.count()


def _every_option() -> None:
    """``CHUNK`` one-job enqueues with every option at once: a queue, a priority, a delay, an
    expiry, attempts, an idempotency key, a group, a unique key, tags, and a dependency (which
    stays queued: each job waits)."""
    dependency = app.enqueue("bench.noop", {})
    for n in range(CHUNK):
        k = next(_KEYS)
        app.enqueue(
            "bench.noop",
            {"n": n},
            queue="bench.every",
            priority=3,
            run_in=3600,
            expires_in=86_400,
            max_attempts=7,
            idempotency_key=f"every-i{k}",
            group=f"g{n % 8}",
            unique_key=f"every-u{k}",
            tags=["bench", "every"],
            after=[dependency],
        )


def run(ctx: Context) -> list[Row]:
    db = ctx.db
    app.bind(db.dsn)
    conn = psycopg.connect(db.url, autocommit=True)
    single_chunks = ctx.size(20, 2)
    single = single_chunks * CHUNK
    concurrent = PRODUCERS * PER_PRODUCER
    concurrent_chunks = ctx.size(10, 3)
    producers = _Producers(conn)
    batches = ctx.size(50, 10)

    def pgjobs_single() -> None:
        for n in range(CHUNK):
            app.enqueue("bench.noop", {"n": n})

    def raw_single() -> None:
        raw.enqueue_one_by_one(conn, "bench.noop", ({"n": n} for n in range(CHUNK)))

    def pgjobs_bulk() -> None:
        app.enqueue_many(JobSpec("bench.noop", {"n": n}) for n in range(BATCH))

    def pgjobs_bulk_unnest() -> None:
        copy_min_rows = statements.COPY_MIN_ROWS
        statements.COPY_MIN_ROWS = BATCH + 1
        try:
            pgjobs_bulk()
        finally:
            statements.COPY_MIN_ROWS = copy_min_rows

    def raw_bulk() -> None:
        raw.enqueue_copy(conn, "bench.noop", ({"n": n} for n in range(BATCH)))

    def narrow_single() -> None:
        raw.narrow_enqueue_one_by_one(conn, ({"n": n} for n in range(CHUNK)))

    def narrow_copy() -> None:
        raw.narrow_enqueue_copy(conn, ({"n": n} for n in range(BATCH)))

    def narrow_unnest() -> None:
        raw.narrow_enqueue_unnest(conn, ({"n": n} for n in range(BATCH)))

    # Each group of ways (name: a chunk's call), the jobs of a chunk, the chunks of a run.
    groups: list[tuple[dict[str, Callable[[], None]], int, int]] = [
        (
            {
                "pgjobs_single": pgjobs_single,
                "pgjobs_every": _every_option,
                "raw_single": raw_single,
                "narrow_single": narrow_single,
            },
            CHUNK,
            single_chunks,
        ),
        (
            {
                "pgjobs_bulk": pgjobs_bulk,
                "pgjobs_bulk_unnest": pgjobs_bulk_unnest,
                "raw_bulk": raw_bulk,
                "narrow_copy": narrow_copy,
                "narrow_unnest": narrow_unnest,
            },
            BATCH,
            batches,
        ),
        (
            {
                "pgjobs_threads": producers.threads,
                "pgjobs_tasks": producers.tasks,
                "raw_beside_producers": producers.one_connection,
            },
            concurrent,
            concurrent_chunks,
        ),
    ]
    measured: dict[str, list[float]] = {name: [] for ways, _, _ in groups for name in ways}
    try:
        raw.narrow_reset(conn)
        app.enqueue("bench.noop", {})  # open the pool and prepare its statements
        raw.enqueue_one_by_one(conn, "bench.noop", [{}])
        raw.narrow_enqueue_one_by_one(conn, [{}])
        producers.open()
        for _ in range(ctx.repeats):
            for ways, jobs, chunks in groups:
                db.conn.execute(_TRUNCATE)
                for name, rate in _interleaved(ways, jobs, chunks).items():
                    measured[name].append(rate)
                    say(f"  enqueue {name}: {rate:,.0f} jobs/s")
    finally:
        producers.close()
        conn.close()
        db.conn.execute(_TRUNCATE)
        raw.narrow_reset(db.conn)

    def figure(name: str) -> Figure:
        return Figure("jobs/s", measured[name])

    def ratio(name: str, reference: str) -> float:
        return figure(name).median / figure(reference).median

    return [
        Row(
            "enqueue",
            "app.enqueue, one job per call",
            figure("pgjobs_single"),
            figure("raw_single"),
            "one autocommit INSERT per job",
            ratio_target("≥ 85% of raw", ratio("pgjobs_single", "raw_single"), 0.85),
            "pgjobs also NOTIFYs and validates",
            {"jobs": single},
            narrow=figure("narrow_single"),
            narrow_name="one autocommit INSERT per job",
        ),
        Row(
            "enqueue",
            "app.enqueue, one job with every option at once",
            figure("pgjobs_every"),
            figure("pgjobs_single"),
            "app.enqueue of a plain job",
            ratio_target("≥ 50% of a plain job", ratio("pgjobs_every", "pgjobs_single"), 0.50),
            "a key, a unique key, a group, tags, a delay, an expiry and after= in one job",
            {"jobs": single},
        ),
        Row(
            "enqueue",
            f"app.enqueue_many, {BATCH:,} per call (COPY)",
            figure("pgjobs_bulk"),
            figure("raw_bulk"),
            f"COPY of {BATCH:,} rows per commit",
            ratio_target("≥ 70% of raw", ratio("pgjobs_bulk", "raw_bulk"), 0.70),
            "ids returned in order",
            {"jobs": batches * BATCH},
            narrow=figure("narrow_copy"),
            narrow_name=f"COPY of {BATCH:,} rows per commit",
            narrow_target=ratio_target(
                "≥ 85% of narrow raw COPY", ratio("pgjobs_bulk", "narrow_copy"), NARROW_GOAL
            ),
        ),
        Row(
            "enqueue",
            f"app.enqueue_many, {BATCH:,} per call, COPY off (INSERT … unnest)",
            figure("pgjobs_bulk_unnest"),
            figure("raw_bulk"),
            f"COPY of {BATCH:,} rows per commit",
            None,
            f"COPY path: {ratio('pgjobs_bulk', 'pgjobs_bulk_unnest'):.2f}x this",
            {"jobs": batches * BATCH},
            narrow=figure("narrow_unnest"),
            narrow_name=f"INSERT … unnest of {BATCH:,} rows per commit",
        ),
        Row(
            "enqueue",
            f"app.enqueue from {PRODUCERS} threads at once",
            figure("pgjobs_threads"),
            figure("raw_beside_producers"),
            "one connection's autocommit INSERT per job",
            ratio_target(
                f"≥ {PRODUCERS_GOAL:g}x one connection",
                ratio("pgjobs_threads", "raw_beside_producers"),
                PRODUCERS_GOAL,
            ),
            "callers meeting share one statement and one commit",
            {"jobs": concurrent_chunks * concurrent, "producers": PRODUCERS},
        ),
        Row(
            "enqueue",
            f"app.enqueue_async from {PRODUCERS} asyncio tasks at once",
            figure("pgjobs_tasks"),
            figure("raw_beside_producers"),
            "one connection's autocommit INSERT per job",
            ratio_target(
                f"≥ {PRODUCERS_GOAL:g}x one connection",
                ratio("pgjobs_tasks", "raw_beside_producers"),
                PRODUCERS_GOAL,
            ),
            "one event loop, the app's async pool",
            {"jobs": concurrent_chunks * concurrent, "producers": PRODUCERS},
        ),
    ]


class _Producers:
    """``PRODUCERS`` producers enqueueing ``PER_PRODUCER`` jobs each, all at once: threads of
    this process calling ``app.enqueue``, or tasks of one event loop (kept for every chunk, so
    that the app's async pool stays open) calling ``app.enqueue_async``; and as many jobs by one
    autocommit connection's INSERTs (``conn``), the reference."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._threads = ThreadPoolExecutor(PRODUCERS)
        self._loop = asyncio.Runner()

    def open(self) -> None:
        """Open the loop's pool and prepare its statements."""
        self._loop.run(app.enqueue_async("bench.noop", {}))

    def threads(self) -> None:
        list(self._threads.map(self._enqueue, range(PRODUCERS)))

    def tasks(self) -> None:
        self._loop.run(self._enqueue_async())

    def one_connection(self) -> None:
        jobs = PRODUCERS * PER_PRODUCER
        raw.enqueue_one_by_one(self._conn, "bench.noop", ({"n": n} for n in range(jobs)))

    @staticmethod
    def _enqueue(producer: int) -> None:
        for n in range(PER_PRODUCER):
            app.enqueue("bench.noop", {"producer": producer, "n": n})

    @staticmethod
    async def _enqueue_async() -> None:
        async def one(producer: int) -> None:
            for n in range(PER_PRODUCER):
                await app.enqueue_async("bench.noop", {"producer": producer, "n": n})

        await asyncio.gather(*(one(producer) for producer in range(PRODUCERS)))

    def close(self) -> None:
        """Close the app's pools (the loop's and the sync one), the loop and the threads."""
        self._loop.run(app.aclose())
        self._loop.close()
        self._threads.shutdown()


def _interleaved(ways: dict[str, Callable[[], None]], jobs: int, chunks: int) -> dict[str, float]:
    """One run of ``ways`` (name: the call of a chunk of ``jobs`` jobs), ``chunks`` chunks each,
    taken in turn, the order rotating at every chunk; each way's jobs/s over its own chunks."""
    names = list(ways)
    spent = dict.fromkeys(names, 0.0)
    for turn in range(chunks):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            ways[name]()
            spent[name] += time.perf_counter() - started
    return {name: jobs * chunks / spent[name] for name in names}
