"""The checks about the server itself: the connection, the schema revision, autovacuum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, migrate, queries
from pgjobs.db.dsn import Dsn
from pgjobs.doctor.report import Check, Status


@dataclass(frozen=True, slots=True)
class Server:
    """What the server says about itself, read once per run."""

    version: str
    database: str
    user: str
    address: str | None
    port: int | None
    pid: int
    autovacuum: bool
    track_counts: bool


def read_server(conn: psycopg.Connection[Any]) -> Server:
    """The server's version, address and vacuum settings (``queries.DOCTOR_SERVER``)."""
    ((version, database, user, address, port, pid, autovacuum, track_counts),) = db.fetch_all(
        conn, queries.DOCTOR_SERVER
    )
    return Server(
        version, database, user, address, port, pid, autovacuum == "on", track_counts == "on"
    )


def connection(server: Server, dsn: Dsn) -> Check:
    """The ``connection`` check: passes with where the server is, once it answered."""
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


def schema(conn: psycopg.Connection[Any]) -> Check:
    """The ``schema`` check: the database's schema revision against this pgjobs' head."""
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


def autovacuum(server: Server) -> Check:
    """The ``autovacuum`` check: autovacuum and track_counts on the server."""
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
