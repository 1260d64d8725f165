"""What is enqueued: ``enqueued_jobs``, and the assertions ``assert_enqueued`` and
``assert_not_enqueued`` whose failure message lists every job that *was* enqueued."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pgjobs import db, queries
from pgjobs.app import App
from pgjobs.db.dsn import Dsn, normalize_dsn
from pgjobs.errors import ConfigurationError, InvalidPayload
from pgjobs.models import Job
from pgjobs.tasks import Task

#: Jobs shown in an assertion's message, at most.
SHOWN = 20

AppOrDsn = App | Dsn | str


def _dsn_of(target: AppOrDsn) -> Dsn:
    if isinstance(target, App):
        return target.dsn
    if isinstance(target, Dsn):
        return target
    if isinstance(target, str):
        return normalize_dsn(target, "the DSN")
    raise ConfigurationError(
        f"expected a pgjobs.App, a Dsn or a DSN string, got {type(target).__name__}"
    )


def task_name(task: str | Task | None) -> str | None:
    return task.name if isinstance(task, Task) else task


def contains(payload: Any, subset: Any) -> bool:
    """Whether ``payload`` holds ``subset``: every key of a subset object is in the payload with
    a value that holds the subset's value (recursively); other values are equal (1 == 1.0).

    Example: ``contains({"to": "a", "cc": ["b"]}, {"to": "a"})`` is True.
    """
    if isinstance(subset, Mapping):
        return isinstance(payload, Mapping) and all(
            key in payload and contains(payload[key], value) for key, value in subset.items()
        )
    return bool(payload == subset)


def _normalised(subset: Mapping[str, Any] | None) -> Any:
    """``subset`` as a stored payload reads back (tuples as lists), so that it compares alike."""
    if subset is None:
        return None
    if not isinstance(subset, Mapping):
        raise ConfigurationError(
            f"payload_subset must be a dict, got {type(subset).__name__}", field="payload_subset"
        )
    try:
        return json.loads(json.dumps(subset))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload_subset is not JSON: {exc}", field="payload_subset") from None


def _all_queued(target: AppOrDsn) -> list[Job]:
    dsn = _dsn_of(target)
    with db.connect(dsn) as conn:
        return [db.job_from_row(row) for row in db.fetch_all(conn, queries.TESTING_QUEUED_JOBS)]


def _matching(
    jobs: Iterable[Job],
    task: str | Task | None,
    queue: str | None,
    payload_subset: Mapping[str, Any] | None,
) -> list[Job]:
    name, subset = task_name(task), _normalised(payload_subset)
    return [
        job
        for job in jobs
        if (name is None or job.task == name)
        and (queue is None or job.queue == queue)
        and (subset is None or contains(job.payload, subset))
    ]


def enqueued_jobs(
    target: AppOrDsn,
    task: str | Task | None = None,
    queue: str | None = None,
    payload_subset: Mapping[str, Any] | None = None,
) -> list[Job]:
    """The jobs in ``queued_jobs`` (ready, scheduled or running: not yet finished), oldest first,
    of ``task`` (a name or the ``Task``), in ``queue``, whose payload holds ``payload_subset``.

    Example: ``enqueued_jobs(app, "emails.welcome", payload_subset={"to": "ada@example.com"})``
    """
    return _matching(_all_queued(target), task, queue, payload_subset)


def _describe(
    task: str | Task | None, queue: str | None, payload_subset: Mapping[str, Any] | None
) -> str:
    parts = [f"task {task_name(task)!r}" if task is not None else "any task"]
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if payload_subset is not None:
        parts.append(f"with payload holding {_json(payload_subset)}")
    return " ".join(parts)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _listing(jobs: Sequence[Job]) -> str:
    """What was enqueued, one job a line, for an assertion's message."""
    if not jobs:
        return "nothing is enqueued"
    now = datetime.now(UTC)
    lines = [f"enqueued ({len(jobs)}):"]
    for job in jobs[:SHOWN]:
        state = (
            "running"
            if job.lease_expires_at is not None
            else "scheduled"
            if job.run_at > now
            else "ready"
        )
        lines.append(
            f"  #{job.id} {job.task} (queue {job.queue!r}, {state}, attempt "
            f"{job.attempts}/{job.max_attempts}) {_json(job.payload)}"
        )
    if len(jobs) > SHOWN:
        lines.append(f"  ... and {len(jobs) - SHOWN} more")
    return "\n".join(lines)


def assert_enqueued(
    target: AppOrDsn,
    task: str | Task,
    payload_subset: Mapping[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that a job of ``task`` is enqueued (exactly ``count`` of them when given), in
    ``queue``, whose payload holds ``payload_subset``; returns the matching jobs. The message of
    a failure lists every job that is enqueued.

    Example: ``assert_enqueued(app, "emails.welcome", {"to": "ada@example.com"}, count=1)``
    """
    everything = _all_queued(target)
    found = _matching(everything, task, queue, payload_subset)
    if (count is None and found) or len(found) == count:
        return found
    wanted = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {wanted} job(s) of {_describe(task, queue, payload_subset)}, found "
        f"{len(found)}; {_listing(everything)}"
    )


def assert_not_enqueued(
    target: AppOrDsn,
    task: str | Task | None = None,
    payload_subset: Mapping[str, Any] | None = None,
    queue: str | None = None,
) -> None:
    """Assert that no job of ``task`` (of any task when None) in ``queue`` whose payload holds
    ``payload_subset`` is enqueued. The message of a failure lists every job that is enqueued.

    Example: ``assert_not_enqueued(app, "emails.welcome")``
    """
    everything = _all_queued(target)
    found = _matching(everything, task, queue, payload_subset)
    if found:
        raise AssertionError(
            f"expected no job of {_describe(task, queue, payload_subset)}, found {len(found)} "
            f"(#{', #'.join(str(job.id) for job in found[:SHOWN])}); {_listing(everything)}"
        )
