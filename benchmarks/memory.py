"""Group d: peak RSS of one worker at --concurrency 300 with sleeping handlers.

Several waves of 300 sleeping jobs keep every slot busy; the peak resident set (VmHWM from
/proc/PID/status, and ``ru_maxrss`` when the process is reaped) is the figure. The raw reference
is a lean consumer running 300 sleeps at once, on asyncio or on 300 threads.
"""

from __future__ import annotations

import json

from benchmarks import harness
from benchmarks.harness import Context, say
from benchmarks.report import Figure, Row, limit_target

CONCURRENCY = 300
#: Peak RSS the issue allows one worker at --concurrency 300, in MiB.
LIMIT = 80.0


def _peak(ctx: Context, kind: str, threads: bool, jobs: int, seconds: float) -> float:
    db = ctx.db
    db.reset()
    task = "bench.sleep_sync" if threads else "bench.sleep"
    db.fill_ready(jobs, task, json.dumps({"seconds": seconds}))
    if kind == "pgjobs":
        command = harness.pgjobs_worker(db.url, CONCURRENCY)
    else:
        options = ["--concurrency", str(CONCURRENCY)] + (["--threads"] if threads else [])
        command = harness.raw_client("sleep", db.url, *options)
    proc = ctx.procs.start(command)
    proc.wait(120)
    say(f"  {kind} {'threads' if threads else 'asyncio'}: peak RSS {proc.peak_rss:.1f} MiB")
    return proc.peak_rss


def run(ctx: Context) -> list[Row]:
    waves = 3
    seconds = 0.5 if not ctx.quick else 0.3
    jobs = waves * CONCURRENCY
    repeats = ctx.runs(2)
    rows = []
    for threads in (False, True):
        peaks: dict[str, list[float]] = {"pgjobs": [], "raw": []}
        for _ in range(repeats):
            for kind in peaks:
                peaks[kind].append(_peak(ctx, kind, threads, jobs, seconds))
        pgjobs = Figure("MiB", peaks["pgjobs"])
        handlers = "sync handlers (300 threads)" if threads else "async handlers"
        rows.append(
            Row(
                "memory",
                f"peak RSS, 1 process, --concurrency {CONCURRENCY}, {handlers} sleeping",
                pgjobs,
                Figure("MiB", peaks["raw"]),
                "300 sleeps on 300 threads" if threads else "300 sleeps on asyncio",
                limit_target(f"≤ {LIMIT:.0f} MiB", pgjobs, LIMIT),
                f"{jobs} jobs of {seconds} s",
                {"jobs": jobs, "sleep_seconds": seconds},
            )
        )
    ctx.db.reset()
    return rows
