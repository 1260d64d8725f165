"""Background services with one shape: a validated config with one default interval per
service, ``run_once()`` returning a typed result, a jittered interval, and a clean stop.

Each service runs in a loop of its own, so a slow round of one (a partition creation waiting on
a lock) does not delay another (the lease rescuer). The loops share a small set of connections
(``CONNECTIONS``). Any number of workers may run the services at once: every statement they send
takes its rows with ``FOR UPDATE SKIP LOCKED`` or an advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Generic, TypeVar

import psycopg

from pgjobs import db
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError

log = logging.getLogger("pgjobs.maintenance")

#: Connections the service loops of one worker share: one round may wait on a lock while the
#: others go on.
CONNECTIONS = 2
#: Seconds after a worker's start within which every service's first round begins, whatever its
#: interval (an hourly service included).
FIRST_ROUND_WITHIN = 1.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How often a service runs and how much it moves per statement. To run no maintenance in a
    worker, use ``WorkerConfig(maintenance=False)`` (``pgjobs work --no-maintenance``)."""

    #: Seconds between the starts of two rounds; > 0.
    interval: float
    #: Fraction of ``interval`` added or removed at random, so workers do not run in lockstep.
    jitter: float = 0.2
    #: Rows one statement moves at most; a run repeats the statement until less is left.
    batch_size: int = 1000

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ConfigurationError(f"interval must be > 0 seconds, got {self.interval}")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {self.batch_size}")

    def next_delay(self) -> float:
        return self.interval * (1 + self.jitter * (2 * random.random() - 1))

    def first_delay(self) -> float:
        """Seconds from start to the first round: at most ``FIRST_ROUND_WITHIN`` (work left by a
        crash is found at once), at random so that workers started together do not run in
        lockstep."""
        return min(FIRST_ROUND_WITHIN, self.next_delay()) * random.random()


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round of a service did: each service's result names its counts."""

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __bool__(self) -> bool:
        """True when the round did anything."""
        return any(self.counts().values())


R = TypeVar("R", bound=RoundResult)


class Service(ABC, Generic[R]):
    """One periodic maintenance job."""

    name: ClassVar[str]
    #: Seconds between rounds unless a config says otherwise; the one place for the default.
    default_interval: ClassVar[float]
    #: The level of the line that says what a round did: INFO, or DEBUG for a service whose
    #: rounds do their routine work (the scheduler enqueues every occurrence of a schedule).
    round_log_level: ClassVar[int] = logging.INFO

    def __init__(self, config: ServiceConfig | None = None) -> None:
        self.config = config or ServiceConfig(interval=self.default_interval)

    @abstractmethod
    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> R:
        """Do one round of work and return what was done."""


class SharedConnections:
    """At most ``size`` connections for the service loops: a loop takes one for a round and
    gives it back; a connection whose round failed is closed, and the next round opens anew."""

    def __init__(self, dsn: Dsn, size: int = CONNECTIONS) -> None:
        self._dsn = dsn
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = await db.connect_async(self._dsn)
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.close()
                raise
            self._idle.append(conn)

    async def close(self) -> None:
        while self._idle:
            with contextlib.suppress(Exception):
                await self._idle.pop().close()


async def run_services(services: Sequence[Service[Any]], dsn: Dsn, stop: asyncio.Event) -> None:
    """Run each of ``services`` in a loop of its own until ``stop`` is set (or this is
    cancelled); they share ``CONNECTIONS`` connections.

    A failing round is logged and tried again at the service's next turn.
    """
    connections = SharedConnections(dsn)
    try:
        await asyncio.gather(*(_run(service, connections, stop) for service in services))
    finally:
        await connections.close()


async def _run(service: Service[Any], connections: SharedConnections, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time() + service.config.first_delay()
    failing = False  # the last round failed: log changes of state only
    while True:
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
            return
        except TimeoutError:
            pass
        next_at = loop.time() + service.config.next_delay()
        try:
            async with connections.connection() as conn:
                result = await service.run_once(conn)
        except Exception as exc:  # a round's failure must not end the service
            if not failing:
                log.warning("%s: round failed, retrying every round: %s", service.name, exc)
                failing = True
            continue
        if failing:
            failing = False
            log.warning("%s: working again", service.name)
        if result:
            done = " ".join(f"{k}={v}" for k, v in result.counts().items())
            log.log(service.round_log_level, "%s: %s", service.name, done)
