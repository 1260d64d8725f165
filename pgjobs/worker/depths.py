"""The depths of a worker's queues for its ``/stats`` (``pgjobs work --http``): how many jobs of
each are ready, scheduled and running, read from ``queued_jobs`` at most once per ``max_age``
seconds however often ``/stats`` is asked (and at most once per ``SLOW_READS`` times what the
last reading took), on a connection opened for the read and closed after it (the claim
connection stays the claim loop's alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import PgjobsError

#: Seconds a reading is served again before the next one is made.
MAX_AGE = 1.0
#: Seconds a reading may take, connecting included, before /stats answers without it.
READ_TIMEOUT = 5.0
#: A reading is served again for at least this many times what it took. The count scans the
#: queues' jobs: 4 ms for 10,000, but 2.4 s (three processes in parallel) for 5M ready jobs, and
#: read every second it would keep the database busy counting whatever else it has to do.
SLOW_READS = 10


@dataclass(frozen=True, slots=True)
class Depths:
    """One reading: per queue ``{"ready": n, "scheduled": n, "running": n}`` (None when the
    database could not be read, ``error`` then says why), and the loop time it was made."""

    queues: dict[str, dict[str, int]] | None
    error: str | None
    read_at: float
    #: Seconds the reading took.
    took: float = 0.0


class QueueDepths:
    """Reads the depths of ``queues`` on demand, at most once per ``max_age`` seconds; callers
    that ask while a reading is made wait for that one.

    Example: ``depths = await QueueDepths(dsn, ["default"]).read()``
    """

    def __init__(self, dsn: Dsn, queues: Sequence[str], max_age: float = MAX_AGE) -> None:
        self.dsn = dsn
        self.queues = list(queues)
        self.max_age = max_age
        self.readings = 0  # made so far, for the tests
        self._last: Depths | None = None
        self._lock = asyncio.Lock()

    async def read(self) -> Depths:
        """The latest reading if it is younger than ``max_age`` (or than ``SLOW_READS`` times
        what it took), else a new one."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            last = self._last
            if last is None or loop.time() - last.read_at >= max(
                self.max_age, SLOW_READS * last.took
            ):
                last = self._last = await self._read(loop)
            return last

    async def _read(self, loop: asyncio.AbstractEventLoop) -> Depths:
        self.readings += 1
        started = loop.time()
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                rows = await self._rows()
        except TimeoutError:
            error = f"the database did not answer within {READ_TIMEOUT:g}s"
            return Depths(None, error, loop.time(), loop.time() - started)
        except PgjobsError as exc:
            return Depths(None, str(exc), loop.time(), loop.time() - started)
        depths = {queue: {"ready": 0, "scheduled": 0, "running": 0} for queue in self.queues}
        for queue, ready, scheduled, running in rows:
            depths[queue] = {"ready": ready, "scheduled": scheduled, "running": running}
        return Depths(depths, None, loop.time(), loop.time() - started)

    async def _rows(self) -> list[tuple[Any, ...]]:
        conn = await db.connect_async(self.dsn)
        try:
            return await db.fetch_all_async(
                conn, queries.WORKER_QUEUE_DEPTHS, {"queues": self.queues}
            )
        finally:
            await conn.close()
