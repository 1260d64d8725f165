"""The COPY path of ``enqueue_many``: the statement and the lines that COPY writes for a list
of prepared jobs whose ids were reserved first (``enqueue.statements.copy``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from pgjobs import queries
from pgjobs.tags import Tags


class CopyRow(Protocol):
    """What COPY reads of a prepared job (``enqueue.PreparedJob``)."""

    @property
    def queue(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def payload(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def run_at(self) -> datetime | None: ...
    @property
    def run_in(self) -> float: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def expires_in(self) -> float | None: ...
    @property
    def payload_version(self) -> int | None: ...
    @property
    def trace_context(self) -> str | None: ...
    @property
    def tags(self) -> Tags | None: ...


def copy_rows(
    rows: Sequence[CopyRow],
    now: datetime,
    ids: list[int],
    batch_id: int | None = None,
    *,
    ready: bool,
) -> tuple[str, Iterator[tuple[Any, ...]]]:
    """The COPY statement for ``rows`` and the rows it writes, with the reserved ``ids`` (and
    ``batch_id`` on each, for a batch's members). ``ready``: every row runs at once and carries
    nothing but the usual columns, outside a batch.

    Example: ``sql, lines = copy_rows(rows, now, ids, ready=True)``
    """
    if ready:
        # The usual batch: neither timestamp travels (run_at defaults to the transaction's
        # now(), as JOB_INSERT_MANY would set it).
        return queries.JOB_COPY_MANY_READY, (
            (job_id, row.queue, row.task, row.payload, row.priority, row.max_attempts)
            for job_id, row in zip(ids, rows, strict=True)
        )
    return queries.JOB_COPY_MANY, _timed(rows, now, ids, batch_id)


def _timed(
    rows: Sequence[CopyRow], now: datetime, ids: list[int], batch_id: int | None
) -> Iterator[tuple[Any, ...]]:
    # Timestamps go in as ISO text: dumping a datetime costs more than the rest of a row, and
    # most jobs share one run_at, the transaction's now() (which is also their created_at). COPY
    # computes nothing: delays are added here to that now(), the database's clock.
    ready = now.isoformat()
    for job_id, row in zip(ids, rows, strict=True):
        if row.run_at is not None:
            run_at = row.run_at.isoformat()
        elif row.run_in:
            run_at = (now + timedelta(seconds=row.run_in)).isoformat()
        else:
            run_at = ready
        yield (
            job_id,
            row.queue,
            row.task,
            row.payload,
            row.priority,
            run_at,
            row.max_attempts,
            _expires_at(row, now),
            row.payload_version,
            row.trace_context,
            None if row.tags is None else list(row.tags),
            batch_id,
        )


def _expires_at(row: CopyRow, now: datetime) -> datetime | None:
    """``row``'s expiry counted from ``now``, the database's now() (for COPY)."""
    if row.expires_in is None:
        return row.expires_at
    return now + timedelta(seconds=row.expires_in)
