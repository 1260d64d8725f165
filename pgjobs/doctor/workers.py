"""The checks about workers: rows without a heartbeat, and running jobs leased to workers that
are not live."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.doctor.report import Check, Status, duration
from pgjobs.maintenance.registry import STALE_AFTER

#: Stale worker rows named in a check's details, at most.
STALE_WORKERS_SHOWN = 20


def stale_workers(conn: psycopg.Connection[Any]) -> Check:
    """The ``stale_workers`` check: worker rows without a recent heartbeat."""
    rows = db.fetch_all(
        conn,
        queries.DOCTOR_STALE_WORKERS,
        {"stale_after": STALE_AFTER, "limit": STALE_WORKERS_SHOWN},
    )
    if not rows:
        return Check(
            "stale_workers",
            Status.PASS,
            f"every registered worker sent a heartbeat in the last {STALE_AFTER:.0f}s",
        )
    total = rows[0][5]
    stale = [
        {"id": wid, "host": host, "pid": pid, "last_seen_at": seen, "seconds": age}
        for wid, host, pid, seen, age, _ in rows
    ]
    named = ", ".join(f"{w['id']} ({duration(w['seconds'])} ago)" for w in stale[:5])
    more = f" and {total - 5} more" if total > 5 else ""
    return Check(
        "stale_workers",
        Status.WARN,
        f"{total} worker row(s) without a heartbeat for over {STALE_AFTER:.0f}s: {named}{more}",
        fix="those processes crashed or lost the database: check their hosts and pids (a process "
        "still running there cannot reach PostgreSQL); the next live worker's heartbeat removes "
        "the rows",
        details={"count": total, "workers": stale},
    )


def orphaned_leases(conn: psycopg.Connection[Any]) -> Check:
    """The ``orphaned_leases`` check: running jobs leased to workers that are not live."""
    ((row),) = db.fetch_all(conn, queries.LEASES_WITHOUT_LIVE_WORKER, {"stale_after": STALE_AFTER})
    orphaned = db.orphaned_leases_from_row(row)
    details = {
        "jobs": orphaned.jobs,
        "owners": orphaned.owners,
        "first_expiry_seconds": orphaned.first_expiry,
        "last_expiry_seconds": orphaned.last_expiry,
    }
    if not orphaned.jobs:
        return Check(
            "orphaned_leases", Status.PASS, "every running job is leased to a live worker", None
        )
    last = orphaned.last_expiry or 0
    when = (
        "their leases have expired: the lease rescuer of any running worker frees them"
        if last <= 0
        else f"their leases expire within {duration(last)}, then a worker's lease rescuer "
        "runs them again (or dead-letters them on their last attempt)"
    )
    return Check(
        "orphaned_leases",
        Status.WARN,
        f"{orphaned.jobs:,} running job(s) leased to {orphaned.owners} worker(s) that are not "
        f"live: {when}",
        fix="keep at least one worker with maintenance services running; if those workers are "
        "hung rather than gone, restart them",
        details=details,
    )
