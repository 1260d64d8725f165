"""`pgjobs work --http HOST:PORT` as a real process: its /metrics (parsed by prometheus_client's
parser) count the jobs it ran, /readyz turns 503 while its database is gone, /stats shows its
slots and its queues' depths, bad addresses and an address in use are one line and exit 2, with
--processes N worker process i listens on PORT+i, and without --http a worker listens on $PORT."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, migrate
from pgjobs.db.dsn import Dsn
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


def _get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:PORT/PATH."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
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
    assert re.search(rf"on http://0\.0\.0\.0:{base}\b", worker.err())
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
    assert_one_line_error(code, proc.err(), "$PORT 0.0.0.0:65535", "--processes 2")
    assert code == 2
