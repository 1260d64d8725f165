"""Snooze: a handler puts its job back for later without spending an attempt, at most its task's
``max_snoozes`` times; one more sends it to dead_letter as ``snoozed_out``."""

from __future__ import annotations

import logging
import os
import signal
from datetime import timedelta

import pytest

import pgjobs
from pgjobs import App, ConfigurationError, Snooze
from tests.support.factories import db_now, row, work
from tests.support.helpers import assert_one_home


def test_a_snooze_refunds_the_attempt_and_the_job_runs_again(make_app, conn):
    app: App = make_app()
    runs: list[int] = []

    @app.task(name="t.publish", max_attempts=1)
    def publish(report: int) -> str:
        runs.append(report)
        if len(runs) < 3:
            raise Snooze(0)  # the data is not there yet: look again at once
        return "published"

    job_id = app.enqueue("t.publish", {"report": 7})
    assert work(app) == 0
    assert runs == [7, 7, 7]
    # One attempt of one: the two snoozes spent none.
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    assert (done["status"], done["attempts"], done["snoozes"]) == ("succeeded", 1, 2)
    assert done["result"] == "published"


def test_a_snoozed_job_waits_its_seconds(make_app, conn):
    app: App = make_app()

    @app.task(name="t.later")
    async def later() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the worker stops after this attempt
        pgjobs.current_job().snooze(600)

    job_id = app.enqueue("t.later", {})
    assert work(app, burst=False) == 0
    waiting = row(conn, "queued_jobs", job_id)
    assert waiting is not None
    assert (waiting["attempts"], waiting["snoozes"], waiting["lease_owner"]) == (0, 1, None)
    assert timedelta(seconds=590) < waiting["run_at"] - db_now(conn) <= timedelta(seconds=600)


@pytest.mark.parametrize("max_snoozes", [0, 1, 2])
def test_one_snooze_past_max_snoozes_is_a_dead_letter(make_app, conn, caplog, max_snoozes):
    app: App = make_app()
    runs: list[int] = []

    @app.task(name="t.never_ready", max_snoozes=max_snoozes)
    def never_ready() -> None:
        runs.append(1)
        raise Snooze(0)

    job_id = app.enqueue("t.never_ready", {})
    with caplog.at_level(logging.WARNING, logger="pgjobs.worker"):
        assert work(app) == 0
    assert len(runs) == max_snoozes + 1
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert (dead["reason"], dead["snoozes"], dead["attempts"]) == ("snoozed_out", max_snoozes, 1)
    # The error and the log count the snoozes that happened, as the snoozes column does.
    plural = "" if max_snoozes == 1 else "s"
    said = (
        f"snoozed out: the job asked to snooze again after {max_snoozes} snooze{plural}; "
        f"its task's max_snoozes is {max_snoozes}"
    )
    assert dead["last_error"] == said
    assert [r.getMessage() for r in caplog.records if "snoozed out" in r.getMessage()] == [
        f"job {job_id} (t.never_ready): {said}; sent to dead_letter"
    ]
    # Redriven, it gets its snoozes again.
    assert app.redrive(job_id) == 1
    again = row(conn, "queued_jobs", job_id)
    assert again is not None and again["snoozes"] == 0


def test_a_snooze_of_impossible_seconds_is_the_handlers_error(make_app, conn):
    app: App = make_app()

    @app.task(name="t.odd", max_attempts=1)
    def odd() -> None:
        raise Snooze(-5)

    job_id = app.enqueue("t.odd", {})
    assert work(app) == 0
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "exhausted" and dead["error_type"] == "builtins.ValueError"
    assert "Snooze takes seconds from 0" in dead["last_error"]


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_max_snoozes_must_be_a_whole_number(make_app, value):
    app: App = make_app()
    with pytest.raises(ConfigurationError, match="max_snoozes must be a whole number"):
        app.task(name="t.bad", max_snoozes=value)(lambda: None)
