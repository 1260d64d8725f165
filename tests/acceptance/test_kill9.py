"""kill -9 a worker mid-run: once their lease runs out, the jobs it held are run again by the
surviving worker; no job is lost and no other job runs twice."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict

import pytest

from pgjobs import JobSpec
from tests.acceptance.conftest import lease_owner_pattern
from tests.acceptance.workload import SHORT_LEASE
from tests.support.helpers import count, stop, wait_archived, wait_until

JOBS = 24
#: Seconds between lease-rescuer rounds in the workers (the default is 15).
RESCUE_INTERVAL = 0.5
#: Seconds to allow, after the kill, for the lease to expire and the survivor to run what is left.
RECOVERY_BOUND = SHORT_LEASE + JOBS * 1.5 / 4 + 20


@pytest.mark.slow
def test_kill9_jobs_rerun_after_lease(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    ids = app.enqueue_many(
        JobSpec("accept.slow_short_lease", {"key": n, "seconds": 1.5}) for n in range(JOBS)
    )
    key_of = dict(zip(ids, range(JOBS), strict=True))

    interval = ("--rescue-interval", str(RESCUE_INTERVAL))
    victim = start_worker("--concurrency", "4", *interval)
    survivor = start_worker("--concurrency", "4", *interval)
    pattern = lease_owner_pattern(victim.pid)

    def victim_mid_run() -> bool:
        # The victim holds leases, and has started (not finished) every job it holds.
        held = conn.execute(
            """
            SELECT count(*),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM runs r WHERE r.key = (q.payload->>'key')::bigint
                       AND r.worker_pid = %(pid)s AND r.phase = 'start'))
            FROM queued_jobs q WHERE lease_owner LIKE %(pattern)s
            """,
            {"pid": victim.pid, "pattern": pattern},
        ).fetchone()
        return bool(held and held[0] > 0 and held[0] == held[1])

    wait_until(victim_mid_run, timeout=30, what="the victim to run jobs", procs=[victim, survivor])
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    # The dead worker cannot change anything any more: what it held now stays held until the
    # lease expires.
    held_ids = {
        row[0]
        for row in conn.execute(
            "SELECT id FROM queued_jobs WHERE lease_owner LIKE %s", [pattern]
        ).fetchall()
    }
    assert held_ids, "the victim held no job when it was killed"
    held_keys = {key_of[i] for i in held_ids}

    wait_archived(
        conn,
        JOBS,
        timeout=RECOVERY_BOUND,
        procs=[survivor],
        interval=0.25,
        detail=lambda: f"the victim held {sorted(held_ids)}",
    )

    # None lost: every job is archived as succeeded, and nowhere else.
    assert count(conn, "queued_jobs") == 0
    assert count(conn, "dead_letter") == 0
    archived_rows = conn.execute(
        "SELECT id, status, attempts, worker FROM archived_jobs"
    ).fetchall()
    assert {row[0] for row in archived_rows} == set(ids)
    assert {row[1] for row in archived_rows} == {"succeeded"}

    # The held jobs were finished by the survivor on their second attempt; no other job needed one.
    for job_id, _, attempts, worker in archived_rows:
        if job_id in held_ids:
            assert attempts == 2, (job_id, attempts, worker)
            assert f":{survivor.pid}:" in worker, (job_id, worker)
        else:
            assert attempts == 1, (job_id, attempts, worker)

    # The side table: re-runs only for the jobs the victim held.
    starts: dict[int, Counter[int]] = defaultdict(Counter)
    dones: dict[int, Counter[int]] = defaultdict(Counter)
    for key, phase, pid in conn.execute("SELECT key, phase, worker_pid FROM runs"):
        (starts if phase == "start" else dones)[key][pid] += 1
    rerun = {key for key, by in starts.items() if sum(by.values()) > 1}
    # ... and never while the victim's lease still held: its lease began just before its run.
    early = conn.execute(
        """
        SELECT v.key, extract(epoch FROM s.at - v.at)
        FROM runs v JOIN runs s ON s.key = v.key AND s.phase = 'start' AND s.worker_pid = %s
        WHERE v.phase = 'start' AND v.worker_pid = %s AND s.at - v.at < %s * interval '1 second'
        """,
        [survivor.pid, victim.pid, SHORT_LEASE - 0.5],
    ).fetchall()
    assert early == [], f"re-run before the lease of {SHORT_LEASE}s expired: {early}"
    assert rerun <= held_keys, f"jobs run twice that the victim did not hold: {rerun - held_keys}"
    for key in range(JOBS):
        if key in held_keys:
            # (A job claimed in the instant before the kill may not have started on the victim.)
            assert starts[key][survivor.pid] == 1, (key, starts[key])
            assert set(starts[key]) <= {victim.pid, survivor.pid}, (key, starts[key])
            assert starts[key][victim.pid] <= 1, (key, starts[key])
            # The victim may have finished the handler a moment before the kill, with the outcome
            # not yet flushed; the survivor's run is the one that counts, exactly once.
            assert dones[key][survivor.pid] == 1 and dones[key][victim.pid] <= 1, dones[key]
        else:
            assert sum(starts[key].values()) == 1 and sum(dones[key].values()) == 1, (
                key,
                starts[key],
                dones[key],
            )
    print(
        f"jobs={JOBS} killed=1 held_by_victim={len(held_ids)} reruns={len(rerun)} "
        f"lost={JOBS - len(archived_rows)}"
    )

    assert stop([survivor], timeout=20) == [0], survivor.describe()
