"""`make bench-peers`: pgjobs beside PgQueuer and procrastinate on the same no-op workload, in
one run on the same server: enqueue ``--jobs`` jobs (one batch call), then process them with one
worker process at the setting each does best with (pgjobs ``--concurrency 32``, PgQueuer batches
of 100, procrastinate ``concurrency=32``); jobs/s and the client's CPU per job, medians of
``--repeats`` runs, each figure with its ratio to pgjobs'.

Each peer runs on the driver its own documentation recommends for throughput, and the table
says which. PgQueuer: asyncpg (its performance guide: a direct asyncpg connection for the
``QueueManager``, ``AsyncpgDriver``, and a pool for producers, ``AsyncpgPoolDriver``; its own
benchmarks put asyncpg at 1.7x its psycopg driver), with ``batch_size`` raised from its default
of 10 to 100 as the guide advises for short jobs. PgQueuer on its psycopg driver
(``PsycopgDriver``) runs too, as its own column. procrastinate: its psycopg 3 connector
(``PsycopgConnector``), the one its docs recommend.

The peers are not pgjobs dependencies: ``make bench-peers`` installs them into a venv of their
own (``.venv/peers``) beside pgjobs, and runs ``python -m benchmarks.peers`` there. Each system
gets a database of its own (created, installed and dropped here) on the benchmark server.

How the figures are read, the same way for all three. A worker process runs until its queue is
empty (``--burst``, PgQueuer's drain mode, procrastinate's ``wait=False``). Its rate comes from
the database, as ``benchmarks.processing`` reads pgjobs': the jobs finished after the first
batch over the span of their finish times (pgjobs' ``archived_jobs.finished_at``, PgQueuer's
``pgqueuer_log`` rows ``successful``, procrastinate's ``procrastinate_events`` ``succeeded``),
so start-up and exit do not count; its client CPU is the worker process's over that same
window (sampled from /proc while it runs), per job finished in it. Enqueue is timed in this
process around one batch call, its CPU with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from benchmarks import QUEUE, harness
from benchmarks.cli import ENV_DSN
from benchmarks.harness import BenchDatabase, BenchmarkError, say
from pgjobs.db.dsn import Dsn, normalize_dsn, resolve_dsn

#: The systems compared, in the table's order.
SYSTEMS = ("pgjobs", "pgqueuer", "pgqueuer-psycopg", "procrastinate")
#: The driver each system runs on, as the table's header says.
DRIVERS = {
    "pgjobs": "psycopg 3 + libpq",
    "pgqueuer": "asyncpg: AsyncpgDriver",
    "pgqueuer-psycopg": "psycopg 3: PsycopgDriver",
    "procrastinate": "psycopg 3: PsycopgConnector",
}
#: The peers' packages (not pgjobs dependencies: checked before the run).
PACKAGES = ("pgqueuer", "asyncpg", "procrastinate")
#: Each system's worker setting: jobs in flight in one process.
PGJOBS_CONCURRENCY = 32
PGQUEUER_BATCH = 100
PROCRASTINATE_CONCURRENCY = 32
#: Longest a processing run may take, in seconds, before the benchmark gives up.
RUN_TIMEOUT = 600.0


@dataclass
class Figures:
    """What was measured for one system, one value per repeat."""

    enqueue: list[float] = field(default_factory=list)  # jobs/s
    enqueue_cpu: list[float] = field(default_factory=list)  # client µs per job
    process: list[float] = field(default_factory=list)  # jobs/s
    process_cpu: list[float] = field(default_factory=list)  # client µs per job


# -- the databases -------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch_database(server: Dsn, prefix: str) -> Iterator[str]:
    """A throwaway database for a peer on the benchmark server; its URL."""
    name = f"{prefix}_{os.urandom(4).hex()}"
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield harness._with_database(server.url, name)
    finally:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# -- PgQueuer ------------------------------------------------------------------------------------


def _peer(module: str) -> Any:
    """A module of a peer (imported by name: the peers are not pgjobs dependencies, and are
    installed only in the venv `make bench-peers` builds)."""
    return importlib.import_module(module)


async def _noop(*_: Any, **__: Any) -> None:
    """The no-op handler of every system: what is left is the queue's own cost."""


async def _pgqueuer_queries(url: str, driver: str = "asyncpg") -> Any:
    """PgQueuer's queries on one connection: asyncpg's (``AsyncpgDriver``) or, for the
    psycopg column, psycopg's (``PsycopgDriver``)."""
    db = _peer("pgqueuer.db")
    if driver == "psycopg":
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        return _peer("pgqueuer.queries").Queries(db.PsycopgDriver(conn))
    return _peer("pgqueuer.queries").Queries(db.AsyncpgDriver(await _peer("asyncpg").connect(url)))


async def pgqueuer_install(url: str) -> None:
    await (await _pgqueuer_queries(url)).install()


async def pgqueuer_enqueue(url: str, jobs: int) -> tuple[float, float]:
    """One batch call from a producer on asyncpg's pool (``AsyncpgPoolDriver``), as PgQueuer's
    performance guide advises for producers."""
    pool = await _peer("asyncpg").create_pool(url, min_size=1, max_size=2)
    try:
        queries = _peer("pgqueuer.queries").Queries(_peer("pgqueuer.db").AsyncpgPoolDriver(pool))
        with _timed() as took:
            await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    finally:
        await pool.close()
    return took[0], took[1]


async def pgqueuer_psycopg_enqueue(url: str, jobs: int) -> tuple[float, float]:
    queries = await _pgqueuer_queries(url, "psycopg")
    with _timed() as took:
        await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    return took[0], took[1]


async def pgqueuer_work(url: str, driver: str = "asyncpg") -> None:
    manager = _peer("pgqueuer.qm").QueueManager(await _pgqueuer_queries(url, driver))
    manager.entrypoint("noop")(_noop)
    await manager.run(
        batch_size=PGQUEUER_BATCH,
        mode=_peer("pgqueuer.types").QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
        # No folding of the log into statistics while it is measured (the log is what is read).
        log_aggregation_interval=timedelta(0),
    )


async def pgqueuer_psycopg_work(url: str) -> None:
    await pgqueuer_work(url, "psycopg")


def pgqueuer_left(url: str) -> int:
    return _count(url, "SELECT count(*) FROM pgqueuer")


#: The finish times of PgQueuer's jobs: its log's rows for successful jobs.
PGQUEUER_FINISHED = "SELECT created AS at FROM pgqueuer_log WHERE status = 'successful'"


# -- procrastinate -------------------------------------------------------------------------------


def _procrastinate_app(url: str) -> Any:
    procrastinate = _peer("procrastinate")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    app.task(name="noop", queue=QUEUE)(_noop)
    return app


async def procrastinate_install(url: str) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_enqueue(url: str, jobs: int) -> tuple[float, float]:
    app = _procrastinate_app(url)
    async with app.open_async():
        with _timed() as took:
            await app.tasks["noop"].batch_defer_async(*({} for _ in range(jobs)))
    return took[0], took[1]


async def procrastinate_work(url: str) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.run_worker_async(
            queues=[QUEUE], concurrency=PROCRASTINATE_CONCURRENCY, wait=False
        )


def procrastinate_left(url: str) -> int:
    return _count(url, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")


#: The finish times of procrastinate's jobs: their "succeeded" events.
PROCRASTINATE_FINISHED = "SELECT at FROM procrastinate_events WHERE type = 'succeeded'"


# -- pgjobs --------------------------------------------------------------------------------------


async def pgjobs_enqueue(url: str, jobs: int) -> tuple[float, float]:
    from benchmarks.tasks import app
    from pgjobs import JobSpec

    app.bind(normalize_dsn(url, "bench"))
    await app.open_async()
    with _timed() as took:
        await app.enqueue_many_async(JobSpec("bench.noop", {}) for _ in range(jobs))
    await app.aclose()
    return took[0], took[1]


@contextlib.contextmanager
def _timed() -> Iterator[list[float]]:
    """Wall and CPU seconds of this process over the block: ``[wall, cpu]`` once it ended.
    Connecting happens before it, for every system."""
    took: list[float] = []
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield took
    finally:
        took += [time.perf_counter() - wall, time.process_time() - cpu]


def pgjobs_left(url: str) -> int:
    return _count(url, "SELECT count(*) FROM queued_jobs")


#: The finish times of pgjobs' jobs.
PGJOBS_FINISHED = "SELECT finished_at AS at FROM archived_jobs"


def _count(url: str, query: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0


def processing_window(url: str, finished: str) -> harness.Window:
    """The jobs finished and the span of their finish times (``finished``: one row per job,
    its finish time as ``at``), as ``BenchDatabase.archived_window`` reads pgjobs'."""
    query = f"""
        WITH run AS ({finished})
        SELECT count(*),
               count(*) FILTER (WHERE at = (SELECT min(at) FROM run)),
               coalesce(extract(epoch FROM min(at)), 0)::float8,
               coalesce(extract(epoch FROM max(at)), 0)::float8
        FROM run
    """
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    window = harness.Window(int(row[0]), int(row[1]), float(row[2]), float(row[3]))
    if window.seconds <= 0:
        raise BenchmarkError("the processing window is empty: too few jobs to measure")
    return window


def _clear_finished(url: str, system: str) -> None:
    """Forget the finish times of an earlier repeat."""
    table = {
        "pgjobs": "archived_jobs",
        "pgqueuer": "pgqueuer_log",
        "pgqueuer-psycopg": "pgqueuer_log",
        "procrastinate": "procrastinate_jobs CASCADE",
    }[system]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {table}")


# -- measuring -----------------------------------------------------------------------------------


def _worker_command(system: str, url: str) -> list[str]:
    if system == "pgjobs":
        return harness.pgjobs_worker(url, PGJOBS_CONCURRENCY, burst=True)
    return [sys.executable, "-m", "benchmarks.peers", "--work", system, "--dsn", url]


def _enqueue(system: str, url: str, jobs: int) -> tuple[float, float]:
    """Enqueue ``jobs`` no-op jobs in one batch call; (seconds, client CPU seconds)."""
    enqueue = {
        "pgjobs": pgjobs_enqueue,
        "pgqueuer": pgqueuer_enqueue,
        "pgqueuer-psycopg": pgqueuer_psycopg_enqueue,
        "procrastinate": procrastinate_enqueue,
    }[system]
    wall, cpu = asyncio.run(enqueue(url, jobs))
    return wall, cpu


def _process(procs: harness.Procs, system: str, url: str) -> harness.CpuTrace:
    """Run one worker process until its queue is empty; its CPU over time."""
    proc = procs.start(_worker_command(system, url))
    trace = harness.CpuTrace()
    deadline = time.monotonic() + RUN_TIMEOUT
    while proc.poll() is None:
        trace.sample([proc.pid])
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{system} worker still running after {RUN_TIMEOUT:.0f}s")
        time.sleep(0.02)
    if proc.returncode != 0:
        raise BenchmarkError(f"{system} worker exited with {proc.returncode}: {proc.describe()}")
    return trace


def measure(
    system: str, url: str, jobs: int, repeats: int, left: Callable[[str], int], finished: str
) -> Figures:
    figures = Figures()
    with harness.procs() as procs:
        for _ in range(repeats):
            _clear_finished(url, system)
            seconds, cpu = _enqueue(system, url, jobs)
            figures.enqueue.append(jobs / seconds)
            figures.enqueue_cpu.append(cpu / jobs * 1e6)
            trace = _process(procs, system, url)
            if (remaining := left(url)) != 0:
                raise BenchmarkError(f"{system}: {remaining} jobs left after the worker exited")
            window = processing_window(url, finished)
            figures.process.append(window.rate)
            used = trace.between(window.started, window.ended)
            if used is not None:
                figures.process_cpu.append(used / (window.count - window.first) * 1e6)
            say(
                f"  {system}: enqueue {figures.enqueue[-1]:,.0f} jobs/s, "
                f"process {figures.process[-1]:,.0f} jobs/s"
            )
    return figures


def run_system(system: str, server: Dsn, jobs: int, repeats: int) -> Figures:
    say(f"{system}: {jobs:,} jobs, {repeats} run(s)")
    if system == "pgjobs":
        db = BenchDatabase(server)
        try:
            return measure(system, db.url, jobs, repeats, pgjobs_left, PGJOBS_FINISHED)
        finally:
            db.drop()
    install, left, finished = {
        "pgqueuer": (pgqueuer_install, pgqueuer_left, PGQUEUER_FINISHED),
        "pgqueuer-psycopg": (pgqueuer_install, pgqueuer_left, PGQUEUER_FINISHED),
        "procrastinate": (procrastinate_install, procrastinate_left, PROCRASTINATE_FINISHED),
    }[system]
    with _scratch_database(server, f"pgjobs_bench_{system.replace('-', '_')}") as url:
        asyncio.run(install(url))
        return measure(system, url, jobs, repeats, left, finished)


# -- the table -----------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def render(results: dict[str, Figures], jobs: int, repeats: int) -> Table:
    table = Table(
        title=f"pgjobs beside its peers: {jobs:,} no-op jobs, one worker process, "
        f"median of {repeats}",
    )
    table.add_column("")
    for system in results:
        table.add_column(f"{system.removesuffix('-psycopg')}\n{DRIVERS[system]}", justify="right")
    base = results["pgjobs"]
    rows: list[tuple[str, Callable[[Figures], list[float]], str, bool]] = [
        ("enqueue, one batch (jobs/s)", lambda f: f.enqueue, ",.0f", True),
        ("enqueue client CPU (µs/job)", lambda f: f.enqueue_cpu, ".1f", False),
        ("processing, 1 process (jobs/s)", lambda f: f.process, ",.0f", True),
        ("processing client CPU (µs/job)", lambda f: f.process_cpu, ".1f", False),
    ]
    for name, pick, spec, higher in rows:
        cells = []
        mine = _median(pick(base)) if pick(base) else None
        for system, figures in results.items():
            if not pick(figures):  # the window was too short to sample
                cells.append("?")
                continue
            value = _median(pick(figures))
            text = format(value, spec)
            if system != "pgjobs" and mine and value:
                # pgjobs' advantage as a factor: > 1 means pgjobs is ahead.
                factor = mine / value if higher else value / mine
                text += f" (pgjobs {factor:.2f}x)"
            cells.append(text)
        table.add_row(name, *cells)
    return table


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description="pgjobs beside PgQueuer and procrastinate on one no-op workload.",
    )
    parser.add_argument(
        "--dsn", help=f"server to benchmark on (default: ${ENV_DSN}, else as pgjobs finds one)"
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only", choices=SYSTEMS[1:], action="append", help="this peer only (repeatable)"
    )
    parser.add_argument("--work", choices=SYSTEMS[1:], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.work is not None:  # one peer's worker process (started by _process)
        work = {
            "pgqueuer": pgqueuer_work,
            "pgqueuer-psycopg": pgqueuer_psycopg_work,
            "procrastinate": procrastinate_work,
        }[args.work]
        asyncio.run(work(args.dsn))
        return 0
    missing = [name for name in PACKAGES if not _installed(name)]
    if missing:
        print(
            f"benchmarks.peers: {', '.join(missing)} not installed here: run `make bench-peers`, "
            "which installs them into .venv/peers",
            file=sys.stderr,
        )
        return 2
    bench_dsn = os.environ.get(ENV_DSN)
    if args.dsn:
        server = normalize_dsn(args.dsn, "--dsn")
    else:
        server = normalize_dsn(bench_dsn, f"${ENV_DSN}") if bench_dsn else resolve_dsn(None)
    chosen = ["pgjobs", *(name for name in SYSTEMS[1:] if not args.only or name in args.only)]
    results = {system: run_system(system, server, args.jobs, args.repeats) for system in chosen}
    Console(width=160).print(render(results, args.jobs, args.repeats))
    return 0


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
