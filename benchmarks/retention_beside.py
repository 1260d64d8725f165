"""Group r: the retention service's round beside processing.

``archived_jobs`` holds a big history (10M rows over the last 40 days, daily partitions; quick:
500k). One `pgjobs work` process (``--concurrency 32``, burst) runs ``JOBS`` no-op jobs twice,
interleaved: alone, and while the retention service's round (``Retainer.run_once``, the round
every worker's maintenance runs, with ``archive = "30d"``) drops the 10 oldest days beside it,
from this process, on a connection of its own. The figure is the processing rate during the
round against the rate alone, each read from the database (the jobs' ``finished_at``); the
target is the issue's: the round slows processing by at most 5%. The history is filled again
before each pair, so every round has the same days to drop.

Run as the group ``retention`` of ``python -m benchmarks``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

from benchmarks import harness, prune
from benchmarks.harness import BenchDatabase, Context, say
from benchmarks.report import Figure, Row, ratio_target
from pgjobs.maintenance.retainer import Retainer
from pgjobs.retention_policy import RetentionPolicy

CONCURRENCY = 32


def _rate(bench: BenchDatabase, marker: int) -> float:
    """Jobs/s of the jobs after ``marker``, from their first finish to their last."""
    row = bench.conn.execute(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(finished_at))::float8 "
        "FROM archived_jobs WHERE id > %s AND task = 'bench.noop' AND queue <> 'history'",
        (marker,),
    ).fetchone()
    assert row is not None
    return float(row[0]) / max(float(row[1] or 0.0), 1e-9)


def _process(ctx: Context, jobs: int, beside: threading.Thread | None) -> float:
    """Run ``jobs`` no-op jobs with one burst worker (``beside`` started with it); jobs/s."""
    marker = ctx.db.fill_ready(jobs)
    worker = ctx.procs.start(harness.pgjobs_worker(ctx.db.url, CONCURRENCY))
    if beside is not None:
        harness.wait_until(
            lambda: bool(
                ctx.db.scalar("SELECT count(*) > 0 FROM archived_jobs WHERE id > %s", (marker,))
            ),
            60,
            "the worker to start",
            every=0.01,
        )
        beside.start()
    worker.wait(600)
    if beside is not None:
        beside.join(600)
    return _rate(ctx.db, marker)


def _round(url: str, done: list[float]) -> threading.Thread:
    """The retention service's round on a connection of its own; its seconds in ``done``."""

    def go() -> None:
        policy = RetentionPolicy.of({"archive": f"{prune.KEEP_DAYS}d"})
        from pgjobs.db.dsn import normalize_dsn

        retainer = Retainer(policy, normalize_dsn(url, "benchmark"))

        async def once() -> None:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            try:
                started = time.perf_counter()
                result = await retainer.run_once(conn)
                done.append(time.perf_counter() - started)
                say(
                    f"    retention round: {result.partitions} partitions, {result.archived:,} rows"
                )
            finally:
                await conn.close()

        asyncio.run(once())

    return threading.Thread(target=go, name="retention-round")


def run(ctx: Context) -> list[Row]:
    rows = ctx.size(10_000_000, 500_000)
    jobs = ctx.size(100_000, 20_000)
    alone: list[float] = []
    beside: list[float] = []
    rounds: list[float] = []
    for _ in range(ctx.runs(3)):
        say(f"  filling archived_jobs with {rows:,} rows over {prune.DAYS} daily partitions")
        prune._fill(ctx.db, rows)
        alone.append(_process(ctx, jobs, None))
        beside.append(_process(ctx, jobs, _round(ctx.db.url, rounds)))
        say(f"  {jobs:,} jobs: {alone[-1]:,.0f} jobs/s alone, {beside[-1]:,.0f}/s beside the round")
    ctx.db.reset()
    row = Row(
        "retention",
        f"{jobs:,} no-op jobs, 1 process --concurrency {CONCURRENCY}, while the retention "
        f"service's round drops 10 of {prune.DAYS} days of a {rows:,}-row archive: jobs/s",
        Figure("jobs/s", beside),
        Figure("jobs/s", alone),
        "the same jobs without the round",
        None,
        f"round took {min(rounds):.1f}-{max(rounds):.1f} s" if rounds else "",
        {"archive_rows": rows, "jobs": jobs},
        reference="beside",
    )
    row.target = ratio_target(">= 95% of alone", row.ratio, 0.95)
    return [row]
