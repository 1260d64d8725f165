"""The options a job may be enqueued with, each with the check that it was kept: shared by the
tests that enqueue a job carrying one option beside other jobs (a job waiting ``after`` it, a
COPY-sized call, a job with a group), in Python and over HTTP.

A check is given the test's connection and ``send``, which makes one call holding the job with
the option (its payload as given) and whatever else the test puts beside it, and returns that
job's id. A check may send twice: a key is kept only if the second call keeps the first job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg

from tests.support.factories import claim_limited, declared_task
from tests.support.helpers import scalar

#: The task of the job that carries the option (its group limit: one running job per group).
TASK = "mixed.job"
#: A moment far ahead, as run_at and expires_at.
FUTURE = datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC)

Send = Callable[[dict[str, Any]], int]


class Option(NamedTuple):
    """An option: its ``JobSpec`` keywords, its fields in the HTTP API's job JSON (None: the
    API has no such option), and the check that the job kept it."""

    name: str
    spec: dict[str, Any]
    json: dict[str, Any] | None
    check: Callable[[psycopg.Connection[Any], Send], None]


def column(conn: psycopg.Connection[Any], job_id: int, name: str) -> Any:
    """Column ``name`` of queued job ``job_id`` (one column: a waiting job's run_at, 'infinity',
    is no Python datetime)."""
    return scalar(conn, f"SELECT {name} FROM queued_jobs WHERE id = %s", [job_id])


def _keeps(name: str, expected: Any) -> Callable[[psycopg.Connection[Any], Send], None]:
    def check(conn: psycopg.Connection[Any], send: Send) -> None:
        assert column(conn, send({"n": 1}), name) == expected

    return check


def _later(name: str) -> Callable[[psycopg.Connection[Any], Send], None]:
    """The column is about an hour from the database's now (a delay of 3,600 seconds)."""

    def check(conn: psycopg.Connection[Any], send: Send) -> None:
        assert column(conn, send({"n": 1}), f"{name} > now() + interval '50 minutes'") is True

    return check


def _idempotent(conn: psycopg.Connection[Any], send: Send) -> None:
    first = send({"n": 1})
    assert send({"n": 1}) == first, "the second call with the key returns the first job"
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = %s", [TASK]) == 1
    assert column(conn, first, "idempotency_key") == "key-1"


def _grouped(conn: psycopg.Connection[Any], send: Send) -> None:
    first, second = send({"n": 1}), send({"n": 2})
    assert first != second
    assert column(conn, first, "group_key") == column(conn, second, "group_key") == "group-1"
    states = conn.execute("SELECT queue, group_key FROM pgjobs_group_states").fetchall()
    assert ("default", "group-1") in states
    # One running job per group: of the group's two jobs, a claim takes one.
    jobs, _ = claim_limited(conn, [declared_task(TASK, group_concurrency=1)], limit=1000)
    assert [job.id for job in jobs if job.task == TASK] == [first]


def _unique(mode: str) -> Callable[[psycopg.Connection[Any], Send], None]:
    def check(conn: psycopg.Connection[Any], send: Send) -> None:
        first = send({"n": 1})
        assert send({"n": 2}) == first, "the second call with the unique key finds the first job"
        assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = %s", [TASK]) == 1
        assert column(conn, first, "unique_key") == "unique-1"
        payload = column(conn, first, "payload")
        assert payload == ({"n": 1} if mode == "keep" else {"n": 2})
        if mode == "debounce":
            assert column(conn, first, "run_at > now() + interval '50 minutes'") is True

    return check


#: Every option of ``App.enqueue`` a job with no ``after`` may have, one at a time.
OPTIONS = [
    Option(
        "idempotency_key", {"idempotency_key": "key-1"}, {"idempotency_key": "key-1"}, _idempotent
    ),
    Option("group", {"group": "group-1"}, {"group": "group-1"}, _grouped),
    *(
        Option(
            f"unique_key-{mode}",
            {"unique_key": "unique-1", "on_conflict": mode}
            | ({"debounce": 3600} if mode == "debounce" else {}),
            {"unique_key": "unique-1", "on_conflict": mode}
            | ({"debounce": 3600} if mode == "debounce" else {}),
            _unique(mode),
        )
        for mode in ("keep", "replace", "debounce")
    ),
    Option("tags", {"tags": ["a:1", "b"]}, {"tags": ["a:1", "b"]}, _keeps("tags", ["a:1", "b"])),
    Option("priority", {"priority": 7}, {"priority": 7}, _keeps("priority", 7)),
    Option("run_at", {"run_at": FUTURE}, {"run_at": FUTURE.isoformat()}, _keeps("run_at", FUTURE)),
    Option("run_in", {"run_in": 3600}, {"delay": 3600}, _later("run_at")),
    Option("max_attempts", {"max_attempts": 9}, {"max_attempts": 9}, _keeps("max_attempts", 9)),
    Option(
        "expires_at",
        {"expires_at": FUTURE},
        {"expires_at": FUTURE.isoformat()},
        _keeps("expires_at", FUTURE),
    ),
    Option("expires_in", {"expires_in": 3600}, {"expires_in": 3600}, _later("expires_at")),
    Option("queue", {"queue": "elsewhere"}, {"queue": "elsewhere"}, _keeps("queue", "elsewhere")),
]

#: The options a job waiting ``after`` others may have, and the check that it kept each: a
#: waiting job sits at run_at 'infinity', the run_at it asked for kept in pgjobs_waiting.
DEPENDENT_OPTIONS: dict[str, tuple[dict[str, Any], str, Any]] = {
    "queue": ({"queue": "elsewhere"}, "queue", "elsewhere"),
    "priority": ({"priority": -3}, "priority", -3),
    "run_at": (
        {"run_at": FUTURE},
        "(SELECT w.run_at FROM pgjobs_waiting w WHERE w.job_id = queued_jobs.id)",
        FUTURE,
    ),
    "tags": ({"tags": ["dependent"]}, "tags", ["dependent"]),
    "max_attempts": ({"max_attempts": 4}, "max_attempts", 4),
    "expires_at": ({"expires_at": FUTURE}, "expires_at", FUTURE),
    "idempotency_key": ({"idempotency_key": "dependent"}, "idempotency_key", "dependent"),
    "group": ({"group": "dependent"}, "group_key", "dependent"),
    **{
        f"unique_key-{mode}": (
            {"unique_key": "dependent", "on_conflict": mode},
            "unique_key",
            "dependent",
        )
        for mode in ("keep", "replace", "debounce")
    },
}
