"""`pgjobs work --http HOST:PORT` as a real process: its /metrics (parsed by prometheus_client's
parser) count the jobs it ran, /readyz turns 503 while its database is gone, /stats shows its
slots and its queues' depths, bad addresses and an address in use are one line and exit 2, with
--processes N worker process i listens on PORT+i, and without --http a worker listens on $PORT.
A port alone listens on loopback only; clients that trickle their requests starve neither the
probes nor the cap on connections; with a token, /metrics and /stats ask for it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, migrate
from pgjobs.db.dsn import Dsn
from pgjobs.worker.http import MAX_CONNECTIONS
from tests.support.external import downstream_service
from tests.support.helpers import (
    Proc,
    assert_one_line_error,
    database_name,
    pgjobs_env,
    scalar,
    wait_until,
)

pytestmark = pytest.mark.slow

APP = "tests.acceptance.http_app:app"
LISTENING = re.compile(r"serving /metrics, /healthz, /readyz and /stats on http://([^\s]+):(\d+)")


def _get(
    port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:PORT/PATH."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _port(proc: Proc, index: int = 0) -> int:
    """The port the worker logged it listens on (the ``index``-th such line)."""

    def found() -> list[int] | None:
        ports = [int(m.group(2)) for m in LISTENING.finditer(proc.err())]
        return ports if len(ports) > index else None

    return wait_until(found, timeout=30, what="the worker to listen", procs=[proc])[index]


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics page by (name, labels but worker)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "worker")
            samples[(sample.name, labels)] = sample.value
    return samples


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_metrics_count_the_jobs_the_worker_ran(spawn: Callable[..., Proc], make_app, conn):
    app: App = make_app(check_task_names=False)
    with downstream_service() as downstream:
        for n in range(3):
            app.enqueue("http.ok", {"n": n})
        broken = app.enqueue("http.broken", {})
        app.enqueue("http.flaky", {})
        external = app.enqueue("http.external", {"order": 1}, queue="downstream")
        worker = spawn(
            "work", "--app", APP, "--http", "127.0.0.1:0", "--concurrency", "3",
            "--poll-interval", "0.1", "--external-url", downstream.url,
        )  # fmt: skip
        port = _port(worker)
        wait_until(
            lambda: (
                scalar(conn, "SELECT count(*) FROM archived_jobs") == 4
                and scalar(conn, "SELECT count(*) FROM dead_letter") == 1
                and downstream.received
            ),
            timeout=30,
            what="every job done or delivered",
            procs=[worker],
        )
        worker_id = scalar(conn, "SELECT lease_owner FROM queued_jobs WHERE id = %s", [external])

        def page() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            status, text = _get(port, "/metrics")
            assert status == 200
            samples = _samples(text)
            heartbeat = _key("pgjobs_worker_last_heartbeat_timestamp_seconds")
            return samples if heartbeat in samples else None

        samples = wait_until(page, timeout=30, what="a heartbeat", procs=[worker])
        assert f'worker="{worker_id}"' in _get(port, "/metrics")[1]
        assert worker.stop() == 0

    def finished(task: str, outcome: str, queue: str = "default") -> float:
        name = "pgjobs_worker_jobs_finished_total"
        return samples.get(_key(name, queue=queue, task=task, outcome=outcome), 0)

    assert finished("http.ok", "succeeded") == 3
    assert finished("http.broken", "dead") == 1
    assert (finished("http.flaky", "retried"), finished("http.flaky", "succeeded")) == (1, 1)
    assert finished("http.external", "delivered", queue="downstream") == 1
    assert finished("http.ok", "retried") == finished("http.broken", "succeeded") == 0
    runs = _key("pgjobs_worker_run_duration_seconds_count", queue="default", task="http.ok")
    pickups = _key("pgjobs_worker_pickup_latency_seconds_count", queue="default", task="http.ok")
    inf = _key(
        "pgjobs_worker_run_duration_seconds_bucket", queue="default", task="http.ok", le="+Inf"
    )
    assert samples[runs] == samples[pickups] == samples[inf] == 3
    assert (
        samples[
            _key("pgjobs_worker_pickup_latency_seconds_count", queue="default", task="http.flaky")
        ]
        == 2
    )
    assert samples[_key("pgjobs_worker_slots")] == 3
    assert samples[_key("pgjobs_worker_slots_busy")] == 0, "a delivered job frees its slot"
    assert samples[_key("pgjobs_worker_connected")] == 1
    assert samples[_key("pgjobs_worker_trips_total")] >= 3
    assert broken in {row[0] for row in conn.execute("SELECT id FROM dead_letter")}


def test_readyz_is_503_while_the_database_is_gone(
    spawn: Callable[..., Proc], create_database: Callable[[], Dsn], server_url: str
):
    dsn = create_database()
    migrate.upgrade(dsn)
    worker = spawn(
        "work", "--app", APP, "--queue", "default", "--http", "127.0.0.1:0",
        "--poll-interval", "0.1", env=pgjobs_env(dsn.url),
    )  # fmt: skip
    port = _port(worker)
    wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    assert json.loads(_get(port, "/healthz")[1])["status"] == "ok"

    name = database_name(dsn.url)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    def not_ready() -> dict[str, Any] | None:
        status, body = _get(port, "/readyz")
        return json.loads(body) if status == 503 else None

    said = wait_until(not_ready, timeout=30, what="/readyz 503", procs=[worker])
    assert said["reason"] == "database unreachable"
    assert _get(port, "/healthz")[0] == 200, "the loop is alive, reconnecting"
    metrics = _samples(_get(port, "/metrics")[1])
    assert metrics[_key("pgjobs_worker_connected")] == 0
    worker.signal(signal.SIGTERM)
    worker.wait_exit(60)


def test_bad_http_values_and_an_address_in_use_exit_2(spawn: Callable[..., Proc]):
    for value in ("nope", "127.0.0.1:70000", "::1:9090"):
        proc = spawn("work", "--app", APP, "--queue", "default", "--http", value)
        code = proc.wait_exit(60)
        assert code == 2
        assert_one_line_error(code, proc.err(), "--http", value)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn("work", "--app", APP, "--queue", "default", "--http", f"127.0.0.1:{port}")
        code = proc.wait_exit(60)
    assert code == 2
    assert_one_line_error(code, proc.err(), f"--http 127.0.0.1:{port}", "address already in use")


def _free_ports(n: int) -> int:
    """A port p such that p..p+n-1 were free a moment ago."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base + n > 65535:
            continue
        sockets = []
        try:
            for i in range(n):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no run of free ports found")


def test_with_processes_each_worker_process_listens_on_port_plus_its_slot(
    spawn: Callable[..., Proc],
):
    base = _free_ports(2)
    supervisor = spawn(
        "work", "--app", APP, "--queue", "default", "--processes", "2",
        "--http", f"127.0.0.1:{base}", "--poll-interval", "0.2",
    )  # fmt: skip
    _port(supervisor, 1)  # both worker processes listen
    ports = sorted(int(m.group(2)) for m in LISTENING.finditer(supervisor.err()))
    assert ports == [base, base + 1]
    workers = set()
    for port in ports:

        def ready(port: int = port) -> bool:
            return _get(port, "/readyz")[0] == 200

        wait_until(ready, timeout=30, what=f"port {port} ready", procs=[supervisor])
        workers.add(json.loads(_get(port, "/healthz")[1])["worker"])
    assert len(workers) == 2, "two worker processes, one per port"
    assert supervisor.stop() == 0


def _stats(port: int) -> dict[str, Any]:
    status, body = _get(port, "/stats")
    assert status == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


def test_stats_show_the_slots_their_jobs_and_the_queues_depths(
    spawn: Callable[..., Proc], make_app, conn, tmp_path
):
    app: App = make_app(check_task_names=False)
    app.pause_queue("other")  # its ready jobs stay ready
    gate = tmp_path / "gate"
    held = [app.enqueue("http.hold", {"gate": str(gate)}) for _ in range(2)]
    later = app.enqueue("http.ok", {"n": 1}, run_in=3600)
    for n in range(4):
        app.enqueue("http.ok", {"n": n}, queue="other")
    worker = spawn(
        "work", "--app", APP, "--http", "127.0.0.1:0", "--concurrency", "3",
        "--queue", "default", "--queue", "other", "--poll-interval", "0.1",
    )  # fmt: skip
    port = _port(worker)

    def both_running() -> dict[str, Any] | None:
        # Two views of one moment: the worker's slots, and the database read at most 1 s before.
        stats = _stats(port)
        depths = stats["queues"] or {}
        running = depths.get("default", {}).get("running")
        return stats if running == 2 and stats["slots"]["busy"] == 2 else None

    stats = wait_until(both_running, timeout=30, what="two held jobs running", procs=[worker])
    assert stats["slots"] == {"total": 3, "busy": 2, "free": 1, "claimed_ahead": 0}
    assert sorted(job["id"] for job in stats["running"]) == held
    assert {(job["task"], job["queue"], job["attempt"]) for job in stats["running"]} == {
        ("http.hold", "default", 1)
    }
    assert stats["queues"] == {
        "default": {"ready": 0, "scheduled": 1, "running": 2},
        "other": {"ready": 4, "scheduled": 0, "running": 0},
    }
    assert stats["queues_error"] is None and 0 <= stats["queues_age"] < 30
    assert stats["worker"] == scalar(
        conn, "SELECT lease_owner FROM queued_jobs WHERE id = %s", [held[0]]
    )

    gate.touch()
    idle = wait_until(
        lambda: (
            (s := _stats(port))["slots"]["busy"] == 0
            and s["queues"]["default"]["running"] == 0
            and s
        ),
        timeout=30,
        what="the held jobs done",
        procs=[worker],
    )
    assert idle["running"] == [] and idle["queues"]["default"]["scheduled"] == 1
    assert worker.stop() == 0
    assert later in {row[0] for row in conn.execute("SELECT id FROM queued_jobs")}


def test_without_http_a_worker_listens_on_port(
    spawn: Callable[..., Proc], subprocess_env: dict[str, str]
):
    base = _free_ports(2)
    env = {**subprocess_env, "PORT": str(base)}
    worker = spawn("work", "--app", APP, "--queue", "default", env=env)
    assert _port(worker) == base
    assert re.search(rf"on http://127\.0\.0\.1:{base}\b", worker.err()), "a port alone: loopback"
    wait_until(lambda: _get(base, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    assert _stats(base)["slots"]["total"] == 8
    assert worker.stop() == 0

    # --http wins over $PORT; with --processes N, $PORT is the first of N ports, as --http's is.
    worker = spawn("work", "--app", APP, "--queue", "default", "--http", "127.0.0.1:0", env=env)
    port = _port(worker)
    assert port != base
    wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    assert worker.stop() == 0
    supervisor = spawn("work", "--app", APP, "--queue", "default", "--processes", "2", env=env)
    _port(supervisor, 1)
    assert sorted(int(m.group(2)) for m in LISTENING.finditer(supervisor.err())) == [base, base + 1]
    for port in (base, base + 1):

        def ready(port: int = port) -> bool:
            return _get(port, "/readyz")[0] == 200

        wait_until(ready, timeout=30, what=f"port {port} ready", procs=[supervisor])
    assert supervisor.stop() == 0


def test_a_bad_port_value_exits_2_in_one_line(
    spawn: Callable[..., Proc], subprocess_env: dict[str, str]
):
    for value in ("http", "70000", "-1", "80 80"):
        env = {**subprocess_env, "PORT": value}
        proc = spawn("work", "--app", APP, "--queue", "default", env=env)
        code = proc.wait_exit(60)
        assert code == 2
        assert_one_line_error(code, proc.err(), "$PORT", "--http")
    env = {**subprocess_env, "PORT": "65535"}
    proc = spawn("work", "--app", APP, "--queue", "default", "--processes", "2", env=env)
    code = proc.wait_exit(60)
    assert_one_line_error(code, proc.err(), "$PORT 127.0.0.1:65535", "--processes 2")
    assert code == 2


#: Trickling clients: more than the cap, so that some always wait for a place.
TRICKLERS = MAX_CONNECTIONS + 16
#: A request head that takes a trickler a minute to send, a byte a second.
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: worker\r\nX-Pad: " + b"p" * 30 + b"\r\n\r\n"


class _Trickler(threading.Thread):
    """A client that sends its request head one byte a second, and connects again whenever the
    server drops it; ``dropped`` counts the times it was, ``answered`` the times it was not."""

    def __init__(self, port: int, done: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.done = port, done
        self.connected = self.dropped = self.answered = 0

    def run(self) -> None:
        while not self.done.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    self.connected += 1
                    self._trickle(sock)
            except OSError:
                self.dropped += 1
                self.done.wait(0.05)

    def _trickle(self, sock: socket.socket) -> None:
        for byte in SLOW_HEAD:
            if self.done.is_set():
                return
            sock.sendall(bytes([byte]))
            if select.select([sock], [], [], 0)[0]:
                if sock.recv(1):
                    self.answered += 1
                raise ConnectionResetError  # the server is done with this connection
            self.done.wait(1.0)
        self.answered += 1


def _endpoint_sockets(pid: int, port: int) -> int:
    """Connections to ``port`` that process ``pid`` holds open (Linux: its sockets' inodes found
    among /proc/net/tcp's and tcp6's non-listening sockets of that local port)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                held.add(target[8:-1])
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] != "0A" and fields[9] in held:  # 0A: LISTEN
                    found += 1
    return found


def test_trickling_clients_starve_neither_the_probes_nor_the_cap(spawn: Callable[..., Proc]):
    worker = spawn(
        "work", "--app", APP, "--queue", "default", "--http", "127.0.0.1:0",
        "--poll-interval", "0.2",
    )  # fmt: skip
    port = _port(worker)
    wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    done = threading.Event()
    tricklers = [_Trickler(port, done) for _ in range(TRICKLERS)]
    try:
        for trickler in tricklers:
            trickler.start()
        wait_until(
            lambda: all(t.connected for t in tricklers),
            timeout=30,
            what="every trickling client connected",
            procs=[worker],
        )
        held, probes = [], []
        for _ in range(6):
            # A probe as the kubelet sends it, with its own timeout: each one is answered.
            held.append(_endpoint_sockets(worker.pid, port))
            try:
                status, body = _get(port, "/healthz", timeout=5)
                probes.append(status == 200 and json.loads(body)["status"])
            except OSError as error:  # refused, reset, timed out
                probes.append(repr(error))
            done.wait(1.0)
        assert probes == ["ok"] * 6
        # Every trickling client was dropped before it sent its head, many times over.
        wait_until(
            lambda: all(t.dropped for t in tricklers),
            timeout=30,
            what="every trickling client dropped",
            procs=[worker],
        )
    finally:
        done.set()
        for trickler in tricklers:
            trickler.join(10)
    assert sum(t.answered for t in tricklers) == 0
    # The cap holds: at most MAX_CONNECTIONS, and the few that the worker's loop accepted on
    # its last turn and had not counted in (or closed, having made way) yet.
    assert max(held) <= MAX_CONNECTIONS + 4 < TRICKLERS, held
    assert worker.alive()
    assert worker.stop() == 0


def test_a_port_alone_listens_on_loopback_only(spawn: Callable[..., Proc]):
    # 127.0.0.2 reaches a socket bound to every address, not one bound to 127.0.0.1.
    with socket.socket() as control:
        control.bind(("0.0.0.0", 0))
        control.listen()
        socket.create_connection(("127.0.0.2", control.getsockname()[1]), timeout=5).close()
    worker = spawn("work", "--app", APP, "--queue", "default", "--http", "0")
    port = _port(worker)
    assert re.search(rf"on http://127\.0\.0\.1:{port}\b", worker.err())
    wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
    assert worker.stop() == 0


TOKEN = "worker-metrics-token-0123456789abcdef"


def test_with_a_token_metrics_and_stats_ask_for_it(
    spawn: Callable[..., Proc], subprocess_env: dict[str, str]
):
    env = {**subprocess_env, "PGJOBS_WORKER_HTTP_TOKEN": f"{TOKEN}\n"}  # as read from a file
    worker = spawn("work", "--app", APP, "--queue", "default", "--http", "127.0.0.1:0", env=env)
    port = _port(worker)
    wait_until(lambda: _get(port, "/readyz")[0] == 200, timeout=30, what="ready", procs=[worker])
    assert _get(port, "/healthz")[0] == 200, "the probes never ask"
    for path in ("/metrics", "/stats"):
        for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}):
            status, body = _get(port, path, headers)
            assert status == 401, (path, headers)
            error = json.loads(body)["error"]
            assert error["code"] == "unauthenticated" and TOKEN not in error["message"]
            assert set(error) == {"code", "message", "field"}
        status, body = _get(port, path, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, body
    samples = _samples(_get(port, "/metrics", {"Authorization": f"Bearer {TOKEN}"})[1])
    assert samples[_key("pgjobs_worker_connected")] == 1
    assert TOKEN not in worker.err()
    assert worker.stop() == 0


def test_a_bad_token_exits_2_in_one_line(
    spawn: Callable[..., Proc], subprocess_env: dict[str, str]
):
    cases = [
        (["--http", "127.0.0.1:0", "--http-token", "short"], {}, "--http-token"),
        (["--http-token", TOKEN], {}, "--http-token protects"),
        (
            ["--http", "127.0.0.1:0"],
            {"PGJOBS_WORKER_HTTP_TOKEN": "has spaces in it, sixteen+"},
            "$PGJOBS_WORKER_HTTP_TOKEN",
        ),
    ]
    for args, extra, said in cases:
        proc = spawn(
            "work", "--app", APP, "--queue", "default", *args, env={**subprocess_env, **extra}
        )
        code = proc.wait_exit(60)
        assert code == 2
        assert_one_line_error(code, proc.err(), said)
        assert "short" not in proc.err() and "has spaces" not in proc.err()
