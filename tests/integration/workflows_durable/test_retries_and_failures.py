"""A step's own retries (inside the run, or with the workflow suspended), a step that fails for
good (dead_letter with the step's error, `dead group`), and a redrive that resumes from it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import App, RetryPolicy, StepFailed, WorkflowContext, admin
from pgjobs.admin import DeadFilter
from pgjobs.workflows import context as workflow_context
from tests.support.factories import row, work
from tests.support.helpers import assert_one_home

QUICK = RetryPolicy(base=0.01, cap=0.02)


def history(conn: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT seq, name, status, attempts, error_type FROM pgjobs_workflow_history "
        "WHERE job_id = %s ORDER BY seq",
        [job_id],
    ).fetchall()


def test_a_flaky_step_retries_inside_the_run_without_spending_the_workflows_attempts(
    make_app, conn
):
    app: App = make_app()
    tries: list[int] = []
    before: list[int] = []

    @pgjobs.step_policy(attempts=4, retry=QUICK)
    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise TimeoutError("upstream slow")
        return "ok"

    @app.workflow(name="t.flaky", max_attempts=1)
    def flow(ctx: WorkflowContext) -> Any:
        ctx.step("before", lambda: before.append(1))
        return ctx.step("flaky", flaky)

    job_id = app.enqueue("t.flaky", {})
    assert work(app) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    assert (done["status"], done["result"], done["attempts"]) == ("succeeded", "ok", 1)
    assert len(tries) == 3 and before == [1]
    assert history(conn, job_id) == [(0, "before", "done", 1, None), (1, "flaky", "done", 3, None)]


def test_a_long_retry_wait_suspends_the_workflow(make_app, conn, monkeypatch):
    monkeypatch.setattr(workflow_context, "IN_RUN_RETRY_WAIT", 0.0)  # every wait suspends
    app: App = make_app()
    tries: list[int] = []
    before: list[int] = []

    @pgjobs.step_policy(attempts=3, retry=QUICK)
    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("refused")
        return "ok"

    @app.workflow(name="t.suspending", max_attempts=1, max_snoozes=0)
    def flow(ctx: WorkflowContext) -> Any:
        ctx.step("before", lambda: before.append(1))
        return ctx.step("flaky", flaky)

    job_id = app.enqueue("t.suspending", {})
    assert work(app) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    # Two suspensions: no attempt spent, no snooze counted (max_snoozes=0 would have buried it).
    assert (done["status"], done["attempts"], done["snoozes"]) == ("succeeded", 1, 0)
    assert len(tries) == 3 and before == [1], "the recorded step did not run again"
    assert history(conn, job_id)[1] == (1, "flaky", "done", 3, None)


def test_a_step_failing_for_good_dead_letters_the_workflow_and_a_redrive_resumes_it(
    make_app, conn, dsn
):
    app: App = make_app()
    calls: dict[str, int] = {"charge": 0, "reserve": 0, "email": 0}
    broken = [True]

    def charge() -> int:
        calls["charge"] += 1
        return 1250

    @pgjobs.step_policy(attempts=2, retry=QUICK)
    def reserve() -> str:
        calls["reserve"] += 1
        if broken[0]:
            raise ValueError("warehouse 7 is offline")
        return "reserved"

    def email() -> None:
        calls["email"] += 1

    @app.workflow(name="t.shop", max_attempts=5)
    def shop(ctx: WorkflowContext) -> str:
        ctx.step("charge", charge)
        ctx.step("reserve", reserve)
        ctx.step("email", email)
        return "shipped"

    job_id = app.enqueue("t.shop", {})
    assert work(app) == 0
    assert calls == {"charge": 1, "reserve": 2, "email": 0}
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "exhausted"
    assert dead["error_type"] == "builtins.ValueError"
    assert "step 'reserve' failed after 2 attempts" in dead["last_error"]
    assert "warehouse 7 is offline" in dead["last_error"]
    assert "ValueError: warehouse 7 is offline" in dead["traceback"]
    assert dead["attempts"] == 1, "the workflow spent one attempt: the step's retries are its own"
    assert history(conn, job_id) == [
        (0, "charge", "done", 1, None),
        (1, "reserve", "failed", 2, "builtins.ValueError"),
    ]
    groups = admin.dead_groups(dsn, DeadFilter(task="t.shop"))
    assert [(g.count, g.latest_id) for g in groups] == [(1, job_id)]
    assert "warehouse" in groups[0].fingerprint

    broken[0] = False
    assert app.redrive(job_id) == 1
    assert work(app) == 0
    assert calls == {"charge": 1, "reserve": 3, "email": 1}, "resumed from the failed step"
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == "shipped"
    assert history(conn, job_id)[1] == (1, "reserve", "done", 1, None)


def test_an_error_the_step_does_not_retry_fails_it_at_once(make_app, conn):
    app: App = make_app()
    tries: list[int] = []

    @pgjobs.step_policy(attempts=5, retry=RetryPolicy(base=0.01, cap=0.02, retry_on=(OSError,)))
    def picky() -> None:
        tries.append(1)
        raise KeyError("sku")

    @app.workflow(name="t.picky")
    def flow(ctx: WorkflowContext) -> None:
        ctx.step("picky", picky)

    job_id = app.enqueue("t.picky", {})
    assert work(app) == 0
    assert tries == [1]
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert (dead["reason"], dead["error_type"]) == ("non_retryable", "builtins.KeyError")


def test_a_caught_step_failure_is_raised_again_at_its_place_on_a_later_run(make_app, conn):
    app: App = make_app()
    calls: list[str] = []
    crash = [True]

    @pgjobs.step_policy(attempts=1)
    def charge() -> None:
        calls.append("charge")
        raise ValueError("declined")

    @app.workflow(name="t.compensate", max_attempts=2, retry_base=0.01, retry_cap=0.02)
    def flow(ctx: WorkflowContext) -> str:
        try:
            ctx.step("charge", charge)
        except StepFailed as exc:
            ctx.step("release", lambda: calls.append("release"))
            if crash:
                crash.pop()
                raise RuntimeError("crash after the compensation") from exc
            return f"compensated {exc.step}: {exc.error_type}"
        return "charged"

    job_id = app.enqueue("t.compensate", {})
    assert work(app) == 0
    assert calls == ["charge", "release"], "neither ran again on the second attempt"
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == "compensated charge: builtins.ValueError"


@pytest.mark.parametrize("attempts", [0, -1, True, 1.5])
def test_a_step_policy_needs_whole_attempts(attempts):
    with pytest.raises(pgjobs.ConfigurationError, match="attempts"):
        pgjobs.step_policy(attempts=attempts)
