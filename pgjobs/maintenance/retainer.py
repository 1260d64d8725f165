"""The retention service: applies the app's retention policy (``pgjobs.retention_policy``) in
every worker that runs the maintenance services, one worker at a time across the fleet.

A round drops the archive's expired daily partitions as `pgjobs prune` does and deletes in
batches where a partition cannot go whole (``pgjobs.retention.apply``). It runs in a thread on a
connection of its own, opened for the round by the worker holding the turn, so that a long
export or a wait for the lock on archived_jobs never holds up the worker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries, retention
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import RoundResult, Service, ServiceConfig
from pgjobs.retention_policy import RetentionPolicy


@dataclass(frozen=True, slots=True)
class Retained(RoundResult):
    """Partitions of archived_jobs dropped, and rows removed from archived_jobs (with the
    partitions, or in batches) and from dead_letter."""

    partitions: int
    archived: int
    dead: int


class Retainer(Service[Retained]):
    """Removes the finished jobs ``policy`` keeps no longer, from ``dsn``'s database.

    Any number of workers may run it at once: they take turns on an advisory lock, and a worker
    that finds the turn taken does nothing that round. A round that finds a `pgjobs prune`
    running leaves the partitions to the next.

    Example: ``await Retainer(RetentionPolicy.of({"archive": "30d"}), dsn).run_once(conn)``
    returns ``Retained(partitions=3, archived=120000, dead=0)``.
    """

    name = "retention"
    #: Hourly: a day's partition goes within an hour of its last row's expiry.
    default_interval = 3600.0

    def __init__(
        self,
        policy: RetentionPolicy,
        dsn: Dsn,
        config: ServiceConfig | None = None,
        *,
        lock_timeout: float = 60.0,
    ) -> None:
        super().__init__(config)
        if not policy.active:
            raise ConfigurationError("a retention service needs a policy with a period")
        if not lock_timeout > 0:
            raise ConfigurationError(f"lock_timeout must be > 0 seconds, got {lock_timeout}")
        self.policy = policy
        self.dsn = dsn
        #: Seconds a round keeps trying for the lock on archived_jobs, per partition.
        self.lock_timeout = lock_timeout

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Retained:
        turn = {"key": queries.RETENTION_LOCK_KEY}
        if not (await db.fetch_all_async(conn, queries.RETENTION_TRY_LOCK, turn))[0][0]:
            return Retained(0, 0, 0)
        stop = threading.Event()
        work = asyncio.ensure_future(
            asyncio.to_thread(
                retention.apply,
                self.dsn,
                self.policy,
                batch_size=self.config.batch_size,
                lock_timeout=self.lock_timeout,
                stopping=stop.is_set,
            )
        )
        try:
            applied = await asyncio.shield(work)
        except asyncio.CancelledError:
            # A stop: the batch or partition at hand is the last, and the turn is held until it
            # ends, so that no other worker starts a round beside it.
            stop.set()
            with contextlib.suppress(Exception):
                await work
            raise
        finally:
            with contextlib.suppress(Exception):
                await db.fetch_all_async(conn, queries.RETENTION_UNLOCK, turn)
        return Retained(
            applied.partitions, applied.partition_rows + applied.archive_rows, applied.dead_rows
        )
