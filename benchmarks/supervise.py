"""Group k: what several worker processes cost at their start and at the end of a burst.

- Start-up: wall time of `pgjobs work --burst` on an empty queue, from the command's start to its
  exit (import, connect, check the schema, find nothing, exit), for `--processes 4` beside one
  worker process.
- Burst exit: with pre-filled no-op jobs, how long after the last job's ``finished_at`` the
  command exits: `--processes 2 --burst`, beside two `pgjobs work --burst` commands started at
  once (the last of them to exit). A worker whose queue ran dry while another still ran jobs
  must learn that it is over without waiting out its poll interval.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks import harness
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row, Target, limit_target

#: Worker processes of the start-up figure.
STARTED = 4
#: Worker processes of the burst-exit figures.
BURSTING = 2
CONCURRENCY = 32
#: Start-up of N worker processes against one: at most this many milliseconds more.
STARTUP_GOAL = 150.0
#: Milliseconds from the last job's finish to the command's exit.
TAIL_GOAL = 50.0


def _command(ctx: Context, processes: int) -> list[str]:
    command = harness.pgjobs_worker(ctx.db.url, CONCURRENCY)
    return [*command, "--processes", str(processes)] if processes > 1 else command


def _wait_all(procs: Sequence[harness.Proc], deadline: float) -> float:
    """Wait for every one of ``procs`` to exit 0; returns the Unix time at which the last one
    was seen gone (polled every millisecond)."""
    while any(proc.poll() is None for proc in procs):
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{procs[0].describe()} still running after the deadline")
        time.sleep(0.001)
    ended = time.time()
    for proc in procs:
        if proc.returncode != 0:
            raise BenchmarkError(f"{proc.describe()} exited with {proc.returncode}")
    return ended


def startup_once(ctx: Context, processes: int) -> float:
    """Seconds from the start of `pgjobs work --burst [--processes N]` to its exit, the queue
    empty."""
    ctx.db.reset()
    started = time.time()
    proc = ctx.procs.start(_command(ctx, processes))
    ended = _wait_all([proc], time.monotonic() + 60)
    ctx.db.wait_for_disconnects()
    return ended - started


def tail_once(ctx: Context, jobs: int, *, supervised: bool) -> float:
    """Seconds from the last job's ``finished_at`` to the exit of the last worker command:
    `--processes 2 --burst`, or two `pgjobs work --burst` commands."""
    db = ctx.db
    db.reset()
    marker = db.fill_ready(jobs)
    commands = [_command(ctx, BURSTING)] if supervised else [_command(ctx, 1)] * BURSTING
    procs = [ctx.procs.start(command) for command in commands]
    ended = _wait_all(procs, time.monotonic() + 120 + jobs / 300)
    db.wait_for_disconnects()
    window = db.archived_window(marker)
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} jobs archived: {procs[0].describe()}")
    return ended - window.ended


def run(ctx: Context) -> list[Row]:
    jobs = ctx.size(20_000, 5_000)
    one: list[float] = []
    many: list[float] = []
    supervised: list[float] = []
    separate: list[float] = []
    for _ in range(ctx.repeats):
        one.append(startup_once(ctx, 1))
        many.append(startup_once(ctx, STARTED))
        say(f"  start-up: 1 process {one[-1]:.3f}s, --processes {STARTED} {many[-1]:.3f}s")
        supervised.append(tail_once(ctx, jobs, supervised=True))
        separate.append(tail_once(ctx, jobs, supervised=False))
        say(
            f"  burst exit after the last job: --processes {BURSTING} "
            f"{supervised[-1] * 1000:.0f} ms, {BURSTING} commands {separate[-1] * 1000:.0f} ms"
        )
    startup = Figure("ms", [seconds * 1000 for seconds in many])
    alone = Figure("ms", [seconds * 1000 for seconds in one])
    more = startup.median - alone.median
    tail = Figure("ms", [seconds * 1000 for seconds in supervised])
    tail_separate = Figure("ms", [seconds * 1000 for seconds in separate])
    return [
        Row(
            "supervise",
            f"start-up of `pgjobs work --processes {STARTED} --burst`, empty queue (start to exit)",
            startup,
            alone,
            "one worker process (`pgjobs work --burst`)",
            Target(
                f"≤ one process + {STARTUP_GOAL:.0f} ms", f"+{more:.0f} ms", more <= STARTUP_GOAL
            ),
            "the worker processes are forked before the app is imported",
            reference="beside",
        ),
        Row(
            "supervise",
            f"exit of `--processes {BURSTING} --burst` after the last of {jobs:,} jobs finished",
            tail,
            tail_separate,
            f"{BURSTING} `pgjobs work --burst` commands, the last to exit",
            limit_target(f"≤ {TAIL_GOAL:.0f} ms", tail, TAIL_GOAL),
            "",
            reference="beside",
        ),
    ]
