"""`pgjobs queue limit`, `pgjobs queue list` and `pgjobs stats` with limits; the Python API's
checks (``queues.limit``, ``@app.task(concurrency=..., rate=...)``); bad input is one line and
exit 2, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from pgjobs import App, ConfigurationError, Rate, queues
from pgjobs.db.dsn import Dsn
from tests.support.helpers import assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    yield
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgjobs_queues, pgjobs_limit_states")


def test_cli_limit_list_stats_and_lift(capsys, dsn, make_app):
    make_app().enqueue("t", {}, queue="emails")
    code, out, err = run(capsys, "queue", "limit", "emails", "10", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert out.strip() == "queue emails limits set: at most 10 running"

    code, out, _ = run(
        capsys, "queue", "limit", "emails", "--rate", "100/s", "--json", "--dsn", dsn.url
    )
    state = json.loads(out)
    assert code == 0 and state["changed"] is True
    assert (state["concurrency"], state["rate"], state["rate_jobs"], state["rate_seconds"]) == (
        10,
        "100/s",
        100,
        1.0,
    )
    code, out, _ = run(capsys, "queue", "limit", "emails", "10", "--dsn", dsn.url)
    assert "limits unchanged: at most 10 running, 100/s starts" in out

    code, out, _ = run(capsys, "queue", "list", "--dsn", dsn.url)
    assert code == 0 and "at most 10 running, 100/s starts" in out
    code, out, _ = run(capsys, "queue", "list", "--json", "--dsn", dsn.url)
    listed = {q["name"]: q for q in json.loads(out)}
    assert listed["emails"]["concurrency"] == 10 and listed["emails"]["rate"] == "100/s"

    code, out, _ = run(capsys, "stats", "--json", "--dsn", dsn.url)
    stats = {q["queue"]: q for q in json.loads(out)}
    assert (stats["emails"]["concurrency"], stats["emails"]["rate_jobs"]) == (10, 100)
    assert stats["emails"]["held"] == 0
    code, out, _ = run(capsys, "stats", "--dsn", dsn.url)
    assert "emails (at most 10 running, 100/s starts)" in out

    # A limited queue without jobs is listed by stats too, as a paused one is.
    run(capsys, "queue", "limit", "quiet", "--rate", "5/10s", "--dsn", dsn.url)
    code, out, _ = run(capsys, "stats", "--json", "--dsn", dsn.url)
    assert {q["queue"]: q["rate_seconds"] for q in json.loads(out)}["quiet"] == 10.0

    code, out, _ = run(
        capsys, "queue", "limit", "emails", "none", "--rate", "none", "--dsn", dsn.url
    )
    assert code == 0 and out.strip() == "queue emails limits set"
    assert not queues.queue(dsn, "emails").limited


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["queue", "limit", "emails"], ["concurrency", "--rate"]),
        (["queue", "limit", "emails", "0"], ["concurrency", "1..1,000,000"]),
        (["queue", "limit", "emails", "ten"], ["concurrency", "whole number"]),
        (["queue", "limit", "emails", "-3"], ["-3"]),
        (["queue", "limit", "emails", "--rate", "fast"], ["rate", "100/s"]),
        (["queue", "limit", "emails", "--rate", "0/s"], ["rate"]),
        (["queue", "limit", "emails", "--rate", "5/3d"], ["period", "a day"]),
        (["queue", "limit", "a\tb", "5"], ["queue name"]),
    ],
)
def test_cli_bad_limits_are_one_line_exit_2_and_change_nothing(capsys, dsn, argv, words):
    code, _, err = run(capsys, *argv, "--dsn", dsn.url)
    assert_one_line_error(code, err, *words)
    assert code == 2
    assert queues.list_queues(dsn) == []


def test_python_api_checks_limits(dsn):
    with pytest.raises(
        ConfigurationError,
        match="give a concurrency limit, a rate, a group concurrency or a group rate",
    ):
        queues.limit(dsn, "emails")
    with pytest.raises(ConfigurationError) as caught:
        queues.limit(dsn, "emails", concurrency=True)
    assert caught.value.field == "concurrency"
    with pytest.raises(ConfigurationError) as caught:
        queues.limit(dsn, "emails", rate="lots")
    assert caught.value.field == "rate"
    assert queues.list_queues(dsn) == []
    change = queues.limit(dsn, "emails", rate=Rate(3, 2.5))
    assert change.changed and (change.queue.rate_jobs, change.queue.rate_seconds) == (3, 2.5)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": 10**9}, "concurrency"),
        ({"rate": "100"}, "rate"),
        ({"rate": "100/week"}, "rate"),
        ({"rate": 100}, "rate"),
    ],
)
def test_a_task_with_bad_limits_is_refused_at_registration(options, field):
    app = App("postgresql://nowhere.invalid/db")
    with pytest.raises(ConfigurationError) as caught:
        app.task(name="t", **options)(lambda: None)
    assert caught.value.field == field
    assert "t" not in app.tasks


def test_a_tasks_limits_are_kept_on_the_task():
    app = App("postgresql://nowhere.invalid/db")

    @app.task(name="crm.sync", concurrency=5, rate="100/m")
    def sync() -> None: ...

    assert (sync.concurrency, sync.rate, sync.limited) == (5, Rate(100, 60.0), True)
    assert str(sync.rate) == "100/m"
    remote = app.external_task("crm.push", url="https://crm.invalid/jobs", rate="2/s")
    assert remote.rate == Rate(2, 1.0) and remote.concurrency is None


def test_app_limit_queue(make_app, dsn):
    app = make_app()
    change = app.limit_queue("emails", concurrency=4)
    assert change.changed and change.queue.concurrency == 4
    assert app.limit_queue("emails", rate="1/s").queue.concurrency == 4  # kept
    assert queues.queue(dsn, "emails").rate_jobs == 1
