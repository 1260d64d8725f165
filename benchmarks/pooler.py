"""Group l: throughput through PgBouncer in transaction mode (``PGJOBS_POOLER=transaction``)
beside the same work on a direct connection: processing of pre-filled no-op jobs by one
`pgjobs work --burst --concurrency 32` process, and enqueues one job per call and 1,000 per call.

The benchmark starts a PgBouncer of its own for each run (``tests/support/pgbouncer.py``, pool
size 20, PgBouncer's default), so that its server connections are gone before the next run
reads the database's figures. Without pgbouncer installed the group prints why and gives no row.
"""

from __future__ import annotations

import subprocess
import time

from benchmarks import harness
from benchmarks.enqueue import _interleaved
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row
from benchmarks.tasks import app as direct_app
from pgjobs import App, JobSpec
from tests.support import pgbouncer

CONCURRENCY = 32
#: Server sessions of the benchmark's PgBouncer: its default_pool_size default.
POOL_SIZE = 20
CHUNK = 200
BATCH = 1_000


def _process(
    ctx: Context, jobs: int, through: pgbouncer.Bouncer | None, *, unprepared: bool = False
) -> float:
    """Jobs/s of one worker process on ``jobs`` pre-filled no-op jobs, directly or through
    the PgBouncer ``through`` (always with ``--pooler transaction``), or directly with that
    mode (``unprepared``: what the mode costs without the extra hop)."""
    db = ctx.db
    db.reset()
    marker = db.fill_ready(jobs)
    url = db.url if through is None else through.url(db.url)
    command = harness.pgjobs_worker(url, CONCURRENCY)
    if through is not None or unprepared:
        command += ["--pooler", "transaction"]
    worker = ctx.procs.start(command)
    deadline = time.monotonic() + 120 + jobs / 300
    while worker.poll() is None:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{worker.describe()} still running after the deadline")
        time.sleep(0.02)
    if worker.returncode != 0:
        raise BenchmarkError(f"{worker.describe()} exited with {worker.returncode}")
    window = db.archived_window(marker)
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} jobs archived: {worker.describe()}")
    return window.rate


def _enqueue(ctx: Context, bouncer: pgbouncer.Bouncer) -> dict[str, float]:
    """One interleaved run of single and batched enqueues, directly and through ``bouncer``."""
    db = ctx.db
    direct_app.bind(db.dsn)
    pooled = App(bouncer.url(db.url), pooler="transaction", check_task_names=False)
    chunks = ctx.size(10, 2)

    def single(app: App) -> None:
        for n in range(CHUNK):
            app.enqueue("bench.noop", {"n": n})

    def many(app: App) -> None:
        app.enqueue_many(JobSpec("bench.noop", {"n": n}) for n in range(BATCH))

    try:
        for app in (direct_app, pooled):
            app.enqueue("bench.noop", {})  # open the pool
        db.conn.execute("TRUNCATE queued_jobs")
        rates = _interleaved(
            {"single_direct": lambda: single(direct_app), "single_pooled": lambda: single(pooled)},
            CHUNK,
            chunks,
        )
        db.conn.execute("TRUNCATE queued_jobs")
        rates |= _interleaved(
            {"many_direct": lambda: many(direct_app), "many_pooled": lambda: many(pooled)},
            BATCH,
            chunks,
        )
    finally:
        pooled.close()
        direct_app.close()
    return rates


def run(ctx: Context) -> list[Row]:
    if pgbouncer.binary() is None:
        say("  pooler: skipped, pgbouncer is not installed (apt-get install pgbouncer)")
        return []
    server = ctx.db.url
    jobs = ctx.size(30_000, 5_000)
    processed: dict[str, list[float]] = {"direct": [], "pooled": [], "unprepared": []}
    enqueued: dict[str, list[float]] = {}
    for _ in range(ctx.runs(3)):
        processed["direct"].append(_process(ctx, jobs, None))
        processed["unprepared"].append(_process(ctx, jobs, None, unprepared=True))
        with pgbouncer.pgbouncer(server, pool_size=POOL_SIZE) as bouncer:
            processed["pooled"].append(_process(ctx, jobs, bouncer))
            for name, rate in _enqueue(ctx, bouncer).items():
                enqueued.setdefault(name, []).append(rate)
        say(
            f"  pooler: processing direct {processed['direct'][-1]:,.0f}, direct without "
            f"prepared statements {processed['unprepared'][-1]:,.0f}, through PgBouncer "
            f"{processed['pooled'][-1]:,.0f} jobs/s"
        )
    ctx.db.reset()
    via = f"through PgBouncer {_version()} (transaction mode, PGJOBS_POOLER=transaction)"

    def row(name: str, pooled: list[float], direct: list[float], what: str) -> Row:
        return Row(
            "pooler",
            f"{name} {via}",
            Figure("jobs/s", pooled),
            Figure("jobs/s", direct),
            f"{what}, direct",
            reference="beside",
        )

    return [
        Row(
            "pooler",
            f"processing, 1 process --concurrency {CONCURRENCY}, direct with --pooler transaction "
            "(no prepared statement, no extra hop)",
            Figure("jobs/s", processed["unprepared"]),
            Figure("jobs/s", processed["direct"]),
            "the same worker, direct, default mode",
            reference="beside",
        ),
        row(
            f"processing, 1 process --concurrency {CONCURRENCY},",
            processed["pooled"],
            processed["direct"],
            "the same worker",
        ),
        row(
            "enqueue, 1 job per call,",
            enqueued["single_pooled"],
            enqueued["single_direct"],
            "the same calls",
        ),
        row(
            f"enqueue_many, {BATCH:,} per call,",
            enqueued["many_pooled"],
            enqueued["many_direct"],
            "the same calls",
        ),
    ]


def _version() -> str:
    exe = pgbouncer.binary()
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=False)
    first = out.stdout.splitlines()[0] if out.stdout else "PgBouncer"
    return first.removeprefix("PgBouncer ").strip() or "?"
