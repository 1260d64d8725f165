"""The lease rescuer: jobs whose worker vanished go back to the queue, or to dead_letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service


@dataclass(frozen=True, slots=True)
class Rescued(RoundResult):
    """Jobs whose lease had expired: back in the queue, or moved to dead_letter."""

    requeued: int
    dead: int


class LeaseRescuer(Service[Rescued]):
    """Requeues jobs whose lease expired (their worker crashed or hung), or dead-letters them
    when that was their last attempt.

    Example: ``await LeaseRescuer(ServiceConfig(interval=15)).run_once(conn)``
    returns ``Rescued(requeued=2, dead=0)``.
    """

    name = "lease-rescuer"
    #: How soon after a lease expires its job is free again, at most (seconds).
    default_interval = 15.0

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Rescued:
        requeued = dead = 0
        while True:
            rows = await db.fetch_all_async(
                conn, queries.JOB_RESCUE_EXPIRED_LEASES, {"limit": self.config.batch_size}
            )
            more_requeued, more_dead = rows[0]
            requeued += more_requeued
            dead += more_dead
            if more_requeued + more_dead < self.config.batch_size:
                return Rescued(requeued, dead)
