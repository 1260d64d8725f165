"""Group e: does processing stay flat when the tables are deep?

Two cases, each against the empty tables, run by run (deep, empty, empty, deep, ...) so that
the ratio is read between neighbouring runs on a shared machine:

- **a deep backlog**: 5M ready jobs of the benchmark queue wait in queued_jobs (in a database of
  their own). A worker (--concurrency 32, no --burst: it would never run dry) takes them from
  the head of the queue and is stopped once it has finished ``jobs`` of them; the jobs it took
  are then added back at the tail and the table vacuumed, as autovacuum keeps a busy queue
  table, so that every run meets the same backlog. The empty case processes ``jobs`` jobs filled
  into empty tables (``--burst``). Both read the rate of the first 90% of the jobs to finish.
  The first run after the fill is not measured: it met a cold head of the queue.
- **a long history**: 10M rows in archived_jobs, finished over the last 30 days (in their daily
  partitions), filled server-side and vacuumed; a worker processes ``jobs`` pre-filled jobs
  (``--burst``) there and in the empty tables.

The raw consumer (``benchmarks/raw.py process``, claim 100 with SKIP LOCKED, archive them; one
connection) does the same beside the worker, so the share of the empty rate it keeps shows what
the deep table costs PostgreSQL itself, whoever the client is.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from benchmarks import QUEUE, harness, processing
from benchmarks.harness import BenchDatabase, BenchmarkError, Context, say
from benchmarks.processing import Run, Setup
from benchmarks.report import Row, ratio_target

#: The issue's target: the deep case keeps at least this share of the empty tables' rate.
GOAL = 0.90
#: The share of a run's jobs its rate is read over (the first to finish).
MEASURED = 0.9


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _interleaved(
    ctx: Context, setups: list[Setup], measure: Callable[[Setup, bool], Run]
) -> dict[tuple[Setup, bool], list[Run]]:
    """``ctx.repeats`` runs of every setup in the deep (True) and the empty (False) case; which
    case goes first alternates from one repeat to the next."""
    results: dict[tuple[Setup, bool], list[Run]] = {
        (setup, deep): [] for setup in setups for deep in (True, False)
    }
    for repeat in range(ctx.repeats):
        for setup in setups:
            for deep in (True, False) if repeat % 2 == 0 else (False, True):
                run = measure(setup, deep)
                results[setup, deep].append(run)
                case = "deep" if deep else "empty"
                say(f"  {setup.kind} {setup.label()}, {case}: {run.rate:,.0f} jobs/s")
    return results


def _shares(deep: list[Run], empty: list[Run]) -> list[float]:
    """The deep run's rate over its empty neighbour's, pair by pair."""
    return [d.rate / e.rate for d, e in zip(deep, empty, strict=True)]


def _rows(
    setups: tuple[Setup, Setup],
    results: dict[tuple[Setup, bool], list[Run]],
    empty_name: str,
    deep_name: str,
    explain: str,
) -> list[Row]:
    worker, reference = setups
    rate = processing.rates
    shares = _shares(results[worker, True], results[worker, False])
    raw_shares = _shares(results[reference, True], results[reference, False])
    share, raw_share = statistics.median(shares), statistics.median(raw_shares)

    def details(deep: bool) -> dict[str, object]:
        return {
            "pgjobs": processing.details(results[worker, deep]),
            "raw": processing.details(results[reference, deep]),
        }

    def pg_cpu(runs: list[Run]) -> str:
        known = [x for run in runs if (x := run.pg_cpu_per_1k) is not None]
        return f"{statistics.median(known) * 1000:.0f}" if known else "?"

    cpu = (
        f"PostgreSQL CPU µs/job, empty → deep: pgjobs {pg_cpu(results[worker, False])} → "
        f"{pg_cpu(results[worker, True])}, raw {pg_cpu(results[reference, False])} → "
        f"{pg_cpu(results[reference, True])}"
    )
    empty = Row(
        "growth",
        f"{empty_name}: {worker.label()}",
        rate(results[worker, False]),
        rate(results[reference, False]),
        reference.label(),
        note=explain,
        details=details(False),
    )
    deep = Row(
        "growth",
        f"{deep_name}: {worker.label()}",
        rate(results[worker, True]),
        rate(results[reference, True]),
        reference.label(),
        ratio_target(f"≥ {GOAL:.0%} of the empty tables' rate", share, GOAL),
        f"share of empty, run by run: {', '.join(f'{s:.0%}' for s in shares)}; "
        f"raw keeps {raw_share:.0%}; {cpu}",
        details(True) | {"shares": shares, "raw_shares": raw_shares},
    )
    return [empty, deep]


# -- a deep backlog of ready jobs ---------------------------------------------------------------


def _run_until(ctx: Context, db: BenchDatabase, setup: Setup, backlog: bool) -> Run:
    """Start ``setup``'s process on ``db``: in a ``backlog`` (where it would never run dry) it
    is stopped (SIGTERM) once it has finished ``setup.jobs`` jobs, else it stops by itself when
    the queue is empty (the worker with --burst). The jobs finished are counted as often in
    both cases; the rate is read over the jobs finished since it started, as
    ``processing.run_once`` reads it (the first batch left out)."""
    since = db.scalar("SELECT now()")
    transactions = db.transactions()
    pg_cpu = harness.BackendCpu(db) if db.local else None
    if setup.kind == "pgjobs":
        command = harness.pgjobs_worker(db.url, setup.width, burst=not backlog)
    else:
        command = harness.raw_client(setup.mode, db.url, "--batch", str(setup.width))
    worker = ctx.procs.start(command)
    client = harness.CpuTrace()
    deadline = time.monotonic() + 120 + setup.jobs / 300
    checked = time.monotonic()
    while worker.poll() is None:
        client.sample([worker.pid])
        if pg_cpu is not None:
            pg_cpu.sample()
        if time.monotonic() - checked >= 0.25:
            checked = time.monotonic()
            if _finished_since(db, since)[0] >= setup.jobs and backlog:
                worker.terminate()
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{worker.describe()} still running after the deadline")
        time.sleep(0.02)
    # A raw consumer stopped by SIGTERM exits with -15 (it has no handler); a worker exits 0.
    if worker.returncode not in ((0,) if setup.kind == "pgjobs" else (0, -15)):
        raise BenchmarkError(f"{worker.describe()} exited with {worker.returncode}")
    db.wait_for_disconnects()
    count = _finished_since(db, since)[0]
    if count < setup.jobs:
        raise BenchmarkError(f"{setup.label()}: {count} of {setup.jobs} jobs archived")
    # The rate of the first MEASURED share of the jobs, in both cases: neither the drain of an
    # emptied queue nor a stopped worker's last flush counts.
    window = harness.Window(*_finished_since(db, since, int(setup.jobs * MEASURED)))
    return Run(
        rate=window.rate,
        jobs=count,
        pg_cpu=None if pg_cpu is None else pg_cpu.seconds(),
        client_cpu=client.between(window.started, window.ended),
        window_jobs=window.count - window.first,
        transactions=db.transactions() - transactions,
    )


def _finished_since(
    db: BenchDatabase, since: object, first: int | None = None
) -> tuple[int, int, float, float]:
    """Jobs archived since ``since`` (the ``first`` of them only, in finishing order): how many,
    how many at the first ``finished_at``, and the first and last ``finished_at`` (Unix time)."""
    row = db.conn.execute(
        """
        WITH run AS (SELECT finished_at FROM archived_jobs WHERE finished_at >= %(since)s
                     ORDER BY finished_at LIMIT %(first)s)
        SELECT count(*),
               count(*) FILTER (WHERE finished_at = (SELECT min(finished_at) FROM run)),
               coalesce(extract(epoch FROM min(finished_at)), 0)::float8,
               coalesce(extract(epoch FROM max(finished_at)), 0)::float8
        FROM run
        """,
        {"since": since, "first": first},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), float(row[2]), float(row[3])


def _top_up(db: BenchDatabase, jobs: int) -> None:
    """Put the backlog back as it was: jobs a stopped raw consumer left leased are ready again,
    ``jobs`` new ones join the tail, and the table is vacuumed (autovacuum is off here; on a
    production server it would keep the queue table's dead rows down as it churns)."""
    db.conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = NULL, lease_owner = NULL, started_at = NULL "
        "WHERE lease_expires_at IS NOT NULL"
    )
    db.conn.execute(
        "INSERT INTO queued_jobs (queue, task, payload) "
        "SELECT %s, 'bench.noop', '{}' FROM generate_series(1, %s)",
        (QUEUE, jobs),
    )
    started = time.monotonic()
    db.vacuum("queued_jobs", "archived_jobs")
    say(f"  backlog topped up with {jobs:,} jobs, vacuumed in {time.monotonic() - started:.1f}s")


def _ready_backlog(ctx: Context) -> list[Row]:
    backlog = ctx.size(5_000_000, 500_000)
    jobs = ctx.size(50_000, 20_000)
    worker = Setup("pgjobs", 1, 32, jobs)
    reference = Setup("raw", 1, 100, jobs)
    deep_db = BenchDatabase(ctx.db.server)
    try:
        say(f"  filling a second database with {_count(backlog)} ready jobs")
        deep_db.fill_ready(backlog)
        deep_db.conn.execute("CHECKPOINT")
        # One run unmeasured: the first after the fill and its checkpoint met a cold head of
        # the queue (pages written since, full-page images), which a worked queue does not.
        _top_up(deep_db, _run_until(ctx, deep_db, worker, backlog=True).jobs)

        def measure(setup: Setup, deep: bool) -> Run:
            if deep:
                run = _run_until(ctx, deep_db, setup, backlog=True)
                _top_up(deep_db, run.jobs)
                return run
            ctx.db.reset()
            ctx.db.fill_ready(setup.jobs)
            return _run_until(ctx, ctx.db, setup, backlog=False)

        results = _interleaved(ctx, [worker, reference], measure)
    finally:
        deep_db.drop()
    ctx.db.reset()
    return _rows(
        (worker, reference),
        results,
        "empty queue",
        f"{_count(backlog)} ready jobs in the queue",
        f"{_count(jobs)} jobs a run, rate of the first {MEASURED:.0%} to finish",
    )


# -- a long history -----------------------------------------------------------------------------


def _long_history(ctx: Context) -> list[Row]:
    history = ctx.size(10_000_000, 1_000_000)
    jobs = ctx.size(50_000, 20_000)
    worker = Setup("pgjobs", 1, 32, jobs)
    reference = Setup("raw", 1, 100, jobs)
    deep_db = BenchDatabase(ctx.db.server)
    try:
        say(f"  filling a second database's archived_jobs with {_count(history)} rows")
        deep_db.fill_archived(history)
        deep = dataclasses.replace(ctx, db=deep_db)

        def measure(setup: Setup, is_deep: bool) -> Run:
            if is_deep:
                return processing.run_once(deep, setup, reset=False)
            return processing.run_once(ctx, setup, reset=True)

        results = _interleaved(ctx, [worker, reference], measure)
    finally:
        deep_db.drop()
    ctx.db.reset()
    return _rows(
        (worker, reference),
        results,
        "archived_jobs empty",
        f"{_count(history)} rows in archived_jobs (daily partitions)",
        f"{_count(jobs)} pre-filled jobs a run, --burst",
    )


def run(ctx: Context) -> list[Row]:
    return _ready_backlog(ctx) + _long_history(ctx)
