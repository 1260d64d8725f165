"""Jobs with a group or a unique key: their options checked, and the statement that writes them.

A job with a group upserts its group's row of ``pgjobs_group_states`` in the statement that
inserts it (a claim trusts its count of a group's running jobs only while that row is unchanged).
A unique key covers the task's jobs not started yet (``uq_queued_jobs_unique_key``): a second
enqueue with the key keeps the job that holds it (``on_conflict="keep"``, the default), gives it
the new payload, priority and run time (``"replace"``), or does so and moves its run time to
``debounce`` seconds from now (``"debounce"``). A throttled task (``Task.throttle``) starts at
most one job per unique key per window: a new job of the key runs no earlier than the start of
the previous one plus the throttle (``pgjobs_throttles`` names that previous job).

Plain jobs never come here: their statements are those of ``pgjobs.enqueue.statements``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from pgjobs import queries, tags
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.submission import JobSpec, check_key, check_on_conflict, check_seconds
from pgjobs.tags import Tags
from pgjobs.tasks import Task

#: Statements a keyed insert may send before every job is resolved: a job whose key a concurrent
#: enqueue holds but has not committed yet is resolved by the next statement, which sees the
#: commit (more than one round only under contention on the key). Each round can meet a new
#: holder: while the key's jobs keep starting (a started job frees the key), the holder the last
#: round waited for may have started before this round looks, and another producer's uncommitted
#: insert may have taken the key again. Eight producers on one key beside a worker starting its
#: jobs, on a loaded machine, lost five rounds in a row about one run in three; twenty make a
#: caller's "retry" error that rare contention's, not a busy machine's.
ROUNDS = 20


class Keys(NamedTuple):
    """A job's group and unique-key options, checked; all None for a plain job."""

    group_key: str | None = None
    unique_key: str | None = None
    #: "keep", "replace" or "debounce" with a unique key; None without one.
    on_conflict: str | None = None
    #: Seconds a debounced job waits (the call's, else the task's, else 0).
    debounce: float | None = None
    #: The task's throttle in seconds, for a job with a unique key.
    throttle: float | None = None


PLAIN = Keys()


def check(spec: JobSpec, task: Task | None) -> Keys:
    """``spec``'s group, unique key, ``on_conflict`` and ``debounce`` checked (a
    ``ConfigurationError`` naming the field), with the task's debounce and throttle.

    Example: ``check(JobSpec("t", unique_key="user-7", on_conflict="replace"), None)``
    """
    if (
        spec.group is None
        and spec.unique_key is None
        and spec.on_conflict is None
        and spec.debounce is None
    ):
        return PLAIN
    group = None if spec.group is None else check_key(spec.group, "group")
    if spec.unique_key is None:
        for field in ("on_conflict", "debounce"):
            if getattr(spec, field) is not None:
                raise ConfigurationError(
                    f"{field} applies to a job with a unique_key; give unique_key too",
                    field=field,
                )
        return Keys(group)
    unique_key = check_key(spec.unique_key, "unique_key")
    mode = "keep" if spec.on_conflict is None else check_on_conflict(spec.on_conflict)
    if spec.debounce is not None:
        if mode != "debounce":
            raise ConfigurationError(
                f"debounce applies to on_conflict='debounce', not {mode!r}", field="debounce"
            )
        debounce: float | None = check_seconds("debounce", spec.debounce)
    elif mode == "debounce":
        debounce = (task.debounce if task is not None else None) or 0.0
    else:
        debounce = None
    throttle = task.throttle if task is not None else None
    return Keys(group, unique_key, mode, debounce, throttle)


class KeyedRow(Protocol):
    """What the keyed insert reads of a job (``enqueue.PreparedJob``): a tuple whose fields
    are in the order of ``KEYED_PARAMS``."""

    @property
    def task(self) -> str: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def on_conflict(self) -> str | None: ...
    @property
    def throttle(self) -> float | None: ...
    @property
    def tags(self) -> Tags | None: ...
    def __getitem__(self, index: int, /) -> Any: ...


#: Parameter names of JOB_INSERT_KEYED, in the order of ``enqueue.PreparedJob``'s fields.
KEYED_PARAMS = (
    "queues",
    "tasks",
    "payloads",
    "priorities",
    "run_ats",
    "run_ins",
    "max_attempts",
    "expires_ats",
    "expires_ins",
    "keys",
    "payload_versions",
    "trace_contexts",
    "groups",
    "unique_keys",
    "modes",
    "debounces",
    "throttles",
)


def resolved(
    pending: list[int],
    answer: Iterable[tuple[Any, ...]],
    results: list[int | None],
    fresh: set[int] | None = None,
) -> list[int]:
    """Record in ``results`` the ids a round of a keyed insert answered ((position, id) rows,
    or (position, id, created), a position counting from 1 in ``pending``), and in ``fresh`` the
    ids the round created; returns the indexes still to send: those answered NULL (a concurrent
    enqueue holds their key and has not committed yet)."""
    still: list[int] = []
    for position, job_id, *created in answer:
        index = pending[position - 1]
        if job_id is None:
            still.append(index)
        else:
            results[index] = int(job_id)
            if created and created[0] and fresh is not None:
                fresh.add(int(job_id))
    return still


def merged(rows: Sequence[KeyedRow]) -> tuple[list[int], list[int]]:
    """The rows of a batch that go to the database, and for each row the position (in the
    first list) of the one that stands for it: several rows with the same task and unique key
    act as if enqueued one after the other, so the last that replaces or debounces stands for
    them all (keep, the default, leaves the first), and they all get its job's id; a row whose
    idempotency key an earlier row has gets that row's job (the first wins).

    Example: rows "keep", "replace" of one key: ``([1], [0, 0])``.
    """
    sent: list[int] = []
    where: dict[tuple[str, str], int] = {}
    first_with: dict[str, int] = {}
    stands_for: list[int] = []
    for index, row in enumerate(rows):
        if row.idempotency_key is not None and row.idempotency_key in first_with:
            stands_for.append(first_with[row.idempotency_key])
            continue
        if row.unique_key is None:
            position = len(sent)
            sent.append(index)
        elif (key := (row.task, row.unique_key)) not in where:
            position = where[key] = len(sent)
            sent.append(index)
        else:
            position = where[key]
            if row.on_conflict != "keep":
                # A later replace stands for the rows before it; a keep after it changes nothing.
                sent[position] = index
        if row.idempotency_key is not None:
            first_with[row.idempotency_key] = position
        stands_for.append(position)
    return sent, stands_for


def _key_field(rows: Sequence[KeyedRow]) -> str:
    """The kind of key of ``rows`` that needs READ COMMITTED, to name in an error."""
    return "idempotency_key" if any(row.idempotency_key for row in rows) else "unique_key"


def check_isolation(level: str, rows: Sequence[KeyedRow]) -> None:
    """Refuse idempotency and unique keys of ``rows`` in the caller's transaction when it is
    REPEATABLE READ or SERIALIZABLE (``level``).

    Such a transaction sees the database as of its first statement: a job with the same key
    committed later, then moved out of queued_jobs (run, archived), is in none of the three tables
    it can see, and its key no longer in queued_jobs' unique index, so a second job would be
    created. Only READ COMMITTED, where each statement sees every commit, keeps the promise. A
    unique key's holder committed since the snapshot, likewise, could be neither kept nor
    replaced (PostgreSQL would refuse the statement as a serialization failure).
    """
    field = _key_field(rows)
    keys = "idempotency keys" if field == "idempotency_key" else "unique keys"
    if level not in (
        "read committed",
        "read uncommitted",
    ):  # PostgreSQL reads the latter as the former
        raise ConfigurationError(
            f"{keys} need a READ COMMITTED transaction, and this one is {level.upper()}: "
            "its snapshot cannot see a job with the same key committed since it began, so a "
            "second job could be created; enqueue keyed jobs at READ COMMITTED or without "
            "connection=",
            field=field,
        )


Statement = tuple[str, dict[str, Any]]


def _throttled(row: KeyedRow) -> bool:
    return row.unique_key is not None and row.throttle is not None


def _lock_order(row: KeyedRow) -> tuple[bool, str, str]:
    return (row.unique_key is None, row.task, row.unique_key or "")


def insert_plan(
    rows: Sequence[KeyedRow], batch_id: int | None = None, fresh: set[int] | None = None
) -> Generator[Statement, list[tuple[Any, ...]], list[int]]:
    """The statements that insert ``rows`` (each with a group or a unique key, or beside such
    rows in one batch): it yields ``(sql, params)``, is sent back the rows, and returns the ids
    in the order of ``rows`` (for a key held, the holder's id). The rows it inserts are members
    of batch ``batch_id`` when one is given; ``fresh`` collects the ids of the jobs it created
    (not a key's holder)."""
    sent, stands_for = merged(rows)
    results: list[int | None] = [None] * len(sent)
    # In (task, unique key) order: concurrent batches that replace the same keys lock their
    # holders in one order.
    pending = sorted(range(len(sent)), key=lambda i: _lock_order(rows[sent[i]]))
    for _ in range(ROUNDS):
        batch = [rows[sent[i]] for i in pending]
        throttled = sorted({(row.task, str(row.unique_key)) for row in batch if _throttled(row)})
        if throttled:
            # The keys' throttle rows exist before the insert locks them (JOB_THROTTLE_ENSURE).
            keys = {"tasks": [t for t, _ in throttled], "unique_keys": [k for _, k in throttled]}
            yield queries.JOB_THROTTLE_ENSURE, keys
        params: dict[str, Any] = {
            name: [row[n] for row in batch] for n, name in enumerate(KEYED_PARAMS)
        }
        params["tags"] = tags.column(batch) if tags.tagged(batch) else None
        params["batch_id"] = batch_id
        still = resolved(pending, (yield queries.JOB_INSERT_KEYED, params), results, fresh)
        if not still:
            return [job_id for i in stands_for if (job_id := results[i]) is not None]
        pending = still
    raise PgjobsError(
        "could not resolve unique or idempotency keys held by concurrent, uncommitted "
        "enqueues; retry"
    )
