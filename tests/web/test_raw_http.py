"""`pgjobs serve` over raw sockets: requests that are not HTTP (which uvicorn answers before the
application runs), paths that are not UTF-8, names holding '/' and trailing slashes, each answered
in the API's one error shape (or as a success), never uvicorn's plain text or a bodiless
redirect."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import httpx

from tests.support.helpers import pgjobs_process, wait_until
from tests.web.conftest import TOKEN

AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()

#: Requests h11 cannot parse, each of which uvicorn answered "Invalid HTTP request received."
NOT_HTTP = {
    "garbage request line": b"GARBAGE\r\n\r\n",
    "no target": b"GET HTTP/1.1\r\nHost: x\r\n\r\n",
    "header without a colon": b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    "NUL in a header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "space before the colon": b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n",
    "no Host in HTTP/1.1": b"GET /healthz HTTP/1.1\r\n\r\n",
    "two Hosts": b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    "control byte in the target": b"GET /hea\x01lthz HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad Content-Length": b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
    "two Content-Lengths": (
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"
    ),
    "unknown Transfer-Encoding": (
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
    ),
    "invalid chunk size": (
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is; the status, headers and body of the answer (read until the
    server closes: it does after an error, or as ``Connection: close`` asks)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The server may answer and close before reading the whole request.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        # No half-close: uvicorn takes it for a client gone and drops the answer.
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def _error_code(status: int, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    """(status, code) of an answer in the one error shape (asserted)."""
    assert headers.get("content-type", "").startswith("application/json"), (headers, body)
    document: Any = json.loads(body)
    assert set(document) == {"error"} and set(document["error"]) == {"code", "message", "field"}
    return status, document["error"]["code"]


def test_requests_that_are_not_http_and_odd_paths_answer_the_one_error_shape(
    subprocess_env: dict[str, str],
) -> None:
    port = _free_port()
    env = {**subprocess_env, "PGJOBS_API_TOKENS": TOKEN}
    with pgjobs_process(env, "serve", "--port", str(port), "--pool-size", "2") as server:
        wait_until(
            lambda: _healthy(port), timeout=30, what="pgjobs serve answering", procs=[server]
        )
        answers = {what: _exchange(port, request) for what, request in NOT_HTTP.items()}
        assert {what: answer[0] for what, answer in answers.items()} == dict.fromkeys(answers, 400)
        for answer in answers.values():
            assert _error_code(*answer) == (400, "bad_request"), answer

        def get(path: str, method: str = "GET", body: bytes = b"") -> tuple[int, str]:
            request = (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                + AUTH
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            status, headers, answer = _exchange(port, request)
            if status < 300:
                return status, ""
            return _error_code(status, headers, answer)

        assert get("/api/v1/jobs/") == (404, "not_found")
        assert get("/api/v1/jobs/", "POST", b'{"task": "t"}') == (404, "not_found")
        assert get("/dead/") == (404, "not_found")
        assert get("/api/v1/jobs/%FF", "PUT", b'{"task": "t"}') == (400, "invalid_path")
        assert get("/api/v1/jobs?queue=a%FFb") == (400, "invalid_query")
        assert get("/api/v1/jobs/a%2Fb", "PUT", b'{"task": "t", "queue": "a/b"}') == (201, "")
        assert get("/queues/a%2Fb") == (200, "")
        assert server.stop() in (0,)
        assert "Invalid HTTP request received" in server.err()  # uvicorn still logs them


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
