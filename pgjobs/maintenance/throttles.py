"""Throttle windows: the rows of ``pgjobs_throttles`` are kept only while they can still hold a
job back.

An enqueue of a throttled task's unique key writes the key's row (its latest job); the next
enqueue of the key starts its job no earlier than that job's start plus the task's throttle.
Once that job has left ``queued_jobs`` and its start is more than a throttle ago, the row can
hold nothing back: this service removes it (a later enqueue of the key writes a new one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service, ServiceConfig


@dataclass(frozen=True, slots=True)
class ThrottlesTidied(RoundResult):
    """Rows of ``pgjobs_throttles`` removed: their window has passed."""

    removed: int


class ThrottleRows(Service[ThrottlesTidied]):
    """Removes the rows of ``pgjobs_throttles`` of ``tasks`` (throttled for ``seconds``) whose
    window has passed.

    Example: ``await ThrottleRows(["crm.sync"], [60.0]).run_once(conn)`` returns
    ``ThrottlesTidied(removed=12)``.
    """

    name = "throttle-rows"
    default_interval = 60.0

    def __init__(
        self, tasks: Sequence[str], seconds: Sequence[float], config: ServiceConfig | None = None
    ) -> None:
        super().__init__(config)
        self.tasks = list(tasks)
        self.seconds = list(seconds)

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> ThrottlesTidied:
        params = {"tasks": self.tasks, "seconds": self.seconds, "limit": self.config.batch_size}
        ((removed,),) = await db.fetch_all_async(conn, queries.THROTTLES_TIDY, params)
        return ThrottlesTidied(int(removed))
