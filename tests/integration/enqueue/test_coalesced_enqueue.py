"""One-job enqueues that arrive together on the app's pool go in as one statement and one commit
(``pgjobs.enqueue.coalescing``): each caller still gets its own job's id, and its own error.

To make the callers meet for sure, the first statement is held back until every other caller has
boarded the next flight (``hold_first``); nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.errors import QueryFailed
from tests.support.helpers import count

CALLERS = 12


def hold_first(app: App, boarding: Callable[[], int], others: int) -> list[int]:
    """Spy on ``app``'s statements: the first waits until ``boarding()`` callers wait for the
    next flight (``others``); returns the rows of each statement sent, in order."""
    sent: list[int] = []
    sender = app._sender
    send = sender._send
    send_async = sender._send_async

    def wait_for_others() -> None:
        deadline = time.monotonic() + 30
        while boarding() < others:
            assert time.monotonic() < deadline, "the other callers never boarded"
            time.sleep(0.005)

    def held(rows: list[Any]) -> list[int]:
        sent.append(len(rows))
        if len(sent) == 1:
            wait_for_others()
        return send(rows)

    async def held_async(rows: list[Any]) -> list[int]:
        sent.append(len(rows))
        deadline = time.monotonic() + 30
        while len(sent) == 1 and boarding() < others:
            assert time.monotonic() < deadline, "the other callers never boarded"
            await asyncio.sleep(0.005)
        return await send_async(rows)

    sender._coalescer._send = held
    if sender._async_coalescer is not None:  # the running loop's, made by an earlier enqueue
        sender._async_coalescer._send = held_async
    sender._send_async = held_async  # type: ignore[method-assign]
    return sent


def threads_boarding(app: App) -> Callable[[], int]:
    def boarding() -> int:
        flight = app._sender._coalescer._next
        return 0 if flight is None else len(flight.rows)

    return boarding


def enqueue_in_threads(
    app: App, payloads: list[dict[str, Any]], sent: list[int]
) -> list[int | BaseException]:
    """Each payload enqueued by a thread of its own, the first one's statement sent before the
    others start (it goes alone); each caller's id or error."""
    outcomes: list[int | BaseException] = [0] * len(payloads)

    def run(position: int) -> None:
        try:
            outcomes[position] = app.enqueue("t", payloads[position], queue="q")
        except BaseException as exc:  # each caller's outcome, its error too
            outcomes[position] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(payloads))]
    threads[0].start()
    while not sent:
        time.sleep(0.001)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def written(conn: psycopg.Connection[Any]) -> dict[int, Any]:
    return dict(conn.execute("SELECT id, payload FROM queued_jobs").fetchall())


def test_callers_meeting_share_one_statement_each_with_its_own_id(make_app, conn):
    app: App = make_app(check_task_names=False)
    sent = hold_first(app, threads_boarding(app), CALLERS - 1)
    payloads = [{"caller": n} for n in range(CALLERS)]

    ids = enqueue_in_threads(app, payloads, sent)

    assert sorted(sent) == [1, CALLERS - 1], "one caller alone, then the others together"
    assert len(set(ids)) == CALLERS
    rows = written(conn)
    assert [rows[job_id] for job_id in ids if isinstance(job_id, int)] == payloads
    assert count(conn, "queued_jobs") == CALLERS
    queued = conn.execute(
        "SELECT DISTINCT queue, task, priority, max_attempts, run_at <= now(), expires_at "
        "FROM queued_jobs"
    ).fetchall()
    assert queued == [("q", "t", 0, 5, True, None)], "the one-job insert's columns"


def test_a_row_the_database_refuses_fails_only_its_caller(make_app, conn, refusing):
    app: App = make_app(check_task_names=False)
    sent = hold_first(app, threads_boarding(app), CALLERS - 1)
    payloads = [{"caller": n} for n in range(CALLERS)]
    payloads[5] = {"caller": 5, "refused": True}

    outcomes = enqueue_in_threads(app, payloads, sent)

    refused = outcomes[5]
    assert isinstance(refused, QueryFailed), refused
    assert "test_no_refused" in str(refused)
    ids = [outcome for n, outcome in enumerate(outcomes) if n != 5]
    assert all(isinstance(job_id, int) for job_id in ids), outcomes
    assert len(set(ids)) == CALLERS - 1
    rows = written(conn)
    assert len(rows) == CALLERS - 1
    for n, outcome in enumerate(outcomes):
        if n != 5:
            assert rows[outcome] == payloads[n]  # type: ignore[index]
    assert sent[:2] == [1, CALLERS - 1], "refused together, then each caller alone"
    assert sorted(sent[2:]) == [1] * (CALLERS - 1)


def test_async_tasks_meeting_share_one_statement(make_app, conn, refusing):
    app: App = make_app(check_task_names=False)
    payloads = [{"caller": n} for n in range(CALLERS)]
    payloads[3] = {"refused": 3}

    async def main() -> list[int | BaseException]:
        async with app:
            await app.enqueue_async("t", {"warm": True}, queue="q")  # the loop's coalescer
            coalescer = app._sender._async_coalescer
            assert coalescer is not None
            sent = hold_first(app, lambda: len(coalescer._next), CALLERS - 1)
            outcomes = await asyncio.gather(
                *(app.enqueue_async("t", payload, queue="q") for payload in payloads),
                return_exceptions=True,
            )
            assert sent[:2] == [1, CALLERS - 1], sent
            return outcomes

    outcomes = asyncio.run(main())

    assert isinstance(outcomes[3], QueryFailed), outcomes[3]
    ids = [outcome for n, outcome in enumerate(outcomes) if n != 3]
    assert len(set(ids)) == CALLERS - 1
    rows = written(conn)
    for n, outcome in enumerate(outcomes):
        if n != 3:
            assert rows[outcome] == payloads[n]  # type: ignore[index]
    assert len(rows) == CALLERS  # the warm-up job and the others


def test_a_caller_alone_goes_at_once_with_its_own_error(make_app, conn, refusing):
    app: App = make_app(check_task_names=False)
    sent = hold_first(app, lambda: 0, 0)

    job_id = app.enqueue("t", {"n": 1}, queue="q")
    with pytest.raises(QueryFailed, match="test_no_refused"):
        app.enqueue("t", {"refused": True}, queue="q")

    assert sent == [1, 1]
    assert written(conn) == {job_id: {"n": 1}}


def test_keyed_jobs_keep_their_own_path_and_tagged_ones_share_the_flight(make_app, conn):
    app: App = make_app(check_task_names=False)
    sent = hold_first(app, lambda: 0, 0)

    first = app.enqueue("t", {}, idempotency_key="k")
    assert app.enqueue("t", {}, idempotency_key="k") == first
    assert sent == [], "keyed jobs: not through the coalescer"
    tagged = app.enqueue("t", {}, tags=["tenant:a"])
    assert sent == [1], "a tagged job is written by the shared statement as by its own"
    row = conn.execute("SELECT tags FROM queued_jobs WHERE id = %s", (tagged,)).fetchone()
    assert row == (["tenant:a"],)
    assert count(conn, "queued_jobs") == 2
