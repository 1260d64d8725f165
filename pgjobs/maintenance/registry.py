"""The worker registry: every worker keeps a row in ``pgjobs_workers`` (id, host, pid, queues,
concurrency, started, last seen) so that `pgjobs stats` can list the live workers and the jobs
each one runs. The row is written at the first round, refreshed every round (the heartbeat),
and deleted at a clean exit; rows whose heartbeat stopped are deleted by any other worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.maintenance import RoundResult, Service, ServiceConfig

#: Seconds between heartbeats: each is a write (a row version, a commit) by every worker, so
#: no more often than the freshness `pgjobs stats` and the doctor need (``STALE_AFTER``).
HEARTBEAT_INTERVAL = 20.0
#: Seconds without a heartbeat after which a worker counts as gone (three missed heartbeats,
#: the longest interval with its jitter being 24 s).
STALE_AFTER = 60.0


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a worker registers about itself."""

    #: The worker's id, as it writes it into queued_jobs.lease_owner.
    id: str
    host: str
    pid: int
    queues: Sequence[str]
    concurrency: int
    started_at: datetime


@dataclass(frozen=True, slots=True)
class Heartbeat(RoundResult):
    """Rows of workers gone silent that this round removed."""

    stale_removed: int


class WorkerRegistry(Service[Heartbeat]):
    """Registers one worker and refreshes its heartbeat; removes the rows of workers whose
    heartbeat is older than ``stale_after`` seconds.

    Example: ``await WorkerRegistry(identity).run_once(conn)`` returns
    ``Heartbeat(stale_removed=0)``.
    """

    name = "worker-registry"
    default_interval = HEARTBEAT_INTERVAL

    def __init__(
        self,
        identity: WorkerIdentity,
        config: ServiceConfig | None = None,
        *,
        stale_after: float = STALE_AFTER,
    ) -> None:
        super().__init__(config)
        if not stale_after > self.config.interval * (1 + self.config.jitter):
            raise ConfigurationError(
                f"stale_after ({stale_after}s) must exceed the longest heartbeat interval "
                f"({self.config.interval * (1 + self.config.jitter):.1f}s)"
            )
        self.identity = identity
        self.stale_after = stale_after

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Heartbeat:
        me = self.identity
        rows = await db.fetch_all_async(
            conn,
            queries.WORKER_HEARTBEAT,
            {
                "id": me.id,
                "host": me.host,
                "pid": me.pid,
                "queues": list(me.queues),
                "concurrency": me.concurrency,
                "started_at": me.started_at,
                "stale_after": self.stale_after,
            },
        )
        return Heartbeat(rows[0][0])

    async def unregister(self, dsn: Dsn, conn: Any = None) -> None:
        """Delete this worker's row: on ``conn`` (the worker's, idle) when given and usable,
        which spares a connection's set-up on the way out, else on a connection of its own."""
        if conn is not None and not conn.closed:
            try:
                with db.translate_errors(dsn):
                    await conn.execute(queries.WORKER_UNREGISTER, {"id": self.identity.id})
                return
            except PgjobsError:
                pass  # that connection is broken: try a new one
        conn = await db.connect_async(dsn)
        try:
            with db.translate_errors(dsn):
                await conn.execute(queries.WORKER_UNREGISTER, {"id": self.identity.id})
        finally:
            await conn.close()
