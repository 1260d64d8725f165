"""A history that no longer matches the code dead-letters the workflow (workflow_diverged);
bad input is a one-line WorkflowError that records nothing."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import psycopg
import pytest

from pgjobs import App, ConfigurationError, WorkflowContext, WorkflowDiverged, WorkflowError
from tests.support.factories import row, work


def entries(conn: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT seq, name, status FROM pgjobs_workflow_history WHERE job_id = %s ORDER BY seq",
        [job_id],
    ).fetchall()


def test_a_renamed_step_is_a_divergence(make_app, conn):
    app: App = make_app()
    version = [1]

    @app.workflow(name="t.changing", max_attempts=2, retry_base=0.01, retry_cap=0.02)
    def changing(ctx: WorkflowContext) -> None:
        if version[0] == 1:
            ctx.step("charge", lambda: 1)
            version[0] = 2  # the code changes (a deploy) before the workflow runs again
            raise RuntimeError("crash")
        ctx.step("charge-v2", lambda: 2)

    job_id = app.enqueue("t.changing", {})
    assert work(app) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert (dead["reason"], dead["error_type"]) == (
        "workflow_diverged",
        "pgjobs.errors.WorkflowDiverged",
    )
    assert "recorded step 'charge', the code now asks for step 'charge-v2'" in dead["last_error"]
    assert entries(conn, job_id) == [(0, "charge", "done")]


def test_returning_before_the_recorded_entries_is_a_divergence(make_app, conn):
    app: App = make_app()
    version = [1]

    @app.workflow(name="t.shorter", max_attempts=2, retry_base=0.01, retry_cap=0.02)
    def shorter(ctx: WorkflowContext) -> None:
        if version[0] == 1:
            version[0] = 2
            ctx.step("a", lambda: 1)
            raise RuntimeError("crash")

    job_id = app.enqueue("t.shorter", {})
    assert work(app) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None and dead["reason"] == "workflow_diverged"


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda ctx: ctx.step("x", lambda: {1, 2}), "returned a value JSON cannot hold"),
        (lambda ctx: ctx.step("x", lambda: math.nan), "returned a value JSON cannot hold"),
        (lambda ctx: (ctx.step("x", lambda: 1), ctx.step("x", lambda: 2)), "used twice"),
        (lambda ctx: ctx.step("", lambda: 1), "step's name must be non-empty"),
        (lambda ctx: ctx.step("x", 42), "fn must be callable"),
        (lambda ctx: ctx.sleep(-1), "ctx.sleep takes seconds from 0"),
        (lambda ctx: ctx.sleep(math.nan), "ctx.sleep takes seconds from 0"),
        (lambda ctx: ctx.sleep(1e12), "ctx.sleep takes seconds from 0"),
        (lambda ctx: ctx.sleep("5"), "ctx.sleep takes seconds from 0"),
        (lambda ctx: ctx.sleep_until(datetime(2030, 1, 1)), "timezone-aware"),
        (lambda ctx: ctx.sleep_until(datetime.max.replace(tzinfo=None)), "timezone-aware"),
        (lambda ctx: ctx.transaction(), "only inside a step's function"),
        (lambda ctx: ctx.step("outer", lambda: ctx.step("inner", lambda: 1)), "do not nest"),
    ],
)
def test_bad_input_is_one_line_and_records_nothing(make_app, conn, call, said):
    app: App = make_app()

    @app.workflow(name="t.bad")
    def bad(ctx: WorkflowContext) -> None:
        call(ctx)

    job_id = app.enqueue("t.bad", {})
    assert work(app) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert (dead["reason"], dead["error_type"]) == ("non_retryable", "pgjobs.errors.WorkflowError")
    assert said in dead["last_error"] and "\n" not in dead["last_error"]
    assert dead["attempts"] == 1
    recorded = [name for _, name, _ in entries(conn, job_id)]
    assert recorded in ([], ["x"]), "nothing of the bad call recorded"
    assert "outer" not in recorded


def test_a_workflow_called_outside_a_worker_says_so(make_app):
    app: App = make_app()

    @app.workflow(name="t.direct")
    def direct(ctx: WorkflowContext, n: int) -> int:
        return n

    with pytest.raises(WorkflowError, match="runs only as a job in a pgjobs worker"):
        direct(n=1)


def test_a_context_kept_after_its_run_refuses(make_app, conn):
    app: App = make_app()
    kept: list[WorkflowContext] = []

    @app.workflow(name="t.keep")
    def keep(ctx: WorkflowContext) -> None:
        kept.append(ctx)

    app.enqueue("t.keep", {})
    assert work(app) == 0
    with pytest.raises(WorkflowError, match=r"ctx.step\(\) works only while its workflow runs"):
        kept[0].step("late", lambda: 1)
    with pytest.raises(WorkflowError, match="works only while"):
        kept[0].sleep(1)


def test_a_workflow_needs_the_context_first(make_app):
    app: App = make_app()
    with pytest.raises(ConfigurationError, match="first parameter receives the"):
        app.workflow(name="t.none")(lambda: None)
    with pytest.raises(ConfigurationError, match="first parameter receives the"):
        app.workflow(name="t.kw")(lambda *, ctx: None)


def test_a_divergence_is_a_workflow_error():
    assert issubclass(WorkflowDiverged, WorkflowError)
