"""Group e: does processing stay flat as history and the schedule grow?

Throughput of one worker (--concurrency 32) and of the raw consumer (1 connection) with
archived_jobs empty, then holding 1M and 5M rows of history, then with 100k jobs scheduled a day
ahead sitting in queued_jobs (in the benchmark queue: the claim must step over them). The
history is filled server-side with ``generate_series``, spread over the last 30 days (in their
daily partitions when archived_jobs is partitioned); the runs' own rows add to it.
"""

from __future__ import annotations

from benchmarks import processing
from benchmarks.harness import Context, say
from benchmarks.processing import Run, Setup
from benchmarks.report import Figure, Row, Target


def _runs(ctx: Context, setups: list[Setup], *, reset: bool, burst: bool) -> dict[Setup, list[Run]]:
    results: dict[Setup, list[Run]] = {setup: [] for setup in setups}
    for _ in range(ctx.runs(3)):
        for setup in setups:
            run = processing.run_once(ctx, setup, reset=reset, burst=burst)
            results[setup].append(run)
            say(f"  {setup.kind} {setup.label()}: {run.rate:,.0f} jobs/s")
    return results


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def run(ctx: Context) -> list[Row]:
    db = ctx.db
    jobs = ctx.size(30_000, 5_000)
    small, large = ctx.size(1_000_000, 100_000), ctx.size(5_000_000, 500_000)
    scheduled = ctx.size(100_000, 20_000)
    worker = Setup("pgjobs", 1, 32, jobs)
    reference = Setup("raw", 1, 100, jobs)
    steps: list[tuple[str, dict[Setup, list[Run]]]] = []

    say("  archived_jobs empty")
    steps.append(("archived_jobs empty", _runs(ctx, [worker, reference], reset=True, burst=True)))
    db.reset()
    say(f"  filling archived_jobs with {_count(small)} rows")
    db.fill_archived(small)
    steps.append(
        (
            f"{_count(small)} rows in archived_jobs",
            _runs(ctx, [worker, reference], reset=False, burst=True),
        )
    )
    say(f"  filling archived_jobs up to {_count(large)} rows")
    db.fill_archived(large - small)
    steps.append(
        (
            f"{_count(large)} rows in archived_jobs",
            _runs(ctx, [worker, reference], reset=False, burst=True),
        )
    )
    say(f"  scheduling {_count(scheduled)} jobs a day ahead")
    db.fill_scheduled(scheduled)
    steps.append(
        (
            f"{_count(large)} archived + {_count(scheduled)} scheduled in queued_jobs",
            _runs(ctx, [worker, reference], reset=False, burst=False),
        )
    )
    db.reset()

    def ratio(results: dict[Setup, list[Run]]) -> float:
        return (
            processing.rates(results[worker]).median / processing.rates(results[reference]).median
        )

    empty = processing.rates(steps[0][1][worker]).median
    rows = []
    for number, (name, results) in enumerate(steps):
        figure = processing.rates(results[worker])
        share = figure.median / empty
        # The same share with each step's pgjobs figure taken against the raw consumer's in that
        # step: what is left once a slower or faster machine moment is factored out.
        against_raw = ratio(results) / ratio(steps[0][1])
        target = None
        note = f"{share:.0%} of empty; against raw {against_raw:.0%}" if number else ""
        if number == len(steps) - 1:
            target = Target("≥ 90% of the empty case", f"{share:.0%}", share >= 0.90)
            note = f"against raw: {against_raw:.0%} of empty"
        rows.append(
            Row(
                "growth",
                f"{name}: 1 process, --concurrency 32",
                figure,
                Figure("jobs/s", [run.rate for run in results[reference]]),
                reference.label(),
                target,
                note,
                {
                    "pgjobs": processing.details(results[worker]),
                    "raw": processing.details(results[reference]),
                },
            )
        )
    return rows
