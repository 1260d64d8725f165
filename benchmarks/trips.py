"""Client CPU per round trip of the worker's hot statement, by way of driving the connection.

Not part of the table: a micro-benchmark for choosing how the worker talks to PostgreSQL. Each
way runs ``JOB_SUCCEED_AND_CLAIM`` (archive the previous batch, claim the next) ``--trips`` times
over pre-filled no-op jobs, and the process's CPU time (every thread) is divided by the trips;
the CPU of a run of no trip (connecting) is subtracted. The ways run interleaved, ``--repeats``
times, each on a fresh fill::

    python -m benchmarks.trips --dsn URL [--batch 32] [--trips 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg

from benchmarks import QUEUE
from benchmarks.harness import BenchDatabase
from pgjobs import db, queries
from pgjobs.completer import ClaimParams
from pgjobs.db import connections, libpq
from pgjobs.db.dsn import Dsn

CLAIM = ClaimParams("trips", [QUEUE])
Rows = list[tuple[Any, ...]]


def _params(done: Rows, limit: int) -> dict[str, Any]:
    """The statement's parameters as the worker sends them: the claimed jobs of ``done``
    succeeded, claim ``limit``."""
    params = CLAIM.bind(limit)
    params["ok_ids"] = "{" + ",".join(str(row[0]) for row in done) + "}"
    params["ok_attempts"] = "{" + ",".join(str(row[6]) for row in done) + "}"
    params["ok_results"] = None
    return params


def _jobs(rows: Rows) -> Rows:
    """The claimed rows (archived ones carry only their id), mapped to jobs as the worker does."""
    claimed = [row for row in rows if row[1] is not None]
    for row in claimed:
        db.job_from_row(row)
    return claimed


async def async_cursor(url: str, trips: int, batch: int) -> None:
    conn = await db.connect_async(Dsn(url, "trips"), hot=True)
    done: Rows = []
    for _ in range(trips):
        cur = await conn.execute(queries.JOB_SUCCEED_AND_CLAIM, _params(done, batch), prepare=True)
        done = _jobs(await cur.fetchall())
    await conn.close()


async def hot_path(url: str, trips: int, batch: int) -> None:
    conn = await db.connect_async(Dsn(url, "trips"), hot=True)
    done: Rows = []
    for _ in range(trips):
        done = _jobs(await libpq.succeed_and_claim(conn, _params(done, batch)))
    await conn.close()


def _sync_connection(url: str) -> psycopg.Connection[Any]:
    conn = db.connect(Dsn(url, "trips"))
    conn.execute(queries.SESSION_HOT)
    psycopg.types.json.set_json_loads(connections._json_loads, conn)
    return conn


def _sync_trip(conn: psycopg.Connection[Any], params: dict[str, Any]) -> Rows:
    return conn.execute(queries.JOB_SUCCEED_AND_CLAIM, params, prepare=True).fetchall()


async def sync_in_thread(url: str, trips: int, batch: int) -> None:
    """A sync connection driven by a thread of its own; the loop hands it each trip's
    parameters and is handed the rows back (``call_soon_threadsafe``)."""
    loop = asyncio.get_running_loop()
    conn = _sync_connection(url)
    work: queue.SimpleQueue[tuple[dict[str, Any], asyncio.Future[Rows]] | None] = (
        queue.SimpleQueue()
    )

    def lane() -> None:
        while (item := work.get()) is not None:
            params, future = item
            rows = _sync_trip(conn, params)
            loop.call_soon_threadsafe(future.set_result, rows)

    thread = threading.Thread(target=lane, daemon=True)
    thread.start()
    done: Rows = []
    for _ in range(trips):
        future: asyncio.Future[Rows] = loop.create_future()
        work.put((_params(done, batch), future))
        done = _jobs(await future)
    work.put(None)
    thread.join()
    conn.close()


def sync_no_loop(url: str, trips: int, batch: int) -> None:
    conn = _sync_connection(url)
    done: Rows = []
    for _ in range(trips):
        done = _jobs(_sync_trip(conn, _params(done, batch)))
    conn.close()


Way = Callable[[str, int, int], Coroutine[Any, Any, None] | None]
WAYS: dict[str, Way] = {
    "async cursor (psycopg AsyncConnection)": async_cursor,
    "sync connection, one thread per lane": sync_in_thread,
    "pgjobs.db.libpq (libpq calls on the loop)": hot_path,
    "sync connection, no event loop (floor)": sync_no_loop,
}


def _cpu(way: Way, url: str, trips: int, batch: int) -> float:
    started = time.process_time()
    outcome = way(url, trips, batch)
    if outcome is not None:
        asyncio.run(outcome)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trips", description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    bench = BenchDatabase(Dsn(args.dsn, "--dsn"))
    per_trip: dict[str, list[float]] = {name: [] for name in WAYS}
    try:
        url = bench.dsn.url
        for _ in range(args.repeats):
            for name, way in WAYS.items():
                bench.reset()
                bench.fill_ready(args.trips * args.batch + args.batch)
                connecting = _cpu(way, url, 0, args.batch)
                cpu = _cpu(way, url, args.trips, args.batch) - connecting
                per_trip[name].append(cpu / args.trips * 1e6)
    finally:
        bench.drop()
    print(f"client CPU per trip, batch {args.batch}, median of {args.repeats} x {args.trips} trips")
    for name, values in per_trip.items():
        median = statistics.median(values)
        print(
            f"{name:44} {median:6.0f} µs ({min(values):.0f}-{max(values):.0f}), "
            f"{median / args.batch:5.1f} µs/job"
        )


if __name__ == "__main__":
    main()
