"""Group m: jobs of many groups under a limit per group, and how soon a new group's first job
starts beside a group that holds a huge backlog.

Throughput: 1,000 groups of 20 no-op jobs of ``bench.grouped`` (``group_concurrency=1``: one job
of a group running at a time, across every worker), enqueued group after group, processed by four
`pgjobs work` processes; beside it, in the same run, the same 20,000 jobs of the same task
enqueued without a group. The runs alternate, so that drift on a shared machine falls on both.
Throughput is read from ``finished_at`` as in group b. And the same grouped jobs claimed by the
raw grouped reference (``benchmarks/raw.py``'s ``grouped``: the leanest SQL that keeps at most
one job of a group running and takes the group whose last claim is oldest first), four clients
claiming 32 at a time, in the same run: the floor of grouped claiming on pgjobs' tables.

Fairness: one group holds 50,000 ready no-op jobs of ``bench.noop`` (no limit per group: alone,
it could fill every slot). Once the four workers are taking them, N other groups get one job
each, in one ``enqueue_many``. The figure is the wait of those jobs, ``started_at - run_at`` in
``archived_jobs`` (both from the database's clock), p50 and p99. Beside it, the same without
groups: the N jobs then wait behind what is left of the backlog.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

from benchmarks import QUEUE, harness, raw
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, ratio_target
from benchmarks.tasks import GROUP_CONCURRENCY, grouped_app
from pgjobs import JobSpec

#: `pgjobs work` processes, and the --concurrency of each.
PROCESSES = 4
CONCURRENCY = 32
#: The share of the throughput without groups that grouped jobs keep (the issue's target).
GOAL = 0.80
#: The share of the raw grouped reference's throughput that grouped jobs keep (the issue's).
RAW_GOAL = 0.85
APP = "benchmarks.tasks:grouped_app"
#: The group that holds the fairness run's backlog.
BIG_GROUP = "big"
#: Jobs per enqueue_many call of a fill.
CHUNK = 5_000


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big group m's runs are (``Sizes.of(ctx)``: smaller with --quick)."""

    groups: int
    per_group: int
    backlog: int
    newcomers: int

    @classmethod
    def of(cls, ctx: Context) -> Sizes:
        return cls(
            groups=ctx.size(1_000, 500),
            per_group=ctx.size(20, 10),
            backlog=ctx.size(50_000, 20_000),
            newcomers=ctx.size(200, 50),
        )


def workload(groups: int, per_group: int, *, grouped: bool) -> Iterator[JobSpec]:
    """The throughput run's jobs of ``bench.grouped``: ``per_group`` jobs of each of ``groups``
    groups, group after group (a tenant's burst at a time); without ``grouped``, the same jobs
    with no group."""
    for n in range(groups):
        group = f"customer-{n}" if grouped else None
        for _ in range(per_group):
            yield JobSpec("bench.grouped", {}, queue=QUEUE, group=group)


def backlog(jobs: int, *, grouped: bool) -> Iterator[JobSpec]:
    """The fairness run's backlog: ``jobs`` no-op jobs of one group (of none, without
    ``grouped``)."""
    group = BIG_GROUP if grouped else None
    for _ in range(jobs):
        yield JobSpec("bench.noop", {}, queue=QUEUE, group=group)


def newcomers(groups: int, *, grouped: bool) -> Iterator[JobSpec]:
    """The fairness run's newcomers: one no-op job of each of ``groups`` new groups (no group,
    without ``grouped``)."""
    for n in range(groups):
        yield JobSpec("bench.noop", {}, queue=QUEUE, group=f"newcomer-{n}" if grouped else None)


def _fill(ctx: Context, specs: Iterator[JobSpec]) -> int:
    """Enqueue ``specs`` through the app (which writes each group's row), in chunks; returns a
    marker: every job enqueued from now on has a larger id."""
    db = ctx.db
    marker = int(db.scalar("SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id'))"))
    chunk: list[JobSpec] = []
    for spec in specs:
        chunk.append(spec)
        if len(chunk) == CHUNK:
            _enqueue(chunk)
            chunk = []
    if chunk:
        _enqueue(chunk)
    db.vacuum("queued_jobs")
    return marker


def _enqueue(specs: list[JobSpec]) -> list[int]:
    """Enqueue ``specs`` in one statement, as an application does."""
    return grouped_app.enqueue_many(specs)


def _reset(ctx: Context) -> None:
    """Empty the job tables and the groups' rows: a queue with group rows is claimed under
    limits, so rows left by a grouped run would change how the run without groups is claimed."""
    ctx.db.reset()
    ctx.db.conn.execute("TRUNCATE pgjobs_group_states")


def _start_workers(ctx: Context, *, burst: bool) -> list[Proc]:
    """Start the worker processes on a paused queue and resume it once every one of them has
    registered: they start on the jobs together (on two cores, four interpreters start a second
    or more apart, and the first would otherwise have drained the queue alone)."""
    command = harness.pgjobs_worker(ctx.db.url, CONCURRENCY, burst=burst, app=APP)
    grouped_app.pause_queue(QUEUE, reason="benchmark: workers starting")
    try:
        workers = [ctx.procs.start(command) for _ in range(PROCESSES)]
        harness.wait_until(lambda: _registered(ctx, workers), 60, "the workers to register")
    finally:
        grouped_app.resume_queue(QUEUE)
    return workers


def _registered(ctx: Context, workers: list[Proc]) -> bool:
    """Every worker has registered (so it handles SIGTERM: it installs its handlers first)."""
    pids = [worker.pid for worker in workers]
    found = ctx.db.scalar("SELECT count(*) FROM pgjobs_workers WHERE pid = ANY(%s)", (pids,))
    if any(worker.poll() is not None for worker in workers):
        raise BenchmarkError(f"a worker exited early: {workers[0].describe()}")
    return bool(found == len(workers))


def _stop_workers(workers: list[Proc]) -> None:
    """SIGTERM (a graceful stop), then wait for each; a worker that failed fails the run."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(60)


def _check_groups(ctx: Context, marker: int, expected: int) -> None:
    """The jobs were stored with their groups (a release whose enqueue drops the group would
    measure plain jobs twice)."""
    found = int(
        ctx.db.scalar(
            "SELECT count(DISTINCT group_key) FROM archived_jobs WHERE id > %s", (marker,)
        )
    )
    if found != expected:
        raise BenchmarkError(f"the jobs were archived with {found} groups, not {expected}")


def throughput_once(ctx: Context, sizes: Sizes, *, grouped: bool) -> float:
    """Jobs/s of the four workers over the processing window, with or without groups."""
    db = ctx.db
    _reset(ctx)
    jobs = sizes.groups * sizes.per_group
    marker = _fill(ctx, workload(sizes.groups, sizes.per_group, grouped=grouped))
    # Burst workers, as in group b: each exits once the queue is empty.
    workers = _start_workers(ctx, burst=True)
    deadline = time.monotonic() + 120 + jobs / 300
    for worker in workers:
        worker.wait(max(deadline - time.monotonic(), 1.0))
    window = db.archived_window(marker)
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} jobs archived: {workers[0].describe()}")
    if grouped:
        _check_groups(ctx, marker, sizes.groups)
    return window.rate


def raw_once(ctx: Context, sizes: Sizes) -> float:
    """Jobs/s of PROCESSES raw grouped clients (``raw.grouped``, CONCURRENCY jobs a claim) over
    the processing window, on the same grouped jobs as ``throughput_once``."""
    db = ctx.db
    _reset(ctx)
    raw.grouped_reset(db.conn)
    jobs = sizes.groups * sizes.per_group
    marker = _fill(ctx, workload(sizes.groups, sizes.per_group, grouped=True))
    raw.grouped_fill(db.conn)
    command = harness.raw_client("grouped", db.url, "--batch", str(CONCURRENCY))
    clients = [ctx.procs.start(command) for _ in range(PROCESSES)]
    deadline = time.monotonic() + 120 + jobs / 300
    for client in clients:
        client.wait(max(deadline - time.monotonic(), 1.0))
    window = db.archived_window(marker)
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} jobs archived: {clients[0].describe()}")
    _check_groups(ctx, marker, sizes.groups)
    return window.rate


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass(frozen=True, slots=True)
class Waits:
    """One fairness run: the newcomers' waits (ms), and the backlog's jobs still ready when the
    last newcomer was enqueued (the backlog must outlast the enqueues for the run to mean
    anything)."""

    waits: list[float]
    backlog_left: int


def fairness_once(ctx: Context, sizes: Sizes, *, grouped: bool) -> Waits:
    """The waits of N newcomers' jobs enqueued while the workers work through the backlog."""
    db = ctx.db
    _reset(ctx)
    marker = _fill(ctx, backlog(sizes.backlog, grouped=grouped))
    workers = _start_workers(ctx, burst=False)
    try:
        harness.wait_until(
            lambda: bool(db.scalar("SELECT EXISTS (SELECT 1 FROM archived_jobs)")),
            60,
            "the workers to start on the backlog",
        )
        # In one statement: without groups, the workers drain a backlog of no-op jobs in a
        # second or two, and the newcomers must find most of it still there.
        ids = _enqueue(list(newcomers(sizes.newcomers, grouped=grouped)))
        left = int(
            db.scalar(
                "SELECT count(*) FROM queued_jobs WHERE id > %s AND id < %s "
                "AND lease_expires_at IS NULL",
                (marker, ids[0]),
            )
        )
        harness.wait_until(
            lambda: (
                db.scalar("SELECT count(*) FROM archived_jobs WHERE id = ANY(%s)", (ids,))
                == len(ids)
            ),
            120,
            "every newcomer's job to finish",
            every=0.1,
        )
    finally:
        _stop_workers(workers)  # what is left of the backlog is not timed
    rows = db.conn.execute(
        "SELECT extract(epoch FROM started_at - run_at)::float8 * 1000, group_key "
        "FROM archived_jobs WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    if grouped and any(group is None for _, group in rows):
        raise BenchmarkError("the newcomers' jobs were archived without their groups")
    return Waits([float(wait) for wait, _ in rows], left)


def run(ctx: Context) -> list[Row]:
    sizes = Sizes.of(ctx)
    grouped_app.bind(ctx.db.dsn)
    try:
        return [*_throughput_rows(ctx, sizes), *_fairness_rows(ctx, sizes)]
    finally:
        grouped_app.close()


def _throughput_rows(ctx: Context, sizes: Sizes) -> list[Row]:
    plain: list[float] = []
    grouped: list[float] = []
    floor: list[float] = []
    for _ in range(ctx.repeats):
        grouped.append(throughput_once(ctx, sizes, grouped=True))
        say(f"  {sizes.groups:,} groups x {sizes.per_group}: {grouped[-1]:,.0f} jobs/s")
        plain.append(throughput_once(ctx, sizes, grouped=False))
        say(f"  the same jobs without groups: {plain[-1]:,.0f} jobs/s")
        floor.append(raw_once(ctx, sizes))
        say(f"  the same grouped jobs, raw grouped SQL: {floor[-1]:,.0f} jobs/s")
    figure = Figure("jobs/s", grouped)
    reference = Figure("jobs/s", plain)
    raw_figure = Figure("jobs/s", floor)
    jobs = sizes.groups * sizes.per_group
    return [_plain_row(sizes, figure, reference, jobs), _raw_row(sizes, figure, raw_figure, jobs)]


def _raw_row(sizes: Sizes, figure: Figure, reference: Figure, jobs: int) -> Row:
    return Row(
        "groups",
        f"{sizes.groups:,} groups x {sizes.per_group} no-op jobs, "
        f"group_concurrency={GROUP_CONCURRENCY}; {PROCESSES} processes, against raw grouped SQL",
        figure,
        reference,
        f"raw grouped SQL on the same {jobs:,} jobs: {PROCESSES} clients, {CONCURRENCY} a claim, "
        "one row per group (running, last claimed), one index range of free groups in turn order",
        ratio_target(
            f"≥ {RAW_GOAL:.0%} of raw grouped SQL", figure.median / reference.median, RAW_GOAL
        ),
        "the same guarantee at its leanest: at most one job of a group running, the group "
        "whose last claim is oldest first, archive and claim in one statement",
        {"jobs": jobs, "groups": sizes.groups},
    )


def _plain_row(sizes: Sizes, figure: Figure, reference: Figure, jobs: int) -> Row:
    return Row(
        "groups",
        f"{sizes.groups:,} groups x {sizes.per_group} no-op jobs, "
        f"group_concurrency={GROUP_CONCURRENCY}; {PROCESSES} processes --concurrency "
        f"{CONCURRENCY} each",
        figure,
        reference,
        f"the same {jobs:,} jobs of the same task without a group",
        ratio_target(
            f"≥ {GOAL:.0%} of the same jobs without groups",
            figure.median / reference.median,
            GOAL,
        ),
        "enqueued group after group; a claim takes one job of a group at a time, taking turns "
        "between groups",
        {"jobs": jobs, "groups": sizes.groups},
        reference="beside",
    )


def _fairness_rows(ctx: Context, sizes: Sizes) -> list[Row]:
    runs: dict[bool, list[Waits]] = {True: [], False: []}
    for _ in range(ctx.runs(3)):
        for grouped in (True, False):
            result = fairness_once(ctx, sizes, grouped=grouped)
            runs[grouped].append(result)
            say(
                f"  newcomers {'in their own groups' if grouped else 'without groups'}: "
                f"p50 {statistics.median(result.waits):.1f} ms, "
                f"p99 {_percentile(result.waits, 99):.1f} ms "
                f"({result.backlog_left:,} of the backlog still ready)"
            )
    rows = []
    for q in (50, 99):
        figure = Figure("ms", [_percentile(r.waits, q) for r in runs[True]])
        reference = Figure("ms", [_percentile(r.waits, q) for r in runs[False]])
        left = min(r.backlog_left for r in runs[True] + runs[False])
        rows.append(
            Row(
                "groups",
                f"fairness: wait of a new group's first job, p{q}, while one group holds "
                f"{sizes.backlog:,} ready jobs; {PROCESSES} processes",
                figure,
                reference,
                "the same jobs without groups, behind the same backlog",
                None,
                f"{sizes.newcomers} new groups, one job each, enqueued in one statement once the "
                f"workers were taking the backlog; at least {left:,} of it still ready then"
                if q == 50
                else "",
                {"newcomers": sizes.newcomers, "backlog": sizes.backlog, "backlog_left": left},
                reference="beside",
            )
        )
    return rows
