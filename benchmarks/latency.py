"""Group c: pickup latency of an idle worker, and what an idle worker costs the database.

Jobs are enqueued one at a time at a low rate; each handler appends ``n time.time()`` to a file,
and the latency of job n is that time minus the moment its enqueue call returned (committed).
The raw reference is a lean LISTEN consumer (``benchmarks/raw.py listen``) fed by the same
``app.enqueue`` calls. Before each batch of jobs, the consumer sits idle for a while and the CPU
of its database backends is read from /proc.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row, Target, limit_target
from benchmarks.tasks import LATENCY_FILE_ENV, app

#: Jobs per second while measuring latency: low enough that every job finds the consumer idle.
RATE = 20.0
#: Most CPU an idle consumer's database backends may use, in ms per second (1% of a core).
IDLE_LIMIT = 10.0


@dataclass
class Consumer:
    """Latencies (ms) per run and idle database CPU (ms/s) per run, of one consumer."""

    latencies: list[list[float]] = field(default_factory=list)
    idle_pg: list[float] = field(default_factory=list)
    idle_client: list[float] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _measure(ctx: Context, kind: str, jobs: int, idle: float, counter: list[int]) -> Consumer:
    db = ctx.db
    result = Consumer()
    with tempfile.TemporaryDirectory(prefix="pgjobs-bench-") as folder:
        path = Path(folder) / "started.txt"
        path.touch()
        if kind == "pgjobs":
            command = harness.pgjobs_worker(db.url, 8, burst=False)
        else:
            command = harness.raw_client("listen", db.url, "--file", str(path))
        consumer = ctx.procs.start(command, harness.subprocess_env({LATENCY_FILE_ENV: str(path)}))
        try:
            harness.wait_until(lambda: db.listeners() > 0, 30, f"the {kind} consumer to LISTEN")
            time.sleep(1.0)  # let it finish starting up and go idle
            for _ in range(ctx.runs(3)):
                backends = db.other_backends()
                pg_before = {pid: harness.process_cpu(pid) for pid in backends}
                client_before = harness.process_cpu(consumer.pid) or 0.0
                time.sleep(idle)
                result.idle_pg.append(harness.cpu_used(pg_before, backends) / idle * 1000)
                client = (harness.process_cpu(consumer.pid) or 0.0) - client_before
                result.idle_client.append(client / idle * 1000)
                result.latencies.append(_latencies(ctx, path, jobs, counter))
                say(
                    f"  {kind}: p50 {statistics.median(result.latencies[-1]):.1f} ms, "
                    f"idle database CPU {result.idle_pg[-1]:.2f} ms/s"
                )
        finally:
            consumer.stop()
    return result


def _latencies(ctx: Context, path: Path, jobs: int, counter: list[int]) -> list[float]:
    committed: dict[int, float] = {}
    next_at = time.monotonic()
    for _ in range(jobs):
        n = counter[0]
        counter[0] += 1
        app.enqueue("bench.latency", {"n": n})
        committed[n] = time.time()
        next_at += 1 / RATE
        time.sleep(max(0.0, next_at - time.monotonic()))
    started: dict[int, float] = {}

    def all_started() -> bool:
        for line in path.read_text().splitlines():
            n, at = line.split()
            started[int(n)] = float(at)
        return committed.keys() <= started.keys()

    try:
        harness.wait_until(all_started, 30, "every latency job to start", every=0.1)
    except BenchmarkError:
        missing = len(committed.keys() - started.keys())
        raise BenchmarkError(f"{missing} of {jobs} latency jobs never started") from None
    return [(started[n] - committed[n]) * 1000 for n in committed]


def run(ctx: Context) -> list[Row]:
    jobs = ctx.size(100, 40)
    idle = ctx.size(3, 1) * 1.0
    app.bind(ctx.db.dsn)
    ctx.db.reset()
    counter = [0]
    try:
        app.enqueue("bench.noop", {})  # open the pool before anything is timed
        ctx.db.reset()
        results = {kind: _measure(ctx, kind, jobs, idle, counter) for kind in ("pgjobs", "raw")}
    finally:
        app.close()
    rows = []
    for q in (50, 95, 99):
        pgjobs = Figure("ms", [_percentile(run, q) for run in results["pgjobs"].latencies])
        raw = Figure("ms", [_percentile(run, q) for run in results["raw"].latencies])
        target: Target | None = None
        if q == 50:
            target = limit_target("≤ 5 ms", pgjobs, 5.0)
        elif q == 99:
            target = limit_target("≤ 50 ms", pgjobs, 50.0)
        rows.append(
            Row(
                "latency",
                f"pickup latency p{q}, idle worker (--concurrency 8), {RATE:.0f} jobs/s",
                pgjobs,
                raw,
                "a LISTEN connection that claims on NOTIFY",
                target,
                f"{jobs} jobs per run" if q == 50 else "",
                {"jobs_per_run": jobs},
            )
        )
    pgjobs_idle = Figure("CPU ms/s", results["pgjobs"].idle_pg)
    client_idle = statistics.median(results["pgjobs"].idle_client)
    rows.append(
        Row(
            "latency",
            "idle worker: CPU of its database backends",
            pgjobs_idle,
            Figure("CPU ms/s", results["raw"].idle_pg),
            "the same LISTEN consumer, idle",
            limit_target(f"≤ {IDLE_LIMIT:.0f} ms/s (1% of a core)", pgjobs_idle, IDLE_LIMIT),
            f"worker process itself: {client_idle:.1f} ms/s",
            {"idle_seconds": idle},
        )
    )
    return rows
