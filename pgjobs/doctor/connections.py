"""The checks about connections: whether a transaction-mode pooler sits in between, and the
connection budget of the workers against ``max_connections``."""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.db.pooler import POOLER_ENV
from pgjobs.doctor.report import Check, Plan, Status, Thresholds
from pgjobs.doctor.server import Server
from pgjobs.errors import SchemaMissing
from pgjobs.maintenance.registry import STALE_AFTER

#: PgBouncer's default port: a DSN that names it probably goes through a pooler.
PGBOUNCER_PORT = 6432


def pooler(conn: psycopg.Connection[Any], dsn: Dsn, server: Server, limits: Thresholds) -> Check:
    """Whether statements share one server session and LISTEN works through ``dsn``: neither
    holds behind a transaction-mode pooler (PgBouncer's ``pool_mode = transaction``), which
    needs ``PGJOBS_POOLER=transaction``; and whether that mode is set where it is needed."""
    port = _dsn_port(dsn, conn)
    same_session = _same_session(conn) and not _shared_sessions(dsn)
    # No LISTEN through a pooler in transaction mode: it would stay behind on a server session.
    listen = same_session and not dsn.transaction_pooled
    elapsed = _listen_round_trip(dsn, limits.listen_timeout) if listen else None
    details = {
        "dsn_port": port,
        "server_port": server.port,
        "listen_round_trip_seconds": elapsed,
        "same_session": same_session,
        "pooler_mode": dsn.pooler.value,
    }
    if not same_session or (listen and elapsed is None):
        return _behind_transaction_pooler(dsn, same_session, limits, details)
    if dsn.transaction_pooled:
        return Check(
            "pooler",
            Status.WARN,
            f"{POOLER_ENV}=transaction is set but each connection keeps one server session (a "
            "direct connection or a session-mode pool): workers poll instead of LISTEN and "
            "prepare no statement for nothing",
            fix=f"unset {POOLER_ENV} (or --pooler session) unless the DSN goes through a "
            "transaction-mode pooler",
            details=details,
        )
    assert elapsed is not None
    proxied = port is not None and server.port is not None and port != server.port
    if port == PGBOUNCER_PORT or proxied:
        hint = (
            f"the DSN names port {port} (PgBouncer's default)"
            if port == PGBOUNCER_PORT
            else f"the DSN names port {port} but the server listens on {server.port}"
        )
        return Check(
            "pooler",
            Status.WARN,
            f"{hint}: a pooler or proxy sits in between; LISTEN worked now ({elapsed * 1000:.0f} "
            "ms round trip), which a session-mode pool allows, but a transaction-mode one would not",
            fix=f"make sure the pool is in session mode, or set {POOLER_ENV}=transaction",
            details=details,
        )
    return Check(
        "pooler",
        Status.PASS,
        f"direct connection: LISTEN/NOTIFY round trip in {elapsed * 1000:.0f} ms on one session",
        details=details,
    )


def _behind_transaction_pooler(
    dsn: Dsn, same_session: bool, limits: Thresholds, details: dict[str, Any]
) -> Check:
    """The check when a transaction-mode pooler sits in between: a pass when the mode is set."""
    what = (
        "consecutive statements ran on different server sessions"
        if not same_session
        else f"a NOTIFY did not come back to its LISTENing connection within "
        f"{limits.listen_timeout:g}s"
    )
    if dsn.transaction_pooled:
        return Check(
            "pooler",
            Status.PASS,
            f"{what}: a transaction-mode pooler, and {POOLER_ENV}=transaction is set (no "
            "prepared statements, session settings or session locks; workers poll, or LISTEN on "
            "--listen-dsn)",
            details=details,
        )
    return Check(
        "pooler",
        Status.FAIL,
        f"{what}: the DSN goes through a transaction-mode pooler, where LISTEN, session "
        "advisory locks and prepared statements do not work",
        fix=f"set {POOLER_ENV}=transaction (or --pooler transaction, App(pooler='transaction')) "
        "for workers, `pgjobs serve` and enqueues, with --listen-dsn naming PostgreSQL directly "
        "to LISTEN; run `pgjobs migrate` and `pgjobs prune` on a direct DSN; or point pgjobs at "
        "PostgreSQL directly or through a session-mode pool",
        details=details,
    )


def _dsn_port(dsn: Dsn, conn: psycopg.Connection[Any]) -> int | None:
    """The port ``dsn`` names, None when it names none; of a list (several hosts), the one of
    the host libpq reached."""
    raw = str(conninfo_to_dict(dsn.url).get("port") or "")
    if "," in raw:
        return int(conn.info.port)
    return int(raw) if raw.isdigit() else None


def _same_session(conn: psycopg.Connection[Any]) -> bool:
    """Whether two statements in two transactions reached the same server session."""
    pids = {db.fetch_all(conn, queries.DOCTOR_BACKEND_PID)[0][0] for _ in range(3)}
    return len(pids) == 1


#: Seconds a statement may wait for a server session while another client holds one in a
#: transaction: a direct connection never waits; a pooler with a single server session does.
_SHARED_WAIT = 3.0


def _shared_sessions(dsn: Dsn) -> bool:
    """Whether another client's transaction moves a connection to another server session, as a
    transaction-mode pooler does when two clients share its pool (and a lone client may well get
    the same session back every time, which ``_same_session`` alone cannot tell)."""
    with (
        db.connect(dsn) as first,
        db.connect(dsn) as second,
        ThreadPoolExecutor(1) as runner,
    ):
        before = _backend_pid(first)
        with db.translate_errors(dsn), second.transaction():
            _backend_pid(second)
            after = runner.submit(_backend_pid, first)
            try:
                return bool(after.result(timeout=_SHARED_WAIT) != before)
            except FutureTimeout:
                return True  # it waits for the other client's transaction to end: shared


def _backend_pid(conn: psycopg.Connection[Any]) -> int:
    return int(db.fetch_all(conn, queries.DOCTOR_BACKEND_PID)[0][0])


def _listen_round_trip(dsn: Dsn, timeout: float) -> float | None:
    """Seconds for a NOTIFY from one connection to reach another that LISTENs, or None when it
    did not arrive within ``timeout`` seconds. The listener polls with a statement: each one reads
    what the server sent meanwhile."""
    token = secrets.token_hex(8)
    received: list[str] = []
    with db.connect(dsn) as listener, db.connect(dsn) as sender, db.translate_errors(dsn):
        listener.add_notify_handler(lambda notify: received.append(notify.payload))
        listener.execute(queries.DOCTOR_LISTEN)
        started = time.monotonic()
        sender.execute(queries.DOCTOR_NOTIFY, {"token": token})
        while token not in received:
            if time.monotonic() - started > timeout:
                return None
            time.sleep(0.01)
            listener.execute(queries.DOCTOR_BACKEND_PID)
        return time.monotonic() - started


def connection_budget(conn: psycopg.Connection[Any], plan: Plan, limits: Thresholds) -> Check:
    """The ``connection_budget`` check: connections in use (or planned) against
    ``max_connections`` less the reserved ones."""
    ((max_connections, superuser, reserved, in_use, by_pgjobs),) = db.fetch_all(
        conn, queries.DOCTOR_CONNECTIONS
    )
    available = max_connections - superuser - reserved
    try:
        workers = db.live_workers(conn, STALE_AFTER)
    except SchemaMissing:
        workers = []
    live_worker_connections = sum((1 if w.concurrency == 1 else 2) + 1 + 2 for w in workers)
    others = max(in_use - by_pgjobs, 0)
    details: dict[str, Any] = {
        "max_connections": max_connections,
        "superuser_reserved_connections": superuser,
        "reserved_connections": reserved,
        "available": available,
        "in_use": in_use,
        "in_use_by_pgjobs": by_pgjobs,
        "live_workers": len(workers),
        "live_worker_connections": live_worker_connections,
    }
    budget = (
        f"max_connections {max_connections} less {superuser + reserved} reserved leaves "
        f"{available}; {in_use} in use now ({by_pgjobs} by pgjobs, {len(workers)} live worker(s) "
        f"holding up to {live_worker_connections})"
    )
    if plan.workers is not None:
        planned = plan.workers * plan.per_worker
        projected = planned + others
        details.update(planned_workers=plan.workers, connections_per_worker=plan.per_worker)
        details.update(planned_connections=planned, projected=projected)
        said = (
            f"{plan.workers} worker(s) x {plan.per_worker} connections = {planned}, plus "
            f"{others} other client connection(s) = {projected}; {budget}"
        )
    else:
        projected = in_use
        details["projected"] = projected
        said = budget
    fix = (
        "fewer workers or less concurrency per host, a pooler in session mode for the "
        "application, or a larger max_connections (needs a restart)"
    )
    if projected > available:
        return Check("connection_budget", Status.FAIL, f"over budget: {said}", fix, details)
    if projected > limits.budget_warn * available:
        share = projected / available if available else 1.0
        return Check(
            "connection_budget", Status.WARN, f"{share:.0%} of the budget: {said}", fix, details
        )
    return Check("connection_budget", Status.PASS, said, details=details)
