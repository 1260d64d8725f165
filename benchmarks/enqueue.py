"""Group a: enqueue throughput, one job per call and 1,000 per call, beside raw INSERT and COPY.

Each run times the whole call from the application's side (building the jobs included) on an
empty ``queued_jobs``; pgjobs and raw runs alternate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from benchmarks import raw
from benchmarks.harness import Context, say
from benchmarks.report import Figure, Row, ratio_target
from benchmarks.tasks import app
from pgjobs import JobSpec, producer

BATCH = 1_000


def run(ctx: Context) -> list[Row]:
    db = ctx.db
    app.bind(db.dsn)
    conn = psycopg.connect(db.url, autocommit=True)
    single = ctx.size(4_000, 500)
    batches = ctx.size(50, 10)

    def pgjobs_single() -> None:
        for n in range(single):
            app.enqueue("bench.noop", {"n": n})

    def raw_single() -> None:
        raw.enqueue_one_by_one(conn, "bench.noop", ({"n": n} for n in range(single)))

    def pgjobs_bulk() -> None:
        for _ in range(batches):
            app.enqueue_many(JobSpec("bench.noop", {"n": n}) for n in range(BATCH))

    def pgjobs_bulk_unnest() -> None:
        copy_min_rows = producer.COPY_MIN_ROWS
        producer.COPY_MIN_ROWS = BATCH + 1
        try:
            pgjobs_bulk()
        finally:
            producer.COPY_MIN_ROWS = copy_min_rows

    def raw_bulk() -> None:
        for _ in range(batches):
            raw.enqueue_copy(conn, "bench.noop", ({"n": n} for n in range(BATCH)))

    cases: dict[str, tuple[Callable[[], None], int]] = {
        "pgjobs_single": (pgjobs_single, single),
        "raw_single": (raw_single, single),
        "pgjobs_bulk": (pgjobs_bulk, batches * BATCH),
        "pgjobs_bulk_unnest": (pgjobs_bulk_unnest, batches * BATCH),
        "raw_bulk": (raw_bulk, batches * BATCH),
    }
    measured: dict[str, list[float]] = {name: [] for name in cases}
    try:
        app.enqueue("bench.noop", {})  # open the pool and prepare its statements
        raw.enqueue_one_by_one(conn, "bench.noop", [{}])
        for _ in range(ctx.repeats):
            for name, (call, jobs) in cases.items():
                db.conn.execute("TRUNCATE queued_jobs")
                started = time.perf_counter()
                call()
                measured[name].append(jobs / (time.perf_counter() - started))
                say(f"  enqueue {name}: {measured[name][-1]:,.0f} jobs/s")
    finally:
        app.close()
        conn.close()
        db.conn.execute("TRUNCATE queued_jobs")

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
        ),
    ]
