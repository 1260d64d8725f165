"""How a worker runs: ``WorkerConfig`` and the timing constants of the claim loop."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from pgjobs import instruments
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import ServiceConfig
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.retention_policy import RetentionPolicy, retention_policy
from pgjobs.submission import check_queue
from pgjobs.targets import ExternalTarget
from pgjobs.text import MAX_RESULT_BYTES

#: Seconds a busy worker waits for more slots to free up before its next round trip.
BATCH_WINDOW = 0.005
#: The same while jobs claimed ahead keep its slots busy (outcomes wait at most this long).
FED_BATCH_WINDOW = 0.02
#: Seconds between reconnection attempts after the database went away: rising, capped at 5 s so
#: that a worker is back within 5 s of a failover however long the outage lasted.
RECONNECT_DELAYS = (0.5, 1.0, 2.0, 5.0)
#: Seconds without a turn of the claim loop (or with one round trip in flight) after which
#: `--http`'s /healthz answers 503.
STUCK_AFTER = 60.0
#: Seconds a job claimed ahead of a free slot may wait for one, at the pace the worker's
#: handlers recently finished: what bounds the read-ahead of a worker whose handlers are slow
#: (no job waits long, and a job claimed ahead can never outlive its lease).
READ_AHEAD_WAIT = 0.05
#: Jobs a worker claims ahead per slot unless told otherwise (``WorkerConfig.read_ahead``):
#: enough for round trips of about 230 jobs at --concurrency 32 with quick handlers (a round
#: trip carries about half of the slots and the read-ahead). Each trip's fixed cost on the
#: server (its commit, the statement's executor start) is spread over its jobs: against 8 per
#: slot (trips of about 120), the server's CPU per job is about 0.83x.
READ_AHEAD_PER_SLOT = 16
#: The smallest bound on a result's size a worker takes (bytes): room for the note that says a
#: result was too large.
MIN_RESULT_BYTES = 1024
#: The most jobs a worker may claim ahead.
MAX_READ_AHEAD = 10_000
#: Characters the endpoint's token must have at least: a guessable token is no protection.
MIN_TOKEN_LENGTH = 16


def check_http_token(token: str, source: str) -> str:
    """``token``, the secret ``/metrics`` and ``/stats`` ask for, when it is one: at least
    ``MIN_TOKEN_LENGTH`` characters of printable ASCII without spaces (what an Authorization
    header carries). Else a ``ConfigurationError`` naming ``source`` and never the token.

    Example: ``check_http_token(secrets.token_urlsafe(32), "--http-token")``
    """
    hint = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        size = len(token) if isinstance(token, str) else 0
        raise ConfigurationError(
            f"{source}: the token is {size} characters long; use at least "
            f"{MIN_TOKEN_LENGTH} ({hint})",
            field="http_token",
        )
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ConfigurationError(
            f"{source}: the token holds spaces or characters outside printable ASCII, which an "
            f"Authorization header cannot carry ({hint})",
            field="http_token",
        )
    return token


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs. Times are in seconds."""

    concurrency: int = 8
    #: Queues to work; None means every queue the app's tasks name.
    queues: Sequence[str] | None = None
    #: Longest wait between claims when no NOTIFY arrives (the polling fallback).
    poll_interval: float = 1.0
    #: After SIGTERM/SIGINT, how long running handlers may take to finish.
    grace: float = 30.0
    #: Exit once the worker's queues hold no job (ready, scheduled or running).
    burst: bool = False
    #: Run the lease rescuer, the expirer and the archive partitioner in this worker.
    maintenance: bool = True
    #: Seconds between lease-rescuer rounds (how soon after a lease expires its job is free).
    rescue_interval: float = LeaseRescuer.default_interval
    #: Seconds between expirer rounds.
    expire_interval: float = Expirer.default_interval
    #: The retention policy the worker's retention service applies (``RetentionPolicy.of({...})``),
    #: over the app's own (``App(retention=...)``) key by key: `pgjobs work` passes
    #: ``[tool.pgjobs.retention]`` and its --retain-* flags here. None: the app's alone.
    retention: RetentionPolicy | None = None
    #: (host, port) to serve /metrics, /healthz, /readyz and /stats on; None serves nothing and
    #: counts nothing. Port 0 picks a free port (logged).
    http: tuple[str, int] | None = None
    #: The secret /metrics and /stats ask for (``Authorization: Bearer <token>``), at least 16
    #: characters; None leaves them open. /healthz and /readyz never ask. Never shown in a repr.
    http_token: str | None = field(default=None, repr=False)
    #: Defaults for external tasks: the URL, timeout and headers of the tasks that set none.
    external: ExternalTarget = field(default_factory=ExternalTarget)
    #: Seconds the claim loop may go without turning (or wait on one round trip) before
    #: /healthz reports it stuck.
    stuck_after: float = STUCK_AFTER
    #: The most jobs claimed ahead of free slots while the queues hold a backlog, started as
    #: slots free up (bigger round trips, and handlers that never wait for one); None:
    #: ``READ_AHEAD_PER_SLOT`` per slot. Held to what the worker's handlers start within
    #: ``READ_AHEAD_WAIT`` seconds at their recent pace. 0 claims only for free slots.
    read_ahead: int | None = None
    #: Largest result stored, in bytes of JSON text (at least 1 KiB; by default
    #: ``$PGJOBS_MAX_RESULT_BYTES``, else 1 MiB): a handler that returns more succeeds, and its
    #: result is a note saying so.
    max_result_bytes: int = field(default_factory=lambda: max_result_bytes_from_env())
    #: OpenTelemetry metrics of this worker's jobs (outcomes, run time, pickup latency; see
    #: ``pgjobs.instruments``): False records none, True records through the global meter
    #: provider (the application's SDK), or give a ``MeterProvider``. Needs the ``otel`` extra.
    otel_metrics: object = False

    def __post_init__(self) -> None:
        instruments.check_provider(self.otel_metrics)
        if self.queues is not None:  # in NFC, as enqueue stores them
            object.__setattr__(self, "queues", [check_queue(queue) for queue in self.queues])
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.read_ahead is not None and not 0 <= self.read_ahead <= MAX_READ_AHEAD:
            raise ConfigurationError(
                f"read_ahead must be 0..{MAX_READ_AHEAD}, got {self.read_ahead}",
                field="read_ahead",
            )
        if not isinstance(self.max_result_bytes, int) or self.max_result_bytes < MIN_RESULT_BYTES:
            raise ConfigurationError(
                f"max_result_bytes must be an integer >= {MIN_RESULT_BYTES}, "
                f"got {self.max_result_bytes!r}",
                field="max_result_bytes",
            )
        if not self.poll_interval > 0:
            raise ConfigurationError(f"poll interval must be > 0 seconds, got {self.poll_interval}")
        self.rescuer_config(), self.expirer_config()  # validated as the services will take them
        policy = retention_policy(self.retention, "WorkerConfig(retention=...)")
        object.__setattr__(self, "retention", policy)
        if self.grace < 0:
            raise ConfigurationError(f"grace must be >= 0 seconds, got {self.grace}")
        if self.http is not None:
            host, port = self.http
            if not isinstance(host, str) or not host or not 0 <= port <= 65535:
                raise ConfigurationError(
                    f"http must be (host, port) with port 0..65535, got {self.http!r}",
                    field="http",
                )
        if self.http_token is not None:
            if self.http is None:
                raise ConfigurationError(
                    "http_token protects the endpoint of http: set http too", field="http_token"
                )
            check_http_token(self.http_token, "http_token")
        if not self.stuck_after > self.poll_interval:
            raise ConfigurationError(
                f"stuck_after ({self.stuck_after}s) must exceed the poll interval "
                f"({self.poll_interval}s)"
            )

    @property
    def claim_ahead(self) -> int:
        """``read_ahead`` with its default."""
        if self.read_ahead is None:
            return min(READ_AHEAD_PER_SLOT * self.concurrency, MAX_READ_AHEAD)
        return self.read_ahead

    def rescuer_config(self) -> ServiceConfig:
        return ServiceConfig(interval=self.rescue_interval)

    def expirer_config(self) -> ServiceConfig:
        return ServiceConfig(interval=self.expire_interval)


#: The environment variable that sets ``WorkerConfig.max_result_bytes`` by default (a worker of
#: `pgjobs work` included).
MAX_RESULT_BYTES_ENV = "PGJOBS_MAX_RESULT_BYTES"


def max_result_bytes_from_env() -> int:
    """``$PGJOBS_MAX_RESULT_BYTES`` as a number of bytes, else ``MAX_RESULT_BYTES``; a value that
    is not a whole number is a ``ConfigurationError``."""
    raw = os.environ.get(MAX_RESULT_BYTES_ENV, "").strip()
    if not raw:
        return MAX_RESULT_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(
            f"{MAX_RESULT_BYTES_ENV}={raw!r} is not a whole number of bytes",
            field="max_result_bytes",
        ) from None
