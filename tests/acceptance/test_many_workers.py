"""Four `pgjobs work` processes share one queue: every job runs exactly once and lands in exactly
one table; SIGTERM stops every worker with exit code 0."""

from __future__ import annotations

import pytest

from pgjobs import JobSpec
from tests.acceptance.conftest import scalar, stop, wait_for

JOBS = 2000
WORKERS = 4


@pytest.mark.slow
def test_four_workers_run_every_job_exactly_once(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    ids = app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(JOBS))
    assert len(set(ids)) == JOBS

    workers = [start_worker("--concurrency", "8") for _ in range(WORKERS)]

    def archived() -> int:
        return int(scalar(conn, "SELECT count(*) FROM archived_jobs"))

    wait_for(
        lambda: archived() == JOBS,
        90,
        lambda: f"{archived()} of {JOBS} jobs archived",
        procs=workers,
    )

    # The side table: every key ran to completion exactly once.
    total, distinct = conn.execute(
        "SELECT count(*), count(DISTINCT key) FROM runs WHERE phase = 'done'"
    ).fetchone()
    duplicates = conn.execute(
        "SELECT key, count(*) FROM runs GROUP BY key, phase HAVING count(*) > 1 LIMIT 10"
    ).fetchall()
    assert duplicates == [], f"keys run more than once: {duplicates}"
    assert (total, distinct) == (JOBS, JOBS)
    keys = {row[0] for row in conn.execute("SELECT key FROM runs WHERE phase = 'done'")}
    assert keys == set(range(JOBS))

    # Every id is in exactly one of the three tables, and it is the archive, as succeeded.
    homes = conn.execute(
        """
        SELECT id, array_agg(home) FROM (
            SELECT id, 'queued' AS home FROM queued_jobs
            UNION ALL SELECT id, 'archived' FROM archived_jobs
            UNION ALL SELECT id, 'dead' FROM dead_letter
        ) j GROUP BY id
        """
    ).fetchall()
    assert {row[0] for row in homes} == set(ids)
    misplaced = [row for row in homes if row[1] != ["archived"]]
    assert misplaced == [], f"jobs not (only) in archived_jobs: {misplaced[:10]}"
    statuses = conn.execute(
        "SELECT status, min(attempts), max(attempts), count(*) FROM archived_jobs GROUP BY status"
    ).fetchall()
    assert statuses == [("succeeded", 1, 1, JOBS)]

    # The work was shared: archived_jobs.worker names the worker that ran each job.
    per_worker = conn.execute(
        "SELECT worker, count(*) FROM archived_jobs GROUP BY worker ORDER BY worker"
    ).fetchall()
    pids = {int(worker.split(":")[-2]) for worker, _ in per_worker}
    assert pids <= {w.pid for w in workers}, per_worker
    assert len(pids) >= 2, f"only one worker ran jobs: {per_worker}"
    print(f"jobs per worker: {[n for _, n in per_worker]}")

    codes = stop(workers, timeout=20)
    assert codes == [0] * WORKERS, [w.describe() for w in workers]
