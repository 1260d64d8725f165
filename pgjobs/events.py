"""Events sent to durable workflows: ``app.send_event``, ``pgjobs event send`` and ``POST
/api/v1/jobs/{id}/events/{name}`` put one in the workflow job's mailbox; ``ctx.wait_for`` takes it.

An event is kept until the workflow takes it, so one sent before the workflow waits is not lost.
Sending and waiting each lock the workflow's row in ``queued_jobs`` first, so whichever comes
second sees the first: a wait finds the event already sent, or a send finds the wait and makes
the job ready at once (and wakes a worker). A send on the caller's own connection is part of the
caller's transaction, like an enqueue: the event exists when that transaction commits.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from pgjobs import queries
from pgjobs.db import Target, target_connection, translate_errors
from pgjobs.errors import ConfigurationError, InvalidPayload, JobNotFound, JobStateConflict
from pgjobs.submission import MAX_JOB_ID, check_key, check_name

#: Largest event payload, in bytes of JSON text: an event says what happened (an id, a status),
#: its data stays in the application's tables.
MAX_EVENT_BYTES = 64 * 1024

#: How deep an event payload's objects and arrays may nest.
MAX_EVENT_DEPTH = 32

_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True)
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class SentEvent:
    """An event in a workflow's mailbox, as ``send`` returns it."""

    #: The event's own id (events of one name are taken oldest first).
    id: int
    #: The workflow job it was sent to.
    job_id: int
    name: str
    sent_at: datetime
    #: True when the workflow was waiting for it and is now ready to run.
    woke: bool


def check_event_name(name: object) -> str:
    """An event's name, checked as a queue's or task's name is (non-empty, at most 200
    characters, visible, in NFC); a ``ConfigurationError`` naming ``name`` otherwise."""
    try:
        return check_name("event", name)
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc), field="name") from None


def event_json(payload: Any) -> str:
    """``payload`` (any JSON value) as the JSON text to store; ``InvalidPayload`` naming why it
    cannot be: not JSON (a set, NaN), past ``MAX_EVENT_BYTES`` or ``MAX_EVENT_DEPTH``, holding
    NUL or text that is not valid UTF-8, which PostgreSQL refuses."""
    try:
        text = _JSON.encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"event payload is not JSON: {exc}", field="payload") from None
    except RecursionError:
        raise InvalidPayload(
            f"event payload nests more than {MAX_EVENT_DEPTH} levels deep", field="payload"
        ) from None
    if len(text) > MAX_EVENT_BYTES:
        raise InvalidPayload(
            f"event payload is {len(text):,} bytes of JSON; the limit is {MAX_EVENT_BYTES:,} "
            "(keep the data in your tables and send its id)",
            field="payload",
        )
    if _depth(text) > MAX_EVENT_DEPTH:
        raise InvalidPayload(
            f"event payload nests more than {MAX_EVENT_DEPTH} levels deep", field="payload"
        )
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidPayload(
            "event payload contains a NUL character, which PostgreSQL refuses", field="payload"
        )
    if "\\ud" in text.lower() and _LONE_SURROGATE.search(text):
        raise InvalidPayload(
            "event payload contains a lone surrogate (text that is not valid UTF-8)",
            field="payload",
        )
    return text


def _depth(text: str) -> int:
    """How deep the JSON text's brackets nest (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def check_target(job: object) -> tuple[int | None, str | None]:
    """The job an event goes to: an id (an ``int``) or the idempotency key it was enqueued with
    (a ``str``); returns ``(id, key)`` with the other None."""
    if isinstance(job, bool) or not isinstance(job, int | str):
        raise ConfigurationError(
            f"send an event to a job id (int) or idempotency key (str), got {type(job).__name__}",
            field="job",
        )
    if isinstance(job, int):
        if not 1 <= job <= MAX_JOB_ID:
            raise ConfigurationError(f"job id {job} is out of range", field="job")
        return job, None
    return None, check_key(job, field="job")


def psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection of ``connection`` (itself, or the one under a SQLAlchemy
    ``Connection`` on the psycopg driver), so that a send joins the caller's transaction."""
    if isinstance(connection, psycopg.Connection):
        return connection
    pooled = getattr(connection, "connection", None)  # SQLAlchemy: the DBAPI connection's proxy
    driver = getattr(pooled, "driver_connection", None)
    if isinstance(driver, psycopg.Connection):
        return driver
    raise ConfigurationError(
        "connection must be a psycopg.Connection or a SQLAlchemy Connection on the psycopg "
        f"driver (use send_event_async for an async one), got {type(connection).__name__}",
        field="connection",
    )


def send(target: Target, job: int | str, name: str, payload: Any = None) -> SentEvent:
    """Put event ``name`` with ``payload`` in the mailbox of workflow job ``job`` (an id or an
    idempotency key), waking the workflow when it waits for it. On a connection with an open
    transaction the event is part of it. Raises ``JobNotFound`` (no such job) or
    ``JobStateConflict`` (it has ended: nobody would read the event); nothing is written then.

    Example: ``events.send(dsn, 42, "payment_confirmed", {"amount": 1200})``
    """
    job_id, key = check_target(job)
    name = check_event_name(name)
    text = event_json(payload)
    with target_connection(target) as conn:
        if not conn.autocommit:  # the caller's transaction: the send is part of it
            return _send(conn, job_id, key, name, text)
        with conn.transaction():
            return _send(conn, job_id, key, name, text)


def _send(
    conn: psycopg.Connection[Any], job_id: int | None, key: str | None, name: str, text: str
) -> SentEvent:
    found = conn.execute(queries.EVENT_LOCK_TARGET, {"id": job_id, "key": key}).fetchone()
    if found is None:
        raise _not_queued(conn, job_id, key)
    target_id = int(found[0])
    event_id, sent_at = conn.execute(
        queries.EVENT_INSERT, {"job_id": target_id, "name": name, "payload": text}
    ).fetchone() or (None, None)
    woke = conn.execute(queries.EVENT_WAKE, {"job_id": target_id, "name": name}).fetchone()
    assert event_id is not None and sent_at is not None
    return SentEvent(int(event_id), target_id, name, sent_at, woke is not None)


async def send_async(
    conn: psycopg.AsyncConnection[Any], job: int | str, name: str, payload: Any = None
) -> SentEvent:
    """``send`` on an async connection (in the caller's transaction unless it is in autocommit
    mode).

    Example: ``await events.send_async(conn, "order-7", "paid")``
    """
    job_id, key = check_target(job)
    name = check_event_name(name)
    text = event_json(payload)
    with translate_errors():
        if not conn.autocommit:
            return await _send_async(conn, job_id, key, name, text)
        async with conn.transaction():
            return await _send_async(conn, job_id, key, name, text)


async def _send_async(
    conn: psycopg.AsyncConnection[Any], job_id: int | None, key: str | None, name: str, text: str
) -> SentEvent:
    cursor = await conn.execute(queries.EVENT_LOCK_TARGET, {"id": job_id, "key": key})
    found = await cursor.fetchone()
    if found is None:
        cursor = await conn.execute(queries.EVENT_TARGET_ENDED, {"id": job_id, "key": key})
        raise _refusal(job_id, key, await cursor.fetchone())
    target_id = int(found[0])
    cursor = await conn.execute(
        queries.EVENT_INSERT, {"job_id": target_id, "name": name, "payload": text}
    )
    event_id, sent_at = await cursor.fetchone() or (None, None)
    cursor = await conn.execute(queries.EVENT_WAKE, {"job_id": target_id, "name": name})
    woke = await cursor.fetchone()
    assert event_id is not None and sent_at is not None
    return SentEvent(int(event_id), target_id, name, sent_at, woke is not None)


def _not_queued(conn: psycopg.Connection[Any], job_id: int | None, key: str | None) -> Exception:
    ended = conn.execute(queries.EVENT_TARGET_ENDED, {"id": job_id, "key": key}).fetchone()
    return _refusal(job_id, key, ended)


def _refusal(job_id: int | None, key: str | None, ended: Any) -> Exception:
    """Why an event cannot go to the job: it is nowhere, or it has ended (``ended``: its home
    table and status)."""
    named = f"job {job_id}" if job_id is not None else f"the job with idempotency key {key!r}"
    if ended is None:
        return JobNotFound(f"no {named}: no event was sent")
    home, status = ended
    where = "is in dead_letter" if home == "dead_letter" else f"has ended ({status})"
    return JobStateConflict(f"{named} {where}: nothing would read the event, so none was sent")


@dataclass(frozen=True, slots=True)
class Taken:
    """The event a wait took from the mailbox."""

    payload: Any
    sent_at: datetime


def wait(
    conn: psycopg.Connection[Any],
    *,
    job_id: int,
    worker: str,
    attempt: int,
    name: str,
    deadline: datetime,
) -> Taken | None:
    """Attempt ``attempt`` of workflow job ``job_id``, leased by ``worker``, waits for event
    ``name`` until ``deadline``: the oldest such event in its mailbox is taken and returned; if
    there is none, the wait is registered and the job suspended until ``deadline`` (its slot
    given back, its attempt refunded), and None is returned: the caller then ends the run
    without an outcome to send. In one transaction on ``conn`` (its own when ``conn`` is in
    autocommit mode, else the caller's), under the job's row lock. Raises
    ``JobStateConflict`` when the attempt no longer holds the job.
    """
    with contextlib.nullcontext() if not conn.autocommit else conn.transaction():
        if not lock_own(conn, job_id=job_id, worker=worker, attempt=attempt):
            raise JobStateConflict(
                f"job {job_id}'s attempt {attempt} no longer holds its lease: it waits for nothing"
            )
        taken = take(conn, job_id=job_id, name=name)
        if taken is None:
            suspend(conn, job_id=job_id, worker=worker, attempt=attempt, name=name, until=deadline)
        return taken


def lock_own(conn: psycopg.Connection[Any], *, job_id: int, worker: str, attempt: int) -> bool:
    """Lock the workflow's own row, fenced by its lease (False: the attempt no longer holds
    it). Senders lock it too: what follows in the transaction is seen by a send, or sees it."""
    params = {"job_id": job_id, "worker": worker, "attempt": attempt}
    return conn.execute(queries.EVENT_LOCK_OWN, params).fetchone() is not None


def take(conn: psycopg.Connection[Any], *, job_id: int, name: str) -> Taken | None:
    """Take the oldest event ``name`` from the job's mailbox (its wait, if any, ends); None
    when none was sent. Under the job's row lock (``lock_own``)."""
    params = {"job_id": job_id, "name": name}
    taken = conn.execute(queries.EVENT_TAKE, params).fetchone()
    if taken is None:
        return None
    conn.execute(queries.EVENT_WAIT_END, params)
    return Taken(taken[0], taken[1])


def suspend(
    conn: psycopg.Connection[Any],
    *,
    job_id: int,
    worker: str,
    attempt: int,
    name: str | None,
    until: datetime | str,
) -> None:
    """Give the job's slot back until ``until`` (a time, or ``"infinity"``: until woken), its
    attempt refunded; with ``name``, register that it waits for that event (a send wakes it).
    Under the job's row lock (``lock_own``)."""
    params = {"job_id": job_id, "worker": worker, "attempt": attempt, "name": name}
    if name is not None:
        conn.execute(queries.EVENT_WAIT_REGISTER, {**params, "deadline": until})
    if conn.execute(queries.EVENT_SUSPEND, {**params, "until": until}).fetchone() is None:
        raise JobStateConflict(f"job {job_id}'s attempt {attempt} no longer holds its lease")


def give_up(conn: psycopg.Connection[Any], *, job_id: int, name: str) -> None:
    """The wait for ``name`` timed out: the job stops waiting for it (a later event of that
    name is kept for a later wait)."""
    conn.execute(queries.EVENT_WAIT_END, {"job_id": job_id, "name": name})


def sweep(target: Target, *, limit: int = 10_000) -> int:
    """Remove the mail and waits of jobs that have left ``queued_jobs`` (ended); returns how
    many rows went. Run by the maintenance round."""
    with target_connection(target) as conn:
        row = conn.execute(queries.EVENT_SWEEP, {"limit": limit}).fetchone()
    return int(row[0]) if row else 0
