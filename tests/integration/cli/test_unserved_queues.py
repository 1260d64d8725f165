"""A job enqueued into a queue no live worker serves would wait unseen: `pgjobs enqueue` warns (one
line on stderr, exit 0), and `pgjobs stats` marks every queue with ready jobs and no live worker."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgjobs.maintenance.registry import STALE_AFTER, WorkerIdentity, WorkerRegistry
from tests.support.factories import run_service
from tests.support.helpers import run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

MARK = "(no live worker)"


def register(dsn, worker_id: str, queues: list[str]) -> None:
    """A worker row as a running `pgjobs work --queue ...` writes it."""
    identity = WorkerIdentity(worker_id, "box", 42, queues, 4, datetime.now(UTC))
    run_service(dsn, WorkerRegistry(identity))


def enqueue(capsys, dsn, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "enqueue", "t.x", *argv, "--dsn", dsn.url)


@pytest.mark.parametrize(
    ("workers", "argv", "queue"),
    [
        ({}, [], "default"),
        ({}, ["--queue", "emails"], "emails"),
        ({"w-1": ["images"]}, ["--queue", "emails"], "emails"),
        ({"w-1": ["emails", "images"]}, [], "default"),
    ],
)
def test_enqueue_warns_in_one_line_when_no_live_worker_serves_the_queue(
    capsys, dsn, conn, workers, argv, queue
):
    for worker_id, queues in workers.items():
        register(dsn, worker_id, queues)
    code, out, err = enqueue(capsys, dsn, *argv)
    assert code == 0, err
    job_id = int(out)
    assert conn.execute("SELECT queue FROM queued_jobs WHERE id = %s", [job_id]).fetchone() == (
        queue,
    )
    [line] = err.splitlines()
    assert line.startswith("pgjobs: warning: ")
    assert f"no live worker serves queue {queue!r}: job {job_id} waits" in line
    assert "the task's own queue is unknown" in line and "$PGJOBS_APP" in line


@pytest.mark.parametrize(
    ("queues", "argv"), [(["emails"], ["--queue", "emails"]), (["a", "default"], [])]
)
def test_enqueue_is_silent_when_a_live_worker_serves_the_queue(capsys, dsn, queues, argv):
    register(dsn, "w-1", queues)
    code, out, err = enqueue(capsys, dsn, *argv)
    assert (code, err) == (0, "")
    assert int(out) > 0


def test_a_worker_gone_silent_serves_nothing(capsys, dsn, conn):
    register(dsn, "w-1", ["emails"])
    conn.execute(
        "UPDATE pgjobs_workers SET last_seen_at = now() - %s * interval '1 second'",
        [STALE_AFTER + 5],
    )
    code, _, err = enqueue(capsys, dsn, "--queue", "emails")
    assert code == 0
    assert "no live worker serves queue 'emails'" in err


def stats_lines(capsys, dsn) -> dict[str, str]:
    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    return {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}


def test_stats_marks_queues_with_ready_jobs_and_no_live_worker(capsys, dsn, conn):
    register(dsn, "w-1", ["served"])
    for queue in ("served", "orphan", "later"):
        conn.execute(
            "INSERT INTO queued_jobs (queue, task, payload, run_at) VALUES "
            "(%s, 't.x', '{}', now() + CASE WHEN %s = 'later' THEN interval '1 hour' "
            "ELSE interval '0' END)",
            [queue, queue],
        )
    rows = stats_lines(capsys, dsn)
    assert MARK in rows["orphan"]
    assert MARK not in rows["served"]
    assert MARK not in rows["later"], "a scheduled job is not ready yet"


def test_enqueue_and_its_look_for_a_worker_share_one_connection(capsys, dsn, monkeypatch):
    """One job, one connection: no pool (whose probe and first connection made two) and no
    second connection for the look at the workers."""
    import psycopg

    opened = []
    real = psycopg.connect

    def counting(*args, **kwargs):
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", counting)
    monkeypatch.setattr(psycopg.Connection, "connect", counting)
    code, out, err = enqueue(capsys, dsn, "--queue", "emails")
    assert code == 0, err
    assert int(out) > 0 and "no live worker serves queue 'emails'" in err
    assert len(opened) == 1
