"""Several burst workers end together: the one that runs the last job NOTIFYs its queues on its
way out, so a burst worker that waits for that job exits with it instead of at its next poll."""

from __future__ import annotations

import threading

from pgjobs import Worker, WorkerConfig
from tests.support.helpers import assert_one_home, count, wait_until

#: Far longer than the bounds below: a worker that waited for its poll would fail them.
POLL = 30.0


def test_a_waiting_burst_worker_exits_when_the_last_busy_one_does(make_app, conn):
    app = make_app()
    release = threading.Event()

    @app.task(name="t.gate")
    def gate():
        release.wait(60)

    job_id = app.enqueue("t.gate", {})
    config = WorkerConfig(
        poll_interval=POLL, stuck_after=4 * POLL, maintenance=False, burst=True, grace=10
    )
    busy, waiting = Worker(app, config), Worker(app, config)
    codes: dict[str, int | BaseException] = {}

    def run(name: str, worker: Worker) -> threading.Thread:
        def target() -> None:
            try:
                codes[name] = worker.run()
            except BaseException as exc:
                codes[name] = exc

        thread = threading.Thread(target=target, name=f"worker-{name}")
        thread.start()
        return thread

    threads = [run("busy", busy)]
    try:
        wait_until(
            lambda: count(conn, "queued_jobs WHERE lease_owner IS NOT NULL") == 1,
            timeout=30,
            what="the busy worker to run the job",
        )
        threads.append(run("waiting", waiting))
        # The second worker found nothing to claim and waits for the job the first one runs.
        wait_until(lambda: waiting.burst.waiting_for is not None, timeout=30, what="it to wait")
        release.set()
        for thread in threads:
            thread.join(POLL / 2)
        assert not any(thread.is_alive() for thread in threads), "a burst worker waited its poll"
        assert codes == {"busy": 0, "waiting": 0}
    finally:
        release.set()
        busy.stop()
        waiting.stop()
        for thread in threads:
            thread.join(60)
    assert_one_home(conn, [job_id])
    assert count(conn, "archived_jobs") == 1
