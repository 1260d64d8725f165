"""External tasks: a worker delivers each job to a downstream HTTP service instead of running a
Python handler, and the service reports the outcome later (``pgjobs.admin.report_outcome``, or
``POST /api/v1/jobs/{id}/outcome`` on `pgjobs serve`).

A delivery is one ``POST`` of the job as JSON, over a connection of its own (``Connection:
close``), on the worker's event loop (asyncio streams; no thread, no HTTP library: the worker
imports nothing the web extra brings). ``timeout`` bounds the whole delivery: connecting, TLS,
sending, and reading the answer's status line and headers. A 2xx answer means the downstream took
the job: it stays running under its lease, which is the downstream's deadline to report. Anything
else (another status, a timeout, a refused connection, a name that does not resolve, a TLS
failure) raises ``DeliveryFailed``, a failed attempt like a handler's exception.

Redirects are not followed (a 3xx is a failed delivery: configure the final URL), and proxies
from the environment are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import ssl
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.models import Job
from pgjobs.targets import (
    DEFAULT_EXTERNAL_TIMEOUT,
    ExternalTarget,
    check_delivery_fits_lease,
    check_headers,
)
from pgjobs.tasks import Task

#: The environment variable holding a bearer token sent as ``Authorization: Bearer ...`` to
#: every downstream whose task and worker set no ``Authorization`` header.
TOKEN_ENV = "PGJOBS_EXTERNAL_TOKEN"
#: Bytes of the downstream's answer head (status line and headers) read at most.
MAX_ANSWER_HEAD = 16 * 1024
#: Bytes of a non-2xx answer's body quoted in the error (when it says how long it is).
MAX_QUOTED_BODY = 200
#: Where the downstream reports the outcome, on `pgjobs serve`.
REPORT_PATH = "/api/v1/jobs/{id}/outcome"


class DeliveryFailed(PgjobsError):
    """A delivery to the downstream failed: the attempt failed (retried with backoff, or
    ``dead_letter`` on the last attempt), with this message as its error."""


# The error type recorded with a failed delivery (``error_type``, ``dead_letter.error_type``) is
# ``pgjobs.external.DeliveryFailed``, as documented and as earlier rows hold it: alerts and
# queries that filter on it keep finding the failures this module records.
DeliveryFailed.__module__ = "pgjobs.external"


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where and how the jobs of one external task are delivered, the task's settings completed
    by the worker's. Built by ``deliveries``."""

    task: str
    url: str
    timeout: float
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    host: str = field(init=False, repr=False)
    port: int = field(init=False, repr=False)
    tls: bool = field(init=False, repr=False)
    #: The request target (path and query) and the Host header.
    target: str = field(init=False, repr=False)
    authority: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        assert parts.hostname is not None  # check_url made sure
        tls = parts.scheme == "https"
        host = parts.hostname
        port = parts.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        default_port = parts.port is None or parts.port == (443 if tls else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        for name, value in (
            ("host", host),
            ("port", port),
            ("tls", tls),
            ("target", target),
            ("authority", shown if default_port else f"{shown}:{port}"),
        ):
            object.__setattr__(self, name, value)

    def defaults(self, user_agent: str) -> list[str]:
        """The User-Agent and Accept lines, unless this delivery's headers set their own."""
        given = {name.lower() for name, _ in self.headers}
        lines = [] if "user-agent" in given else [f"User-Agent: {user_agent}"]
        return lines if "accept" in given else [*lines, "Accept: */*"]

    @property
    def where(self) -> str:
        """The URL without its query string (which may hold a secret), for messages."""
        return self.url.split("?", 1)[0]


def deliveries(
    tasks: Mapping[str, Task],
    defaults: ExternalTarget,
    queues: Collection[str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, Delivery]:
    """The delivery of every external task in ``tasks``: what the task sets, else what
    ``defaults`` (the worker's) set; headers by name, the task's first, then the worker's, then
    ``Authorization: Bearer $PGJOBS_EXTERNAL_TOKEN`` when neither sets one. Refuses a task of
    one of ``queues`` (None: any) left without a URL, and a timeout not shorter than its task's
    lease; a task of another queue without a URL is left out.

    Example: ``deliveries(app.tasks, ExternalTarget(url="http://127.0.0.1:8000/jobs"))``
    """
    token = environ.get(TOKEN_ENV, "").strip()
    if token:
        try:
            check_headers(TOKEN_ENV, [("Authorization", f"Bearer {token}")])
        except ConfigurationError:
            raise ConfigurationError(
                f"${TOKEN_ENV} must be printable ASCII text without line breaks", field="token"
            ) from None
    found = {}
    for name, task in tasks.items():
        if task.external is None:
            continue
        url = task.external.url or defaults.url
        if url is None and queues is not None and task.queue not in queues:
            continue
        if url is None:
            raise ConfigurationError(
                f"external task {name!r} has no URL: declare it with url=... or run the worker "
                "with --external-url",
                field="url",
            )
        timeout = task.external.timeout or defaults.timeout or DEFAULT_EXTERNAL_TIMEOUT
        if task.external.timeout is None:  # the task's own was checked when it was declared
            check_delivery_fits_lease(name, timeout, task.lease)
        headers = dict(_by_name(defaults.headers))
        headers.update(_by_name(task.external.headers))
        if token and "authorization" not in headers:
            headers["authorization"] = ("Authorization", f"Bearer {token}")
        found[name] = Delivery(name, url, timeout, tuple(headers.values()))
    return found


def _by_name(headers: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, str]]:
    return {name.lower(): (name, value) for name, value in headers}


def request_body(job: Job) -> bytes:
    """What a delivery sends: the job as the downstream needs it to work and to report.

    Example: ``{"id": 7, "task": "billing.charge", "payload": {...}, "attempt": 1,
    "max_attempts": 5, "queue": "default", "lease_expires_at": "2030-01-01T00:05:00+00:00",
    "report_url_path": "/api/v1/jobs/7/outcome"}``
    """
    lease = job.lease_expires_at
    return json.dumps(
        {
            "id": job.id,
            "task": job.task,
            "payload": job.payload,
            "attempt": job.attempts,
            "max_attempts": job.max_attempts,
            "queue": job.queue,
            "lease_expires_at": lease.isoformat() if lease is not None else None,
            "report_url_path": REPORT_PATH.format(id=job.id),
        },
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Built once (loading the CA store takes milliseconds): the system's trust store, and
    # $SSL_CERT_FILE / $SSL_CERT_DIR when set, as OpenSSL reads them.
    return ssl.create_default_context()


async def delivery_of(deliveries: Mapping[str, Delivery], job: Job) -> int:
    """Deliver ``job`` as ``deliveries`` (a worker's) say for its task; ``DeliveryFailed`` when
    they hold none for it (a job of a task whose queue this worker does not serve).

    Example: ``await delivery_of(deliveries(app.tasks, ExternalTarget()), job)``
    """
    delivery = deliveries.get(job.task)
    if delivery is None:
        raise DeliveryFailed(
            f"external task {job.task!r} has no URL in this worker: declare it with "
            "url=... or run the worker with --external-url"
        )
    return await deliver(delivery, job)


async def deliver(delivery: Delivery, job: Job, user_agent: str = "pgjobs") -> int:
    """POST ``job`` to its downstream and return the 2xx status it answered; any other outcome
    raises ``DeliveryFailed`` saying what happened (never a header's value).

    Example: ``await deliver(deliveries(app.tasks, ExternalTarget())["billing.charge"], job)``
    """
    body = request_body(job)
    head = [
        f"POST {delivery.target} HTTP/1.1",
        f"Host: {delivery.authority}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        f"Pgjobs-Job-Id: {job.id}",
        f"Pgjobs-Attempt: {job.attempts}",
        *delivery.defaults(user_agent),
        *(f"{name}: {value}" for name, value in delivery.headers),
    ]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body
    try:
        async with asyncio.timeout(delivery.timeout):
            status, reason, quoted = await _exchange(delivery, request)
    except TimeoutError:
        raise DeliveryFailed(
            f"delivery to {delivery.where} timed out after {delivery.timeout:g}s"
        ) from None
    except ssl.SSLError as exc:
        raise DeliveryFailed(f"delivery to {delivery.where}: TLS failed: {_reason(exc)}") from None
    except OSError as exc:  # refused, reset, unreachable, name not resolved
        raise DeliveryFailed(f"delivery to {delivery.where} failed: {_reason(exc)}") from None
    if 200 <= status < 300:
        return status
    said = f": {quoted}" if quoted else ""
    raise DeliveryFailed(f"delivery to {delivery.where} answered HTTP {status} {reason}{said}")


async def _exchange(delivery: Delivery, request: bytes) -> tuple[int, str, str]:
    """Send ``request`` and read the answer's status, reason and (for a non-2xx answer that
    says its length) the start of its body."""
    tls: dict[str, Any] = {"ssl": _tls_context()} if delivery.tls else {}
    reader, writer = await asyncio.open_connection(
        delivery.host, delivery.port, limit=MAX_ANSWER_HEAD, **tls
    )
    try:
        writer.write(request)
        await writer.drain()
        while True:
            status, reason = _status_line(await _line(reader, delivery), delivery)
            headers = await _headers(reader, delivery)
            if not 100 <= status < 200:
                break  # interim answers (100 Continue, 103 Early Hints) come before the real one
        quoted = ""
        length = headers.get("content-length", "")
        if not 200 <= status < 300 and _digits(length) and int(length) > 0:
            with contextlib.suppress(asyncio.IncompleteReadError):
                raw = await reader.readexactly(min(int(length), MAX_QUOTED_BODY))
                quoted = " ".join(raw.decode("utf-8", "replace").split())[:MAX_QUOTED_BODY]
        return status, reason, quoted
    finally:
        writer.transport.abort()  # the answer is read: nothing more to say or wait for


async def _line(reader: asyncio.StreamReader, delivery: Delivery) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        raise DeliveryFailed(
            f"delivery to {delivery.where}: the connection closed before a full answer"
        ) from None
    except asyncio.LimitOverrunError:
        raise DeliveryFailed(
            f"delivery to {delivery.where}: answer line longer than {MAX_ANSWER_HEAD} bytes"
        ) from None
    return line.rstrip(b"\r\n")


def _status_line(line: bytes, delivery: Delivery) -> tuple[int, str]:
    """(status, reason) of ``HTTP/1.1 202 Accepted``; a line that is not one is refused."""
    parts = line.decode("latin-1").split(" ", 2)
    if (
        len(parts) < 2
        or not parts[0].startswith("HTTP/")
        or not (len(parts[1]) == 3 and _digits(parts[1]))
    ):
        raise DeliveryFailed(
            f"delivery to {delivery.where}: not an HTTP answer: {line[:60].decode('latin-1')!r}"
        )
    reason = " ".join(parts[2].split())[:100] if len(parts) > 2 else ""
    return int(parts[1]), reason


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # not "²", which str.isdigit accepts


async def _headers(reader: asyncio.StreamReader, delivery: Delivery) -> dict[str, str]:
    headers: dict[str, str] = {}
    size = 0
    while line := await _line(reader, delivery):
        size += len(line)
        if size > MAX_ANSWER_HEAD:
            raise DeliveryFailed(
                f"delivery to {delivery.where}: answer headers longer than {MAX_ANSWER_HEAD} bytes"
            )
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def _reason(exc: BaseException) -> str:
    """An OS or TLS error in a few words: ``ConnectionRefusedError: [Errno 111] Connect call
    failed ('127.0.0.1', 9)`` reads as ``connection refused``."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted ({exc.verify_message})"
    text = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe(deliveries: Mapping[str, Delivery]) -> list[str]:
    """One line per external task, for the worker's start-up log: task, URL (no query string),
    timeout, and the names of the headers sent (never their values).

    Example: ``['billing.charge -> https://billing.internal/jobs (timeout 10s, headers:
    Authorization)']``
    """
    lines = []
    for name, delivery in deliveries.items():
        headers = ", ".join(header for header, _ in delivery.headers) or "none"
        lines.append(
            f"{name} -> {delivery.where} (timeout {delivery.timeout:g}s, headers: {headers})"
        )
    return lines
