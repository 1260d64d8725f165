"""`pgjobs serve`'s uvicorn, hardened against slow and noisy clients: a deadline for each
request's headers, a bound on open connections, and logs that a flood cannot fill.

uvicorn times out idle keep-alive connections only: a client that sends its headers a byte at a
time (slowloris) holds its connection for ever. Here every connection has ``header_timeout``
seconds to send each request's headers; and at ``max_connections`` a new connection takes the
place of the oldest one still waiting for its headers (a client that sends a whole request at
once is never that one), or is closed at once when every connection is busy with a request.
The body has its own deadline, in the guards (``pgjobs.web.guards``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from pgjobs.web.protocol import JsonErrorsH11Protocol

logger = logging.getLogger("pgjobs.web.serving")

#: Seconds a connection has to send a request's headers.
DEFAULT_HEADER_TIMEOUT = 10.0
#: Connections open at once at most.
DEFAULT_MAX_CONNECTIONS = 1000
#: Log lines of one kind let through per interval: (lines, seconds). Access lines are one kind.
ACCESS_LOG_RATE = (50, 1.0)
OTHER_LOG_RATE = (10, 10.0)


def guarded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a headers deadline and a bound on connections."""
    # The connections waiting for a request's headers, oldest first (a dict keeps order).
    waiting: dict[GuardedH11, None] = {}

    class GuardedH11(JsonErrorsH11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:  # every connection is busy with a request: refuse this one
                    logger.warning("refused a connection: %d connections are open", max_connections)
                    transport.close()
                    return
                oldest.close_slow(
                    "it waited longest for its headers when the connection limit was reached"
                )
            self._await_headers()

        def _await_headers(self) -> None:
            self._headers_arrived()
            waiting[self] = None
            self._header_timer = self.loop.call_later(
                header_timeout,
                self.close_slow,
                f"it sent no complete request headers within {header_timeout:g} s",
            )

        def _headers_arrived(self) -> None:
            waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers are complete
                self._headers_arrived()

        def on_response_complete(self) -> None:
            # Armed first: the parent may start a pipelined request, whose headers have arrived.
            self._await_headers()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_arrived()
            super().connection_lost(exc)

        def close_slow(self, why: str) -> None:
            self._headers_arrived()
            if not self.transport.is_closing():
                logger.warning("closed a connection: %s", why)
                self.transport.close()

    return GuardedH11


@dataclass(slots=True)
class _Window:
    start: float
    passed: int = 0
    dropped: int = 0


class LogThrottle(logging.Filter):
    """Lets ``lines`` records of one kind (logger and message template) through per
    ``seconds``: the last one let through says that more are being counted, and the first one of
    the next interval (or ``report``, when the server stops) says how many were dropped.

    Example: ``handler.addFilter(LogThrottle(10, 10.0))``.
    """

    #: Kinds remembered at most (templates are few; this bounds a logger that formats its own).
    MAX_KINDS = 1000

    def __init__(
        self, lines: int, seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.lines, self.seconds, self._clock = lines, seconds, clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind, now = (record.name, str(record.msg)), self._clock()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self.seconds:
            dropped = window.dropped if window is not None else 0
            if len(self._windows) >= self.MAX_KINDS:
                self._windows.clear()
            window = self._windows[kind] = _Window(now)
            if dropped:
                # No "%" added: the message is still formatted with the record's arguments.
                record.msg = f"{record.msg} [and {dropped} more like it, not logged]"
        if window.passed >= self.lines:
            window.dropped += 1
            return False
        window.passed += 1
        if window.passed == self.lines:
            record.msg = (
                f"{record.msg} [more like it in the next {self.seconds:g} s are counted, "
                "not logged]"
            )
        return True

    def report(self) -> list[str]:
        """What was dropped and not yet said, one line per kind (the server is stopping)."""
        said = [
            f"{name}: {window.dropped} more lines like {template!r} were not logged"
            for (name, template), window in self._windows.items()
            if window.dropped
        ]
        self._windows.clear()
        return said


def throttle_logs() -> list[LogThrottle]:
    """Put a ``LogThrottle`` on every handler that writes what `pgjobs serve` logs."""
    access = logging.getLogger("uvicorn.access").handlers
    added = []
    for handler in logging.getLogger().handlers + logging.getLogger("uvicorn").handlers + access:
        rate = ACCESS_LOG_RATE if handler in access else OTHER_LOG_RATE
        added.append(LogThrottle(*rate))
        handler.addFilter(added[-1])
    return added


def settle_heap() -> None:
    """Collect once, then freeze what exists: the application, its routes and models live as
    long as the process, and a full collection walked all of them (about 84,000 objects: 20 ms
    on a quiet machine, 54 ms seen under load), stalling every request in flight. Frozen, the
    collector never walks them again; what requests leave behind it still collects."""
    gc.collect()
    gc.freeze()


def serve(
    web: Any,
    *,
    host: str,
    port: int,
    log_level: str,
    root_path: str,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Run ``web`` on uvicorn until it is stopped (SIGINT, SIGTERM)."""
    config = uvicorn.Config(
        web,
        host=host,
        port=port,
        log_level=log_level,
        server_header=False,
        root_path=root_path,
        http=guarded_protocol(header_timeout, max_connections),
    )
    throttles = throttle_logs()  # after Config, which configures uvicorn's logging
    settle_heap()
    try:
        uvicorn.Server(config).run()
    finally:
        for throttle in throttles:
            for line in throttle.report():
                logger.warning("%s", line)
