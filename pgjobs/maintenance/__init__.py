"""Background services with one shape: a validated config, ``run_once()`` returning counts,
a jittered interval, and a clean stop. Any number of workers may run them at once: every
statement they send takes its rows with ``FOR UPDATE SKIP LOCKED``."""

from __future__ import annotations

import asyncio
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db
from pgjobs.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError

log = logging.getLogger("pgjobs.maintenance")


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How often a service runs and how much it moves per statement."""

    #: Seconds between runs; 0 disables the service.
    interval: float
    #: Fraction of ``interval`` added or removed at random, so workers do not run in lockstep.
    jitter: float = 0.2
    #: Rows one statement moves at most; a run repeats the statement until less is left.
    batch_size: int = 1000

    def __post_init__(self) -> None:
        if self.interval < 0:
            raise ConfigurationError(f"interval must be >= 0 seconds, got {self.interval}")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {self.batch_size}")

    def next_delay(self) -> float:
        return self.interval * (1 + self.jitter * (2 * random.random() - 1))


class Service(ABC):
    """One periodic maintenance job."""

    name: str

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config

    @abstractmethod
    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        """Do one round of work and return what was done, e.g. ``{"requeued": 3}``."""


async def run_services(services: Sequence[Service], dsn: Dsn, stop: asyncio.Event) -> None:
    """Run ``services`` on one connection of their own until ``stop`` is set.

    A failing round is logged and tried again at the service's next turn.
    """
    enabled = [s for s in services if s.config.interval > 0]
    if not enabled:
        return
    loop = asyncio.get_running_loop()
    # First rounds within a second of start (work left by a crash is found at once), at random
    # so that workers started together do not run in lockstep.
    due = {s.name: loop.time() + min(1.0, s.config.next_delay()) * random.random() for s in enabled}
    conn: psycopg.AsyncConnection[Any] | None = None
    failing: set[str] = set()  # services whose last round failed: log state changes only
    try:
        while not stop.is_set():
            pause = max(0.0, min(due.values()) - loop.time())
            try:
                await asyncio.wait_for(stop.wait(), pause)
                return
            except TimeoutError:
                pass
            for service in enabled:
                if due[service.name] > loop.time():
                    continue
                due[service.name] = loop.time() + service.config.next_delay()
                try:
                    if conn is None or conn.closed:
                        conn = await db.connect_async(dsn)
                    counts = await service.run_once(conn)
                except PgjobsError as exc:
                    if service.name not in failing:
                        log.warning("%s: round failed, retrying every round: %s", service.name, exc)
                        failing.add(service.name)
                    if conn is not None:
                        await conn.close()
                    conn = None
                    continue
                if service.name in failing:
                    failing.discard(service.name)
                    log.warning("%s: working again", service.name)
                if any(counts.values()):
                    done = " ".join(f"{k}={v}" for k, v in counts.items())
                    log.info("%s: %s", service.name, done)
    finally:
        if conn is not None:
            await conn.close()
