"""The maintenance runner: each service in a loop of its own over shared connections, typed
results, one place for defaults."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import CONNECTIONS, RoundResult, Service, ServiceConfig, run_services
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.worker import WorkerConfig

FAST = ServiceConfig(interval=0.01, jitter=0)


@dataclass(frozen=True, slots=True)
class Ran(RoundResult):
    rounds: int


class Counting(Service[Ran]):
    """Counts its rounds; the first ``failures`` rounds raise."""

    name = "counting"
    default_interval = 0.01

    def __init__(self, failures: int = 0) -> None:
        super().__init__(FAST)
        self.rounds = 0
        self.failures = failures
        self.backends: set[int] = set()

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Ran:
        self.rounds += 1
        self.backends.add(conn.info.backend_pid)
        if self.rounds <= self.failures:
            raise RuntimeError("round failed on purpose")
        return Ran(self.rounds)


class Stuck(Service[Ran]):
    """A round that waits (as a partition creation waits on a lock) until released."""

    name = "stuck"
    default_interval = 0.01

    def __init__(self) -> None:
        super().__init__(FAST)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Ran:
        self.started.set()
        await self.release.wait()
        return Ran(1)


def run_until(dsn: Dsn, services: list[Service[Any]], done: Any) -> None:
    """Run ``services`` until ``done()`` holds, then stop them; TimeoutError when it does not
    within 10 s (so a test need not assert ``done()`` again)."""

    async def main() -> None:
        stop = asyncio.Event()
        runner = asyncio.create_task(run_services(services, dsn, stop))
        try:
            async with asyncio.timeout(10):
                while not done():
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            for service in services:
                if isinstance(service, Stuck):
                    service.release.set()
            await runner

    asyncio.run(main())


def test_a_service_waiting_on_a_lock_does_not_hold_the_others_back(dsn):
    stuck, counting = Stuck(), Counting()
    # Stuck is released only when run_until stops the services: the rounds ran past it.
    run_until(dsn, [stuck, counting], lambda: stuck.started.is_set() and counting.rounds >= 5)
    assert len(counting.backends) <= CONNECTIONS


def test_a_failing_round_is_retried_and_the_service_goes_on(dsn):
    flaky = Counting(failures=2)
    run_until(dsn, [flaky], lambda: flaky.rounds >= 4)
    # A failed round's connection is closed and the next round opens another.
    assert len(flaky.backends) >= 2


def test_defaults_live_in_the_services():
    config = WorkerConfig()
    assert config.rescue_interval == LeaseRescuer.default_interval
    assert config.expire_interval == Expirer.default_interval
    assert LeaseRescuer().config.interval == LeaseRescuer.default_interval
    assert Expirer().config.interval == Expirer.default_interval


@pytest.mark.parametrize("interval", [0, -1])
def test_an_interval_must_be_positive_everywhere(interval):
    with pytest.raises(ConfigurationError, match="interval must be > 0"):
        ServiceConfig(interval=interval)
    with pytest.raises(ConfigurationError, match="interval must be > 0"):
        WorkerConfig(expire_interval=interval)
    with pytest.raises(ConfigurationError, match="interval must be > 0"):
        WorkerConfig(rescue_interval=interval)


def test_a_round_result_says_whether_it_did_anything():
    assert not Ran(0) and Ran(2)
    assert Ran(2).counts() == {"rounds": 2}
