"""Group h: enqueue through the HTTP API of `pgjobs serve`, beside ``app.enqueue`` in the same run.

A real `pgjobs serve` runs as a subprocess (uvicorn, a bearer token) on the benchmark database;
clients are threads of this process, each with one keep-alive HTTP connection (``http.client``).
The reference is the Python API doing the same work with the same number of threads:
``app.enqueue`` for one job per request (32 clients beside 32 threads: many producers at once,
which the API should serve at least 70% as fast), ``app.enqueue_many`` for batches of 1,000
(4 clients beside 4 threads; at least 50%).

Throughput is closed-loop: every client sends its next request as soon as the last one answered.
Latency is open-loop: requests are due at a fixed rate (500 a second) whatever the answers, and
each one's latency runs from the moment it was due, not from when a free client sent it, so a
server that falls behind shows in the figures (no coordinated omission); its p99 should stay
within 20 ms. The benchmark app (``benchmarks.tasks``) is the server's ``--app``, so task names
are checked as in production.
"""

from __future__ import annotations

import http.client
import json
import queue
import secrets
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import floors, harness
from benchmarks.harness import BenchmarkError, Context, Proc, say
from benchmarks.report import Figure, Row, limit_target, ratio_target
from benchmarks.tasks import app
from pgjobs import JobSpec

BATCH = 1_000
#: Concurrent clients of the one-job throughput runs (keep-alive connections, or Python threads).
CLIENTS = 32
#: Concurrent clients of the batch runs: 4 bodies of 1,000 jobs in flight keep the server busy.
BATCH_CLIENTS = 4
#: Requests a second of the latency runs, and the clients that send them when due.
RATE = 500
LATENCY_CLIENTS = 32
#: The issue's targets: the API's share of the Python API's rate, one job and batches, and the
#: open-loop p99 (ms) at ``RATE``.
SINGLE_GOAL = 0.70
BATCH_GOAL = 0.50
P99_GOAL = 20.0
TASK = "bench.noop"
JOBS_PATH = "/api/v1/jobs"
BATCH_PATH = "/api/v1/jobs/batch"


# -- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(ctx: Context, token: str) -> Iterator[int]:
    """`pgjobs serve` on the benchmark database, until the block ends; yields its port."""
    port = _free_port()
    command = [sys.executable, "-m", "pgjobs", "serve", "--app", "benchmarks.tasks:app"]
    command += ["--dsn", ctx.db.url, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--log-level", "warning"]  # as the workers of the other groups: no access log
    with _serving(ctx, command, port, {"PGJOBS_API_TOKENS": token}):
        yield port


@contextmanager
def serve_floor(ctx: Context, name: str) -> Iterator[int]:
    """One of ``benchmarks.floors``' servers (``nothing`` or ``stack``), until the block ends;
    yields its port."""
    port = _free_port()
    with _serving(ctx, floors.command(name, port), port, {}):
        yield port


@contextmanager
def _serving(ctx: Context, command: list[str], port: int, env: dict[str, str]) -> Iterator[None]:
    proc = ctx.procs.start(command, env=harness.subprocess_env(env))
    try:
        _wait_ready(proc, port)
        yield
    finally:
        proc.stop()


def _wait_ready(proc: Proc, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise BenchmarkError(f"{proc.describe()} exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{proc.describe()} not ready after {timeout:.0f}s")
        time.sleep(0.1)


class Client:
    """One keep-alive connection to the server."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: Any) -> None:
        data = json.dumps(body)
        try:
            self.conn.request("POST", path, data, self.headers)
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the idle keep-alive connection (uvicorn does after 5 s): open a
            # new one and send again, as an HTTP client library would.
            self.conn.close()
            self.conn.request("POST", path, data, self.headers)
            response = self.conn.getresponse()
        text = response.read()
        if response.status != 201:
            raise BenchmarkError(f"POST {path} answered {response.status}: {text[:300]!r}")

    def close(self) -> None:
        self.conn.close()


def _fresh(clients: list[Client]) -> None:
    """Close every connection (each opens again at its next request), so that no run starts on
    connections the server is about to close for idleness."""
    for client in clients:
        client.close()


def _job(n: int) -> dict[str, Any]:
    return {"task": TASK, "payload": {"n": n}}


# -- running calls from threads -----------------------------------------------------------------


def _in_threads(threads: int, calls: int, call: Callable[[int, int], None]) -> float:
    """``call(thread, n)`` for n in 0..calls-1, spread over ``threads`` threads that each take
    the next n as soon as their last call returned; the seconds from first to last."""
    counter = iter(range(calls))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop(thread: int) -> None:
        while not errors:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            try:
                call(thread, n)
            except BaseException as exc:
                errors.append(exc)

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise BenchmarkError(f"a client failed: {errors[0]}") from errors[0]
    return elapsed


def open_loop(
    rate: float, seconds: float, threads: int, call: Callable[[int, int], None]
) -> list[float]:
    """Latencies (ms) of ``rate * seconds`` calls due at a fixed rate, each measured from the
    moment it was due; ``threads`` threads send the calls that are due."""
    total = int(rate * seconds)
    due: queue.Queue[tuple[int, float] | None] = queue.Queue()
    latencies: list[float] = []
    errors: list[BaseException] = []

    def loop(thread: int) -> None:
        while (item := due.get()) is not None:
            n, at = item
            if errors:
                continue
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                call(thread, n)
            except BaseException as exc:
                errors.append(exc)
                continue
            latencies.append((time.perf_counter() - at) * 1000)

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start = time.perf_counter() + 0.2
    for n in range(total):
        at = start + n / rate
        # Hand each call out a moment before it is due, so that a free thread is waiting for it.
        pause = at - 0.005 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        due.put((n, at))
    for _ in workers:
        due.put(None)
    for worker in workers:
        worker.join()
    if errors:
        raise BenchmarkError(f"a client failed: {errors[0]}") from errors[0]
    return latencies


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# -- the group ----------------------------------------------------------------------------------


def run(ctx: Context) -> list[Row]:
    db = ctx.db
    app.bind(db.dsn)
    token = secrets.token_urlsafe(24)
    single = ctx.size(8_000, 1_500)
    batches = ctx.size(24, 8)
    latency_seconds = float(ctx.size(10, 3))
    measured: dict[str, list[float]] = {}
    with serve(ctx, token) as port, serve_floor(ctx, "nothing") as floor_port:
        clients = [Client(port, token) for _ in range(max(CLIENTS, LATENCY_CLIENTS))]
        floor_clients = [Client(floor_port, token) for _ in range(CLIENTS)]

        def floor_single(thread: int, n: int) -> None:
            floor_clients[thread].post(JOBS_PATH, _job(n))

        def api_single(thread: int, n: int) -> None:
            clients[thread].post(JOBS_PATH, _job(n))

        def api_batch(thread: int, n: int) -> None:
            clients[thread].post(BATCH_PATH, {"jobs": [_job(i) for i in range(BATCH)]})

        def app_single(thread: int, n: int) -> None:
            app.enqueue(TASK, {"n": n})

        def app_batch(thread: int, n: int) -> None:
            app.enqueue_many(JobSpec(TASK, {"n": i}) for i in range(BATCH))

        throughput: dict[str, tuple[Callable[[int, int], None], int, int, int]] = {
            "api_single": (api_single, single, 1, CLIENTS),
            "app_single": (app_single, single, 1, CLIENTS),
            "floor_single": (floor_single, single, 1, CLIENTS),
            "api_batch": (api_batch, batches, BATCH, BATCH_CLIENTS),
            "app_batch": (app_batch, batches, BATCH, BATCH_CLIENTS),
        }
        latency: dict[str, Callable[[int, int], None]] = {
            "api_latency": api_single,
            "app_latency": app_single,
        }
        try:
            # Warm up: the server's pool and statements, the app's pool.
            _in_threads(CLIENTS, 4 * CLIENTS, api_single)
            _in_threads(CLIENTS, 4 * CLIENTS, app_single)
            _in_threads(CLIENTS, 4 * CLIENTS, floor_single)
            for _ in range(ctx.repeats):
                for name, (call, calls, jobs, threads) in throughput.items():
                    _fresh(clients)
                    _fresh(floor_clients)
                    db.conn.execute("TRUNCATE queued_jobs")
                    rate = calls * jobs / _in_threads(threads, calls, call)
                    enqueued = db.scalar("SELECT count(*) FROM queued_jobs")
                    if enqueued != (0 if name == "floor_single" else calls * jobs):
                        raise BenchmarkError(f"{name}: {enqueued} of {calls * jobs} jobs enqueued")
                    measured.setdefault(name, []).append(rate)
                    say(f"  api {name}: {rate:,.0f} jobs/s")
                for name, call in latency.items():
                    _fresh(clients)
                    db.conn.execute("TRUNCATE queued_jobs")
                    ms = open_loop(RATE, latency_seconds, LATENCY_CLIENTS, call)
                    p50, p99 = percentile(ms, 0.50), percentile(ms, 0.99)
                    measured.setdefault(f"{name}_p50", []).append(p50)
                    measured.setdefault(f"{name}_p99", []).append(p99)
                    say(f"  api {name} at {RATE}/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        finally:
            for client in clients + floor_clients:
                client.close()
            app.close()
            db.conn.execute("TRUNCATE queued_jobs")
    return _rows(measured, single, batches, latency_seconds)


def _rows(measured: dict[str, list[float]], single: int, batches: int, seconds: float) -> list[Row]:
    def jobs(name: str) -> Figure:
        return Figure("jobs/s", measured[name])

    def ms(name: str) -> Figure:
        return Figure("ms", measured[name])

    def ratio(name: str, reference: str) -> float:
        return statistics.median(measured[name]) / statistics.median(measured[reference])

    clients, batch_clients = f"{CLIENTS} keep-alive clients", f"{BATCH_CLIENTS} keep-alive clients"
    threads, batch_threads = f"{CLIENTS} threads", f"{BATCH_CLIENTS} threads"
    open_loop_note = (
        f"open loop: {RATE} requests/s for {seconds:g} s, {LATENCY_CLIENTS} clients; "
        "latency from each request's due time"
    )
    return [
        Row(
            "api",
            f"POST {JOBS_PATH}, one job per request ({clients})",
            jobs("api_single"),
            jobs("app_single"),
            f"app.enqueue, same run, {threads}",
            ratio_target(
                f"≥ {SINGLE_GOAL:.0%} of app.enqueue",
                ratio("api_single", "app_single"),
                SINGLE_GOAL,
            ),
            "requests/s = jobs/s",
            {"requests": single, "clients": CLIENTS},
            "Python API",
        ),
        Row(
            "api",
            f"the ceiling: an ASGI app that does nothing, on uvicorn as `pgjobs serve` runs it, "
            f"one POST per request ({clients})",
            jobs("floor_single"),
            jobs("app_single"),
            f"app.enqueue, same run, {threads}",
            None,
            f"{ratio('floor_single', 'app_single'):.2f} of app.enqueue: no app served so on this "
            f"machine passes that share; pgjobs serve reaches "
            f"{ratio('api_single', 'floor_single'):.2f} of it",
            {"requests": single, "clients": CLIENTS},
            "Python API",
        ),
        Row(
            "api",
            f"POST {BATCH_PATH}, {BATCH:,} jobs per request ({batch_clients})",
            jobs("api_batch"),
            jobs("app_batch"),
            f"app.enqueue_many, {BATCH:,} per call, same run, {batch_threads}",
            ratio_target(
                f"≥ {BATCH_GOAL:.0%} of enqueue_many", ratio("api_batch", "app_batch"), BATCH_GOAL
            ),
            f"{statistics.median(measured['api_batch']) / BATCH:,.1f} requests/s; "
            "the answer lists every job",
            {"requests": batches, "jobs_per_request": BATCH, "clients": BATCH_CLIENTS},
            "Python API",
        ),
        Row(
            "api",
            f"POST {JOBS_PATH} latency p50 at {RATE} requests/s",
            ms("api_latency_p50"),
            ms("app_latency_p50"),
            f"app.enqueue at {RATE} calls/s, same run",
            None,
            open_loop_note,
            {"rate": RATE, "seconds": seconds},
            "Python API",
        ),
        Row(
            "api",
            f"POST {JOBS_PATH} latency p99 at {RATE} requests/s",
            ms("api_latency_p99"),
            ms("app_latency_p99"),
            f"app.enqueue at {RATE} calls/s, same run",
            limit_target(f"≤ {P99_GOAL:.0f} ms", ms("api_latency_p99"), P99_GOAL),
            open_loop_note,
            {"rate": RATE, "seconds": seconds},
            "Python API",
        ),
    ]
