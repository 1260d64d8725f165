"""Group w: durable workflows. 10-step workflows of no-op steps run by one `pgjobs work` process:
recorded steps/s, from the workflows' commit (their ``created_at``) to the last one's end, beside
the same number of plain no-op jobs; and the delay past the due time with which a workflow
resumes after a 1 s sleep on an idle worker (the step after the sleep recorded, minus the sleep's
``wake_at``, both from the database's clock).

Workers load this module's app: ``pgjobs work --app benchmarks.durable:app``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pgjobs
from benchmarks import QUEUE, harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row
from pgjobs import JobSpec

#: The --concurrency of the one worker process.
CONCURRENCY = 32
STEPS = 10
APP = "benchmarks.durable:app"

app = pgjobs.App(pool_size=CONCURRENCY + 2)


async def _noop() -> None:
    """A step that does nothing: what is left is the record's cost."""


@app.workflow(name="bench.steps", queue=QUEUE)
async def steps(ctx: pgjobs.WorkflowContext, n: int = STEPS) -> None:
    for i in range(n):
        await ctx.step(f"s{i}", _noop)


@app.workflow(name="bench.nap", queue=QUEUE)
async def nap(ctx: pgjobs.WorkflowContext, seconds: float = 1.0) -> None:
    await ctx.sleep(seconds)
    await ctx.step("after", _noop)


@app.task(name="bench.plain", queue=QUEUE)
async def plain(**_: Any) -> None:
    """A plain no-op job, the reference."""


def _start_worker(ctx: Context) -> Proc:
    worker = ctx.procs.start(harness.pgjobs_worker(ctx.db.url, CONCURRENCY, burst=False, app=APP))

    def registered() -> bool:
        if worker.poll() is not None:
            raise BenchmarkError(f"the worker exited early: {worker.describe()}")
        found = ctx.db.scalar("SELECT count(*) FROM pgjobs_workers WHERE pid = %s", (worker.pid,))
        return bool(found == 1)

    harness.wait_until(registered, 60, "the worker to register")
    return worker


def _per_second(ctx: Context, ids: list[int], units: int) -> float:
    harness.wait_until(
        lambda: (
            ctx.db.scalar("SELECT count(*) FROM archived_jobs WHERE id = ANY(%s)", (ids,))
            == len(ids)
        ),
        300,
        "every job to finish",
        every=0.02,
    )
    seconds = ctx.db.scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 "
        "FROM archived_jobs WHERE id = ANY(%s)",
        (ids,),
    )
    return units / float(seconds)


def steps_once(ctx: Context, workflows: int) -> float:
    ids = app.enqueue_many(JobSpec("bench.steps", {"n": STEPS}) for _ in range(workflows))
    return _per_second(ctx, ids, workflows * STEPS)


def plain_once(ctx: Context, jobs: int) -> float:
    ids = app.enqueue_many(JobSpec("bench.plain", {}) for _ in range(jobs))
    return _per_second(ctx, ids, jobs)


def resume_delays(ctx: Context, naps: int) -> list[float]:
    """Milliseconds past each 1 s sleep's wake time until the step after it was recorded."""
    ids = []
    for _ in range(naps):
        ids.append(app.enqueue("bench.nap", {"seconds": 1.0}))
        time.sleep(0.05)  # spread out: each resume alone on an idle worker
    _per_second(ctx, ids, naps)
    delays = ctx.db.conn.execute(
        "SELECT extract(epoch FROM a.recorded_at - s.wake_at)::float8 * 1000 "
        "FROM pgjobs_workflow_history s JOIN pgjobs_workflow_history a "
        "ON a.job_id = s.job_id AND a.seq = 1 WHERE s.seq = 0 AND s.job_id = ANY(%s)",
        (ids,),
    ).fetchall()
    return [float(row[0]) for row in delays]


def run(ctx: Context) -> list[Row]:
    workflows = ctx.size(1_000, 100)
    naps = ctx.size(100, 20)
    app.bind(ctx.db.dsn)
    ctx.db.reset()
    worker = _start_worker(ctx)
    rates: list[float] = []
    plains: list[float] = []
    delays: list[float] = []
    try:
        for _ in range(ctx.runs(5)):
            rates.append(steps_once(ctx, workflows))
            plains.append(plain_once(ctx, workflows))
            say(
                f"  {workflows:,} workflows of {STEPS} steps: {rates[-1]:,.0f} steps/s; "
                f"{workflows:,} plain jobs: {plains[-1]:,.0f} jobs/s"
            )
        delays = resume_delays(ctx, naps)
        say(f"  resume after a 1 s sleep: p99 {_p99(delays):.1f} ms past the due time")
    finally:
        worker.stop()
        app.close()
    details = {"workflows": workflows, "steps": STEPS, "concurrency": CONCURRENCY}
    return [
        Row(
            "durable",
            f"{STEPS}-step workflow of no-op steps, {workflows:,} workflows, 1 process "
            f"--concurrency {CONCURRENCY}: recorded steps/s",
            Figure("steps/s", rates),
            Figure("jobs/s", plains),
            f"{workflows:,} plain no-op jobs",
            None,
            "each step one INSERT into pgjobs_workflow_history, fenced by the run's lease; one "
            "read of the history per run",
            details,
            reference="beside",
        ),
        Row(
            "durable",
            "resume after a 1 s sleep on an idle worker: ms past the due time, p99",
            Figure("ms", [_p99(delays)]),
            None,
            "",
            None,
            f"median {statistics.median(delays):.1f} ms over {len(delays)} sleeps: the worker "
            "that put the job back claims again when it falls due",
            {"sleeps": naps},
        ),
    ]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
