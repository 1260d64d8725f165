"""`pgjobs job show` lists a workflow's steps and sleeps (text and --json)."""

from __future__ import annotations

import json

import pgjobs
from pgjobs import App, WorkflowContext
from tests.support.external import run_worker_while
from tests.support.factories import work
from tests.support.helpers import run, wait_until


def test_job_show_lists_the_steps_and_sleeps(make_app, capsys, dsn):
    app: App = make_app()

    @pgjobs.step_policy(attempts=1)
    def reserve() -> None:
        raise ValueError("warehouse offline")

    @app.workflow(name="t.shown", max_attempts=1)
    def shown(ctx: WorkflowContext) -> None:
        ctx.step("charge", lambda: {"cents": 1250})
        ctx.sleep(0)
        ctx.step("reserve", reserve)

    job_id = app.enqueue("t.shown", {})
    assert work(app) == 0

    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0, err
    lines = out.split("workflow:\n", 1)[1].splitlines()
    assert lines[0].split()[:6] == ["0", "step", "charge", "done", "1", "attempt,"]
    assert lines[0].endswith('{"cents": 1250}')
    assert lines[1].split()[:3] == ["1", "sleep", "wakes"]
    assert lines[2].split()[:4] == ["2", "step", "reserve", "failed"]
    assert lines[2].endswith("ValueError: warehouse offline")

    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url, "--json")
    assert code == 0, err
    entries = json.loads(out)["workflow"]
    assert [(e["seq"], e["kind"], e["name"], e["status"]) for e in entries] == [
        (0, "step", "charge", "done"),
        (1, "sleep", "sleep", "done"),
        (2, "step", "reserve", "failed"),
    ]
    assert entries[0]["result"] == {"cents": 1250} and entries[0]["seconds"] >= 0
    assert entries[1]["wake_at"] is not None
    assert entries[2]["error_type"] == "builtins.ValueError"


def test_a_plain_job_shows_no_workflow(make_app, capsys, dsn):
    app: App = make_app()
    job_id = app.enqueue("t.plain", {})
    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url, "--json")
    assert code == 0, err
    assert json.loads(out)["workflow"] == []
    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert "workflow:" not in out


def test_job_show_lists_waits_for_events_and_children(make_app, capsys, dsn, conn):
    app: App = make_app()

    @app.task(name="t.leaf", queue="later")  # no worker serves it here
    def leaf(n: int) -> int:
        return n

    @app.workflow(name="t.waits")
    def waits(ctx: WorkflowContext) -> None:
        ctx.wait_for("approved", timeout=3600)
        ctx.map(leaf, [{"n": 1}, {"n": 2}])

    job_id = app.enqueue("t.waits", {})
    app.send_event(job_id, "approved", {"by": "ana"})

    def suspended(_worker: object) -> None:
        wait_until(
            lambda: conn.execute(
                "SELECT 1 FROM pgjobs_workflow_history WHERE job_id = %s AND kind = 'children'",
                [job_id],
            ).fetchone(),
            what="the children's wait",
        )

    run_worker_while(app, suspended, queues=["default"])
    code, out, err = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0, err
    lines = out.split("workflow:\n", 1)[1].splitlines()
    assert lines[0].split()[:5] == ["0", "event", "approved", "done", '{"by":']
    assert lines[1].split()[:6] == ["1", "children", "t.leaf", "waiting", "2", "child"]
