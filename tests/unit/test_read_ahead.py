"""The worker's read-ahead, without a database: how many jobs it claims ahead of free slots, and
what becomes of a job claimed ahead that is cancelled or that a stop finds waiting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgjobs import App, ConfigurationError, Job, Worker, WorkerConfig
from pgjobs.worker import READ_AHEAD_PER_SLOT, READ_AHEAD_WAIT, _Pace


def job(job_id: int, attempts: int = 1) -> Job:
    now = datetime.now(UTC)
    return Job(
        job_id, "default", "t", {}, 0, now, attempts, 5, "w", now, None, now, None, None, None, None
    )


@pytest.fixture
def worker() -> Worker:
    app = App("postgresql://nowhere.invalid/db")
    app.task(name="t")(lambda: None)
    return Worker(app, WorkerConfig(concurrency=4, read_ahead=100))


def test_read_ahead_defaults_to_a_few_jobs_per_slot_and_refuses_nonsense():
    assert WorkerConfig(concurrency=32).claim_ahead == READ_AHEAD_PER_SLOT * 32
    assert WorkerConfig(concurrency=32, read_ahead=0).claim_ahead == 0
    for bad in (-1, 10**9):
        with pytest.raises(ConfigurationError) as caught:
            WorkerConfig(read_ahead=bad)
        assert caught.value.field == "read_ahead"


def test_the_read_ahead_follows_the_handlers_pace_and_needs_a_backlog(worker: Worker):
    pace = _Pace(backlog=True)
    assert worker._ahead(pace, 10.0) == 0  # no pace measured yet
    worker._left_slots = 2_000  # 2,000 jobs left their slots in the next second
    assert worker._ahead(pace, 11.0) == 100  # 2,000/s x 50 ms, capped at read_ahead
    worker._left_slots += 30  # slow handlers now: 30 in a second
    pace.slot_rate = 0.0  # (forget the smoothing)
    assert worker._ahead(pace, 12.0) == int(30 * READ_AHEAD_WAIT)  # 1: no job waits long
    pace.backlog = False
    assert worker._ahead(pace, 13.0) == 0  # the last claim did not fill: no backlog to read


def test_a_job_cancelled_while_claimed_ahead_never_starts(worker: Worker):
    waiting = [job(1), job(2), job(3)]
    worker._waiting.extend(waiting)
    worker._cancel_requested("cancel\t2\t1")
    assert list(worker._waiting) == [waiting[0], waiting[2]]
    worker._cancel_requested("cancel\t3\t7")  # another attempt of job 3: not this one
    assert list(worker._waiting) == [waiting[0], waiting[2]]
    assert not worker._completer.pending  # the cancel archived it: nothing to send


def test_a_stop_gives_the_jobs_claimed_ahead_back_unstarted(worker: Worker):
    worker._waiting.extend([job(1), job(2, attempts=3)])
    worker._give_back_waiting()
    assert not worker._waiting
    batch = worker._completer.outcomes.drain()
    assert (batch.release_ids, batch.release_attempts) == ([1, 2], [1, 3])
    assert batch.release_refunds == [True, True]  # never started: their attempts are refunded
