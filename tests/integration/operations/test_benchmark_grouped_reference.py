"""The raw grouped reference of the groups benchmark (``benchmarks.raw.grouped``) holds on a real
PostgreSQL the guarantee its row is compared under: with several clients at once, at most one job
of a group runs at a time, and the group whose last claim is oldest is taken first."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from benchmarks import QUEUE, raw
from pgjobs.db.dsn import Dsn
from tests.support.helpers import scalar

GROUPS = 20
PER_GROUP = 15


def _fill(conn: psycopg.Connection[Any]) -> None:
    """``GROUPS`` groups of ``PER_GROUP`` ready jobs, interleaved, and the reference's rows."""
    raw.grouped_reset(conn)
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, payload, group_key) "
        "SELECT %s, 'bench.grouped', '{}', 'g' || (n %% %s) FROM generate_series(1, %s) n",
        (QUEUE, GROUPS, GROUPS * PER_GROUP),
    )
    raw.grouped_fill(conn)


def test_several_clients_never_run_two_jobs_of_a_group_at_once(
    dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    _fill(conn)
    errors: list[BaseException] = []

    def client(name: str) -> None:
        try:
            raw.grouped(dsn.url, 8, owner=name)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    clients = [threading.Thread(target=client, args=(f"client-{n}",)) for n in range(4)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(120)
    assert errors == []
    assert scalar(conn, "SELECT count(*) FROM archived_jobs") == GROUPS * PER_GROUP
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 0
    # Each job of a group started after the one before it had ended.
    overlaps = scalar(
        conn,
        "SELECT count(*) FROM ("
        "  SELECT started_at, lag(finished_at) OVER (PARTITION BY group_key ORDER BY started_at)"
        "  AS before FROM archived_jobs) j WHERE started_at <= before",
    )
    assert overlaps == 0
    assert scalar(conn, "SELECT count(DISTINCT worker) FROM archived_jobs") > 1


def test_one_client_takes_the_groups_in_turns(dsn: Dsn, conn: psycopg.Connection[Any]) -> None:
    """One job at a time: every group's first job before any group's second, and so on."""
    _fill(conn)
    raw.grouped(dsn.url, 1)
    order = [
        row[0]
        for row in conn.execute("SELECT group_key FROM archived_jobs ORDER BY started_at, id")
    ]
    rounds = [order[n : n + GROUPS] for n in range(0, len(order), GROUPS)]
    assert len(rounds) == PER_GROUP
    assert all(len(set(turn)) == GROUPS for turn in rounds)
