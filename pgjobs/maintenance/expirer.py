"""The expirer: jobs past their expires_at are archived as expired, never run."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import Service, ServiceConfig


class Expirer(Service):
    """Archives unleased jobs whose ``expires_at`` has passed, with status ``expired``.

    Example: ``await Expirer().run_once(conn)`` returns ``{"expired": 12}``.
    """

    name = "expirer"

    def __init__(self, config: ServiceConfig | None = None) -> None:
        super().__init__(config or ServiceConfig(interval=30.0))

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        expired = 0
        while True:
            rows = await db.fetch_all_async(
                conn, queries.JOB_EXPIRE_MANY, {"limit": self.config.batch_size}
            )
            expired += rows[0][0]
            if rows[0][0] < self.config.batch_size:
                return {"expired": expired}
