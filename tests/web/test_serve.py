"""`pgjobs serve` as a real process on uvicorn: it answers, refuses to start without a token
unless told it is insecure (and then says so), keeps tokens out of its output, and holds against
slow and hostile clients (headers and bodies that never end, more connections than allowed,
writes without a token, floods of bad requests) with a log of a few lines."""

from __future__ import annotations

import gc
import logging
import re
import socket

import httpx
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st

from pgjobs.db.dsn import Dsn
from pgjobs.web import serving
from pgjobs.web.serving import LogThrottle
from tests.support.helpers import pgjobs_process, run_pgjobs, wait_until
from tests.web.conftest import READ_TOKEN, TOKEN

#: How `pgjobs serve` ends on SIGTERM: a graceful shutdown, exit 0.
STOPPED = (0,)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, **kwargs: object) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError:
        return None


def test_serve_answers_with_tokens_and_never_prints_them(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "PGJOBS_API_TOKENS": TOKEN, "PGJOBS_API_READ_TOKENS": READ_TOKEN}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with pgjobs_process(env, "serve", "--port", str(port), "--pool-size", "2") as server:
        health = wait_until(
            lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server]
        )
        assert health.json() == {"status": "ok"}
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        created = httpx.post(f"{base}/api/v1/jobs", json={"task": "t"}, headers=auth)
        assert created.status_code == 201, created.text
        read = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert httpx.get(f"{base}/api/v1/jobs", headers=read).status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs").status_code == 401
        assert server.stop() in STOPPED
        output = server.out() + server.err()
    assert "/api/v1/jobs" in output  # the access log was on
    for token in (TOKEN, READ_TOKEN):
        assert token not in output


def test_serve_refuses_to_start_without_a_token(subprocess_env: dict[str, str]) -> None:
    result = run_pgjobs(subprocess_env, "serve", "--port", str(_free_port()))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("pgjobs: error: no API token")
    assert "--insecure-no-auth" in lines[0]


def test_serve_insecure_says_so_on_start(subprocess_env: dict[str, str]) -> None:
    port = _free_port()
    with pgjobs_process(
        subprocess_env, "serve", "--port", str(port), "--insecure-no-auth", "--pool-size", "1"
    ) as server:
        wait_until(
            lambda: _get(f"http://127.0.0.1:{port}/healthz"),
            timeout=30,
            what="/healthz",
            procs=[server],
        )
        created = httpx.post(f"http://127.0.0.1:{port}/api/v1/jobs", json={"task": "t"})
        assert created.status_code == 201
        assert server.stop() in STOPPED
        assert "WITHOUT AUTHENTICATION" in server.err()


def test_serve_behind_a_proxy_prefix_links_under_it(subprocess_env: dict[str, str]) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ("serve", "--port", str(port), "--insecure-no-auth", "--root-path", "/pgjobs")
    with pgjobs_process(subprocess_env, *args, "--pool-size", "1") as server:
        wait_until(lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server])
        # The proxy strips the prefix; the pages link under it.
        page = httpx.get(f"{base}/dead")
        assert page.status_code == 200, page.text
        assert 'href="/pgjobs/jobs' in page.text
        assert server.stop() in STOPPED
    result = run_pgjobs(subprocess_env, "serve", "--insecure-no-auth", "--root-path", "pgjobs/")
    assert result.returncode == 2
    assert result.stderr.startswith("pgjobs: error: --root-path") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("named_by", ["--app", "PGJOBS_APP"])
def test_serve_with_an_app_accepts_only_its_tasks(
    subprocess_env: dict[str, str], dsn: Dsn, named_by: str
) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ("serve", "--port", str(port), "--insecure-no-auth", "--pool-size", "1")
    env = {**subprocess_env, "PGJOBS_DATABASE_URL": ""}
    app: tuple[str, ...] = ("--dsn", dsn.url)
    if named_by == "--app":
        app += ("--app", "tests.integration.cli_app:app")
    else:
        env["PGJOBS_APP"] = "tests.integration.cli_app:app"
    with pgjobs_process(env, *args, *app) as server:
        wait_until(lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server])
        unknown = httpx.post(f"{base}/api/v1/jobs", json={"task": "cli.nope"})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "unknown_task"
        known = httpx.post(
            f"{base}/api/v1/jobs", json={"task": "cli.shout", "payload": {"text": "a"}}
        )
        assert known.status_code == 201, known.text
        assert known.json()["queue"] == "loud"  # the task's default
        server.stop()


def test_serve_bad_options_are_one_line(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "PGJOBS_API_TOKENS": "short"}
    result = run_pgjobs(env, "serve", "--port", str(_free_port()))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "at least 16" in result.stderr
    assert "short" not in result.stderr.replace("characters long", "")
    result = run_pgjobs(subprocess_env, "serve", "--insecure-no-auth", "--app", "no.such:app")
    assert result.returncode == 2
    assert result.stderr.startswith("pgjobs: error: --app") and result.stderr.count("\n") == 1


def _raw(port: int, request: bytes) -> socket.socket:
    """A connection that has sent ``request`` (or part of one) and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(request)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (it is read without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _count_closed(socks: list[socket.socket]) -> int:
    return sum(_closed(sock) for sock in socks)


def _answer(sock: socket.socket) -> bytes:
    """What the server answers on ``sock`` up to the end of the response's headers (the socket's
    timeout bounds the wait: a server that waits for a body never sent answers nothing)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_slow_and_hostile_clients_neither_stop_nor_flood_the_server(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "PGJOBS_API_TOKENS": TOKEN}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ("serve", "--port", str(port), "--pool-size", "1", "--max-connections", "20")
    limits = ("--header-timeout", "30", "--body-timeout", "2")
    with pgjobs_process(env, *args, *limits) as server:
        wait_until(lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server])
        # Twice as many connections as allowed, each stuck in the middle of its headers.
        slow = [_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(40)]
        try:
            # Beyond the bound the oldest ones waiting for their headers make room (long before
            # the header timeout), a whole request still gets its answer, and the header
            # timeout closes the rest.
            wait_until(lambda: _count_closed(slow) >= 20, timeout=20, what="20 closed at the bound")
            assert httpx.get(f"{base}/healthz", timeout=20).status_code == 200
            wait_until(lambda: _count_closed(slow) == 40, timeout=60, what="all slow ones closed")
        finally:
            for sock in slow:
                sock.close()
        # A write without a valid token is refused before its body is read: the body never
        # comes, the answer does (long before the body timeout).
        head = b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with _raw(port, head + b"Content-Length: 100000\r\n\r\n") as sock:
            assert _answer(sock).startswith(b"HTTP/1.1 401 ")
        # So is a dashboard form posted by nobody signed in (the page says: sign in first).
        form = b"POST /dead/bulk HTTP/1.1\r\nHost: x\r\n"
        form += b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n"
        with _raw(port, form + b"Cookie: pgjobs_session=" + b"x" * 43 + b"\r\n\r\n") as sock:
            assert _answer(sock).startswith(b"HTTP/1.1 403 ")
        # With a token, a body that stops arriving is cut off after the body timeout.
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        with _raw(port, head + auth + b'Content-Length: 100\r\n\r\n{"task"') as sock:
            assert _answer(sock).startswith(b"HTTP/1.1 408 ")
        # Hostile requests by the hundred: each is refused, and the log stays a few lines.
        for _ in range(200):
            with _raw(port, b"NOT HTTP AT ALL\r\n\r\n") as sock:
                _answer(sock)
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert server.stop() in STOPPED
        log = server.err()
    assert log.count("Invalid HTTP request received.") <= 20, log
    assert "more like it in the next 10 s are counted, not logged" in log
    assert "more lines like 'Invalid HTTP request received.' were not logged" in log
    assert log.count("closed a connection") <= 30, log  # two kinds, 10 each, and their counts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 5)), max_size=300))
def test_the_log_throttle_lets_few_lines_through_and_counts_the_rest(
    records: list[tuple[str, float]],
) -> None:
    now = [0.0]
    throttle = LogThrottle(3, 10.0, clock=lambda: now[0])
    passed: dict[tuple[str, int], int] = {}
    dropped = 0
    said = 0
    for kind, later in records:
        now[0] += later
        record = logging.LogRecord("x", logging.WARNING, "", 0, kind, None, None)
        if throttle.filter(record):
            key = (kind, int(now[0] // 10))
            passed[key] = passed.get(key, 0) + 1
            found = re.search(r"and (\d+) more like it", str(record.msg))
            said += int(found.group(1)) if found else 0
        else:
            dropped += 1
    # Never more than 3 lines of a kind in an interval (two intervals may share a 10 s slot).
    assert all(count <= 6 for count in passed.values())
    reported = sum(int(line.split()[1]) for line in throttle.report())
    assert said + reported == dropped


def test_serve_timeouts_must_be_finite(subprocess_env: dict[str, str]) -> None:
    for option in ("--header-timeout", "--body-timeout"):
        for value in ("inf", "nan", "0"):
            result = run_pgjobs(subprocess_env, "serve", "--insecure-no-auth", option, value)
            assert result.returncode == 2, result.stderr
            assert result.stderr.count("\n") == 1 and option in result.stderr, result.stderr


def test_serve_collects_and_freezes_what_exists_before_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The application and everything built before it are frozen when uvicorn starts, so that no
    full collection walks them while requests are in flight (each one stalled every request)."""
    built = [{"route": n} for n in range(10_000)]  # long-lived, as an application's routes
    frozen: list[int] = []

    class Server:
        def __init__(self, config: object) -> None:
            pass

        def run(self) -> None:
            frozen.append(gc.get_freeze_count())

    monkeypatch.setattr(uvicorn, "Server", Server)
    gc.unfreeze()
    try:
        serving.serve(built, host="127.0.0.1", port=0, log_level="warning", root_path="")
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] >= len(built)
