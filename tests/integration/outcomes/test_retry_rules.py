"""Retry rules per exception class: ``retry_on`` (only these retry), ``never_retry_on`` (these go
to dead_letter at once), ``retry_delays`` (a class's own wait) and an exception's own
``retry_after``, as a worker applies them."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest

from pgjobs import App, ConfigurationError
from tests.support.factories import db_now, row, work
from tests.support.helpers import assert_one_home


class RateLimited(Exception):
    """An upstream said "too many requests"."""


class Throttled(Exception):
    """An upstream said when to come back."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"come back in {seconds}s")
        self.retry_after = seconds


def test_retry_on_retries_only_the_named_errors(make_app, conn):
    app: App = make_app()
    calls: list[str] = []

    @app.task(
        name="t.fetch",
        max_attempts=5,
        retry_base=0.01,
        retry_cap=0.02,
        retry_on=(TimeoutError, ConnectionError),
    )
    def fetch(kind: str) -> None:
        calls.append(kind)
        if kind == "timeout" and calls.count("timeout") < 3:
            raise TimeoutError("slow upstream")
        if kind == "bad":
            raise ValueError("malformed reply")

    retried = app.enqueue("t.fetch", {"kind": "timeout"})
    refused = app.enqueue("t.fetch", {"kind": "bad"})
    assert work(app) == 0

    # A TimeoutError is worth a retry: the third attempt succeeded.
    assert calls.count("timeout") == 3
    assert row(conn, "archived_jobs", retried)["attempts"] == 3  # type: ignore[index]
    # A ValueError is not in retry_on: dead at once, one attempt used of five.
    assert calls.count("bad") == 1
    dead = row(conn, "dead_letter", refused)
    assert dead is not None
    assert (dead["reason"], dead["attempts"]) == ("non_retryable", 1)
    assert dead["error_type"] == "builtins.ValueError"
    assert assert_one_home(conn, [retried, refused]) == {
        retried: "archived_jobs",
        refused: "dead_letter",
    }


def test_never_retry_on_wins_over_retry_on_and_over_attempts_left(make_app, conn):
    app: App = make_app()
    calls: list[int] = []

    @app.task(
        name="t.charge",
        max_attempts=5,
        retry_base=0.01,
        retry_cap=0.02,
        retry_on=(OSError,),
        never_retry_on=(PermissionError,),
    )
    def charge(n: int) -> None:
        calls.append(n)
        raise PermissionError("card declined")  # an OSError, but never retried

    job_id = app.enqueue("t.charge", {"n": 1})
    assert work(app) == 0
    assert calls == [1]
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None and dead["reason"] == "non_retryable"


def test_a_class_delay_and_an_exceptions_own_retry_after_replace_the_backoff(make_app, conn):
    app: App = make_app()

    # The backoff would wait 0.5-1 s; the rules ask for 600 s (RateLimited) and 900 s (the
    # exception's own retry_after). The worker stops after the first attempts, so the retries
    # are still scheduled when it exits.
    @app.task(
        name="t.call",
        max_attempts=3,
        retry_base=1,
        retry_cap=1,
        retry_delays={RateLimited: 600, Exception: 5},
    )
    def call(kind: str) -> None:
        try:
            if kind == "rate":
                raise RateLimited("429")
            if kind == "own":
                raise Throttled(900)
            raise KeyError("other")
        finally:
            seen.append(kind)
            if len(seen) == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    seen: list[str] = []
    rate = app.enqueue("t.call", {"kind": "rate"})
    own = app.enqueue("t.call", {"kind": "own"})
    other = app.enqueue("t.call", {"kind": "other"})
    assert work(app, burst=False, concurrency=3) == 0

    now = db_now(conn)
    waits = {
        name: row(conn, "queued_jobs", job_id)["run_at"] - now  # type: ignore[index]
        for name, job_id in (("rate", rate), ("own", own), ("other", other))
    }
    assert timedelta(seconds=590) < waits["rate"] <= timedelta(seconds=600)
    assert timedelta(seconds=890) < waits["own"] <= timedelta(seconds=900)
    # KeyError has no delay of its own: the nearest base class named (Exception) gives it.
    assert timedelta(seconds=0) < waits["other"] <= timedelta(seconds=5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_on": ValueError()}, "retry_on takes exception classes"),
        ({"never_retry_on": (ValueError, "oops")}, "never_retry_on takes exception classes"),
        ({"retry_delays": {ValueError: -1}}, "retry_delays[ValueError]"),
        ({"retry_delays": {"ValueError": 5}}, "retry_delays takes exception classes"),
        ({"retry_delays": [ValueError]}, "retry_delays must map exception classes to seconds"),
    ],
)
def test_rules_that_are_not_classes_or_seconds_are_refused_in_one_line(make_app, options, message):
    app: App = make_app()
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")) as caught:
        app.task(name="t.bad", **options)(lambda: None)
    assert "\n" not in str(caught.value)
    assert "t.bad" not in app.tasks
