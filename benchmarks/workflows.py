"""Group o: workflows. A batch of 1,000 no-op jobs with a callback, processed by four
`pgjobs work` processes: the members' throughput, from the batch's commit (the members'
``created_at``) to the last member's ``finished_at``, beside the same 1,000 jobs enqueued without a
batch (so the reference shows what counting each member's end in the batch row costs); and the
callback's latency after the last member, its ``started_at`` minus the batch's ``completed_at``
(both from the database's clock). And a chain of 10 jobs, each enqueued ``after`` the one
before: the time from the first job's enqueue to the last one's end, beside one job's (what each
link's release costs: the trigger's release in the archiving transaction, its NOTIFY, the claim).
"""

from __future__ import annotations

import statistics

from benchmarks import QUEUE, harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row
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
    ]
