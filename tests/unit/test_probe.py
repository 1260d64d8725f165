"""The worker's probe without a database: --http addresses, the metrics' text format (parsed by
prometheus_client's own parser), and the HTTP server's answers to good, bad and hostile clients."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import ConfigurationError
from pgjobs.completer import Outcome
from pgjobs.models import Job
from pgjobs.worker.http import MAX_REQUEST_HEAD, ProbeServer, ProbeState, parse_address
from pgjobs.worker.metrics import WorkerMetrics


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9090", ("::1", 9090)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        # A port alone is this machine's only: another must be named.
        ("9090", ("127.0.0.1", 9090)),
        (":9090", ("127.0.0.1", 9090)),
        ("0", ("127.0.0.1", 0)),
    ],
)
def test_http_addresses(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize(
    "text",
    [
        "",
        ":",
        "nope",
        "127.0.0.1:",
        "127.0.0.1:65536",
        "::1:9090",
        "h:\uff19\uff10",
        "h:-1",
        "a b:1",
    ],
)
def test_bad_http_addresses_are_refused_in_one_line(text):
    with pytest.raises(ConfigurationError, match="--http") as refused:
        parse_address(text)
    assert "\n" not in str(refused.value)


def _job(job_id: int, queue: str, task: str, *, late: float = 0.0, attempts: int = 1) -> Job:
    now = datetime.now(UTC)
    return Job(
        job_id, queue, task, {}, 0, now - timedelta(seconds=late), attempts, 3, "w", now, None,
        now, None, None,
    )  # fmt: skip


WEIRD = 'q"uo\\te\nd'


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    found: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        found[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return found


def test_metrics_parse_as_prometheus_text_with_escaped_labels():
    metrics = WorkerMetrics('host:1:"x"\\', slots=4, tasks={"send", WEIRD})
    metrics.claimed(_job(1, WEIRD, WEIRD, late=2.0), datetime.now(UTC).timestamp())
    metrics.finished(_job(1, WEIRD, WEIRD), Outcome.SUCCEEDED)
    metrics.claimed(_job(2, "mail", "send"), datetime.now(UTC).timestamp())
    metrics.finished(_job(2, "mail", "send"), Outcome.RETRIED)
    metrics.not_run(_job(3, "mail", "no.such.task"))
    metrics.trip()
    metrics.heartbeat()
    text = metrics.render(busy=3, connected=True)
    families = _families(text)
    me = {"worker": 'host:1:"x"\\'}
    assert families["pgjobs_worker_slots"] == [("pgjobs_worker_slots", me, 4)]
    assert families["pgjobs_worker_slots_busy"] == [("pgjobs_worker_slots_busy", me, 3)]
    assert families["pgjobs_worker_connected"] == [("pgjobs_worker_connected", me, 1)]
    assert families["pgjobs_worker_trips"] == [("pgjobs_worker_trips_total", me, 1)]
    [(_, _, beat)] = families["pgjobs_worker_last_heartbeat_timestamp_seconds"]
    assert abs(beat - datetime.now(UTC).timestamp()) < 60
    finished = {
        (s[1]["queue"], s[1]["task"], s[1]["outcome"]): s[2]
        for s in families["pgjobs_worker_jobs_finished"]
    }
    assert finished == {
        (WEIRD, WEIRD, Outcome.SUCCEEDED): 1,
        ("mail", "send", Outcome.RETRIED): 1,
        ("mail", "(unknown)", "dead"): 1,
    }
    pickup = {
        (s[1]["task"], s[1].get("le")): s[2]
        for s in families["pgjobs_worker_pickup_latency_seconds"]
        if s[0].endswith("_bucket")
    }
    assert pickup[(WEIRD, "1.0")] == 0 and pickup[(WEIRD, "2.5")] == 1
    assert pickup[("send", "+Inf")] == 1
    runs = [s for s in families["pgjobs_worker_run_duration_seconds"] if s[0].endswith("_count")]
    assert sorted(s[2] for s in runs) == [1, 1], "a job that never ran has no run duration"


def test_without_jobs_the_families_are_still_described():
    text = WorkerMetrics("w", slots=1, tasks=()).render(busy=0, connected=False)
    families = _families(text)
    assert families["pgjobs_worker_connected"] == [("pgjobs_worker_connected", {"worker": "w"}, 0)]
    assert families["pgjobs_worker_jobs_finished"] == []
    assert families["pgjobs_worker_last_heartbeat_timestamp_seconds"] == []
    assert "# TYPE pgjobs_worker_run_duration_seconds histogram" in text


# --- the server ---------------------------------------------------------------------------


async def _exchange(port: int, raw: bytes, *, read: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 15) if read else b""
    writer.close()
    return answer


def _serve(state: ProbeState, *requests: bytes, token: str | None = None) -> list[bytes]:
    async def go() -> list[bytes]:
        server = ProbeServer(WorkerMetrics("w", 2, ()), lambda: state, _stats, token=token)
        _, port = await server.start("127.0.0.1", 0)
        try:
            return [await _exchange(port, raw) for raw in requests]
        finally:
            await server.close()

    return asyncio.run(go())


OK = ProbeState(busy=1, connected=True, not_ready=None, unhealthy=None)
STATS = {"worker": "w", "slots": {"total": 2, "busy": 1}, "queues": {"default": {"ready": 3}}}


async def _stats() -> dict[str, Any]:
    await asyncio.sleep(0)  # the worker's reads the database: /stats is awaited
    return STATS


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_the_four_paths_answer():
    metrics, health, ready, head, stats = _serve(
        OK,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\n\r\n",
        b"GET /readyz?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD /metrics HTTP/1.1\r\n\r\n",
        b"GET /stats HTTP/1.1\r\n\r\n",
    )
    assert _status(metrics) == 200
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in metrics
    assert b'pgjobs_worker_slots_busy{worker="w"} 1' in metrics
    assert (_status(health), _status(ready)) == (200, 200)
    assert health.endswith(b'{"status": "ok", "worker": "w"}')
    assert _status(head) == 200 and head.endswith(b"\r\n\r\n"), "HEAD has no body"
    assert _status(stats) == 200 and b"Content-Type: application/json" in stats
    assert json.loads(stats.split(b"\r\n\r\n", 1)[1]) == STATS


def test_not_ready_and_stuck_answer_503():
    state = ProbeState(busy=0, connected=False, not_ready="database unreachable", unhealthy=None)
    health, ready = _serve(state, b"GET /healthz HTTP/1.1\r\n\r\n", b"GET /readyz HTTP/1.1\r\n\r\n")
    assert _status(health) == 200
    assert _status(ready) == 503 and b'"reason": "database unreachable"' in ready
    stuck = ProbeState(busy=0, connected=True, not_ready=None, unhealthy="stuck for 99s")
    health, ready = _serve(stuck, b"GET /healthz HTTP/1.1\r\n\r\n", b"GET /readyz HTTP/1.1\r\n\r\n")
    assert (_status(health), _status(ready)) == (503, 503)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
        (b"DELETE /healthz HTTP/1.1\r\n\r\n", 405),
        (b"GET /metrics\r\n\r\n", 400),
        (b"get /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX: \xff\r\n\r\n", 400),
        (b"GET /" + b"a" * MAX_REQUEST_HEAD + b" HTTP/1.1\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n", 431),
        # No path takes a body: a small one is read and dropped, a large or chunked one refused.
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-length: 1\r\n\r\nxx", 400),
    ],
)
def test_bad_requests_get_a_4xx_in_the_error_shape(raw, status):
    [answer] = _serve(OK, raw)
    assert _status(answer) == status, answer[:200]
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert body.startswith(b'{"error": {"code": ')
    if status == 405:
        assert b"Allow: GET, HEAD" in answer


def test_a_silent_client_does_not_stop_others():
    async def go() -> tuple[bytes, bytes]:
        server = ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats)
        _, port = await server.start("127.0.0.1", 0)
        try:
            # Half a request, then nothing: the server goes on serving others meanwhile.
            _, silent = await asyncio.open_connection("127.0.0.1", port)
            silent.write(b"GET /metr")
            others = await asyncio.gather(
                *(_exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n") for _ in range(5))
            )
            silent.close()
            return others[0], others[-1]
        finally:
            await server.close()

    first, last = asyncio.run(go())
    assert _status(first) == _status(last) == 200


def test_an_address_in_use_is_a_configuration_error():
    async def go() -> None:
        first = ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats)
        host, port = await first.start("127.0.0.1", 0)
        try:
            with pytest.raises(ConfigurationError, match=f"--http 127.0.0.1:{port}: cannot listen"):
                await ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats).start(host, port)
        finally:
            await first.close()

    asyncio.run(go())


def test_a_small_body_is_read_and_the_request_answered():
    [answer] = _serve(OK, b"GET /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert _status(answer) == 200


TOKEN = "a-token-of-thirty-two-characters"


@pytest.mark.parametrize("path", ["/metrics", "/stats"])
def test_with_a_token_metrics_and_stats_ask_for_it(path):
    get = f"GET {path} HTTP/1.1\r\n".encode()
    none, other, basic, head, right = _serve(
        OK,
        get + b"\r\n",
        get + b"Authorization: Bearer " + TOKEN.upper().encode() + b"\r\n\r\n",
        get + b"Authorization: Basic " + TOKEN.encode() + b"\r\n\r\n",
        f"HEAD {path} HTTP/1.1\r\n\r\n".encode(),
        get + b"authorization: bearer " + TOKEN.encode() + b"\r\n\r\n",
        token=TOKEN,
    )
    for refused in (none, other, basic):
        assert _status(refused) == 401
        assert b'WWW-Authenticate: Bearer realm="pgjobs"' in refused
        error = json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "unauthenticated" and "\n" not in error["message"]
        assert TOKEN not in error["message"] and TOKEN.upper() not in error["message"]
    assert b'error="invalid_token"' in other
    assert _status(head) == 401 and head.endswith(b"\r\n\r\n"), "HEAD has no body"
    assert _status(right) == 200


def test_with_a_token_the_probes_stay_open():
    health, ready = _serve(
        OK, b"GET /healthz HTTP/1.1\r\n\r\n", b"GET /readyz HTTP/1.1\r\n\r\n", token=TOKEN
    )
    assert (_status(health), _status(ready)) == (200, 200)


@pytest.mark.parametrize(
    "token", ["", "short", "sixteen chars ok", "caf\u00e9-token-of-32-characters!!"]
)
def test_a_weak_or_unsendable_token_is_refused_in_one_line(token):
    with pytest.raises(ConfigurationError, match="the token") as refused:
        ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats, token=token)
    assert "\n" not in str(refused.value) and (not token or token not in str(refused.value))


async def _dropped(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it dropped the connection (b"" for nothing at all)."""
    try:
        return await asyncio.wait_for(reader.read(), 30)
    except ConnectionError:
        return b""


def test_a_client_that_does_not_finish_its_head_or_body_is_dropped_unanswered():
    async def go() -> list[bytes]:
        server = ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats)
        _, port = await server.start("127.0.0.1", 0)
        try:
            half_head = await asyncio.open_connection("127.0.0.1", port)
            half_head[1].write(b"GET /healthz HTTP/1.1\r\nHost: x")
            half_body = await asyncio.open_connection("127.0.0.1", port)
            half_body[1].write(b"GET /healthz HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc")
            said = await asyncio.gather(_dropped(half_head[0]), _dropped(half_body[0]))
            half_head[1].close()
            half_body[1].close()
            assert server.open_connections == 0
            return list(said)
        finally:
            await server.close()

    assert asyncio.run(go()) == [b"", b""]


def test_past_the_cap_the_oldest_waiting_client_makes_way_and_the_cap_holds():
    cap = 8

    async def go() -> list[bytes]:
        server = ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, _stats, max_connections=cap)
        _, port = await server.start("127.0.0.1", 0)
        try:
            # Three times the cap of clients that send nothing after their first bytes, then
            # probes: each probe is served, and the server never holds more than the cap.
            stalled = []
            for _ in range(3 * cap):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /heal")
                stalled.append((reader, writer))
                await asyncio.sleep(0.01)
                assert server.open_connections <= cap
            answers = []
            for _ in range(5):
                answers.append(await _exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n"))
                assert server.open_connections <= cap
            # The oldest made way: their connections ended without an answer.
            first = await asyncio.gather(*(_dropped(r) for r, _ in stalled[: 2 * cap]))
            assert first == [b""] * (2 * cap)
            for _, writer in stalled:
                writer.close()
            return answers
        finally:
            await server.close()

    assert [_status(a) for a in asyncio.run(go())] == [200] * 5


def test_past_the_cap_a_new_client_is_closed_at_once_while_every_one_is_answered():
    cap = 4
    release = asyncio.Event()

    async def slow_stats() -> dict[str, Any]:
        await release.wait()  # the worker reads its queues' depths: the exchange is ours
        return STATS

    async def go() -> tuple[list[bytes], bytes]:
        server = ProbeServer(WorkerMetrics("w", 2, ()), lambda: OK, slow_stats, max_connections=cap)
        _, port = await server.start("127.0.0.1", 0)
        try:
            waiting = [
                asyncio.create_task(_exchange(port, b"GET /stats HTTP/1.1\r\n\r\n"))
                for _ in range(cap)
            ]
            for _ in range(500):  # until each is being answered
                await asyncio.sleep(0.01)
                if server.open_connections == cap:
                    break
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            turned_away = await _dropped(reader)
            writer.close()
            release.set()
            return await asyncio.gather(*waiting), turned_away
        finally:
            await server.close()

    answered, turned_away = asyncio.run(go())
    assert [_status(a) for a in answered] == [200] * cap
    assert turned_away == b""


def test_a_refused_head_request_has_no_body_either():
    missing, wrong = _serve(
        OK, b"HEAD /nope HTTP/1.1\r\n\r\n", b"HEAD /metrics HTTP/1.1\r\n\r\n", token=TOKEN
    )
    assert (_status(missing), _status(wrong)) == (404, 401)
    assert missing.endswith(b"\r\n\r\n") and wrong.endswith(b"\r\n\r\n")
