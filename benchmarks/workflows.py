"""Group o: workflows. A batch of 1,000 no-op jobs with a callback, processed by four
`pgjobs work` processes: the members' throughput, from the batch's commit (the members'
``created_at``) to the last member's ``finished_at``, beside the same 1,000 jobs enqueued without a
batch (so the reference shows what counting each member's end in the batch row costs); and the
callback's latency after the last member, its ``started_at`` minus the batch's ``completed_at``
(both from the database's clock). And a chain of 10 jobs, each enqueued ``after`` the one
before: the time from the first job's enqueue to the last one's end, beside one job's (what each
link's release costs: the trigger's release in the archiving transaction, its NOTIFY, the claim).
And a fan-out/fan-in, 1 -> 100 -> 1, 50 of them at once: as one ``after=`` graph in one
``enqueue_many`` (each middle job released by its root's end, each join by its 100th
dependency's), beside the same work as a batch with a callback (each root enqueues its 100 jobs
as a batch whose callback is the join): jobs/s from the first root's enqueue to the last job's
end.
"""

from __future__ import annotations

import statistics

from benchmarks import QUEUE, harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, Target, ratio_target
from benchmarks.tasks import app
from pgjobs import JobSpec, Ref

#: `pgjobs work` processes, and the --concurrency of each.
PROCESSES = 4
CONCURRENCY = 32
#: The callback: the no-op task, which takes any payload (the "batch" key too).
CALLBACK = JobSpec("bench.noop", {"report": 1})


def _start_workers(ctx: Context) -> list[Proc]:
    command = harness.pgjobs_worker(ctx.db.url, CONCURRENCY, burst=False)
    workers = [ctx.procs.start(command) for _ in range(PROCESSES)]
    pids = [worker.pid for worker in workers]

    def registered() -> bool:
        if any(worker.poll() is not None for worker in workers):
            raise BenchmarkError(f"a worker exited early: {workers[0].describe()}")
        found = ctx.db.scalar("SELECT count(*) FROM pgjobs_workers WHERE pid = ANY(%s)", (pids,))
        return bool(found == len(workers))

    harness.wait_until(registered, 60, "the workers to register")
    return workers


def _members_per_second(ctx: Context, ids: list[int]) -> float:
    """Jobs/s from the jobs' commit (their created_at) to the last one's finished_at."""
    harness.wait_until(
        lambda: (
            ctx.db.scalar("SELECT count(*) FROM archived_jobs WHERE id = ANY(%s)", (ids,))
            == len(ids)
        ),
        120,
        "every member to finish",
        every=0.02,
    )
    seconds = ctx.db.scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 "
        "FROM archived_jobs WHERE id = ANY(%s)",
        (ids,),
    )
    return len(ids) / float(seconds)


def batch_once(ctx: Context, members: int) -> tuple[float, float]:
    """(members/s, ms from the last member's end to the callback's start) of one batch."""
    with app.batch(on_complete=CALLBACK) as batch:
        for _ in range(members):
            batch.enqueue("bench.noop", {})
    rate = _members_per_second(ctx, batch.ids)
    harness.wait_until(
        lambda: bool(
            ctx.db.scalar(
                "SELECT EXISTS (SELECT 1 FROM archived_jobs a JOIN pgjobs_batches b "
                "ON a.id = b.callback_job_id WHERE b.id = %s)",
                (batch.id,),
            )
        ),
        60,
        "the callback to run",
        every=0.01,
    )
    latency = ctx.db.scalar(
        "SELECT extract(epoch FROM a.started_at - b.completed_at)::float8 * 1000 "
        "FROM pgjobs_batches b JOIN archived_jobs a ON a.id = b.callback_job_id WHERE b.id = %s",
        (batch.id,),
    )
    return rate, float(latency)


def plain_once(ctx: Context, members: int) -> float:
    """Jobs/s of the same jobs enqueued without a batch."""
    ids = app.enqueue_many(JobSpec("bench.noop", {}, queue=QUEUE) for _ in range(members))
    return _members_per_second(ctx, ids)


#: Links of the chain row.
CHAIN = 10


def chain_once(ctx: Context, links: int) -> float:
    """Milliseconds from the first job's enqueue (its created_at) to the last one's end, for
    ``links`` jobs each enqueued after the one before, all in one call (a graph of Refs)."""
    specs = [JobSpec("bench.noop", {}, queue=QUEUE)]
    specs += [JobSpec("bench.noop", {}, queue=QUEUE, after=[Ref(n)]) for n in range(links - 1)]
    ids = app.enqueue_many(specs)
    harness.wait_until(
        lambda: bool(
            ctx.db.scalar("SELECT EXISTS (SELECT 1 FROM archived_jobs WHERE id = %s)", (ids[-1],))
        ),
        60,
        "the chain's last job to finish",
        every=0.005,
    )
    elapsed = ctx.db.scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 * 1000 "
        "FROM archived_jobs WHERE id = ANY(%s)",
        (ids,),
    )
    return float(elapsed)


#: The fan-out/fan-in row: graphs at once, and the jobs between each root and its join.
FAN_GRAPHS = 50
FAN_WIDTH = 100
#: The graph form's share of the batch form's rate, and the widest min-max spread of its runs
#: (the issue's targets).
FAN_GOAL = 0.90
FAN_SPREAD = 0.20


def fan_specs(graphs: int, width: int) -> list[JobSpec]:
    """``graphs`` graphs of 1 -> ``width`` -> 1 no-op jobs for one ``enqueue_many``: a root,
    ``width`` jobs after it, a join after all of those."""
    specs: list[JobSpec] = []
    for _ in range(graphs):
        root = len(specs)
        specs.append(JobSpec("bench.noop", {}, queue=QUEUE))
        specs += [JobSpec("bench.noop", {}, queue=QUEUE, after=[Ref(root)])] * width
        specs.append(
            JobSpec("bench.noop", {}, queue=QUEUE, after=[Ref(root + 1 + n) for n in range(width)])
        )
    return specs


def _fan_rate(ctx: Context, first: int, jobs: int) -> float:
    """Jobs/s of the ``jobs`` jobs with ids from ``first`` on, from the first one's commit to
    the last one's end, once they have all ended."""
    harness.wait_until(
        lambda: (
            ctx.db.scalar("SELECT count(*) FROM archived_jobs WHERE id >= %s", (first,)) == jobs
        ),
        300,
        "every graph to end",
        every=0.02,
    )
    seconds = ctx.db.scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 "
        "FROM archived_jobs WHERE id >= %s",
        (first,),
    )
    return jobs / float(seconds)


def fan_graph_once(ctx: Context, graphs: int, width: int) -> float:
    """Jobs/s of ``graphs`` 1 -> ``width`` -> 1 graphs written as one ``after=`` graph."""
    ids = app.enqueue_many(fan_specs(graphs, width))
    return _fan_rate(ctx, min(ids), len(ids))


def fan_batch_once(ctx: Context, graphs: int, width: int) -> float:
    """Jobs/s of the same work as batches: ``graphs`` roots, each enqueueing ``width`` jobs as a
    batch whose callback is the join (``bench.fan_out``)."""
    roots = app.enqueue_many(
        JobSpec("bench.fan_out", {"width": width}, queue=QUEUE) for _ in range(graphs)
    )
    return _fan_rate(ctx, min(roots), graphs * (width + 2))


def _fan_row(graph: list[float], batch: list[float], details: dict[str, int]) -> Row:
    figure, reference = Figure("jobs/s", graph), Figure("jobs/s", batch)
    spread = (figure.high - figure.low) / figure.median
    return Row(
        "workflows",
        f"fan-out/fan-in 1 -> {FAN_WIDTH} -> 1 x {FAN_GRAPHS} as one after= graph: jobs/s; "
        f"{PROCESSES} processes --concurrency {CONCURRENCY} each",
        figure,
        reference,
        f"the same as batches: each root enqueues its {FAN_WIDTH} jobs as a batch whose "
        "callback is the join",
        ratio_target(
            f"≥ {FAN_GOAL:.0%} of the batch form", figure.median / reference.median, FAN_GOAL
        ),
        "from the first root's enqueue to the last job's end; each released job NOTIFYs its "
        "queue, and a trip locks the joins' rows in one order",
        details | {"graphs": FAN_GRAPHS, "width": FAN_WIDTH},
        reference="beside",
        more_targets=[
            Target(f"min-max within {FAN_SPREAD:.0%}", f"{spread:.0%}", spread <= FAN_SPREAD)
        ],
    )


def run(ctx: Context) -> list[Row]:
    members = ctx.size(1_000, 1_000)
    app.bind(ctx.db.dsn)
    ctx.db.reset()
    workers = _start_workers(ctx)
    rates: list[float] = []
    plain: list[float] = []
    latencies: list[float] = []
    chains: list[float] = []
    singles: list[float] = []
    fan_graphs: list[float] = []
    fan_batches: list[float] = []
    try:
        for _ in range(ctx.runs(5)):
            rate, latency = batch_once(ctx, members)
            rates.append(rate)
            latencies.append(latency)
            plain.append(plain_once(ctx, members))
            say(
                f"  batch of {members:,}: {rate:,.0f} members/s, callback {latency:.1f} ms after "
                f"the last member; without a batch: {plain[-1]:,.0f} jobs/s"
            )
        for _ in range(ctx.runs(5)):
            chains.append(chain_once(ctx, CHAIN))
            singles.append(chain_once(ctx, 1))
            say(f"  chain of {CHAIN}: {chains[-1]:.1f} ms; one job: {singles[-1]:.1f} ms")
        for _ in range(ctx.runs(5)):
            fan_graphs.append(fan_graph_once(ctx, FAN_GRAPHS, FAN_WIDTH))
            fan_batches.append(fan_batch_once(ctx, FAN_GRAPHS, FAN_WIDTH))
            say(
                f"  1 -> {FAN_WIDTH} -> 1 x {FAN_GRAPHS}: {fan_graphs[-1]:,.0f} jobs/s as a graph, "
                f"{fan_batches[-1]:,.0f} jobs/s as batches"
            )
    finally:
        for worker in workers:
            worker.stop()
        app.close()
    details = {"members": members, "processes": PROCESSES, "concurrency": CONCURRENCY}
    return [
        Row(
            "workflows",
            f"{members:,}-job batch with a callback: members/s; {PROCESSES} processes "
            f"--concurrency {CONCURRENCY} each",
            Figure("jobs/s", rates),
            Figure("jobs/s", plain),
            f"the same {members:,} jobs without a batch",
            None,
            "from the batch's commit to the last member's end; each member's end is counted "
            "in the batch's row, under its lock",
            details,
            reference="beside",
        ),
        Row(
            "workflows",
            f"{members:,}-job batch: callback latency after the last member (its start minus "
            "the batch's completed_at)",
            Figure("ms", latencies),
            None,
            "",
            None,
            f"median {statistics.median(latencies):.1f} ms: the callback is enqueued in the "
            "last member's transaction and NOTIFYs idle workers",
            details,
        ),
        Row(
            "workflows",
            f"{CHAIN}-level chain (each job after the one before): ms from the first job's "
            "enqueue to the last one's end",
            Figure("ms", chains),
            Figure("ms", singles),
            "one job alone, enqueued to ended",
            None,
            "each link is released by the trigger in the transaction that archives the one "
            "before, and its NOTIFY wakes an idle worker",
            details | {"links": CHAIN},
            reference="beside",
        ),
        _fan_row(fan_graphs, fan_batches, details),
    ]
