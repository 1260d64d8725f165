"""Group f: PostgreSQL CPU seconds per 1,000 jobs processed.

Read from /proc during each processing run of group b (the same runs when both groups run): the
CPU of the backends serving the benchmark database, sampled every 20 ms while the run lasts, so
that other databases on a shared server do not count. Background processes (WAL writer,
checkpointer) are left out; the backends write and flush their own WAL at commit.
"""

from __future__ import annotations

from benchmarks import processing
from benchmarks.harness import Context
from benchmarks.processing import Run
from benchmarks.report import Figure, Row, ratio_limit_target


def _figure(runs: list[Run]) -> Figure | None:
    values = [run.pg_cpu_per_1k for run in runs]
    if any(value is None for value in values):
        return None
    return Figure("CPU s/1k jobs", [value for value in values if value is not None])


#: Server CPU per job against the one-trip loop (the performance issue's target).
GOAL = 1.2


def run(ctx: Context) -> list[Row]:
    named = processing.setups(ctx)
    pairs = (("c32", "trip_1"), ("2x32", "trip_2"))
    results = processing.measure(ctx, [named[name] for pair in pairs for name in pair])
    rows = []
    for name, reference in pairs:
        pgjobs = _figure(results[named[name]])
        raw = _figure(results[named[reference]])
        note = "" if pgjobs is not None else "server not on this machine: /proc unavailable"
        ratio = pgjobs.median / raw.median if pgjobs is not None and raw is not None else None
        rows.append(
            Row(
                "pg cpu",
                f"PostgreSQL CPU per 1,000 jobs: {named[name].label()}",
                pgjobs,
                raw,
                named[reference].label(),
                ratio_limit_target(f"≤ {GOAL}x of raw", ratio, GOAL),
                note,
                {"jobs": named[name].jobs},
            )
        )
    return rows
