"""Burst exit (``WorkerConfig.burst``): a burst worker leaves once its queues hold no job, ready,
scheduled or running; until then it says, once, what it waits for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pgjobs import db, queries
from pgjobs.completer import Completer
from pgjobs.errors import PgjobsError
from pgjobs.worker.pacing import ClaimPacer
from pgjobs.worker.slots import Slots

log = logging.getLogger("pgjobs.worker")

#: Expired jobs a burst worker with nothing to claim archives per statement before it exits.
BURST_EXPIRE_BATCH = 1000


class BurstExit:
    """Decides when a burst worker is done.

    Example::

        if burst.due(connected=True) and await burst.done(conn):
            return  # nothing left in the worker's queues
    """

    def __init__(
        self,
        enabled: bool,
        queues: Sequence[str],
        completer: Completer,
        pacer: ClaimPacer,
        slots: Slots,
        changed: asyncio.Event,
    ) -> None:
        self.enabled = enabled
        self.queues = list(queues)
        self.completer = completer
        self.pacer = pacer
        self.slots = slots
        self.changed = changed
        #: What the worker last said it waits for (said once until it changes): scheduled
        #: jobs, when the next is due, jobs of paused queues, limited jobs, jobs waiting for their
        #: dependencies; None while it works.
        self.waiting_for: tuple[int, datetime | None, int, int, int] | None = None

    def due(self, *, connected: bool) -> bool:
        """In burst mode: nothing to claim, nothing running or waiting, nothing left to flush,
        and the database there to ask what is left."""
        due = (
            self.enabled
            and self.pacer.idle
            and connected
            and not self.slots.in_hand
            and not len(self.completer.outcomes)
        )
        if not due:
            self.waiting_for = None
        return due

    async def done(self, conn: Any) -> bool:
        """Whether the worker may leave: ``queries.QUEUES_LEFT_FOR_BURST`` for its queues over
        ``conn`` archives the expired jobs (a burst worker leaves none behind), then tells what
        is left. Raises ``DatabaseUnavailable`` or ``SchemaMissing`` when the database is
        away."""
        rows = await db.fetch_all_async(
            conn,
            queries.QUEUES_LEFT_FOR_BURST,
            {"queues": self.queues, "limit": BURST_EXPIRE_BATCH},
        )
        left = rows[0]
        expired, jobs = left[0], left[1]
        if expired:  # more may have expired than one statement archives: look again
            log.info("burst: archived %d expired job(s), unrun", expired)
            return False
        if not jobs:
            log.info("burst: no job left in %s", ",".join(self.queues))
            await self._wake_peers(conn)
            return True
        self._say_what_it_waits_for(left)
        return False

    async def _wake_peers(self, conn: Any) -> None:
        """NOTIFY this worker's queues on the way out of a burst, as an enqueue does: burst
        workers that wait for the jobs this one ran (its last settle is committed) look again
        now and exit with it, instead of at their next poll. One statement per exit, nothing
        on the hot path; a failure only leaves the others to their poll."""
        if conn.closed:
            return
        with contextlib.suppress(PgjobsError):
            await db.fetch_all_async(conn, queries.QUEUES_WAKE, {"queues": self.queues})

    def _say_what_it_waits_for(self, left: tuple[Any, ...]) -> None:
        """Log once (and again when it changes) why a burst worker with nothing to claim does
        not exit yet: jobs scheduled for later, jobs of paused queues, jobs waiting for a
        concurrency limit or a rate, jobs other workers run."""
        _, jobs, scheduled, next_due, paused, running, limited, dependent = left
        if jobs > scheduled + paused + running + limited + dependent:
            # A job fell due since the last claim (or a limited task's job waits in its queue's
            # range, which only a claim under limits takes): claim now, there is nothing to say.
            self.pacer.woken = True
            self.completer.limits_due()
            self.changed.set()
            return
        waiting = (scheduled, next_due, paused, limited, dependent)
        if waiting == self.waiting_for:
            return
        self.waiting_for = waiting
        parts = []
        if scheduled:
            due = f"{next_due.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            parts.append(f"{scheduled} scheduled job(s), the next due at {due}")
        if dependent:
            parts.append(f"{dependent} job(s) waiting for their dependencies")
        if paused:
            parts.append(f"{paused} job(s) of paused queues (`pgjobs queue resume`)")
        if limited:
            parts.append(f"{limited} job(s) waiting for a concurrency limit or a rate")
        if running:
            parts.append(f"{running} job(s) other workers run")
        log.info("burst: waiting for %s in %s", "; ".join(parts), ",".join(self.queues))
