"""A complete example of testing tasks with pgjobs' pytest plugin (``pgjobs.testing``): installing
pgjobs provides the fixtures ``pgjobs_database`` and ``pgjobs_app``; the helpers are imported.

Run it with a PostgreSQL at hand: ``PGJOBS_TEST_DSN=postgresql://postgres@127.0.0.1/postgres
pytest examples/testing_example`` (or with the embedded extra installed, nothing to set).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import pgjobs
from examples.testing_example import shop
from pgjobs.testing import assert_enqueued, assert_not_enqueued, drain, eager, enqueued_jobs


@pytest.fixture
def app(pgjobs_app):
    """The shop's own App, bound to this test's empty database."""
    shop.OUTBOX.clear()
    return pgjobs_app(shop.app)


def test_sign_up_enqueues_a_welcome_email(app):
    job_id = shop.sign_up("ada@example.com")
    (job,) = assert_enqueued(app, "emails.welcome", {"to": "ada@example.com"}, queue="emails")
    assert job.id == job_id
    assert_not_enqueued(app, "billing.charge")
    assert shop.OUTBOX == []  # enqueued, not run: no worker ran


def test_drain_runs_sync_and_async_handlers(app):
    shop.sign_up("ada@example.com")
    shop.sign_up("grace@example.com")
    result = drain(app)
    assert len(result.succeeded) == 2
    assert sorted(shop.OUTBOX) == [
        ("ada@example.com", "Welcome!"),
        ("grace@example.com", "Welcome!"),
    ]
    assert enqueued_jobs(app) == []


def test_a_failed_attempt_is_retried_later_and_drain_can_run_it_now(app):
    charge_id, receipt_id = shop.place_order(7, 19.99)
    first = drain(app)
    # The receipt (async) succeeded; the charge timed out and waits for its retry (backoff).
    assert first.succeeded == [receipt_id]
    assert first.results[receipt_id] == "receipt-7.pdf"
    (retry,) = first.retried
    assert (retry.id, retry.attempt, retry.error) == (
        charge_id,
        1,
        "TimeoutError: payment gateway timed out",
    )
    assert_enqueued(app, "billing.charge", {"order_id": 7}, count=1)
    # Advancing the clock runs the retry at once.
    second = drain(app, include_scheduled=True)
    assert second.succeeded == [charge_id]
    assert second.results[charge_id] == {"order_id": 7, "charged": 19.99}
    assert_not_enqueued(app)


def test_a_non_retryable_error_goes_to_dead_letter(app):
    charge_id, _ = shop.place_order(8, -5)
    result = drain(app)
    (dead,) = result.dead
    assert (dead.id, dead.reason) == (charge_id, "non_retryable")
    assert "amount -5 is not positive" in dead.error
    assert app.job(charge_id).status == "dead"


def test_scheduled_jobs_wait_for_their_time(app):
    _, receipt_id = shop.place_order(9, 10, ship_in=3600)
    drain(app, include_scheduled=False)  # runs the charge's first attempt only
    assert_enqueued(app, "receipts.build", {"order_id": 9})
    in_two_hours = datetime.now(UTC) + timedelta(hours=2)
    result = drain(app, now=in_two_hours)  # every job due by then, retries included
    assert receipt_id in result.succeeded
    assert_not_enqueued(app)


def test_an_assertion_says_what_was_enqueued(app):
    shop.sign_up("ada@example.com")
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(app, "emails.welcome", {"to": "bob@example.com"})
    message = str(failed.value)
    assert "expected at least 1 job(s) of task 'emails.welcome'" in message
    assert "found 0; enqueued (1):" in message
    assert (
        'emails.welcome (queue \'emails\', ready, attempt 0/5) {"to": "ada@example.com"}' in message
    )


def test_eager_mode_runs_handlers_at_enqueue_without_a_database():
    shop.OUTBOX.clear()
    with eager(shop.app) as ran:
        job_id = shop.sign_up("ada@example.com")
        # What a handler raises comes out of enqueue (no retry): the charge fails on attempt 1.
        with pytest.raises(TimeoutError, match="payment gateway timed out"):
            shop.place_order(10, 5)
    assert job_id < 0  # a fake id
    assert shop.OUTBOX == [("ada@example.com", "Welcome!")]
    assert ran.of("emails.welcome")[0].result == "sent to ada@example.com"


def test_eager_mode_validates_as_enqueue_does():
    with eager(shop.app), pytest.raises(pgjobs.UnknownTask):
        shop.app.enqueue("emails.welcom", {"to": "ada@example.com"})
    with eager(shop.app), pytest.raises(pgjobs.InvalidPayload):
        shop.app.enqueue("emails.welcome", {"to": "ada@example.com", "cc": "bob"})
