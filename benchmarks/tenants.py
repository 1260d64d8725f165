"""Group n: the database's other tenants. What a queue at a steady rate costs the OLTP work that
shares its server, and what idle workers cost it.

``pgbench`` (TPC-B-like: scale 10, 8 clients, 60 s; --quick: scale 2, 10 s) runs in a database
of its own (``pgbench -i``, dropped afterwards) alone, then beside pgjobs processing a steady
2,000 jobs/s in the benchmark database (a paced producer process and one `pgjobs work`
process), then, when the peers' venv is there (`make bench-peers` builds it), beside PgQueuer on
asyncpg at the same rate in a database of its own. The cases alternate run by run (alone,
pgjobs, alone, PgQueuer, ...) so that drift on a shared machine falls on all of them. The
raw reference runs beside it too: ``benchmarks/raw.py``'s narrow tables and its one-statement
trip, fed at the same pace (one statement inserts a batch and notifies) and woken by LISTEN.
The figure is pgbench's TPS; beside it, the server CPU per job of the queue's backends over the
pgbench run (read from /proc as group f reads it) and the rate the queue kept.

What idle workers cost the server is the idle group's (``benchmarks/idle.py``).

``python -m benchmarks.tenants produce|work|install ...`` are this group's own subprocesses:
the paced producers (pgjobs, PgQueuer and the narrow queue), PgQueuer's worker, which runs in the
peers' venv, and the narrow queue's worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from glob import glob
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks import QUEUE, harness, raw
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, Target, ratio_target

#: Jobs per second the producer enqueues, for either queue.
RATE = 2_000
#: Jobs per enqueue call: the producer sends one batch every BATCH / RATE seconds (10 ms).
BATCH = 20
#: pgbench's clients; its threads (-j) stay at the default, one.
CLIENTS = 8
#: The most pgbench's TPS may fall beside pgjobs (the performance issue's target).
MAX_DROP = 0.10
#: The share of RATE a queue must finish for its drop to be read against the target.
HELD = 0.95
#: The worker's --concurrency, and PgQueuer's batch size (as in `make bench-peers`).
PGJOBS_CONCURRENCY = 32
PGQUEUER_BATCH = 100
#: The raw reference's row name, and the channel its producer notifies its worker on.
NARROW_NAME = "the narrow raw queue"
NARROW_CHANNEL = "narrow_jobs"
#: The narrow producer's statement: a batch's jobs and the worker's notification, in one.
NARROW_PRODUCE = f"""
WITH jobs AS ({raw.NARROW_INSERT_MANY.strip()} RETURNING id)
SELECT pg_notify('{NARROW_CHANNEL}', '')
"""
#: Seconds the queue runs at its rate before pgbench starts.
WARMUP = 3.0
#: The peers' venv (`make bench-peers`), unless PGJOBS_BENCH_PEERS_PYTHON names a Python.
PEERS_PYTHON_ENV = "PGJOBS_BENCH_PEERS_PYTHON"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Sizes:
    """pgbench's scale factor and run length."""

    scale: int
    seconds: int

    @classmethod
    def of(cls, ctx: Context) -> Sizes:
        return cls(ctx.size(10, 2), ctx.size(60, 10))


# -- the server ------------------------------------------------------------------------------------


def pgbench_binary() -> str:
    """pgbench on the PATH, else in PostgreSQL's own bin directory (Debian's layout)."""
    found = shutil.which("pgbench") or next(
        iter(sorted(glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        raise BenchmarkError("pgbench not found (it comes with PostgreSQL's client programs)")
    return found


def parse_tps(output: str) -> float:
    """pgbench's TPS from its report (the figure without the connections' start-up)."""
    match = _TPS.search(output)
    if match is None:
        raise BenchmarkError(f"no TPS in pgbench's output: {output[-500:]}")
    return float(match.group(1))


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A throwaway database on the benchmark server, dropped afterwards; its URL."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield harness._with_database(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class ServerCpu:
    """CPU seconds of the backends serving one database (the reader's own connection aside),
    from /proc: those alive at the start count from there, those found later from zero."""

    def __init__(self, conn: psycopg.Connection[Any], database: str) -> None:
        self.conn, self.database = conn, database
        self.start: dict[int, float] = {}
        self.last: dict[int, float] = {}
        for pid in self._pids():
            self.start[pid] = self.last[pid] = harness.process_cpu(pid) or 0.0

    def _pids(self) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,),
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    def sample(self) -> None:
        for pid in self._pids():
            self.start.setdefault(pid, 0.0)
        for pid in self.start:
            cpu = harness.process_cpu(pid)
            if cpu is not None:
                self.last[pid] = cpu

    def seconds(self) -> float:
        return sum(self.last.get(pid, start) - start for pid, start in self.start.items())


def _database(url: str) -> str:
    with psycopg.connect(url) as conn:
        return str(conn.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]


# -- the queues beside pgbench ---------------------------------------------------------------------


def peers_python() -> str | None:
    """The Python of the peers' venv, when it is there and has PgQueuer and asyncpg."""
    python = os.environ.get(PEERS_PYTHON_ENV) or str(harness.REPO_ROOT / ".venv/peers/bin/python")
    if not Path(python).exists():
        return None
    check = subprocess.run(
        [python, "-c", "import pgqueuer, asyncpg"], capture_output=True, check=False
    )
    return python if check.returncode == 0 else None


@dataclass
class Queue:
    """One queue system beside pgbench: its database, the Python its processes run on, and how
    its finished jobs are read."""

    system: str
    url: str
    python: str
    #: One row per finished job, its finish time as ``at``.
    finished: str
    #: Empties the queue's tables between runs.
    reset: Callable[[], None]
    #: Counts the queue's jobs not finished yet.
    left: str

    def commands(self) -> list[list[str]]:
        """The worker's command line, then the producer's."""
        if self.system == "pgjobs":
            worker = harness.pgjobs_worker(self.url, PGJOBS_CONCURRENCY, burst=False)
        else:
            worker = self._tenants("work")
        return [worker, self._tenants("produce", "--rate", str(RATE), "--batch", str(BATCH))]

    def _tenants(self, action: str, *options: str) -> list[str]:
        command = [self.python, "-m", "benchmarks.tenants", action, self.system]
        return [*command, "--dsn", self.url, *options]

    def backlog(self) -> int:
        """Jobs enqueued and not finished yet."""
        with psycopg.connect(self.url) as conn:
            row = conn.execute(self.left).fetchone()
        return int(row[0]) if row else 0

    def jobs_between(self, start: float, end: float) -> int:
        """Jobs finished from ``start`` to ``end`` (Unix time; the server shares the clock)."""
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM ({self.finished}) AS run "
                "WHERE at >= to_timestamp(%s) AND at < to_timestamp(%s)",
                (start, end),
            ).fetchone()
        return int(row[0]) if row else 0


@dataclass(frozen=True, slots=True)
class Case:
    """One pgbench run: its TPS and, beside a queue, the jobs that queue finished meanwhile, its
    backlog (ready or running jobs) at the start and at the end, the CPU of its backends, and how
    long the run lasted."""

    tps: float
    jobs: int = 0
    backlog: tuple[int, int] = (0, 0)
    server_cpu: float | None = None
    seconds: float = 0.0
    #: CPU seconds of the producer and worker processes over the run.
    client_cpu: float | None = None

    @property
    def rate(self) -> float:
        """Jobs/s the queue finished."""
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def offered(self) -> float:
        """Jobs/s the producer enqueued: those finished and those left over."""
        if not self.seconds:
            return 0.0
        return (self.jobs + self.backlog[1] - self.backlog[0]) / self.seconds

    @property
    def us_per_job(self) -> float | None:
        if self.server_cpu is None or not self.jobs:
            return None
        return self.server_cpu / self.jobs * 1e6

    @property
    def client_us_per_job(self) -> float | None:
        if self.client_cpu is None or not self.jobs:
            return None
        return self.client_cpu / self.jobs * 1e6


def vacuum_pgbench(url: str) -> None:
    """What ``pgbench`` does before a run, and the accounts too (``-v``; autovacuum may be off),
    done here so that pgbench's run is only its transactions."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgbench_history")
        conn.execute("VACUUM ANALYZE pgbench_branches, pgbench_tellers, pgbench_accounts")


def run_pgbench(
    ctx: Context, url: str, seconds: int, queue: Queue | None, clients: list[Proc] | None = None
) -> Case:
    """One pgbench run on ``url`` (its tables vacuumed first), beside ``queue`` when given: the
    CPU of its backends is sampled while pgbench runs, and that of its ``clients``."""
    vacuum_pgbench(url)
    pids = [proc.pid for proc in clients or []]
    before = {pid: harness.process_tree_cpu(pid) for pid in pids}
    cpu = None
    if queue is not None and ctx.db.local:
        cpu = ServerCpu(ctx.db.conn, _database(queue.url))
    command = [pgbench_binary(), "-n", "-c", str(CLIENTS), "-T", str(seconds), url]
    backlog = queue.backlog() if queue is not None else 0
    started = time.time()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as pgbench:
        try:
            while pgbench.poll() is None:
                if cpu is not None:
                    cpu.sample()
                time.sleep(0.25)
            output = pgbench.communicate()[0]
        finally:
            if pgbench.poll() is None:
                pgbench.kill()
    ended = time.time()
    if pgbench.returncode != 0:
        raise BenchmarkError(f"pgbench exited with {pgbench.returncode}: {output[-500:]}")
    if queue is None:
        return Case(parse_tps(output))
    if cpu is not None:
        cpu.sample()
    client_cpu = 0.0
    for pid in pids:
        start, end = before[pid], harness.process_tree_cpu(pid)
        if start is None or end is None:
            raise BenchmarkError(f"{queue.system}: a producer or worker exited during pgbench")
        client_cpu += end - start
    return Case(
        parse_tps(output),
        queue.jobs_between(started, ended),
        (backlog, queue.backlog()),
        None if cpu is None else cpu.seconds(),
        ended - started,
        client_cpu if pids else None,
    )


def beside(ctx: Context, url: str, seconds: int, queue: Queue) -> Case:
    """pgbench while ``queue`` processes RATE jobs/s: the worker first, then the producer,
    WARMUP seconds before pgbench starts; both stopped after it."""
    queue.reset()
    procs: list[Proc] = []
    env = harness.subprocess_env()
    try:
        for command in queue.commands():
            procs.append(ctx.procs.start(command, env))
        time.sleep(WARMUP)
        for proc in procs:
            if proc.poll() is not None:
                raise BenchmarkError(f"{queue.system}: {proc.describe()} exited early")
        return run_pgbench(ctx, url, seconds, queue, procs)
    finally:
        for proc in reversed(procs):  # the producer first
            proc.stop()


def _pgjobs_queue(ctx: Context) -> Queue:
    def reset() -> None:
        ctx.db.reset()
        ctx.db.vacuum("queued_jobs", "archived_jobs")

    return Queue(
        "pgjobs",
        ctx.db.url,
        sys.executable,
        "SELECT finished_at AS at FROM archived_jobs",
        reset,
        "SELECT count(*) FROM queued_jobs",
    )


def _narrow_queue(ctx: Context) -> Queue:
    def reset() -> None:
        raw.narrow_reset(ctx.db.conn)
        ctx.db.conn.execute("VACUUM ANALYZE narrow.queued_jobs")

    return Queue(
        "narrow",
        ctx.db.url,
        sys.executable,
        "SELECT finished_at AS at FROM narrow.archived_jobs",
        reset,
        "SELECT count(*) FROM narrow.queued_jobs",
    )


def _pgqueuer_queue(url: str, python: str) -> Queue:
    def reset() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
            conn.execute("VACUUM ANALYZE pgqueuer")

    return Queue(
        "pgqueuer",
        url,
        python,
        "SELECT created AS at FROM pgqueuer_log WHERE status = 'successful'",
        reset,
        "SELECT count(*) FROM pgqueuer",
    )


# -- the rows --------------------------------------------------------------------------------------


@dataclass
class Runs:
    alone: list[Case] = field(default_factory=list)
    pgjobs: list[Case] = field(default_factory=list)
    pgqueuer: list[Case] = field(default_factory=list)
    narrow: list[Case] = field(default_factory=list)


def run(ctx: Context) -> list[Row]:
    sizes = Sizes.of(ctx)
    python = peers_python()
    if python is None:
        say("  PgQueuer: no peers' venv (`make bench-peers` builds it): pgjobs and pgbench only")
    runs = Runs()
    server = ctx.db.server.url
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(scratch_database(server, "pgjobs_bench_pgbench"))
        say(f"  pgbench -i -s {sizes.scale}")
        subprocess.run(
            [pgbench_binary(), "-i", "-q", "-s", str(sizes.scale), url],
            capture_output=True,
            check=True,
        )
        queues = [_pgjobs_queue(ctx), _narrow_queue(ctx)]
        if python is not None:
            peer_url = stack.enter_context(scratch_database(server, "pgjobs_bench_pgqueuer"))
            subprocess.run(
                [python, "-m", "benchmarks.tenants", "install", "pgqueuer", "--dsn", peer_url],
                env=harness.subprocess_env(),
                capture_output=True,
                check=True,
            )
            queues.append(_pgqueuer_queue(peer_url, python))
        for _ in range(ctx.runs(3)):
            for queue in queues:
                runs.alone.append(run_pgbench(ctx, url, sizes.seconds, None))
                say(f"  pgbench alone: {runs.alone[-1].tps:,.0f} TPS")
                case = beside(ctx, url, sizes.seconds, queue)
                getattr(runs, queue.system).append(case)
                us = "?" if case.us_per_job is None else f"{case.us_per_job:.1f}"
                say(
                    f"  pgbench beside {queue.system}: {case.tps:,.0f} TPS; {case.rate:,.0f} "
                    f"jobs/s finished, {case.offered:,.0f} enqueued, server CPU {us} µs/job, "
                    f"producer and worker CPU {_client([case])} µs/job"
                )
    ctx.db.reset()
    return [*_tps_rows(sizes, runs), _cpu_row(runs)]


def _tps(cases: list[Case]) -> Figure:
    return Figure("TPS", [case.tps for case in cases])


def _drop(cases: list[Case], alone: Figure) -> float | None:
    return 1 - _tps(cases).median / alone.median if cases else None


def _held(cases: list[Case]) -> bool:
    """Whether the queue finished its jobs at the rate asked (the median run, within 5%): a
    queue that fell behind loaded the server less, and its drop is not comparable."""
    return bool(cases) and statistics.median(case.rate for case in cases) >= HELD * RATE


def _tps_rows(sizes: Sizes, runs: Runs) -> list[Row]:
    alone = _tps(runs.alone)
    pgjobs_drop = _drop(runs.pgjobs, alone)
    peer_drop = _drop(runs.pgqueuer, alone)
    workload = (
        f"pgbench TPC-B-like, scale {sizes.scale}, {CLIENTS} clients, {sizes.seconds} s, "
        f"beside a queue at {RATE:,} jobs/s (a producer enqueueing {BATCH} every "
        f"{BATCH / RATE * 1000:.0f} ms, one worker process)"
    )
    rows = []
    for system, cases, drop in (
        ("pgjobs", runs.pgjobs, pgjobs_drop),
        ("PgQueuer 1.6 (asyncpg)", runs.pgqueuer, peer_drop),
        (NARROW_NAME, runs.narrow, _drop(runs.narrow, alone)),
    ):
        if not cases:
            continue
        ratio = _tps(cases).median / alone.median
        target = ratio_target(f"TPS drop ≤ {MAX_DROP:.0%}", ratio, 1 - MAX_DROP)
        target.shown = f"-{drop:.1%}" if drop is not None else "n/a"
        if not _held(cases):
            target.shown += f" (below {RATE:,} jobs/s)"
            target.met = None
        more: Target | None = None
        if system == "pgjobs":
            more = Target(
                "drop smaller than beside PgQueuer",
                "n/a" if peer_drop is None else f"-{pgjobs_drop:.1%} vs -{peer_drop:.1%}",
                None if peer_drop is None or pgjobs_drop is None else pgjobs_drop < peer_drop,
            )
            if runs.pgqueuer and not (_held(runs.pgqueuer) and _held(cases)):
                more.shown += " (a queue below the rate: not comparable)"
                more.met = None
        kept = Figure("jobs/s", [case.rate for case in cases])
        offered = Figure("jobs/s", [case.offered for case in cases])
        rows.append(
            Row(
                "tenants",
                f"{workload}: pgbench TPS beside {system}",
                _tps(cases),
                alone,
                "pgbench alone, runs interleaved with these",
                target if system == "pgjobs" else None,
                (
                    "raw SQL at this rate (raw.py's narrow tables and trip); "
                    if system == NARROW_NAME
                    else ""
                )
                + f"the queue finished {kept.median:,.0f} jobs/s ({kept.low:,.0f}-{kept.high:,.0f}), "
                f"the producer enqueued {offered.median:,.0f} jobs/s; the producer's and the "
                f"worker's own CPU {_client(cases)} µs/job: they, pgbench and the server share "
                "this machine's cores",
                {
                    "tps_alone": alone.runs,
                    "jobs_per_s": kept.runs,
                    "enqueued_per_s": offered.runs,
                    "backlog": [case.backlog for case in cases],
                    "client_cpu_us_per_job": [case.client_us_per_job for case in cases],
                    "server_cpu_us_per_job": [case.us_per_job for case in cases],
                },
                reference="beside",
                more_targets=[more] if more is not None else [],
            )
        )
    return rows


def _client(cases: list[Case]) -> str:
    values = [us for case in cases if (us := case.client_us_per_job) is not None]
    return f"{statistics.median(values):.0f}" if values else "?"


def _us(cases: list[Case]) -> Figure | None:
    values = [us for case in cases if (us := case.us_per_job) is not None]
    return Figure("µs/job", values) if values else None


def _cpu_row(runs: Runs) -> Row:
    pgjobs, peer, narrow = _us(runs.pgjobs), _us(runs.pgqueuer), _us(runs.narrow)
    raw_cpu = f"; the narrow raw queue: {narrow.median:.0f} µs/job" if narrow is not None else ""
    return Row(
        "tenants",
        f"PostgreSQL CPU per job (enqueue and processing) at {RATE:,} jobs/s beside pgbench",
        pgjobs,
        peer,
        "PgQueuer 1.6 (asyncpg) at the same rate" if peer is not None else "",
        None,
        "the producer's and the worker's backends, over pgbench's runs: what a producer and a "
        f"worker on other hosts would still cost the server{raw_cpu}"
        if pgjobs is not None
        else "server not on this machine: /proc unavailable",
        reference="beside",
    )


# -- this group's subprocesses ---------------------------------------------------------------------


async def pace(send: Callable[[int], Awaitable[Any]], rate: float, batch: int) -> None:
    """Call ``send(n)`` so that ``rate`` jobs a second go out, in batches of about ``batch``:
    a batch that comes late is made up by the next (at most ten batches at once)."""
    start = time.monotonic()
    sent = 0
    while True:
        due = int((time.monotonic() - start) * rate)
        if due - sent > 0:
            count = min(due - sent, batch * 10)
            await send(count)
            sent += count
        await asyncio.sleep(max(start + (sent + batch) / rate - time.monotonic(), 0.0))


async def produce(system: str, url: str, rate: float, batch: int) -> None:
    if system == "narrow":
        await narrow_produce(url, rate, batch)
        return
    if system == "pgjobs":
        from benchmarks.tasks import app
        from pgjobs import JobSpec
        from pgjobs.db.dsn import normalize_dsn

        app.bind(normalize_dsn(url, "bench"))
        await app.open_async()
        await pace(
            lambda n: app.enqueue_many_async(
                JobSpec("bench.noop", {}, queue=QUEUE) for _ in range(n)
            ),
            rate,
            batch,
        )
        return
    from benchmarks import peers

    queries = await peers._pgqueuer_queries(url)
    await pace(lambda n: queries.enqueue(["noop"] * n, [None] * n, [0] * n), rate, batch)


async def narrow_produce(url: str, rate: float, batch: int) -> None:
    """The narrow queue's producer: one autocommitted statement per batch inserts its jobs and
    notifies the worker (``NARROW_PRODUCE``)."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)

    async def send(count: int) -> None:
        await conn.execute(
            NARROW_PRODUCE, {"queue": QUEUE, "payloads": ["{}"] * count}, prepare=True
        )

    await pace(send, rate, batch)


async def narrow_work(url: str) -> None:
    """The narrow queue's worker: raw.py's narrow trip (archive the last batch, claim up to 100)
    until a trip claims nothing, then wait for a notification (or a second without one)."""
    connect = psycopg.AsyncConnection.connect
    async with await connect(url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {NARROW_CHANNEL}")
        async with await connect(url, autocommit=True) as conn:
            ids: list[int] = []
            trip = {"owner": "narrow", "queue": QUEUE, "limit": 100}
            while True:
                while True:
                    cursor = await conn.execute(raw.NARROW_TRIP, {**trip, "ids": ids}, prepare=True)
                    ids = [row[0] for row in await cursor.fetchall()]
                    if not ids:
                        break
                async for _ in listener.notifies(timeout=1.0, stop_after=1):
                    pass


async def pgqueuer_work(url: str) -> None:
    """PgQueuer's worker at its throughput settings (as `make bench-peers` runs it), steady:
    it waits for jobs instead of draining. Its log is not folded into statistics, so that the
    jobs it finished can be read (the same setting as `make bench-peers`)."""
    from benchmarks import peers

    manager = peers._peer("pgqueuer.qm").QueueManager(await peers._pgqueuer_queries(url))
    manager.entrypoint("noop")(peers._noop)
    await manager.run(batch_size=PGQUEUER_BATCH, log_aggregation_interval=timedelta(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenants")
    parser.add_argument("action", choices=("produce", "work", "install"))
    parser.add_argument("system", choices=("pgjobs", "pgqueuer", "narrow"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args(argv)
    if args.action == "produce":
        asyncio.run(produce(args.system, args.dsn, args.rate, args.batch))
    elif args.action == "work" and args.system == "pgqueuer":
        asyncio.run(pgqueuer_work(args.dsn))
    elif args.action == "work" and args.system == "narrow":
        asyncio.run(narrow_work(args.dsn))
    elif args.action == "install" and args.system == "pgqueuer":
        from benchmarks import peers

        asyncio.run(peers.pgqueuer_install(args.dsn))
    else:
        parser.error(f"{args.action} {args.system}: not this module's to run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
