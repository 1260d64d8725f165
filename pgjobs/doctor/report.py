"""The shapes of a `pgjobs doctor` run: a ``Check``'s verdict and ``Status``, the whole
``Report``, and what the caller tunes (``Plan``, ``Thresholds``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import CONNECTIONS as SERVICE_CONNECTIONS

#: Connections one `pgjobs work` process holds at most: two claim connections (one when its
#: concurrency is 1), one LISTEN connection and the maintenance services' shared connections.
WORKER_CONNECTIONS = 2 + 1 + SERVICE_CONNECTIONS


class Status(enum.StrEnum):
    """How a check came out. ``skip``: it could not run (the tables it reads are missing)."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: ``message`` says what was found, ``fix`` what to do (None on a pass),
    ``details`` the figures behind it (JSON-ready, times as datetimes)."""

    name: str
    status: Status
    message: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "message": self.message,
            "fix": self.fix,
            "details": self.details,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """Planning inputs of the connection budget: ``workers`` `pgjobs work` processes holding
    ``connections_per_worker`` connections each. ``workers`` None: judge the live workers.

    Example: ``Plan(workers=12)`` asks whether twelve workers fit in ``max_connections``.
    """

    workers: int | None = None
    connections_per_worker: int | None = None

    def __post_init__(self) -> None:
        for name, value in (
            ("workers", self.workers),
            ("connections_per_worker", self.connections_per_worker),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(
                    f"{name} must be a whole number, got {value!r}", field=name
                )
        if self.workers is not None and self.workers < 0:
            raise ConfigurationError(f"workers must be >= 0, got {self.workers}", field="workers")
        if self.connections_per_worker is not None:
            if self.workers is None:
                raise ConfigurationError(
                    "connections per worker is a planning input: give the number of workers too",
                    field="connections_per_worker",
                )
            if self.connections_per_worker < 1:
                raise ConfigurationError(
                    f"connections per worker must be >= 1, got {self.connections_per_worker}",
                    field="connections_per_worker",
                )

    @property
    def per_worker(self) -> int:
        return self.connections_per_worker or WORKER_CONNECTIONS


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where a check turns from pass to warn (or fail)."""

    #: Seconds a transaction may stay open before it counts as holding back vacuum.
    long_transaction: float = 300.0
    #: Dead rows per live row of queued_jobs above which it needs a vacuum, once it has at least
    #: ``dead_rows`` dead rows (a few dead rows in a small table are nothing).
    dead_ratio: float = 0.2
    dead_rows: int = 1000
    #: Share of the NOTIFY queue in use: warn, fail.
    notify_warn: float = 0.5
    notify_fail: float = 0.9
    #: Share of the available connections in use (or planned) above which the budget is tight.
    budget_warn: float = 0.8
    #: Seconds the pooler check waits for its own NOTIFY to come back.
    listen_timeout: float = 2.0
    #: Days of history (the oldest archived job's age) above which an archive without a
    #: retention policy counts as growing unchecked.
    archive_days: float = 90.0


@dataclass(frozen=True, slots=True)
class Report:
    """Every check of one `pgjobs doctor` run, in order."""

    checks: list[Check]

    def count(self, status: Status) -> int:
        return sum(1 for check in self.checks if check.status is status)

    @property
    def status(self) -> Status:
        """``fail`` if any check failed, else ``warn`` if any warned, else ``pass``."""
        for worst in (Status.FAIL, Status.WARN):
            if self.count(worst):
                return worst
        return Status.PASS

    @property
    def exit_code(self) -> int:
        """1 when a check failed, else 0 (warnings included)."""
        return 1 if self.status is Status.FAIL else 0

    def summary(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "passed": self.count(Status.PASS),
            "warnings": self.count(Status.WARN),
            "failed": self.count(Status.FAIL),
            "skipped": self.count(Status.SKIP),
        }

    def as_json(self) -> dict[str, Any]:
        """What `pgjobs doctor --json` prints: ``{"checks": [...], "summary": {...}}``."""
        return {"checks": [c.as_json() for c in self.checks], "summary": self.summary()}


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: ``42s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
