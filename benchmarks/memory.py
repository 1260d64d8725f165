"""Group d: memory and start-up, each beside the floor of any pgjobs process, a bare
``python -c "import psycopg"`` measured in the same run.

Peak RSS of one worker at --concurrency 300 with sleeping handlers: several waves of 300 sleeping
jobs keep every slot busy; the peak resident set (VmHWM from /proc/PID/status, and ``ru_maxrss``
when the process is reaped) is the figure, beside a lean consumer running 300 sleeps at once (on
asyncio or on 300 threads). Peak RSS of `pgjobs serve` after 200 one-job POSTs, beside the
libraries it stands on serving the same (``benchmarks.floors``). Wall time, start
to exit, of `pgjobs --help` and of `pgjobs enqueue` of one job (each run interleaved with a bare
interpreter's, as the machine's load drifts).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time

from benchmarks import QUEUE, api, harness
from benchmarks.harness import Context, say
from benchmarks.report import Figure, Row, limit_target, ratio_limit_target

CONCURRENCY = 300
#: Peak RSS the issue allows one worker at --concurrency 300: the bare interpreter's plus this.
OVER_BARE = 8.0
#: What 300 handler threads add, raw, allowed on top for the sync-handler row (MiB).
THREADS_EXTRA = 6.0
#: Peak RSS the issue allows `pgjobs serve`, in MiB.
SERVE_LIMIT = 60.0
#: Wall time the issue allows `pgjobs --help` and `pgjobs enqueue`, against the bare one's.
START_RATIO = 1.5
BARE = [sys.executable, "-c", "import psycopg"]
BARE_NAME = 'python -c "import psycopg"'


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


def _bare_rss() -> float:
    """Peak RSS of the bare interpreter, read by itself once psycopg is imported (sampling it
    from outside could miss so short a process)."""
    code = "import psycopg; print(open('/proc/self/status').read())"
    status = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def run(ctx: Context) -> list[Row]:
    # As an installed package is: compiled once (this machine's environment may forbid writing
    # bytecode, and compiling at every start would count in every row here).
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "pgjobs", "benchmarks"],
        cwd=harness.REPO_ROOT,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    bare = Figure("MiB", [_bare_rss() for _ in range(ctx.runs(3))])
    say(f"  bare interpreter: peak RSS {bare.median:.1f} MiB")
    return [*_workers(ctx, bare), *_serve(ctx, bare), *_start_up(ctx)]


def _workers(ctx: Context, bare: Figure) -> list[Row]:
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
        # The target is for async handlers; 300 threads cost ~5 MiB more even raw.
        limit = bare.median + OVER_BARE + (THREADS_EXTRA if threads else 0.0)
        rows.append(
            Row(
                "memory",
                f"peak RSS, 1 process, --concurrency {CONCURRENCY}, {handlers} sleeping",
                pgjobs,
                Figure("MiB", peaks["raw"]),
                "300 sleeps on 300 threads" if threads else "300 sleeps on asyncio",
                limit_target(
                    f"≤ {limit - bare.median:.0f} MiB over bare ({limit:.1f})", pgjobs, limit
                ),
                f"{jobs} jobs of {seconds} s; {BARE_NAME}: {bare.median:.1f} MiB",
                {"jobs": jobs, "sleep_seconds": seconds, "bare_mib": bare.runs},
            )
        )
    ctx.db.reset()
    return rows


def _serve(ctx: Context, bare: Figure) -> list[Row]:
    """Peak RSS of `pgjobs serve` that has answered 200 one-job POSTs, and of the libraries it
    stands on (``benchmarks.floors``' ``stack``) after the same, run by run."""
    peaks: list[float] = []
    floor: list[float] = []
    token = secrets.token_urlsafe(24)
    for _ in range(ctx.runs(2)):
        with api.serve(ctx, token) as port:
            peaks.append(_after_posts(ctx, port, token))
        say(f"  pgjobs serve: peak RSS {peaks[-1]:.1f} MiB")
        with api.serve_floor(ctx, "stack") as port:
            floor.append(_after_posts(ctx, port, token))
        say(f"  its stack alone: peak RSS {floor[-1]:.1f} MiB")
    ctx.db.reset()
    figure = Figure("MiB", peaks)
    stack = Figure("MiB", floor)
    return [
        Row(
            "memory",
            "peak RSS, `pgjobs serve` after 200 one-job POSTs",
            figure,
            bare,
            BARE_NAME,
            limit_target(f"≤ {SERVE_LIMIT:.0f} MiB", figure, SERVE_LIMIT),
            f"the reference is the bare interpreter's peak RSS; the stack alone (next row): "
            f"{stack.median:.1f} MiB, {figure.median - stack.median:+.1f} MiB for pgjobs",
        ),
        Row(
            "memory",
            "peak RSS, the stack alone after 200 POSTs: one FastAPI route on uvicorn, "
            "psycopg and psycopg_pool imported",
            stack,
            bare,
            BARE_NAME,
            None,
            f"the floor under `pgjobs serve`: its ≤ {SERVE_LIMIT:.0f} MiB leaves "
            f"{SERVE_LIMIT - stack.median:.1f} MiB for pgjobs",
        ),
    ]


def _after_posts(ctx: Context, port: int, token: str) -> float:
    """The peak RSS of the server last started, once it has answered 200 one-job POSTs."""
    client = api.Client(port, token)
    for n in range(200):
        client.post(api.JOBS_PATH, {"task": "bench.noop", "payload": {"n": n}})
    client.close()
    proc = ctx.procs.last()
    proc.sample()
    return proc.peak_rss


def _wall(command: list[str]) -> float:
    """Milliseconds from start to exit of ``command`` (which must succeed)."""
    started = time.perf_counter()
    subprocess.run(
        command,
        cwd=harness.REPO_ROOT,
        env=harness.subprocess_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return (time.perf_counter() - started) * 1000


def _start_up(ctx: Context) -> list[Row]:
    """Wall time of `pgjobs --help` and of `pgjobs enqueue` of one job, runs interleaved with the
    bare interpreter's."""
    pgjobs = [sys.executable, "-m", "pgjobs"]
    commands = {
        "help": [*pgjobs, "--help"],
        "enqueue": [*pgjobs, "enqueue", "bench.noop", "--queue", QUEUE, "--dsn", ctx.db.url],
    }
    for command in [BARE, *commands.values()]:
        _wall(command)  # warm the page cache and the bytecode
    walls: dict[str, list[float]] = {"bare": [], "help": [], "enqueue": []}
    for _ in range(ctx.size(15, 7)):
        walls["bare"].append(_wall(BARE))
        for name, command in commands.items():
            walls[name].append(_wall(command))
    ctx.db.reset()
    bare = Figure("ms", walls["bare"])
    say(
        f"  wall: bare {bare.median:.0f} ms, "
        + ", ".join(f"{name} {Figure('ms', walls[name]).median:.0f} ms" for name in commands)
    )
    rows = []
    for name, what in (("help", "`pgjobs --help`"), ("enqueue", "`pgjobs enqueue` of one job")):
        row = Row("memory", f"start-up: {what}, start to exit", Figure("ms", walls[name]), bare)
        row.raw_name = BARE_NAME
        row.target = ratio_limit_target(f"≤ {START_RATIO}x bare", row.ratio, START_RATIO)
        row.note = "runs interleaved with the bare interpreter's"
        rows.append(row)
    return rows
