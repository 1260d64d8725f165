"""Workflow mailboxes: the events and waits of jobs that have ended are removed.

An event waits in ``pgjobs_events`` until its workflow takes it; a workflow that ended without
taking one (it finished, died or was cancelled) leaves it behind, and its waits too. This
service removes them, a batch at a time: nothing could read them any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service


@dataclass(frozen=True, slots=True)
class MailboxesTidied(RoundResult):
    """Rows of ``pgjobs_events`` and ``pgjobs_event_waits`` removed: their job has ended."""

    removed: int


class Mailboxes(Service[MailboxesTidied]):
    """Removes the events and waits of jobs no longer in ``queued_jobs``.

    Example: ``await Mailboxes().run_once(conn)`` returns ``MailboxesTidied(removed=3)``.
    """

    name = "mailboxes"
    default_interval = 300.0

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> MailboxesTidied:
        params = {"limit": self.config.batch_size}
        ((removed,),) = await db.fetch_all_async(conn, queries.EVENT_SWEEP, params)
        return MailboxesTidied(int(removed))
