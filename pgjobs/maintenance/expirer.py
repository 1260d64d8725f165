"""The expirer: jobs past their expires_at are archived as expired, never run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service


@dataclass(frozen=True, slots=True)
class Expired(RoundResult):
    """Jobs archived as expired."""

    expired: int


class Expirer(Service[Expired]):
    """Archives unleased jobs whose ``expires_at`` has passed, with status ``expired``.

    Example: ``await Expirer().run_once(conn)`` returns ``Expired(expired=12)``.
    """

    name = "expirer"
    #: Seconds between rounds: how long past its expires_at a job may wait to be archived.
    default_interval = 30.0

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Expired:
        expired = 0
        while True:
            rows = await db.fetch_all_async(
                conn, queries.JOB_EXPIRE_MANY, {"limit": self.config.batch_size}
            )
            expired += rows[0][0]
            if rows[0][0] < self.config.batch_size:
                return Expired(expired)
