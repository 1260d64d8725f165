"""Group p: idle workers, the database's other tenants too (group n measures a queue at work
beside pgbench). `pgjobs work` processes with nothing to do; the CPU of their backends, read
from /proc, over 30 s (10 s quick), in ms per second (10 ms/s is 1% of one core). As many of
the 20 as the server's free connections allow (each holds a few), leaving room for others;
the row says how many ran and scales their figure to 20. The rows are the tenants' (group n's
table), run apart so that they can be measured without pgbench: ``--only idle``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from benchmarks import harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, limit_target
from benchmarks.tenants import ServerCpu

#: Idle workers, and the most server CPU they may use together (ms per s: 1% of one core).
IDLE_WORKERS = 20
IDLE_LIMIT = 10.0
#: Connections left free for the server's other users when idle workers are started (each
#: idle worker holds 3-4), and the most idle workers a --quick run starts.
SPARE_CONNECTIONS = 30
QUICK_IDLE_WORKERS = 5


def run(ctx: Context) -> list[Row]:
    return [idle_row(ctx, ctx.size(30, 10))]


def _free_connections(ctx: Context) -> int:
    row = ctx.db.conn.execute(
        "SELECT current_setting('max_connections')::int "
        "- current_setting('superuser_reserved_connections')::int "
        "- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    ).fetchone()
    return int(row[0]) if row else 0


def _registered(ctx: Context, workers: list[Proc]) -> bool:
    for worker in workers:
        if worker.poll() is not None:
            raise BenchmarkError(f"an idle worker exited: {worker.describe()}")
    pids = [worker.pid for worker in workers]
    found = ctx.db.scalar("SELECT count(*) FROM pgjobs_workers WHERE pid = ANY(%s)", (pids,))
    return bool(found == len(workers))


@dataclass(frozen=True, slots=True)
class Idle:
    """One run of idle workers: how many, their connections, their backends' CPU (ms per s of
    all of them) and the transactions they ran per second."""

    workers: int
    connections: int
    ms_per_s: float
    xacts_per_s: float


def idle_once(ctx: Context, seconds: int) -> Idle:
    """Start as many idle workers as fit (up to IDLE_WORKERS; QUICK_IDLE_WORKERS with --quick),
    let them settle, and read their backends' CPU over ``seconds``."""
    db = ctx.db
    db.reset()
    command = harness.pgjobs_worker(db.url, 8, burst=False)
    workers = [ctx.procs.start(command)]
    try:
        harness.wait_until(lambda: _registered(ctx, workers), 60, "an idle worker to register")
        time.sleep(1.0)
        each = max(len(db.other_backends()), 1)
        fit = (_free_connections(ctx) - SPARE_CONNECTIONS) // each
        more = max(min(ctx.size(IDLE_WORKERS, QUICK_IDLE_WORKERS) - 1, fit), 0)
        workers += [ctx.procs.start(command) for _ in range(more)]
        harness.wait_until(lambda: _registered(ctx, workers), 120, "the idle workers to register")
        time.sleep(3.0)  # their first rounds of maintenance and heartbeats
        cpu = ServerCpu(db.conn, db.name)
        xacts = db.transactions()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cpu.sample()
            time.sleep(0.5)
        cpu.sample()
        # Our own statements count too (two: this one and the one before the window).
        xacts = db.transactions() - xacts - 2
        return Idle(len(workers), len(cpu.start), cpu.seconds() / seconds * 1000, xacts / seconds)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.stop()
        db.wait_for_disconnects(30)


def idle_row(ctx: Context, seconds: int) -> Row:
    if not ctx.db.local:
        note = "server not on this machine: /proc unavailable"
        return Row("tenants", f"{IDLE_WORKERS} idle workers: server CPU", None, note=note)
    idle = [idle_once(ctx, seconds) for _ in range(ctx.runs(2))]
    for one in idle:
        say(
            f"  {one.workers} idle workers ({one.connections} connections): server CPU "
            f"{one.ms_per_s:.2f} ms/s, {one.xacts_per_s:.1f} transactions/s"
        )
    workers = min(one.workers for one in idle)
    connections = min(one.connections for one in idle)
    figure = Figure("CPU ms/s", [one.ms_per_s * IDLE_WORKERS / one.workers for one in idle])
    measured = Figure("CPU ms/s", [one.ms_per_s for one in idle])
    xacts = statistics.median(one.xacts_per_s / one.workers for one in idle)
    if workers == IDLE_WORKERS:
        name, how = f"{IDLE_WORKERS} idle workers: server CPU", ""
    else:
        name = f"{IDLE_WORKERS} idle workers: server CPU, scaled from {workers} processes"
        why = (
            "a --quick run starts few"
            if ctx.quick and workers == QUICK_IDLE_WORKERS
            else f"no more fitted in the server's free connections, {SPARE_CONNECTIONS} "
            "left to others"
        )
        how = f"{workers} ran ({why}): {measured.median:.2f} ms/s, x {IDLE_WORKERS}/{workers}; "
    return Row(
        "tenants",
        name,
        figure,
        note=f"{how}`pgjobs work` defaults (maintenance on), empty queue, {connections} "
        f"connections, {seconds} s; {xacts:.1f} transactions/s per worker; "
        "10 ms/s is 1% of one core",
        target=limit_target(f"≤ {IDLE_LIMIT:.0f} ms/s (1% of one core)", figure, IDLE_LIMIT),
        details={
            "workers": workers,
            "connections": connections,
            "measured_ms_per_s": measured.runs,
            "transactions_per_s_per_worker": xacts,
        },
    )
