"""The checks about what keeps vacuum from cleaning ``queued_jobs``: its dead rows, the oldest
transaction, and the NOTIFY queue a stuck listener fills."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.doctor.report import Check, Status, Thresholds, duration
from pgjobs.doctor.server import Server
from pgjobs.errors import SchemaMissing


def hot_table(conn: psycopg.Connection[Any], server: Server, limits: Thresholds) -> Check:
    """The ``queued_jobs_vacuum`` check: its dead rows and its last vacuum."""
    health = [db.table_health_from_row(row) for row in db.fetch_all(conn, queries.TABLE_HEALTH)]
    hot = next((t for t in health if t.table == "queued_jobs"), None)
    if hot is None:
        raise SchemaMissing("queued_jobs is missing")
    last = max(filter(None, (hot.last_vacuum, hot.last_autovacuum)), default=None)
    disabled = "autovacuum_enabled=false" in (hot.options or [])
    details = {
        "live_rows": hot.live_rows,
        "dead_rows": hot.dead_rows,
        "dead_ratio": hot.dead_ratio,
        "last_vacuum": hot.last_vacuum,
        "last_autovacuum": hot.last_autovacuum,
        "autovacuum_count": hot.autovacuum_count,
        "storage_options": hot.options,
    }
    ratio = "-" if hot.dead_ratio is None else f"{hot.dead_ratio:.0%}"
    vacuumed = "never vacuumed" if last is None else f"last vacuumed {last:%Y-%m-%d %H:%M} UTC"
    found = f"{hot.live_rows or 0:,} live, {hot.dead_rows or 0:,} dead rows ({ratio}); {vacuumed}"
    dead = hot.dead_rows or 0
    bloated = dead >= limits.dead_rows and (
        hot.dead_ratio is None or hot.dead_ratio > limits.dead_ratio
    )
    if disabled:
        return Check(
            "queued_jobs_vacuum",
            Status.WARN,
            f"autovacuum is disabled on queued_jobs itself (autovacuum_enabled=false); {found}",
            fix="ALTER TABLE queued_jobs RESET (autovacuum_enabled);",
            details=details,
        )
    if bloated:
        why = "autovacuum is off" if not server.autovacuum else "autovacuum is not keeping up"
        return Check(
            "queued_jobs_vacuum",
            Status.WARN,
            f"{found}: too many dead rows ({why})",
            fix="VACUUM (ANALYZE) queued_jobs; then find what holds vacuum back (see "
            "oldest_transaction) or lower autovacuum_vacuum_scale_factor on queued_jobs",
            details=details,
        )
    return Check("queued_jobs_vacuum", Status.PASS, found, details=details)


def oldest_transaction(conn: psycopg.Connection[Any], limits: Thresholds) -> Check:
    """The ``oldest_transaction`` check: what holds back vacuum the longest."""
    rows = db.fetch_all(conn, queries.DOCTOR_OLDEST_XMIN)
    if not rows:
        return Check(
            "oldest_transaction",
            Status.PASS,
            "no other transaction holds back vacuum in this database",
        )
    kind, pid, state, application, who, xmin_age, seconds, what, backend_type = rows[0]
    details = {
        "kind": kind,
        "pid": pid,
        "state": state,
        "application_name": application,
        "user": who if kind != "replication slot" else None,
        "slot": who if kind == "replication slot" else None,
        "xmin_age": xmin_age,
        "seconds": seconds,
        "query": what,
        "backend_type": backend_type,
    }
    if kind == "session":
        holder = (
            f"pid {pid} ({state or 'unknown state'}, application {application or '-'!r}, "
            f"user {who!r})"
        )
        fix = (
            f"commit or roll back that transaction in its application, or end it: "
            f"SELECT pg_terminate_backend({pid}); set idle_in_transaction_session_timeout"
        )
    elif kind == "prepared transaction":
        holder = f"prepared transaction {what!r} (owner {who!r})"
        fix = f"COMMIT PREPARED {_literal(what)} or ROLLBACK PREPARED {_literal(what)}"
    else:
        holder = f"replication slot {who!r} ({state}, {what})"
        fix = f"resume its consumer, or drop it: SELECT pg_drop_replication_slot({_literal(who)})"
    held = f"open {duration(seconds)}, " if seconds is not None else ""
    message = f"oldest: {holder}, {held}{xmin_age:,} transactions behind"
    too_old = (seconds or 0) > limits.long_transaction or kind == "replication slot"
    if kind == "replication slot" and state == "active" and (xmin_age or 0) < 1_000_000:
        too_old = False
    if not too_old:
        return Check("oldest_transaction", Status.PASS, message, details=details)
    return Check(
        "oldest_transaction",
        Status.WARN,
        f"{message}: vacuum cannot remove any row that died after it began, so queued_jobs' "
        "dead rows pile up while it stays open",
        fix=fix,
        details=details,
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def notify_queue(conn: psycopg.Connection[Any], limits: Thresholds) -> Check:
    """The ``notify_queue`` check: the share of the NOTIFY queue in use."""
    ((usage,),) = db.fetch_all(conn, queries.DOCTOR_NOTIFY_USAGE)
    usage = float(usage)
    details = {"usage": usage}
    message = f"{usage:.1%} of the NOTIFY queue in use"
    if usage < limits.notify_warn:
        return Check("notify_queue", Status.PASS, message, details=details)
    return Check(
        "notify_queue",
        Status.FAIL if usage >= limits.notify_fail else Status.WARN,
        f"{message}: a session that LISTENs stopped reading (it sits in a long transaction); when "
        "the queue is full, every enqueue fails at commit",
        fix="find the LISTENing session that stays in a transaction (see oldest_transaction) and "
        "end its transaction or the session",
        details=details,
    )
