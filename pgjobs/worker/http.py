"""A worker's own HTTP endpoint (`pgjobs work --http [HOST:]PORT`, or ``$PORT``): ``/metrics`` in
Prometheus' text format (``pgjobs.worker.metrics``), ``/healthz`` (the claim loop is alive),
``/readyz`` (schema checked, database connected) and ``/stats`` (JSON: the worker's slots and
the jobs in them, its queues' depths). With a token, ``/metrics`` and ``/stats`` ask for it
(``Authorization: Bearer``); the probes never do.

A small HTTP/1.1 server on the worker's event loop (``asyncio.start_server``), without a web
framework or a metrics library, so that a plain worker loads neither: one request per
connection, ``GET`` and ``HEAD`` only. A request head (at most ``MAX_REQUEST_HEAD`` bytes) must
arrive within ``HEAD_TIMEOUT`` seconds and a declared body (read and discarded) within
``BODY_TIMEOUT``; at most ``MAX_CONNECTIONS`` are open at once. A connection past the cap
takes the place of the oldest one that waits on its client, so that a probe, whose request
arrives with its connection, is served however many clients trickle or stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError
from pgjobs.worker.config import check_http_token
from pgjobs.worker.metrics import WorkerMetrics

log = logging.getLogger("pgjobs.worker")

#: Bytes of a request's line and headers read at most; a longer request is refused (431).
MAX_REQUEST_HEAD = 8 * 1024
#: Header lines of a request read at most.
MAX_REQUEST_HEADERS = 100
#: Bytes of a declared request body read (and discarded: no path takes one) at most; a larger
#: one is refused (413).
MAX_REQUEST_BODY = 64 * 1024
#: Seconds a client has to send its request line and headers; a slower one is dropped.
HEAD_TIMEOUT = 5.0
#: Seconds a client has to send the body it declared; a slower one is dropped.
BODY_TIMEOUT = 5.0
#: Seconds a whole exchange may take, the answer worked out and read by the client included.
REQUEST_TIMEOUT = 15.0
#: Connections open at once (a scraper and the probes need a few). One more takes the place of
#: the oldest that waits on its client, or is closed at once when every one is being answered.
MAX_CONNECTIONS = 32
#: The host a port given alone listens on: the endpoint is for this machine unless told.
DEFAULT_HOST = "127.0.0.1"
#: The paths a token, when set, protects; the probes stay open to the kubelet and its kind.
PROTECTED = ("/metrics", "/stats")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:9090``, ``[::1]:9090``, ``0.0.0.0:9090``, ``localhost:0``) or a
    port alone (``9090``, ``:9090``: on ``DEFAULT_HOST``, this machine only) as (host, port);
    port 0 picks a free port. Anything else is a ``ConfigurationError``.

    Example: ``parse_address("[::1]:9090") == ("::1", 9090)``; ``parse_address("9090") ==
    ("127.0.0.1", 9090)``
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host = DEFAULT_HOST  # a port alone
    elif not host:
        host = DEFAULT_HOST  # ":9090"
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address must be bracketed: [::1]:9090
    if not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(
            f"--http {text!r}: expected [HOST:]PORT, e.g. 9090 (this machine only), "
            "0.0.0.0:9090 or [::1]:9090 (port 0..65535)",
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
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
#: The paths the endpoint serves.
PATHS = ("/metrics", "/healthz", "/readyz", "/stats")
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _BadRequest(Exception):
    def __init__(
        self, status: int, code: str, message: str, extra: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra or {}


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    #: The Authorization header's value, if any.
    authorization: str | None
    #: Bytes of body the request declared (Content-Length).
    body: int


@dataclass(slots=True, eq=False)
class _Connection:
    transport: asyncio.WriteTransport
    #: True while the exchange waits on the client (its request, or its reading of the answer);
    #: False while the worker works out the answer. Only a connection that waits gives way.
    waiting: bool = field(default=True)


class ProbeServer:
    """Serves ``/metrics``, ``/healthz``, ``/readyz`` and ``/stats`` for one worker; with
    ``token``, ``/metrics`` and ``/stats`` answer only a request that presents it.

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
        *,
        token: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.metrics = metrics
        self._state = state
        self._stats = stats
        # Only the token's digest is kept; digests are compared in constant time.
        self._token = None if token is None else _digest(check_http_token(token, "the token"))
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        #: The open connections, oldest first.
        self._open: dict[_Connection, None] = {}

    @property
    def open_connections(self) -> int:
        """Connections open at this moment (at most ``max_connections``)."""
        return len(self._open)

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
            for connection in list(self._open):
                connection.transport.abort()
            self._open.clear()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def _admit(self, connection: _Connection) -> bool:
        """Count ``connection`` in, in place of the oldest that waits on its client when the
        cap is reached; False when every open connection is being answered."""
        if len(self._open) >= self.max_connections:
            oldest = next((c for c in self._open if c.waiting), None)
            if oldest is None:
                return False
            del self._open[oldest]
            oldest.transport.abort()  # its exchange ends at its next read or write
        self._open[connection] = None
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer.transport)
        if not self._admit(connection):
            writer.transport.abort()
            return
        method = "GET"  # until the request line says otherwise (a HEAD's answer has no body)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                try:
                    async with asyncio.timeout(HEAD_TIMEOUT):
                        request = await _read_request(reader)
                    method = request.method
                    if request.body:
                        async with asyncio.timeout(BODY_TIMEOUT):
                            await reader.readexactly(request.body)
                    connection.waiting = False
                    status, content_type, body, extra = await self._answer(request)
                except _BadRequest as bad:
                    extra = bad.extra
                    status, content_type = bad.status, "application/json"
                    body = _error_body(bad.code, str(bad))
                connection.waiting = True
                writer.write(_response(status, content_type, body, extra, head=method == "HEAD"))
                await writer.drain()
            writer.close()
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.transport.abort()  # a client too slow, gone, or made way: no more of our time
        except Exception:  # a bug here must not end the worker
            log.exception("--http: could not answer a request")
            writer.transport.abort()
        finally:
            self._open.pop(connection, None)

    async def _answer(self, request: _Request) -> tuple[int, str, bytes, dict[str, str]]:
        method, path = request.method, request.path
        if path not in PATHS:
            raise _BadRequest(404, "not_found", f"no such path: {path[:100]}; try /metrics")
        if method not in ("GET", "HEAD"):
            raise _BadRequest(
                405,
                "method_not_allowed",
                f"{method[:20]} is not allowed here",
                {"Allow": "GET, HEAD"},
            )
        if path in PROTECTED:
            self._authenticate(path, request.authorization)
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

    def _authenticate(self, path: str, authorization: str | None) -> None:
        """Nothing when no token is set or the request presents it; else 401."""
        if self._token is None:
            return
        scheme, _, presented = (authorization or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            raise _BadRequest(
                401,
                "unauthenticated",
                f"{path} needs this worker's token: send the header Authorization: Bearer <token>",
                {"WWW-Authenticate": 'Bearer realm="pgjobs"'},
            )
        import hmac  # with hashlib, only for a worker given a token

        if not hmac.compare_digest(_digest(presented), self._token):
            raise _BadRequest(
                401,
                "unauthenticated",
                "the bearer token is not this worker's token",
                {"WWW-Authenticate": 'Bearer realm="pgjobs", error="invalid_token"'},
            )


def _digest(token: str) -> bytes:
    # Imported only by a worker given a token: hashlib costs a plain worker ~0.7 MiB resident.
    import hashlib

    return hashlib.sha256(token.encode()).digest()


async def _read_request(reader: asyncio.StreamReader) -> _Request:
    """The request's line and the headers the endpoint uses; every header is read and bounded."""
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
    headers: dict[str, str] = {}
    for _ in range(MAX_REQUEST_HEADERS):
        header = await _request_line(reader)
        if not header:
            return _Request(method, path, headers.get("authorization"), _body_length(headers))
        size += len(header)
        if size > MAX_REQUEST_HEAD:
            break
        name, sep, value = header.partition(":")
        if not sep:
            raise _BadRequest(400, "bad_request", "malformed header line")
        name = name.strip().lower()
        if name in ("authorization", "content-length", "transfer-encoding"):
            if name in headers:
                raise _BadRequest(400, "bad_request", f"the {name} header is given twice")
            headers[name] = value.strip()
    raise _BadRequest(431, "request_too_large", f"request head over {MAX_REQUEST_HEAD} bytes")


def _body_length(headers: dict[str, str]) -> int:
    """Bytes of body the request declares: 0 without one; a body the endpoint will not read
    is refused before it is sent."""
    if "transfer-encoding" in headers:
        raise _BadRequest(
            400, "bad_request", "Transfer-Encoding is not accepted here: no path takes a body"
        )
    length = headers.get("content-length", "0")
    if not length.isascii() or not length.isdigit():
        raise _BadRequest(400, "bad_request", "Content-Length is not a number of bytes")
    if int(length) > MAX_REQUEST_BODY:
        raise _BadRequest(
            413,
            "request_too_large",
            f"request body over {MAX_REQUEST_BODY} bytes; no path takes one",
        )
    return int(length)


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
