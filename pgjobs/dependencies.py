"""Jobs enqueued ``after`` others: where a job stands in its graph (``of``: the jobs it waits
for, its dependents, how many it still waits on). Such jobs go in through the enqueue door
(``pgjobs.enqueue.waiting``), and the trigger ``pgjobs_job_ended`` releases them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgjobs import db, queries
from pgjobs.models import JobStatus


@dataclass(frozen=True, slots=True)
class Edge:
    """A job on the other end of a dependency, its status (None: purged or pruned) and the name
    the dependent gave it at enqueue (``after={"charge": 41}``; None: by id only)."""

    id: int
    status: JobStatus | None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Dependencies:
    """A job's place in a graph: the jobs it was enqueued ``after``, the jobs enqueued after it,
    and, while it waits, how many of its dependencies have not succeeded yet."""

    after: tuple[Edge, ...]
    dependents: tuple[Edge, ...]
    waiting_on: int | None


def of(target: db.Target, job_id: int) -> Dependencies:
    """Job ``job_id``'s dependencies and dependents (one statement; empty for a job without).

    Example: ``dependencies.of(dsn, 42).waiting_on``
    """
    with db.target_connection(target) as conn:
        rows = conn.execute(queries.DEPENDENCY_SHOW, {"id": job_id}).fetchall()
    sides: dict[str, list[Edge]] = {"after": [], "dependent": []}
    waiting_on = None
    for side, other, status, name in rows:
        if side == "waiting":
            waiting_on = int(other)
        else:
            shown = None if status is None else JobStatus(status)
            sides[side].append(Edge(int(other), shown, name))
    return Dependencies(tuple(sides["after"]), tuple(sides["dependent"]), waiting_on)
