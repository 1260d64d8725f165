"""A worker whose server went away tries its claim connections again after 0.5 s, 1 s, 2 s, then
every 5 s (``RECONNECT_DELAYS``, as the high-availability page says), each lane on its own: a
second lane's losses do not push the first one's next try further away, so a primary that is back
(a failover manager's promotion, a restart) is found within the schedule's step, not seconds
later. Once a trip goes through again, the next outage starts over at 0.5 s.

The server is a throwaway of the test's own (``tests/support/cluster.py``), stopped and started
under a running worker; what is checked is the delay the worker chose before each try, not how
long anything took.
"""

from __future__ import annotations

import asyncio
import time

from pgjobs import App, Worker, migrate
from pgjobs.db.dsn import Dsn
from pgjobs.worker.config import RECONNECT_DELAYS
from pgjobs.worker.pacing import ClaimPacer, Lane
from tests.support.cluster import replicated_pair
from tests.support.external import run_worker_while
from tests.support.helpers import wait_until


def _schedule(tries: int) -> list[float]:
    """The first ``tries`` delays of one outage, as documented."""
    return [RECONNECT_DELAYS[min(n, len(RECONNECT_DELAYS) - 1)] for n in range(tries)]


def test_each_claim_lane_backs_off_on_the_documented_schedule_and_starts_over(monkeypatch):
    # A delay is recorded per lane each time the worker gives one up: (outage, lane, seconds).
    delays: list[tuple[int, int, float]] = []
    outage = [0]
    lost = ClaimPacer.lost

    def spy(pacer: ClaimPacer, lane: Lane, ready_at: float | None = None) -> None:
        if ready_at is not None:
            now = asyncio.get_running_loop().time()
            delays.append((outage[0], pacer.lanes.index(lane), round(ready_at - now, 1)))
        lost(pacer, lane, ready_at)

    monkeypatch.setattr(ClaimPacer, "lost", spy)
    with replicated_pair(synchronous=False) as pair:
        url = pair.primary.url()
        migrate.upgrade(Dsn(url, "test"))
        app = App(url)

        @app.task(name="t.noop")
        def noop() -> None:
            pass

        def per_lane(number: int) -> dict[int, list[float]]:
            found: dict[int, list[float]] = {}
            for seen, lane, seconds in list(delays):
                if seen == number:
                    found.setdefault(lane, []).append(seconds)
            return found

        def down_and_up(worker: Worker, number: int) -> None:
            outage[0] = number
            pair.primary.stop(immediate=True)
            # Long enough for every step of the schedule before its repeat (0.5 + 1 + 2 s).
            wait_until(
                lambda: any(len(tries) >= 4 for tries in per_lane(number).values()),
                timeout=30,
                what=lambda: f"four tries on a lane in outage {number}: {per_lane(number)}",
            )
            pair.primary.start()
            wait_until(
                lambda: worker.probe_state().connected,
                timeout=30,
                what=f"the worker connected again after outage {number}",
            )

        def scenario(worker: Worker) -> None:
            down_and_up(worker, 1)
            time.sleep(0.2)  # a few trips through before the next outage
            down_and_up(worker, 2)

        _, code = run_worker_while(app, scenario, concurrency=4)
    assert code == 0
    for number in (1, 2):
        lanes = per_lane(number)
        assert lanes, f"no lane lost its connection in outage {number}"
        for lane, seconds in lanes.items():
            assert seconds == _schedule(len(seconds)), (number, lane, lanes)
