"""Durable workflows' steps: recorded once, returned without running on every later run, the
handler's return value the job's result."""

from __future__ import annotations

from typing import Any

import pgjobs
from pgjobs import App, WorkflowContext
from tests.support.factories import row, work
from tests.support.helpers import assert_one_home


def test_steps_run_once_and_later_runs_replay_them(make_app, conn):
    app: App = make_app()
    runs: dict[str, int] = {"charge": 0, "reserve": 0, "email": 0}
    failures = [1]

    def step(name: str, value: Any) -> Any:
        runs[name] += 1
        return value

    @app.workflow(name="t.checkout", max_attempts=3)
    def checkout(ctx: WorkflowContext, order_id: int) -> dict[str, Any]:
        charged = ctx.step("charge", step, "charge", {"order": order_id, "cents": 1250})
        ctx.step("reserve", step, "reserve", [1, 2])
        if failures:
            failures.pop()
            raise RuntimeError("crash between steps")  # the workflow's own attempt fails
        ctx.step("email", step, "email", None)
        return {"charged": charged}

    job_id = app.enqueue("t.checkout", {"order_id": 42})
    assert work(app) == 0
    assert runs == {"charge": 1, "reserve": 1, "email": 1}
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    assert done["result"] == {"charged": {"order": 42, "cents": 1250}}
    history = conn.execute(
        "SELECT seq, kind, name, status, result, attempts FROM pgjobs_workflow_history "
        "WHERE job_id = %s ORDER BY seq",
        [job_id],
    ).fetchall()
    assert history == [
        (0, "step", "charge", "done", {"order": 42, "cents": 1250}, 1),
        (1, "step", "reserve", "done", [1, 2], 1),
        (2, "step", "email", "done", None, 1),
    ]


def test_an_async_workflow_awaits_its_steps(make_app, conn):
    app: App = make_app()
    calls: list[str] = []

    async def fetch(n: int) -> int:
        calls.append(f"fetch{n}")
        return n * 2

    def plain(n: int) -> int:
        calls.append(f"plain{n}")
        return n + 1

    @app.workflow(name="t.async_flow")
    async def flow(ctx: WorkflowContext, n: int) -> int:
        a = await ctx.step("fetch", fetch, n)
        b = await ctx.step("plain", plain, a)
        await ctx.sleep(0)
        return int(b)

    job_id = app.enqueue("t.async_flow", {"n": 5})
    assert work(app) == 0
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == 11
    assert calls == ["fetch5", "plain10"]


def test_ctx_is_exported():
    assert pgjobs.WorkflowContext is WorkflowContext
