"""Workflows that wait without a slot: for an event (``ctx.wait_for``) and for their children
(``ctx.map``, ``ctx.run``), run by real workers on a real database."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgjobs import App, ChildFailed, EventTimeout, WorkflowContext
from pgjobs.errors import WorkflowError
from tests.support.external import run_worker_while
from tests.support.factories import row
from tests.support.helpers import count, scalar, wait_until


def _ended(conn: psycopg.Connection[Any], job_id: int) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT EXISTS (SELECT 1 FROM archived_jobs WHERE id = %(id)s) "
            "OR EXISTS (SELECT 1 FROM dead_letter WHERE id = %(id)s)",
            {"id": job_id},
        )
    )


def _suspended(conn: psycopg.Connection[Any], job_id: int) -> bool:
    return bool(
        scalar(
            conn,
            "SELECT lease_owner IS NULL AND run_at > now() FROM queued_jobs WHERE id = %s",
            [job_id],
        )
    )


def work(
    app: App,
    conn: psycopg.Connection[Any],
    job_id: int,
    *,
    queues: list[str] | None = None,
    until: str = "ended",
    **config: Any,
) -> int:
    """Run a worker of ``app`` until job ``job_id`` has ended (or, ``until="suspended"``, waits
    without a slot); returns the worker's exit code."""
    done = _ended if until == "ended" else _suspended

    def scenario(_worker: Any) -> None:
        wait_until(lambda: done(conn, job_id), timeout=120, what=f"job {job_id} {until}")

    if queues is not None:
        config["queues"] = queues
    return run_worker_while(app, scenario, **config)[1]


def _entries(conn: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT kind, name, status FROM pgjobs_workflow_history WHERE job_id = %s ORDER BY seq",
        [job_id],
    ).fetchall()


def test_a_workflow_waits_for_an_event_without_a_slot_and_resumes_with_it(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    charged: list[int] = []

    @app.workflow(name="shop.checkout", max_attempts=1)
    def checkout(ctx: WorkflowContext, order: int) -> dict[str, Any]:
        ctx.step("charge", lambda: charged.append(order))
        shipped = ctx.wait_for("shipped")
        return {"order": order, "carrier": shipped["carrier"]}

    job_id = app.enqueue("shop.checkout", {"order": 7})
    assert work(app, conn, job_id, until="suspended") == 0
    waiting = conn.execute(
        "SELECT lease_owner, attempts, snoozes, run_at = 'infinity' FROM queued_jobs WHERE id = %s",
        [job_id],
    ).fetchone()
    assert waiting == (None, 0, 0, True)  # no slot, no attempt, no snooze: until the event
    assert _entries(conn, job_id) == [("step", "charge", "done"), ("event", "shipped", "waiting")]
    sent = app.send_event(job_id, "shipped", {"carrier": "ups"})
    assert sent.woke
    assert work(app, conn, job_id) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == {"order": 7, "carrier": "ups"}
    assert charged == [7]  # the step before the wait ran once
    assert _entries(conn, job_id)[1] == ("event", "shipped", "done")
    assert count(conn, "pgjobs_events") == 0 and count(conn, "pgjobs_event_waits") == 0


def test_an_event_sent_before_the_wait_is_taken_at_once(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.workflow(name="shop.refund")
    async def refund(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for("approved")

    job_id = app.enqueue("shop.refund", {}, idempotency_key="refund-9")
    app.send_event("refund-9", "approved", {"by": "ana"})
    assert work(app, conn, job_id) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == {"by": "ana"}


def test_a_wait_that_times_out_raises_event_timeout(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.workflow(name="shop.remind")
    def remind(ctx: WorkflowContext) -> str:
        try:
            ctx.wait_for("paid", timeout=0.2)
        except EventTimeout as exc:
            return f"reminded: {exc.name}"
        return "paid"

    job_id = app.enqueue("shop.remind", {})
    assert work(app, conn, job_id) == 0  # suspended until the deadline, then it times out
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == "reminded: paid"
    assert _entries(conn, job_id) == [("event", "paid", "failed")]


def test_an_uncaught_timeout_dead_letters_the_workflow(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.workflow(name="shop.expire")
    def expire(ctx: WorkflowContext) -> None:
        ctx.wait_for("paid", timeout=0)

    job_id = app.enqueue("shop.expire", {})
    assert work(app, conn, job_id) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "non_retryable" and "no event 'paid' came" in dead["last_error"]


def test_map_runs_children_and_returns_their_results_in_order(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    fanned: list[int] = []

    @app.task(name="math.square")
    def square(n: int) -> int:
        return n * n

    @app.workflow(name="math.sum_squares", max_attempts=1)
    def sum_squares(ctx: WorkflowContext, upto: int) -> int:
        ctx.step("start", lambda: fanned.append(upto))
        squares = ctx.map("math.square", [{"n": n} for n in range(upto)], priority=3)
        one = ctx.run(square, {"n": 12})
        return int(sum(squares) + one)

    job_id = app.enqueue("math.sum_squares", {"upto": 5})
    assert work(app, conn, job_id) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == 0 + 1 + 4 + 9 + 16 + 144
    assert fanned == [5]
    assert scalar(conn, "SELECT count(*) FROM archived_jobs WHERE task = 'math.square'") == 6
    priorities = "SELECT DISTINCT priority FROM archived_jobs WHERE payload->>'n' IN ('0', '4')"
    assert scalar(conn, priorities) == 3
    assert _entries(conn, job_id)[1:] == [
        ("children", "math.square", "done"),
        ("children", "math.square", "done"),
    ]
    # The workflow never held a slot while its children ran, nor spent an attempt.
    assert done["attempts"] == 1 and done["snoozes"] == 0


def test_a_failed_child_raises_child_failed_with_the_others_results(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.task(name="math.invert", max_attempts=1)
    def invert(n: int) -> float:
        return 1 / n

    @app.workflow(name="math.inverses")
    def inverses(ctx: WorkflowContext) -> dict[str, Any]:
        try:
            return {"all": ctx.map("math.invert", [{"n": 1}, {"n": 0}, {"n": 4}])}
        except ChildFailed as exc:
            return {"results": exc.results, "failed": [f[0] for f in exc.failures]}

    job_id = app.enqueue("math.inverses", {})
    assert work(app, conn, job_id) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == {"results": [1.0, None, 0.25], "failed": [1]}


def test_children_are_enqueued_once_however_often_the_workflow_runs(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.task(name="t.child", queue="children")  # no worker serves it yet
    def child(n: int) -> int:
        return n

    @app.workflow(name="t.parent")
    def parent(ctx: WorkflowContext) -> list[int]:
        return list(ctx.map(child, [{"n": 1}, {"n": 2}]))

    job_id = app.enqueue("t.parent", {})
    assert work(app, conn, job_id, queues=["default"], until="suspended") == 0
    # Made ready by hand (as an operator's edit would): it runs, finds its children pending and
    # suspends again, enqueueing none.
    conn.execute("UPDATE queued_jobs SET run_at = now() WHERE id = %s", [job_id])
    assert work(app, conn, job_id, queues=["default"], until="suspended") == 0
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = 't.child'") == 2
    assert scalar(conn, "SELECT run_at = 'infinity' FROM queued_jobs WHERE id = %s", [job_id])
    assert work(app, conn, job_id, queues=["children", "default"]) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == [1, 2]


def test_ten_thousand_children(make_app: Any, conn: psycopg.Connection[Any]) -> None:
    app: App = make_app()

    @app.task(name="t.leaf")
    def leaf(n: int) -> int:
        return n

    @app.workflow(name="t.fan")
    def fan(ctx: WorkflowContext) -> int:
        results = ctx.map(leaf, [{"n": n} for n in range(10_000)])
        assert results == list(range(10_000))
        return len(results)

    job_id = app.enqueue("t.fan", {})
    assert work(app, conn, job_id, concurrency=32) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == 10_000


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (lambda ctx: ctx.wait_for("paid", timeout=-1), "timeout is seconds from 0"),
        (lambda ctx: ctx.wait_for("paid", timeout=float("nan")), "timeout is seconds from 0"),
        (lambda ctx: ctx.wait_for(" paid"), "begins or ends with a space"),
        (lambda ctx: ctx.map("t.leaf", [{}], after=[1]), "but 'after'"),
        (lambda ctx: ctx.map("t.leaf", {"n": 1}), "iterable of payload dicts"),
        (lambda ctx: ctx.map("t.nope", [{}]), "unknown task 't.nope'"),
    ],
)
def test_bad_waits_dead_letter_the_workflow_in_one_line(
    make_app: Any, conn: psycopg.Connection[Any], body: Any, words: str
) -> None:
    app: App = make_app()

    @app.task(name="t.leaf")
    def leaf() -> None: ...

    @app.workflow(name="t.bad")
    def bad(ctx: WorkflowContext) -> None:
        body(ctx)

    job_id = app.enqueue("t.bad", {})
    assert work(app, conn, job_id) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None and dead["reason"] == "non_retryable", dead
    assert words in dead["last_error"] and "\n" not in dead["last_error"]
    assert count(conn, "pgjobs_events") == 0
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 0  # no child was enqueued


def test_waits_outside_a_workflow_are_refused(make_app: Any, conn: psycopg.Connection[Any]) -> None:
    app: App = make_app()
    seen: list[Any] = []

    @app.workflow(name="t.leak")
    def leak(ctx: WorkflowContext) -> None:
        seen.append(ctx)

    job_id = app.enqueue("t.leak", {})
    work(app, conn, job_id)
    with pytest.raises(WorkflowError, match="works only while its workflow runs"):
        seen[0].wait_for("paid")
    with pytest.raises(WorkflowError, match="works only while its workflow runs"):
        seen[0].map("t.leak", [{}])
