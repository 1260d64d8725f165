"""Four `pgjobs work` processes share one queue: every job runs exactly once and lands in exactly
one table; SIGTERM stops every worker with exit code 0."""

from __future__ import annotations

import pytest

from pgjobs import JobSpec
from tests.support.helpers import assert_one_home, stop, wait_archived

JOBS = 2000
WORKERS = 4


@pytest.mark.slow
def test_four_workers_run_every_job_exactly_once(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    ids = app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(JOBS))
    assert len(set(ids)) == JOBS

    workers = [start_worker("--concurrency", "8") for _ in range(WORKERS)]

    wait_archived(conn, JOBS, timeout=90, procs=workers)

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
    where = assert_one_home(conn, ids)
    misplaced = {job_id: table for job_id, table in where.items() if table != "archived_jobs"}
    assert misplaced == {}, f"jobs not in archived_jobs: {list(misplaced.items())[:10]}"
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
