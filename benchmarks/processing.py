"""Group b: processing of pre-filled no-op jobs by `pgjobs work --burst` subprocesses, beside raw
SQL consumers (claim a batch with SKIP LOCKED, then archive it in one statement): on pgjobs' own
tables, and on the narrowest tables that hold a job (``benchmarks/raw.py``'s narrow reference).

Throughput is read from the database, not timed around the process: the jobs archived after the
first batch over the span of ``finished_at``, so worker startup and shutdown do not count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from benchmarks import harness, raw
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row, limit_target, ratio_target


@dataclass(frozen=True, slots=True)
class Setup:
    """One way of processing ``jobs`` pre-filled jobs."""

    #: "pgjobs" (worker processes), "raw" (benchmarks/raw.py consumers on pgjobs' tables) or
    #: "narrow" (benchmarks/raw.py's narrow loop on its own tables).
    kind: str
    processes: int
    #: The worker's --concurrency, or the raw consumer's claim batch size.
    width: int
    jobs: int
    #: The task of the pre-filled jobs.
    task: str = "bench.noop"
    #: A raw consumer's loop: "process" (claim, then archive: two round trips a batch) or
    #: "trip" (archive the last batch and claim the next in one statement).
    mode: str = "process"

    def label(self) -> str:
        if self.kind == "narrow":
            procs = "1 process" if self.processes == 1 else f"{self.processes} processes"
            return (
                f"archive the last {self.width} and claim {self.width} in one prepared "
                f"statement, narrow tables; {procs}"
            )
        if self.kind == "raw":
            conns = "1 connection" if self.processes == 1 else f"{self.processes} connections"
            if self.mode == "trip":
                return f"archive the last {self.width} and claim {self.width} in one trip; {conns}"
            return f"claim {self.width} (SKIP LOCKED), archive them; {conns}"
        procs = "1 process" if self.processes == 1 else f"{self.processes} processes"
        each = " each" if self.processes > 1 else ""
        sync = ", sync handlers" if self.task.endswith("_sync") else ""
        return f"{procs}, --concurrency {self.width}{each}{sync}"


@dataclass(frozen=True, slots=True)
class Run:
    """What one processing run measured."""

    rate: float
    jobs: int
    #: CPU seconds of the benchmark database's backends during the run (None: the server is
    #: not on this machine).
    pg_cpu: float | None
    #: CPU seconds of the worker (or raw consumer) processes over the processing window (their
    #: startup and shutdown left out), and the jobs finished in that window; None when the
    #: window was too short to sample.
    client_cpu: float | None
    window_jobs: int
    #: Transactions in the benchmark database during the run (one per statement, mostly).
    transactions: int

    @property
    def pg_cpu_per_1k(self) -> float | None:
        return None if self.pg_cpu is None else self.pg_cpu / self.jobs * 1000

    @property
    def client_us_per_job(self) -> float | None:
        if self.client_cpu is None or self.window_jobs <= 0:
            return None
        return self.client_cpu / self.window_jobs * 1e6


def _commands(ctx: Context, setup: Setup, burst: bool) -> list[list[str]]:
    if setup.kind == "narrow":
        command = harness.raw_client("narrow", ctx.db.url, "--batch", str(setup.width))
    elif setup.kind == "raw":
        command = harness.raw_client(setup.mode, ctx.db.url, "--batch", str(setup.width))
    else:
        command = harness.pgjobs_worker(ctx.db.url, setup.width, burst=burst)
    return [command] * setup.processes


def run_once(ctx: Context, setup: Setup, *, reset: bool = True, burst: bool = True) -> Run:
    """Fill ``setup.jobs`` ready jobs, process them all, and read the processing window.

    ``reset`` empties every table first. Without ``burst`` (when scheduled jobs stay in the queue
    and a bursting worker would never exit) the workers get SIGTERM once the queue is drained.
    """
    db = ctx.db
    if reset:
        db.reset()
    if setup.kind == "narrow":
        raw.narrow_reset(db.conn)  # the narrow tables, created on first use
        marker = raw.narrow_fill(db.conn, setup.jobs)
    else:
        marker = db.fill_ready(setup.jobs, setup.task)
    pg_cpu = harness.BackendCpu(db) if db.local else None
    transactions = db.transactions()
    workers = [ctx.procs.start(command) for command in _commands(ctx, setup, burst)]
    client = harness.CpuTrace()
    deadline = time.monotonic() + 120 + setup.jobs / 300
    stopping = setup.kind != "pgjobs" or burst
    checked = time.monotonic()
    while any(worker.poll() is None for worker in workers):
        client.sample([worker.popen.pid for worker in workers])
        if pg_cpu is not None:
            pg_cpu.sample()
        if not stopping and time.monotonic() - checked >= 0.2:
            checked = time.monotonic()
            if db.queue_drained():
                stopping = True
                for worker in workers:
                    worker.terminate()
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{workers[0].describe()} still running after the deadline")
        time.sleep(0.02)
    for worker in workers:
        if worker.returncode != 0:
            raise BenchmarkError(f"{worker.describe()} exited with {worker.returncode}")
    db.wait_for_disconnects()
    window = db.archived_window(
        marker, "narrow.archived_jobs" if setup.kind == "narrow" else "archived_jobs"
    )
    if window.count != setup.jobs:
        raise BenchmarkError(
            f"{setup.label()}: {window.count} of {setup.jobs} jobs archived; "
            f"stderr: {workers[0].describe()}"
        )
    transactions = db.transactions() - transactions
    return Run(
        rate=window.rate,
        jobs=setup.jobs,
        pg_cpu=None if pg_cpu is None else pg_cpu.seconds(),
        client_cpu=client.between(window.started, window.ended),
        window_jobs=window.count - window.first,
        transactions=transactions,
    )


def measure(ctx: Context, setups: list[Setup]) -> dict[Setup, list[Run]]:
    """``ctx.repeats`` runs of each setup, interleaved so that drift on a shared machine spreads
    over all of them; runs made earlier in this benchmark (by another group) are reused."""
    cache: dict[Setup, list[Run]] = ctx.cache.setdefault("processing", {})
    for repeat in range(ctx.repeats):
        for setup in setups:
            runs = cache.setdefault(setup, [])
            if len(runs) > repeat:
                continue
            run = run_once(ctx, setup)
            runs.append(run)
            say(f"  {setup.kind} {setup.label()}: {run.rate:,.0f} jobs/s")
    return {setup: cache[setup] for setup in setups}


def rates(runs: list[Run]) -> Figure:
    return Figure("jobs/s", [run.rate for run in runs])


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _client_us(runs: list[Run]) -> str:
    known = [x for run in runs if (x := run.client_us_per_job) is not None]
    return f"{_median(known):.0f} µs" if known else "? µs"


def client_note(pgjobs: list[Run], raw: list[Run]) -> str:
    """Where the time goes: client CPU per job, and jobs per database transaction."""

    us = _client_us

    def per_xact(runs: list[Run]) -> float:
        return _median([run.jobs / max(run.transactions, 1) for run in runs])

    return (
        f"client CPU/job: pgjobs {us(pgjobs)}, raw {us(raw)}; "
        f"jobs/transaction: pgjobs {per_xact(pgjobs):.1f}, raw {per_xact(raw):.1f}"
    )


def details(runs: list[Run]) -> dict[str, Any]:
    """Per-run figures for the JSON output."""
    return {
        "jobs": runs[0].jobs,
        "client_cpu_us_per_job": [
            None if (us := run.client_us_per_job) is None else round(us, 1) for run in runs
        ],
        "jobs_per_transaction": [round(run.jobs / max(run.transactions, 1), 2) for run in runs],
        "pg_cpu_s_per_1k_jobs": [run.pg_cpu_per_1k for run in runs],
    }


def setups(ctx: Context) -> dict[str, Setup]:
    """The setups of group b, by name (other groups reuse some of them).

    Rows at --concurrency 1 and 8 have the raw consumer with the same bound on jobs in flight
    beside them (claim batches of 1, 8; a worker's batches are at most its slots). The
    --concurrency 32 rows and the two-process row are checked against the leanest loop there is
    (the targets of the performance issue): archive the last batch and claim the next in one
    statement, batches of 100, on one connection and on two.
    """
    # Sizes keep each run to a few seconds of processing at today's speeds; throughput is read
    # over the processing window, so it does not depend on them much.
    jobs = ctx.size(100_000, 10_000)
    return {
        "c1": Setup("pgjobs", 1, 1, ctx.size(2_000, 500)),
        "c8": Setup("pgjobs", 1, 8, ctx.size(30_000, 5_000)),
        "c32": Setup("pgjobs", 1, 32, ctx.size(50_000, 10_000)),
        "c32_sync": Setup("pgjobs", 1, 32, ctx.size(30_000, 5_000), task="bench.noop_sync"),
        "2x32": Setup("pgjobs", 2, 32, jobs),
        "raw_b1": Setup("raw", 1, 1, ctx.size(2_000, 500)),
        "raw_b8": Setup("raw", 1, 8, ctx.size(30_000, 5_000)),
        "raw_b32": Setup("raw", 1, 32, ctx.size(50_000, 10_000)),
        "raw_2": Setup("raw", 2, 100, jobs),
        "trip_1": Setup("raw", 1, 100, ctx.size(50_000, 10_000), mode="trip"),
        "trip_2": Setup("raw", 2, 100, jobs, mode="trip"),
        "narrow_1": Setup("narrow", 1, 100, ctx.size(50_000, 10_000)),
        "narrow_2": Setup("narrow", 2, 100, jobs),
    }


#: The issue's targets: one process, and two, against the one-trip loop on as many connections.
GOALS = {"c32": 0.70, "2x32": 0.70}
#: Performance round 3's targets: one process, and two, against the narrow loop in as many
#: processes.
NARROW_GOALS = {"c32": 0.85, "2x32": 0.75}
#: The narrow loop beside each row that has one (as many processes).
NARROW_PAIRS = {"c32": "narrow_1", "c32_sync": "narrow_1", "2x32": "narrow_2"}
#: Client CPU per no-op job (µs) at --concurrency 32, async and sync handlers.
CLIENT_GOALS = {"c32": 20.0, "c32_sync": 30.0}


def run(ctx: Context) -> list[Row]:
    named = setups(ctx)
    pairs = (
        ("c1", "raw_b1"),
        ("c8", "raw_b8"),
        ("c32", "trip_1"),
        ("c32_sync", "trip_1"),
        ("2x32", "trip_2"),
    )
    wanted = dict.fromkeys([*(name for pair in pairs for name in pair), *NARROW_PAIRS.values()])
    results = measure(ctx, [named[name] for name in wanted])
    runs = {name: results[named[name]] for name in wanted}
    rows = []
    for name, raw_name in pairs:
        figure = rates(runs[name])
        reference = rates(runs[raw_name])
        target = None
        if name in GOALS:
            target = ratio_target(
                f"≥ {GOALS[name]:.0%} of raw: {named[raw_name].label()}",
                figure.median / reference.median,
                GOALS[name],
            )
        row = Row(
            "processing",
            named[name].label(),
            figure,
            reference,
            named[raw_name].label(),
            target,
            client_note(runs[name], runs[raw_name]),
            {"pgjobs": details(runs[name]), "raw": details(runs[raw_name])},
        )
        if name in NARROW_PAIRS:
            _add_narrow(row, named[NARROW_PAIRS[name]], runs[NARROW_PAIRS[name]], name)
        rows.append(row)
    for name, goal in CLIENT_GOALS.items():
        client = client_figure(runs[name])
        rows.append(
            Row(
                "processing",
                f"client CPU per no-op job: {named[name].label()}",
                client,
                client_figure(runs["trip_1"]),
                named["trip_1"].label(),
                limit_target(f"≤ {goal:.0f} µs", client, goal),
                narrow=client_figure(runs["narrow_1"]),
                narrow_name=named["narrow_1"].label(),
            )
        )
    # PostgreSQL's CPU per job, from these same runs, beside both references (group f).
    from benchmarks import pgcpu

    rows += pgcpu.rows(ctx, named, runs)
    return rows


def _add_narrow(row: Row, setup: Setup, runs: list[Run], name: str) -> None:
    """Put the narrow loop's figure (``setup``, ``runs``) beside ``row``, with its target."""
    row.narrow = rates(runs)
    row.narrow_name = setup.label()
    row.details["narrow"] = details(runs)
    if name in NARROW_GOALS and row.pgjobs is not None:
        goal = NARROW_GOALS[name]
        row.narrow_target = ratio_target(
            f"≥ {goal:.0%} of narrow raw", row.pgjobs.median / row.narrow.median, goal
        )
    row.note += f"; narrow raw client CPU/job {_client_us(runs)}"


def client_figure(runs: list[Run]) -> Figure | None:
    """Client CPU per job (µs) of ``runs``, None when no run could be sampled."""
    values = [us for run in runs if (us := run.client_us_per_job) is not None]
    return Figure("µs/job", values) if values else None
