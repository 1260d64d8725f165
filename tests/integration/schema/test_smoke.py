from __future__ import annotations

from pgjobs import App, Worker, WorkerConfig


def test_enqueue_then_work_archives(make_app, conn):
    app: App = make_app()
    ran = []

    @app.task(name="t.add")
    def add(a: int, b: int) -> int:
        ran.append(a + b)
        return a + b

    job_id = app.enqueue("t.add", {"a": 1, "b": 2})
    assert Worker(app, WorkerConfig(concurrency=2, burst=True, poll_interval=0.05)).run() == 0
    assert ran == [3]
    row = conn.execute(
        "SELECT status, result FROM archived_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert row == ("succeeded", 3)
