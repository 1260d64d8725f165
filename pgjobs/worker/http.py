"""A worker's own HTTP endpoint (`pgjobs work --http HOST:PORT`, or ``$PORT``): ``/metrics`` in
Prometheus' text format (``pgjobs.worker.metrics``), ``/healthz`` (the claim loop is alive),
``/readyz`` (schema checked, database connected) and ``/stats`` (JSON: the worker's slots and
the jobs in them, its queues' depths).

A small HTTP/1.1 server on the worker's event loop (``asyncio.start_server``), without a web
framework or a metrics library, so that a plain worker loads neither: one request per
connection, ``GET`` and ``HEAD`` only, a request head of at most ``MAX_REQUEST_HEAD`` bytes read
within ``REQUEST_TIMEOUT`` seconds, at most ``MAX_CONNECTIONS`` at once. A slow or hostile
client is cut off; it cannot hold the worker up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError
from pgjobs.worker.metrics import WorkerMetrics

log = logging.getLogger("pgjobs.worker")

#: Bytes of a request's line and headers read at most; a longer request is refused (431).
MAX_REQUEST_HEAD = 8 * 1024
#: Header lines of a request read at most.
MAX_REQUEST_HEADERS = 100
#: Seconds a client has to send its request and read the answer.
REQUEST_TIMEOUT = 10.0
#: Connections served at once; more are closed at once (a scraper needs one).
MAX_CONNECTIONS = 32


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:9090``, ``[::1]:9090``, ``localhost:0``) as (host, port);
    port 0 picks a free port. Anything else is a ``ConfigurationError``.

    Example: ``parse_address("[::1]:9090") == ("::1", 9090)``
    """
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address must be bracketed: [::1]:9090
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(
            f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9090 or [::1]:9090 "
            "(port 0..65535)",
            field="http",
        )
    if not host.isascii() or not host.isprintable() or " " in host:
        raise ConfigurationError(f"--http {text!r}: not a host name or address", field="http")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class ProbeState:
    """What the worker says about itself at the moment of a request."""

    busy: int
    connected: bool
    #: None when ready, else why not ("starting", "database unreachable", "stopping").
    not_ready: str | None
    #: None when the claim loop is alive, else why not.
    unhealthy: str | None


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
#: The paths the endpoint serves.
PATHS = ("/metrics", "/healthz", "/readyz", "/stats")
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _BadRequest(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class ProbeServer:
    """Serves ``/metrics``, ``/healthz``, ``/readyz`` and ``/stats`` for one worker.

    Example::

        server = ProbeServer(metrics, worker.probe_state, worker.stats)
        host, port = await server.start("127.0.0.1", 9090)
        ...
        await server.close()
    """

    def __init__(
        self,
        metrics: WorkerMetrics,
        state: Callable[[], ProbeState],
        stats: Callable[[], Awaitable[dict[str, Any]]],
    ) -> None:
        self.metrics = metrics
        self._state = state
        self._stats = stats
        self._server: asyncio.Server | None = None
        self._open = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host``:``port``; returns the address bound (the port chosen for 0).
        An address in use or not available is a ``ConfigurationError``."""
        try:
            self._server = await asyncio.start_server(
                self._serve, host, port, limit=MAX_REQUEST_HEAD
            )
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConfigurationError(
                f"--http {address_text(host, port)}: cannot listen there: "
                f"{reason[:1].lower()}{reason[1:]}",
                field="http",
            ) from None
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._open += 1
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                try:
                    method, path = await _read_request(reader)
                    status, content_type, body, extra = await self._answer(method, path)
                except _BadRequest as bad:
                    method, extra = "GET", {"Allow": "GET, HEAD"} if bad.status == 405 else {}
                    status, content_type = bad.status, "application/json"
                    body = _error_body(bad.code, str(bad))
                writer.write(_response(status, content_type, body, extra, head=method == "HEAD"))
                await writer.drain()
            writer.close()
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.transport.abort()  # a client too slow or gone: no more of our time
        except Exception:  # a bug here must not end the worker
            log.exception("--http: could not answer a request")
            writer.transport.abort()
        finally:
            self._open -= 1

    async def _answer(self, method: str, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        if path not in PATHS:
            raise _BadRequest(404, "not_found", f"no such path: {path[:100]}; try /metrics")
        if method not in ("GET", "HEAD"):
            raise _BadRequest(405, "method_not_allowed", f"{method[:20]} is not allowed here")
        if path == "/stats":
            return 200, "application/json", json.dumps(await self._stats()).encode(), {}
        state = self._state()
        if path == "/metrics":
            text = self.metrics.render(busy=state.busy, connected=state.connected)
            return 200, _METRICS_TYPE, text.encode(), {}
        problem = state.unhealthy if path == "/healthz" else state.not_ready
        if path == "/readyz" and problem is None:
            problem = state.unhealthy
        status = (
            {"status": "ok"} if problem is None else {"status": "unavailable", "reason": problem}
        )
        body = json.dumps({**status, "worker": self.metrics.worker}).encode()
        extra = {} if problem is None else {"Retry-After": "5"}
        return (200 if problem is None else 503), "application/json", body, extra


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """(method, path) of a request; its headers are read (and bounded) but not used."""
    line = await _request_line(reader)
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise _BadRequest(400, "bad_request", "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if version.startswith("HTTP/") and version[5:6].isdigit():
            raise _BadRequest(505, "http_version", f"{version[:20]} is not served; use HTTP/1.1")
        raise _BadRequest(400, "bad_request", "malformed request line")
    try:
        path = urlsplit(target).path
    except ValueError:
        raise _BadRequest(400, "bad_request", "malformed request target") from None
    if not path.startswith("/"):
        raise _BadRequest(400, "bad_request", "malformed request target")
    size = len(line)
    for _ in range(MAX_REQUEST_HEADERS):
        header = await _request_line(reader)
        if not header:
            return method, path
        size += len(header)
        if size > MAX_REQUEST_HEAD:
            break
        if ":" not in header:
            raise _BadRequest(400, "bad_request", "malformed header line")
    raise _BadRequest(431, "request_too_large", f"request head over {MAX_REQUEST_HEAD} bytes")


async def _request_line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(
            431, "request_too_large", f"request line over {MAX_REQUEST_HEAD} bytes"
        ) from None
    try:
        return raw.rstrip(b"\r\n").decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest(400, "bad_request", "request head is not ASCII") from None


def _error_body(code: str, message: str) -> bytes:
    # The shape of every error pgjobs answers over HTTP.
    return json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()


def _response(
    status: int, content_type: str, body: bytes, extra: dict[str, str], *, head: bool
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body)


def address_text(host: str, port: int) -> str:
    """``host:port``, the host bracketed when it is an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
