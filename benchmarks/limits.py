"""Group j: what a task held at its concurrency limit costs the other jobs of its queue.

One worker process (`--concurrency 32`) processes no-op jobs twice: with the benchmark app, and
with an app that also declares ``bench.limited`` (concurrency 2, one second per job) while a
thousand of its jobs wait at the front of the same queue. The second worker holds the limited
jobs back out of the queue's range (its first claims under limits) and runs two at a time. The
figure is the no-op jobs' throughput over their processing window, beside the same jobs without
the limited task; the runs alternate, so that drift on a shared machine falls on both.
"""

from __future__ import annotations

import time

from benchmarks import harness
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row, ratio_target
from benchmarks.tasks import LIMITED_CONCURRENCY

#: The limited task's jobs queued in front of the no-op ones.
LIMITED_JOBS = 1000
#: The share of the unlimited throughput the no-op jobs keep beside the limited task.
GOAL = 0.90
CONCURRENCY = 32


def run_once(ctx: Context, jobs: int, *, limited: bool) -> float:
    """No-op jobs/s of one worker, with or without the limited task in front of them."""
    db = ctx.db
    db.reset()
    if limited:
        db.fill_ready(LIMITED_JOBS, "bench.limited", '{"seconds": 1.0}')
    marker = db.fill_ready(jobs)
    app = "benchmarks.tasks:limited_app" if limited else "benchmarks.tasks:app"
    worker = ctx.procs.start(harness.pgjobs_worker(db.url, CONCURRENCY, burst=not limited, app=app))
    deadline = time.monotonic() + 120 + jobs / 300
    stopping = not limited
    while worker.poll() is None:
        if not stopping and _noop_done(ctx):
            stopping = True
            worker.terminate()  # the limited jobs would take many minutes: they are not timed
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{worker.describe()} still running after the deadline")
        time.sleep(0.05)
    if worker.returncode != 0:
        raise BenchmarkError(f"{worker.describe()} exited with {worker.returncode}")
    db.wait_for_disconnects()
    window = db.archived_window(marker)
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} no-op jobs archived: {worker.describe()}")
    if limited:
        running = db.scalar("SELECT count(*) FROM archived_jobs WHERE task = 'bench.limited'")
        say(f"    ({running} limited jobs ran meanwhile, {LIMITED_CONCURRENCY} at a time)")
    return window.rate


def _noop_done(ctx: Context) -> bool:
    return not ctx.db.scalar("SELECT EXISTS (SELECT 1 FROM queued_jobs WHERE task = 'bench.noop')")


def run(ctx: Context) -> list[Row]:
    jobs = ctx.size(30_000, 8_000)
    plain: list[float] = []
    beside: list[float] = []
    for _ in range(ctx.repeats):
        plain.append(run_once(ctx, jobs, limited=False))
        say(f"  no-op jobs alone: {plain[-1]:,.0f} jobs/s")
        beside.append(run_once(ctx, jobs, limited=True))
        say(f"  no-op jobs beside a limited task: {beside[-1]:,.0f} jobs/s")
    figure = Figure("jobs/s", beside)
    reference = Figure("jobs/s", plain)
    return [
        Row(
            "limits",
            f"no-op jobs beside {LIMITED_JOBS:,} jobs of a task at its concurrency limit "
            f"({LIMITED_CONCURRENCY}), same queue; 1 process --concurrency {CONCURRENCY}",
            figure,
            reference,
            "the same no-op jobs, no limited task in the app",
            ratio_target(
                f"≥ {GOAL:.0%} of the same jobs alone", figure.median / reference.median, GOAL
            ),
            "the limited jobs are held back out of the queue's claim range by the first claims "
            "under limits; then plain claims, and one under limits when due",
        )
    ]
