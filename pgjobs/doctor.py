"""What `pgjobs doctor` checks, as data: every check reads the database and returns a ``Check``
(pass, warn, fail or skip, what it found, how to fix it, and the figures behind it).

The checks, in the order they run: the connection itself; the schema revision; autovacuum on the
server and on ``queued_jobs`` (its last vacuum and dead-row ratio); the oldest transaction
holding back vacuum; the NOTIFY queue; whether the DSN goes through a transaction-mode pooler; the
connection budget; the archive's partitions for today and tomorrow and its DEFAULT partition;
stale worker rows; leases held by workers that are not live.

``diagnose`` runs them all on one connection (the pooler check opens a second one for its
LISTEN/NOTIFY round trip) and never raises for what it finds: an unreachable database is a failed
``connection`` check, a missing schema a failed ``schema`` check that skips the checks needing
the tables. ``pgjobs.cli.doctor`` prints the ``Report``.
"""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgjobs import archive, db, migrate, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, DatabaseUnavailable, PgjobsError, SchemaMissing
from pgjobs.maintenance import CONNECTIONS as SERVICE_CONNECTIONS
from pgjobs.maintenance.registry import STALE_AFTER

#: Connections one `pgjobs work` process holds at most: two claim connections (one when its
#: concurrency is 1), one LISTEN connection and the maintenance services' shared connections.
WORKER_CONNECTIONS = 2 + 1 + SERVICE_CONNECTIONS
#: PgBouncer's default port: a DSN that names it probably goes through a pooler.
PGBOUNCER_PORT = 6432
#: Stale worker rows named in a check's details, at most.
STALE_WORKERS_SHOWN = 20


class Status(enum.StrEnum):
    """How a check came out. ``skip``: it could not run (the tables it reads are missing)."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: ``message`` says what was found, ``fix`` what to do (None on a pass),
    ``details`` the figures behind it (JSON-ready, times as datetimes)."""

    name: str
    status: Status
    message: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "message": self.message,
            "fix": self.fix,
            "details": self.details,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """Planning inputs of the connection budget: ``workers`` `pgjobs work` processes holding
    ``connections_per_worker`` connections each. ``workers`` None: judge the live workers.

    Example: ``Plan(workers=12)`` asks whether twelve workers fit in ``max_connections``.
    """

    workers: int | None = None
    connections_per_worker: int | None = None

    def __post_init__(self) -> None:
        for name, value in (
            ("workers", self.workers),
            ("connections_per_worker", self.connections_per_worker),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(
                    f"{name} must be a whole number, got {value!r}", field=name
                )
        if self.workers is not None and self.workers < 0:
            raise ConfigurationError(f"workers must be >= 0, got {self.workers}", field="workers")
        if self.connections_per_worker is not None:
            if self.workers is None:
                raise ConfigurationError(
                    "connections per worker is a planning input: give the number of workers too",
                    field="connections_per_worker",
                )
            if self.connections_per_worker < 1:
                raise ConfigurationError(
                    f"connections per worker must be >= 1, got {self.connections_per_worker}",
                    field="connections_per_worker",
                )

    @property
    def per_worker(self) -> int:
        return self.connections_per_worker or WORKER_CONNECTIONS


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where a check turns from pass to warn (or fail)."""

    #: Seconds a transaction may stay open before it counts as holding back vacuum.
    long_transaction: float = 300.0
    #: Dead rows per live row of queued_jobs above which it needs a vacuum, once it has at least
    #: ``dead_rows`` dead rows (a few dead rows in a small table are nothing).
    dead_ratio: float = 0.2
    dead_rows: int = 1000
    #: Share of the NOTIFY queue in use: warn, fail.
    notify_warn: float = 0.5
    notify_fail: float = 0.9
    #: Share of the available connections in use (or planned) above which the budget is tight.
    budget_warn: float = 0.8
    #: Seconds the pooler check waits for its own NOTIFY to come back.
    listen_timeout: float = 2.0


@dataclass(frozen=True, slots=True)
class Report:
    """Every check of one `pgjobs doctor` run, in order."""

    checks: list[Check]

    def count(self, status: Status) -> int:
        return sum(1 for check in self.checks if check.status is status)

    @property
    def status(self) -> Status:
        """``fail`` if any check failed, else ``warn`` if any warned, else ``pass``."""
        for worst in (Status.FAIL, Status.WARN):
            if self.count(worst):
                return worst
        return Status.PASS

    @property
    def exit_code(self) -> int:
        """1 when a check failed, else 0 (warnings included)."""
        return 1 if self.status is Status.FAIL else 0

    def summary(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "passed": self.count(Status.PASS),
            "warnings": self.count(Status.WARN),
            "failed": self.count(Status.FAIL),
            "skipped": self.count(Status.SKIP),
        }

    def as_json(self) -> dict[str, Any]:
        """What `pgjobs doctor --json` prints: ``{"checks": [...], "summary": {...}}``."""
        return {"checks": [c.as_json() for c in self.checks], "summary": self.summary()}


@dataclass(frozen=True, slots=True)
class _Server:
    version: str
    database: str
    user: str
    address: str | None
    port: int | None
    pid: int
    autovacuum: bool
    track_counts: bool


def diagnose(dsn: Dsn, *, plan: Plan | None = None, thresholds: Thresholds | None = None) -> Report:
    """Run every check against ``dsn``'s database.

    Example: ``diagnose(resolve_dsn(None)).exit_code`` is 0 unless a check failed.
    """
    plan = plan or Plan()
    limits = thresholds or Thresholds()
    try:
        conn = db.connect(dsn)
    except DatabaseUnavailable as exc:
        return Report([_unreachable(exc)])
    with conn:
        try:
            server = _server(conn)
        except DatabaseUnavailable as exc:
            return Report([_unreachable(exc)])
        checks = [_connection(server, dsn)]
        schema = _guarded("schema", lambda: _schema(conn))
        checks.append(schema)
        tables = schema.status is Status.PASS or schema.details.get("revision") is not None
        steps: list[tuple[str, Callable[[], Check], bool]] = [
            ("autovacuum", lambda: _autovacuum(server), False),
            ("queued_jobs_vacuum", lambda: _hot_table(conn, server, limits), True),
            ("oldest_transaction", lambda: _oldest_transaction(conn, limits), False),
            ("notify_queue", lambda: _notify_queue(conn, limits), False),
            ("pooler", lambda: _pooler(conn, dsn, server, limits), False),
            ("connection_budget", lambda: _budget(conn, plan, limits), False),
            ("archive_partitions", lambda: _partitions(conn), True),
            ("archive_default_partition", lambda: _default_partition(conn), True),
            ("stale_workers", lambda: _stale_workers(conn), True),
            ("orphaned_leases", lambda: _orphaned_leases(conn), True),
        ]
        for name, run, needs_tables in steps:
            if needs_tables and not tables:
                checks.append(
                    Check(name, Status.SKIP, "needs the pgjobs tables (see the schema check)")
                )
            else:
                checks.append(_guarded(name, run))
    return Report(checks)


def _guarded(name: str, run: Callable[[], Check]) -> Check:
    """``run()``, or a failed check saying why it could not run (a privilege missing, the
    connection lost)."""
    try:
        return run()
    except SchemaMissing as exc:
        return Check(name, Status.SKIP, f"needs the pgjobs tables: {exc}")
    except PgjobsError as exc:
        denied = "permission denied" in str(exc)
        return Check(
            name,
            Status.FAIL,
            f"the check could not run: {exc}",
            fix="grant the role pg_monitor (read access to the statistics views) and retry"
            if denied
            else "see the message, then run `pgjobs doctor` again",
        )


def _unreachable(exc: PgjobsError) -> Check:
    return Check(
        "connection",
        Status.FAIL,
        str(exc),
        fix="check the DSN (--dsn, $PGJOBS_DATABASE_URL, $DATABASE_URL) and that PostgreSQL is up",
    )


def _server(conn: psycopg.Connection[Any]) -> _Server:
    ((version, database, user, address, port, pid, autovacuum, track_counts),) = db.fetch_all(
        conn, queries.DOCTOR_SERVER
    )
    return _Server(
        version, database, user, address, port, pid, autovacuum == "on", track_counts == "on"
    )


def _connection(server: _Server, dsn: Dsn) -> Check:
    where = f"{server.address}:{server.port}" if server.address else "a local socket"
    return Check(
        "connection",
        Status.PASS,
        f"PostgreSQL {server.version} at {where}, database {server.database!r}, as {server.user!r}",
        details={
            "dsn": dsn.redacted,
            "server_version": server.version,
            "database": server.database,
            "user": server.user,
            "server_address": server.address,
            "server_port": server.port,
        },
    )


def _schema(conn: psycopg.Connection[Any]) -> Check:
    with db.translate_errors():
        revision = db.schema_revision(conn)
    head = migrate.head()
    details = {"revision": revision, "head": head}
    if revision is None:
        return Check(
            "schema",
            Status.FAIL,
            "the pgjobs tables are missing in this database",
            fix="run `pgjobs migrate` (or `pgjobs migrate --sql` for the DDL to review)",
            details=details,
        )
    if revision == head:
        return Check("schema", Status.PASS, f"at revision {revision}, the head", details=details)
    if revision.isdigit() and head.isdigit() and int(revision) > int(head):
        return Check(
            "schema",
            Status.FAIL,
            f"at revision {revision}, newer than this pgjobs knows ({head})",
            fix="upgrade pgjobs on this host to the release that migrated the database",
            details=details,
        )
    return Check(
        "schema",
        Status.FAIL,
        f"at revision {revision}; this pgjobs needs {head} (workers refuse to start)",
        fix="run `pgjobs migrate`",
        details=details,
    )


_AUTOVACUUM_WHY = (
    "every claim and completion updates or deletes a queued_jobs row, so the hot table makes dead "
    "rows all day; without vacuum they pile up, the claim scans them, and the table and its "
    "indexes bloat until they are rewritten"
)


def _autovacuum(server: _Server) -> Check:
    details = {"autovacuum": server.autovacuum, "track_counts": server.track_counts}
    if not server.autovacuum:
        return Check(
            "autovacuum",
            Status.WARN,
            f"autovacuum is off on this server: {_AUTOVACUUM_WHY}",
            fix="ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf(); (or set it in "
            "postgresql.conf); meanwhile run VACUUM (ANALYZE) queued_jobs regularly",
            details=details,
        )
    if not server.track_counts:
        return Check(
            "autovacuum",
            Status.WARN,
            "track_counts is off, so autovacuum never sees which tables need it: "
            + _AUTOVACUUM_WHY,
            fix="ALTER SYSTEM SET track_counts = on; SELECT pg_reload_conf();",
            details=details,
        )
    return Check("autovacuum", Status.PASS, "autovacuum is on", details=details)


def _hot_table(conn: psycopg.Connection[Any], server: _Server, limits: Thresholds) -> Check:
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


def _oldest_transaction(conn: psycopg.Connection[Any], limits: Thresholds) -> Check:
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
    held = f"open {_duration(seconds)}, " if seconds is not None else ""
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


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _notify_queue(conn: psycopg.Connection[Any], limits: Thresholds) -> Check:
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


def _pooler(conn: psycopg.Connection[Any], dsn: Dsn, server: _Server, limits: Thresholds) -> Check:
    """Whether LISTEN works through ``dsn`` and statements share one server session: neither
    holds behind a transaction-mode pooler (PgBouncer's ``pool_mode = transaction``)."""
    port = _dsn_port(dsn)
    same_session = _same_session(conn)
    elapsed = _listen_round_trip(dsn, limits.listen_timeout)
    details = {
        "dsn_port": port,
        "server_port": server.port,
        "listen_round_trip_seconds": elapsed,
        "same_session": same_session,
    }
    fix = (
        "point pgjobs (workers, `pgjobs migrate`, `pgjobs prune`) at PostgreSQL directly or "
        "through a session-mode pool; keep the transaction-mode pooler for the application's "
        "enqueues only (PgBouncer 1.21 or later, with max_prepared_statements above 0)"
    )
    if elapsed is None or not same_session:
        what = (
            "consecutive statements ran on different server sessions"
            if not same_session
            else f"a NOTIFY did not come back to its LISTENing connection within "
            f"{limits.listen_timeout:g}s"
        )
        return Check(
            "pooler",
            Status.FAIL,
            f"{what}: the DSN goes through a transaction-mode pooler, where LISTEN, session "
            "advisory locks and prepared statements do not work",
            fix=fix,
            details=details,
        )
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
            fix=f"make sure the pool is in session mode, or {fix}",
            details=details,
        )
    return Check(
        "pooler",
        Status.PASS,
        f"direct connection: LISTEN/NOTIFY round trip in {elapsed * 1000:.0f} ms on one session",
        details=details,
    )


def _dsn_port(dsn: Dsn) -> int | None:
    """The port ``dsn`` names (the first one of a list), None when it names none."""
    raw = str(conninfo_to_dict(dsn.url).get("port") or "").split(",")[0]
    return int(raw) if raw.isdigit() else None


def _same_session(conn: psycopg.Connection[Any]) -> bool:
    """Whether two statements in two transactions reached the same server session."""
    pids = {db.fetch_all(conn, queries.DOCTOR_BACKEND_PID)[0][0] for _ in range(3)}
    return len(pids) == 1


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


def _budget(conn: psycopg.Connection[Any], plan: Plan, limits: Thresholds) -> Check:
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


def _partitions(conn: psycopg.Connection[Any]) -> Check:
    ((today, partitioned, _),) = db.fetch_all(conn, queries.ARCHIVE_STATE)
    if not partitioned:
        return Check(
            "archive_partitions",
            Status.PASS,
            "archived_jobs is not partitioned (schema before 0004): nothing to create ahead",
        )
    partitions = archive.list_partitions(conn)
    days: list[date] = [today, today + timedelta(days=1)]
    missing = [day for day in days if not archive.overlaps(partitions, *archive.day_range(day))]
    dated = [p for p in partitions if not p.is_default and p.upper is not None]
    last = max((p.upper for p in dated if p.upper is not None), default=None)
    details = {
        "today": today.isoformat(),
        "missing": [archive.partition_name(day) for day in missing],
        "partitions": len(dated),
        "covered_until": last,
    }
    if missing:
        names = ", ".join(archive.partition_name(day) for day in missing)
        return Check(
            "archive_partitions",
            Status.WARN,
            f"no partition for {names}: jobs finished then land in the DEFAULT partition, which "
            "`pgjobs prune` cannot drop by day",
            fix="run a worker with its maintenance services (the default): the "
            "archive-partitions service creates today's and the next days' partitions within an "
            "hour of starting",
            details=details,
        )
    until = "-" if last is None else f"{last:%Y-%m-%d %H:%M} UTC"
    return Check(
        "archive_partitions",
        Status.PASS,
        f"partitions for today and tomorrow exist ({len(dated)} in all, up to {until})",
        details=details,
    )


def _default_partition(conn: psycopg.Connection[Any]) -> Check:
    ((_, partitioned, _),) = db.fetch_all(conn, queries.ARCHIVE_STATE)
    default = archive.default_partition(archive.list_partitions(conn)) if partitioned else None
    if default is None:
        return Check(
            "archive_default_partition",
            Status.PASS,
            "archived_jobs has no DEFAULT partition" if partitioned else "not partitioned",
        )
    rows = archive.default_rows(conn, default)
    details = {"partition": default.name, "rows": rows}
    if rows == 0:
        return Check(
            "archive_default_partition",
            Status.PASS,
            f"{default.name} is empty",
            details=details,
        )
    return Check(
        "archive_default_partition",
        Status.WARN,
        f"{rows:,} row(s) in {default.name}: their days had no partition when they finished",
        fix="run a worker with its maintenance services: the archive-partitions service moves "
        "them into partitions of their own days (up to 7 days per hourly round)",
        details=details,
    )


def _stale_workers(conn: psycopg.Connection[Any]) -> Check:
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
    named = ", ".join(f"{w['id']} ({_duration(w['seconds'])} ago)" for w in stale[:5])
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


def _orphaned_leases(conn: psycopg.Connection[Any]) -> Check:
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
        else f"their leases expire within {_duration(last)}, then a worker's lease rescuer "
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
