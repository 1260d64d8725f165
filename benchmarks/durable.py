"""Group w: durable workflows. 10-step workflows of no-op steps run by one `pgjobs work` process:
recorded steps/s, from the workflows' commit (their ``created_at``) to the last one's end, beside
the same number of plain no-op jobs; the delay past the due time with which a workflow resumes
after a 1 s sleep on an idle worker (the step after the sleep recorded, minus the sleep's
``wake_at``, both from the database's clock); and a fan-out/fan-in of 1 -> 100 -> 1, 50 times,
with ``ctx.map`` (a unit is a parent, a child or the parent's last step).

Beside DBOS Transact: when the peers' venv (``make bench-peers`` builds it) has ``dbos``, the
same steps and fan-out workloads run on DBOS 3.x in a process of its own
(``benchmarks.dbos_peer``), against a database of its own on the same server, and the rows say
pgjobs' ratio to it (targets: >= 5x and >= 20x). Without it the rows say so.

Workers load this module's app: ``pgjobs work --app benchmarks.durable:app``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import pgjobs
from benchmarks import QUEUE, harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, limit_target, ratio_target
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


@app.task(name="bench.leaf", queue=QUEUE)
async def leaf(n: int) -> int:
    """A child of the fan-out: returns its number."""
    return n


@app.workflow(name="bench.fan", queue=QUEUE)
async def fan(ctx: pgjobs.WorkflowContext, width: int = 100) -> int:
    results = await ctx.map(leaf, [{"n": n} for n in range(width)])
    return int(await ctx.step("sum", lambda: sum(results)))


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


def fan_once(ctx: Context, fans: int, width: int) -> float:
    """Units/s of ``fans`` workflows of 1 -> ``width`` -> 1 (children by ``ctx.map``)."""
    ids = app.enqueue_many(JobSpec("bench.fan", {"width": width}) for _ in range(fans))
    return _per_second(ctx, ids, fans * (width + 2))


#: Where the peers' venv keeps its Python (``make bench-peers``), or $PGJOBS_BENCH_PEERS_PYTHON.
PEERS_PYTHON_ENV = "PGJOBS_BENCH_PEERS_PYTHON"


def dbos_python() -> str | None:
    """The Python of the peers' venv, when it is there and has DBOS."""
    python = os.environ.get(PEERS_PYTHON_ENV) or str(harness.REPO_ROOT / ".venv/peers/bin/python")
    if not Path(python).exists():
        return None
    check = subprocess.run([python, "-c", "import dbos"], capture_output=True, check=False)
    return python if check.returncode == 0 else None


def dbos_once(ctx: Context, python: str, workflows: int, fans: int, width: int) -> dict[str, Any]:
    """One run of ``benchmarks.dbos_peer`` on a database of its own (dropped after)."""
    name = f"pgjobs_bench_dbos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ctx.db.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = urllib.parse.urlsplit(ctx.db.url)._replace(path=f"/{name}").geturl()
    try:
        done = subprocess.run(
            [
                python,
                "-m",
                "benchmarks.dbos_peer",
                "--dsn",
                url,
                "--workflows",
                str(workflows),
                "--steps",
                str(STEPS),
                "--fans",
                str(fans),
                "--width",
                str(width),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
            cwd=harness.REPO_ROOT,
        )
        if done.returncode != 0:
            raise BenchmarkError(f"the DBOS run failed: {done.stderr.strip()[-500:]}")
        figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return figures
    finally:
        with psycopg.connect(ctx.db.url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


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
    fans, width = ctx.size(50, 5), 100
    app.bind(ctx.db.dsn)
    ctx.db.reset()
    worker = _start_worker(ctx)
    rates: list[float] = []
    plains: list[float] = []
    fanned: list[float] = []
    delays: list[float] = []
    try:
        for _ in range(ctx.runs(5)):
            rates.append(steps_once(ctx, workflows))
            plains.append(plain_once(ctx, workflows))
            say(
                f"  {workflows:,} workflows of {STEPS} steps: {rates[-1]:,.0f} steps/s; "
                f"{workflows:,} plain jobs: {plains[-1]:,.0f} jobs/s"
            )
        for _ in range(ctx.runs(3)):
            fanned.append(fan_once(ctx, fans, width))
            say(f"  {fans} x (1 -> {width} -> 1) with ctx.map: {fanned[-1]:,.0f} units/s")
        delays = resume_delays(ctx, naps)
        say(f"  resume after a 1 s sleep: p99 {_p99(delays):.1f} ms past the due time")
    finally:
        worker.stop()
        app.close()
    dbos = _dbos(ctx, workflows, fans, width)
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
        _beside_dbos(
            f"the same {STEPS}-step workflows against DBOS 3.x (a DBOS queue of concurrency "
            f"{CONCURRENCY}, one process): steps/s",
            Figure("steps/s", rates),
            dbos.get("steps_per_s"),
            "steps/s",
            5.0,
        ),
        _beside_dbos(
            f"fan-out/fan-in 1 -> {width} -> 1 with ctx.map, {fans} times: units/s against DBOS "
            "(child workflows on a DBOS queue)",
            Figure("units/s", fanned),
            dbos.get("fan_units_per_s"),
            "units/s",
            20.0,
        ),
        Row(
            "durable",
            "resume after a 1 s sleep on an idle worker: ms past the due time, p99",
            Figure("ms", [_p99(delays)]),
            None,
            "",
            limit_target("<= 100 ms", Figure("ms", [_p99(delays)]), 100.0),
            f"median {statistics.median(delays):.1f} ms over {len(delays)} sleeps: the worker "
            "that put the job back claims again when it falls due",
            {"sleeps": naps},
        ),
    ]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _dbos(ctx: Context, workflows: int, fans: int, width: int) -> dict[str, list[float]]:
    """DBOS' figures over ``ctx.runs(1)`` runs, or none when the peers' venv has no DBOS."""
    python = dbos_python()
    if python is None:
        say("  DBOS: not installed in the peers' venv (make bench-peers installs it): skipped")
        return {}
    figures: dict[str, list[float]] = {"steps_per_s": [], "fan_units_per_s": []}
    for _ in range(ctx.runs(1)):
        got = dbos_once(ctx, python, workflows, fans, width)
        for key in figures:
            figures[key].append(float(got[key]))
        say(
            f"  DBOS: {got['steps_per_s']:,.0f} steps/s; fan-out {got['fan_units_per_s']:,.0f} "
            "units/s"
        )
    return figures


def _beside_dbos(
    name: str, ours: Figure, theirs: list[float] | None, unit: str, at_least: float
) -> Row:
    reference = Figure(unit, theirs) if theirs else None
    row = Row(
        "durable",
        name,
        ours,
        reference,
        "DBOS 3.x" if theirs else "DBOS not installed (make bench-peers)",
        None,
        "DBOS in a process of its own, on a database of its own on the same server",
        {},
        reference="beside",
    )
    row.target = ratio_target(f">= {at_least:g}x DBOS", row.ratio, at_least)
    return row
