"""The worker's read-ahead, without a database: how many jobs it claims ahead of free slots, and
what becomes of a job claimed ahead that is cancelled or that a stop finds waiting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgjobs import App, ConfigurationError, Job, Worker, WorkerConfig
from pgjobs.worker.config import READ_AHEAD_PER_SLOT, READ_AHEAD_WAIT
from pgjobs.worker.loop import cancel_notice


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
    pacer = worker.pacer
    pacer.backlog = True
    assert pacer.read_ahead(10.0, left=0) == 0  # no pace measured yet
    left = 2_000  # 2,000 jobs left their slots in the next second
    assert pacer.read_ahead(11.0, left) == 100  # 2,000/s x 50 ms, capped at read_ahead
    left += 30  # slow handlers now: 30 in a second
    pacer.slot_rate = 0.0  # (forget the smoothing)
    assert pacer.read_ahead(12.0, left) == int(30 * READ_AHEAD_WAIT)  # 1: no job waits long
    pacer.backlog = False
    assert pacer.read_ahead(13.0, left) == 0  # the last claim did not fill: no backlog to read


def test_a_job_cancelled_while_claimed_ahead_never_starts(worker: Worker):
    waiting = [job(1), job(2), job(3)]
    worker.slots.add(waiting)
    worker.slots.cancel(2, 1)
    assert worker.slots.waiting_jobs() == [waiting[0], waiting[2]]
    worker.slots.cancel(3, 7)  # another attempt of job 3: not this one
    assert worker.slots.waiting_jobs() == [waiting[0], waiting[2]]
    assert not worker.completer.pending  # the cancel archived it: nothing to send


def test_a_cancel_notice_names_the_job_and_its_attempt():
    assert cancel_notice("cancel\t2\t1") == (2, 1)
    assert cancel_notice("cancel\t2") is None
    assert cancel_notice("cancel\tx\t1") is None


def test_a_stop_gives_the_jobs_claimed_ahead_back_unstarted(worker: Worker):
    worker.slots.add([job(1), job(2, attempts=3)])
    worker.slots.give_back_waiting()
    assert not worker.slots.waiting_jobs()
    batch = worker.completer.outcomes.drain()
    assert (batch.release_ids, batch.release_attempts) == ([1, 2], [1, 3])
    assert batch.release_refunds == [True, True]  # never started: their attempts are refunded
