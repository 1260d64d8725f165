"""`pgjobs job edit`: each option, the line it prints, the record `job show` prints (and its
JSON), and every refusal as one line with exit 2, writing nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgjobs import App
from tests.support.admin_factories import bury, claim_one
from tests.support.helpers import assert_one_line_error, count, run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

APP = "tests.integration.cli_app:app"


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app(check_task_names=False)
    return app


def test_edit_changes_the_job_and_job_show_prints_the_record(app, conn, dsn, capsys) -> None:
    job = app.enqueue("cli.add", {"a": 1, "b": 2}, tags=["old"])
    code, out, err = run(
        capsys,
        *("job", "edit", str(job), "--priority", "7", "--run-at", "2030-01-02T03:04:05+00:00"),
        *("--payload", '{"a": 5, "b": 6}', "--max-attempts", "9", "--tag", "x", "--tag", "y"),
        *("--by", "ops@example.com", "--app", APP, "--dsn", dsn.url),
    )
    assert (code, err) == (0, "")
    assert out.startswith(f"job {job} edited (scheduled): priority 0 -> 7; run_at ")
    assert "2030-01-02 03:04:05 UTC" in out and "tags old -> x, y" in out
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [job]) == {"a": 5, "b": 6}

    code, out, _ = run(capsys, "job", "show", str(job), "--dsn", dsn.url)
    assert code == 0
    lines = out.splitlines()
    edits = lines[lines.index("edits:") + 1]
    assert " by ops@example.com: priority 0 -> 7;" in edits
    assert 'payload {"a": 1, "b": 2} -> {"a": 5, "b": 6}' in edits

    code, out, _ = run(capsys, "job", "show", str(job), "--json", "--dsn", dsn.url)
    (edit,) = json.loads(out)["edits"]
    assert edit["edited_by"] == "ops@example.com"
    assert edit["changes"]["max_attempts"] == {"old": 5, "new": 9}


def test_run_now_no_tags_and_the_default_author(app, conn, dsn, capsys) -> None:
    job = app.enqueue("t", {}, run_in=3600, tags=["a"])
    code, out, err = run(
        capsys, "job", "edit", str(job), "--run-at", "now", "--no-tags", "--json", "--dsn", dsn.url
    )
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["status"] == "ready" and shown["tags"] == []
    assert "@" in shown["edit"]["edited_by"]
    code, out, _ = run(capsys, "job", "edit", str(job), "--no-tags", "--dsn", dsn.url)
    assert (code, out) == (0, f"job {job} unchanged: it has these values already\n")
    code, out, _ = run(capsys, "job", "edit", str(job), "--run-in", "10m", "--dsn", dsn.url)
    assert code == 0 and f"job {job} edited (scheduled): run_at " in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], ["nothing to edit"]),
        (["--priority", "40000"], ["--priority"]),
        (["--run-at", "tomorrow"], ["--run-at"]),
        (["--run-at", "2030-01-01T00:00:00"], ["timezone"]),
        (["--run-in", "-5m"], ["--run-in"]),
        (["--run-at", "now", "--run-in", "5m"], ["not both"]),
        (["--payload", "[1]"], ["JSON object"]),
        (["--payload", "{nope"], ["--payload"]),
        (["--payload", '{"a": "x", "b": 1}', "--app", APP], ["payload.a"]),
        (["--payload", '{"c": 1}', "--app", APP], ["c"]),
        (["--max-attempts", "0"], ["--max-attempts"]),
        (["--tag", ""], ["tag"]),
        (["--tag", "a", "--no-tags"], ["not both"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(app, conn, dsn, capsys, args, words) -> None:
    job = app.enqueue("cli.add", {"a": 1, "b": 2})
    code, _, err = run(capsys, "job", "edit", str(job), *args, "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, *words)
    assert count(conn, "pgjobs_job_edits") == 0


def test_a_job_that_cannot_be_edited_is_refused_with_exit_2(app, conn, dsn, capsys) -> None:
    running = app.enqueue("t", {})
    claim_one(conn, running, owner="host:1:w")
    (dead,) = bury(conn, 1)
    for job_id, words in (
        (running, ["running on worker host:1:w"]),
        (dead, ["dead", "dead_letter"]),
        (123_456_789, ["no job 123456789"]),
    ):
        code, _, err = run(capsys, "job", "edit", str(job_id), "--priority", "1", "--dsn", dsn.url)
        assert code == 2
        assert_one_line_error(code, err, *words)
    assert count(conn, "pgjobs_job_edits") == 0
