"""The threads of sync handlers (``pgjobs.runs.threads``), no database: calls run, start
threads only as needed and never beyond the bound, can be cancelled until they start, and shut
down."""

from __future__ import annotations

import logging
import threading

import pytest

from pgjobs.runs.threads import HandlerThreads

WAIT = 10.0


def test_calls_run_and_report_done():
    threads = HandlerThreads(4, "t")
    ran = threading.Event()
    run = threads.submit(ran.set)
    assert ran.wait(WAIT)
    threads.shutdown(wait=True)
    assert run.done()
    assert not run.cancel()  # it ran: too late to cancel


def test_a_free_thread_is_reused_rather_than_a_new_one_started():
    threads = HandlerThreads(8, "t")
    for _ in range(50):
        done = threading.Event()
        threads.submit(done.set)
        assert done.wait(WAIT)
        # the thread counts itself free after its call: wait for that before the next submit
        for _ in range(1000):
            with threads._lock:
                if threads._spare:
                    break
            threading.Event().wait(0.001)
    threads.shutdown(wait=True)
    assert len(threads._threads) == 1


def test_threads_never_exceed_the_bound_and_queued_calls_wait_for_one():
    threads = HandlerThreads(3, "t")
    release = threading.Event()
    started = threading.Semaphore(0)
    names: set[str] = set()

    def hold() -> None:
        names.add(threading.current_thread().name)
        started.release()
        release.wait(WAIT)

    runs = [threads.submit(hold) for _ in range(7)]
    for _ in range(3):
        assert started.acquire(timeout=WAIT)
    assert not started.acquire(timeout=0.2)  # the fourth waits for a thread
    assert len(threads._threads) == 3
    release.set()
    for _ in range(4):
        assert started.acquire(timeout=WAIT)
    threads.shutdown(wait=True)
    assert names == {"t-0", "t-1", "t-2"}
    assert all(run.done() for run in runs)


def test_a_call_cancelled_before_it_starts_never_runs():
    threads = HandlerThreads(1, "t")
    release = threading.Event()
    ran: list[int] = []
    busy = threads.submit(release.wait, WAIT)
    waiting = threads.submit(ran.append, 1)
    assert waiting.cancel()
    assert waiting.done()
    assert not busy.cancel()  # started (or about to be): a running call is not stopped
    release.set()
    threads.shutdown(wait=True)
    assert ran == []
    assert busy.done()


def test_shutdown_cancels_queued_calls_and_leaves_a_running_one_to_finish():
    threads = HandlerThreads(1, "t")
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    def hold() -> None:
        started.set()
        release.wait(WAIT)
        ran.append(0)

    running = threads.submit(hold)
    queued = threads.submit(ran.append, 1)
    assert started.wait(WAIT)
    threads.shutdown(wait=False)
    assert queued.done() and not running.done()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.submit(ran.append, 2)
    release.set()
    threads._threads[0].join(WAIT)
    assert ran == [0]
    assert running.done()


def test_a_call_that_raises_is_logged_and_its_thread_carries_on(caplog):
    threads = HandlerThreads(1, "t")
    done = threading.Event()

    def boom() -> None:
        raise SystemExit(3)

    with caplog.at_level(logging.ERROR, logger="pgjobs.worker.threads"):
        failed = threads.submit(boom)
        threads.submit(done.set)
        assert done.wait(WAIT)
    threads.shutdown(wait=True)
    assert failed.done()
    assert len(threads._threads) == 1
    assert "a call on thread t-0 raised" in caplog.text


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError, match="at least one thread"):
        HandlerThreads(0, "t")
