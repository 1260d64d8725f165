"""Fencing: an outcome applies only while its worker still holds the lease for that attempt."""

from __future__ import annotations

import pytest

from pgjobs.completer.outcomes import Outcomes
from pgjobs.maintenance.leases import LeaseRescuer, Rescued
from pgjobs.models import DeadReason
from tests.support.factories import claim, counts, lease_expired, row, run_service, settle
from tests.support.helpers import assert_one_home, wait_until

OUTCOMES = {
    "succeed": lambda o, job: o.succeed(job, '"done"'),
    "retry": lambda o, job: o.retry(job, 0.0, "ValueError: stale"),
    "bury": lambda o, job: o.bury(
        job, DeadReason.EXHAUSTED, "ValueError: stale", "builtins.ValueError"
    ),
    "release": lambda o, job: o.release(job, refund=True),
}


@pytest.fixture
def leased(make_app, conn):
    """A job claimed by worker-a (attempt 1)."""
    app = make_app(check_task_names=False)
    app.enqueue("t.pay", {"amount": 10})
    [job] = claim(conn, owner="worker-a")
    return job


@pytest.mark.parametrize("kind", sorted(OUTCOMES))
@pytest.mark.parametrize(
    "stale",
    [
        pytest.param({"owner": "worker-b"}, id="wrong-owner"),
        pytest.param({"attempts": 2}, id="later-attempt"),
        pytest.param({"attempts": 0}, id="earlier-attempt"),
    ],
)
def test_stale_outcome_changes_nothing(conn, leased, kind, stale):
    before = row(conn, "queued_jobs", leased.id)
    owner = stale.get("owner", "worker-a")
    job = leased._replace(attempts=stale.get("attempts", leased.attempts))
    outcomes = Outcomes(owner)
    OUTCOMES[kind](outcomes, job)

    assert settle(conn, outcomes) == set()
    assert row(conn, "queued_jobs", leased.id) == before
    assert counts(conn) == {"queued_jobs": 1, "archived_jobs": 0, "dead_letter": 0}


@pytest.mark.parametrize("kind", sorted(OUTCOMES))
def test_the_lease_holder_outcome_applies(conn, leased, kind):
    outcomes = Outcomes("worker-a")
    OUTCOMES[kind](outcomes, leased)
    assert settle(conn, outcomes) == {leased.id}
    expected = {"succeed": "archived_jobs", "bury": "dead_letter"}.get(kind, "queued_jobs")
    assert assert_one_home(conn, [leased.id]) == {leased.id: expected}


def test_worker_whose_lease_was_rescued_cannot_settle_the_new_run(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    job_id = app.enqueue("t.pay", {"amount": 10})
    [first] = claim(conn, owner="worker-a", lease=0.05)
    wait_until(lease_expired(conn, job_id), what="worker-a's lease to expire")
    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=1, dead=0)
    [second] = claim(conn, owner="worker-b")
    assert second.attempts == 2

    late = Outcomes("worker-a")
    late.succeed(first, '"from a"')
    assert settle(conn, late) == set()
    still = row(conn, "queued_jobs", job_id)
    assert still is not None and still["lease_owner"] == "worker-b"

    # Same owner name, old attempt: also refused (a worker that re-claimed its own job).
    replay = Outcomes("worker-b")
    replay.succeed(second._replace(attempts=1), '"replayed"')
    assert settle(conn, replay) == set()

    current = Outcomes("worker-b")
    current.succeed(second, '"from b"')
    assert settle(conn, current) == {job_id}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["worker"], archived["result"], archived["attempts"]) == (
        "worker-b",
        "from b",
        2,
    )
    assert_one_home(conn, [job_id])


def test_a_batch_applies_only_its_fresh_outcomes(make_app, conn):
    app = make_app(check_task_names=False)
    app.enqueue("t.pay", {"n": 1})
    app.enqueue("t.pay", {"n": 2})
    fresh, other = claim(conn, owner="worker-a", limit=2)

    outcomes = Outcomes("worker-a")
    outcomes.succeed(fresh, None)
    outcomes.succeed(other._replace(attempts=other.attempts + 1), None)
    assert settle(conn, outcomes) == {fresh.id}
    assert assert_one_home(conn, [fresh.id, other.id]) == {
        fresh.id: "archived_jobs",
        other.id: "queued_jobs",
    }
