"""What `pgjobs doctor` checks, as data: every check reads the database and returns a ``Check``
(pass, warn, fail or skip, what it found, how to fix it, and the figures behind it).

The checks, in the order they run: the connection itself; the schema revision; autovacuum on the
server and on ``queued_jobs`` (its last vacuum and dead-row ratio); the oldest transaction
holding back vacuum; the NOTIFY queue; whether the DSN goes through a transaction-mode pooler; the
connection budget; the archive's partitions for today and tomorrow and its DEFAULT partition;
how much history the archive holds without a retention policy; stale worker rows; leases held
by workers that are not live. Each subject has its module (``server``, ``vacuum``,
``connections``, ``partitions``, ``workers``); ``report`` holds the shapes of the result.

``diagnose`` runs them all on one connection (the pooler check opens a second one for its
LISTEN/NOTIFY round trip) and never raises for what it finds: an unreachable database is a failed
``connection`` check, a missing schema a failed ``schema`` check that skips the checks needing
the tables. ``pgjobs.cli.doctor`` prints the ``Report``.
"""

from __future__ import annotations

from collections.abc import Callable

from pgjobs import db
from pgjobs.db.dsn import Dsn
from pgjobs.doctor import connections, partitions, server, vacuum, workers
from pgjobs.doctor.report import WORKER_CONNECTIONS, Check, Plan, Report, Status, Thresholds
from pgjobs.errors import DatabaseUnavailable, PgjobsError, SchemaMissing
from pgjobs.retention_policy import RetentionPolicy

__all__ = [
    "WORKER_CONNECTIONS",
    "Check",
    "Plan",
    "Report",
    "Status",
    "Thresholds",
    "diagnose",
]


def diagnose(
    dsn: Dsn,
    *,
    plan: Plan | None = None,
    thresholds: Thresholds | None = None,
    retention: RetentionPolicy | None = None,
) -> Report:
    """Run every check against ``dsn``'s database; ``retention`` is the policy the workers apply
    (``[tool.pgjobs.retention]``), if known.

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
            facts = server.read_server(conn)
        except DatabaseUnavailable as exc:
            return Report([_unreachable(exc)])
        checks = [server.connection(facts, dsn)]
        schema = _guarded("schema", lambda: server.schema(conn))
        checks.append(schema)
        tables = schema.status is Status.PASS or schema.details.get("revision") is not None
        steps: list[tuple[str, Callable[[], Check], bool]] = [
            ("autovacuum", lambda: server.autovacuum(facts), False),
            ("queued_jobs_vacuum", lambda: vacuum.hot_table(conn, facts, limits), True),
            ("oldest_transaction", lambda: vacuum.oldest_transaction(conn, limits), False),
            ("notify_queue", lambda: vacuum.notify_queue(conn, limits), False),
            ("pooler", lambda: connections.pooler(conn, dsn, facts, limits), False),
            ("connection_budget", lambda: connections.connection_budget(conn, plan, limits), False),
            ("archive_partitions", lambda: partitions.archive_partitions(conn), True),
            ("archive_default_partition", lambda: partitions.archive_default_partition(conn), True),
            (
                "archive_retention",
                lambda: partitions.archive_retention(conn, retention, limits),
                True,
            ),
            ("stale_workers", lambda: workers.stale_workers(conn), True),
            ("orphaned_leases", lambda: workers.orphaned_leases(conn), True),
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
