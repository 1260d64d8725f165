"""Group rows: the rows of ``pgjobs_group_states`` follow the groups that hold jobs.

An enqueue into a group writes its group's row; a claim takes turns between the groups by those
rows. A group whose jobs are all done keeps its row for a while (its next job is likely soon);
this service removes the rows of groups that have held no job for ``idle`` seconds, so that
claims stop looking at them, and writes the row of any group that holds ready jobs without one
(a job inserted by SQL written by hand, or a row removed while an enqueue into its group waited
to commit), so that no group's jobs wait for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service, ServiceConfig


@dataclass(frozen=True, slots=True)
class GroupsTidied(RoundResult):
    """Rows of idle groups removed, and rows written for groups that had jobs but no row."""

    removed: int
    restored: int


class GroupRows(Service[GroupsTidied]):
    """Keeps ``pgjobs_group_states`` in step with the groups of ``queues`` that hold jobs.

    Example: ``await GroupRows(["default"]).run_once(conn)`` returns
    ``GroupsTidied(removed=3, restored=0)``.
    """

    name = "group-rows"
    default_interval = 60.0
    #: Seconds a group without jobs keeps its row (since its last enqueue and its last claim).
    idle = 600.0

    def __init__(self, queues: Sequence[str], config: ServiceConfig | None = None) -> None:
        super().__init__(config)
        self.queues = list(queues)

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> GroupsTidied:
        params = {"queues": self.queues, "idle": self.idle, "limit": self.config.batch_size}
        ((removed, restored),) = await db.fetch_all_async(conn, queries.GROUP_STATES_TIDY, params)
        return GroupsTidied(int(removed), int(restored))
