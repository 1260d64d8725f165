"""What the tests of external tasks share: a downstream HTTP service in a thread of the test
(``http.server``), and a worker run in the test's main thread while a scenario drives it from
another thread."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pgjobs import App
from pgjobs.worker import Worker, WorkerConfig
from tests.support.helpers import wait_until


@dataclass
class Delivery:
    """One request the downstream received."""

    body: dict[str, Any]
    headers: dict[str, str]
    path: str
    #: Every header line as sent, in order (``headers`` keeps the last of a repeated name).
    lines: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Downstream:
    """A downstream service: records every delivery and answers what ``answer`` says for it:
    (status, seconds to wait first). ``before_answer`` runs before the answer is sent (a
    downstream that reports before its 2xx reaches the worker)."""

    url: str = ""
    received: list[Delivery] = field(default_factory=list)
    answer: Callable[[dict[str, Any]], tuple[int, float]] = lambda body: (202, 0.0)
    before_answer: Callable[[dict[str, Any]], None] | None = None
    errors: list[BaseException] = field(default_factory=list)

    def bodies(self) -> list[dict[str, Any]]:
        return [d.body for d in list(self.received)]

    def wait_for(self, n: int, timeout: float = 20) -> list[dict[str, Any]]:
        """Wait until ``n`` deliveries arrived; returns their bodies."""
        wait_until(
            lambda: len(self.received) >= n,
            timeout=timeout,
            what=lambda: f"{n} deliveries (got {self.bodies()})",
        )
        return self.bodies()


@contextlib.contextmanager
def downstream_service(tls: ssl.SSLContext | None = None) -> Iterator[Downstream]:
    """A ``Downstream`` listening on 127.0.0.1 (a free port) until the block ends; over HTTPS
    with ``tls`` (a server context)."""
    service = Downstream()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            lines = list(self.headers.items())
            service.received.append(Delivery(body, dict(lines), self.path, lines))
            status, delay = service.answer(body)
            if delay:
                time.sleep(delay)
            if service.before_answer is not None:
                try:
                    service.before_answer(body)
                except BaseException as exc:
                    service.errors.append(exc)
            payload = b'{"error": "the downstream says no"}' if status >= 300 else b"{}"
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the worker gave up waiting (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    service.url = f"{scheme}://127.0.0.1:{server.server_address[1]}/jobs"
    thread = threading.Thread(target=server.serve_forever, name="downstream", daemon=True)
    thread.start()
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert not service.errors, service.errors


def run_worker_while(
    app: App, scenario: Callable[[Worker], None], **config: Any
) -> tuple[Worker, int]:
    """Run a worker of ``app`` in this thread while ``scenario(worker)`` runs in another; the
    worker stops (``Worker.stop``) when the scenario ends, and what the scenario raised is
    raised here. Returns the worker and its exit code."""
    options: dict[str, Any] = {"poll_interval": 0.05, "maintenance": False, "grace": 10}
    options.update(config)
    worker = Worker(app, WorkerConfig(**options))
    failures: list[BaseException] = []

    def drive() -> None:
        try:
            wait_until(lambda: worker.checked, timeout=30, what="the worker to start")
            scenario(worker)
        except BaseException as exc:
            failures.append(exc)
        finally:
            # Until the worker's loop exists, stop() does nothing: try until it ran.
            while not done.is_set():
                worker.stop()
                done.wait(0.05)

    done = threading.Event()
    thread = threading.Thread(target=drive, name="scenario")
    thread.start()
    try:
        code = worker.run()
    finally:
        done.set()
        thread.join(60)
    if failures:
        raise failures[0]
    return worker, code
