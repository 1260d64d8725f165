"""Lapsed limits: jobs held back for a task's limit go back to their queue's claim range once the
worker's code declares that task without a concurrency limit or a rate (a deploy removed it).

A claim that limits a task marks the jobs it holds back with ``limit_key`` (the task's name),
which moves them out of their queue's claim range into the task's own; only the claims of
workers that limit the task look there. When no worker limits the task any more, nobody would.
Every worker that runs the task without a limit gives them back, a batch per statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.maintenance import RoundResult, Service, ServiceConfig


@dataclass(frozen=True, slots=True)
class Released(RoundResult):
    """Jobs given back to their queue's claim range."""

    released: int


class LapsedLimits(Service[Released]):
    """Gives back to their queues' claim ranges the held-back jobs, in ``queues``, of ``tasks``:
    the tasks this worker runs without a limit.

    Example: ``await LapsedLimits(["default"], ["emails.send"]).run_once(conn)`` returns
    ``Released(released=40)``.
    """

    name = "lapsed-limits"
    #: Seconds between rounds: how long after a deploy that removed a task's limit its held-back
    #: jobs wait to be claimed as any other. A rare event, asked after by every worker: a round
    #: is a statement of each idle worker too.
    default_interval = 30.0

    def __init__(
        self, queues: Sequence[str], tasks: Sequence[str], config: ServiceConfig | None = None
    ) -> None:
        super().__init__(config)
        self.queues = list(queues)
        self.tasks = list(tasks)

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Released:
        released = 0
        params = {"queues": self.queues, "tasks": self.tasks, "limit": self.config.batch_size}
        while True:
            rows = await db.fetch_all_async(conn, queries.JOB_RELEASE_LAPSED_LIMITS, params)
            released += len(rows)
            if len(rows) < self.config.batch_size:
                return Released(released)
