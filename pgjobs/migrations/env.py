"""Alembic environment of pgjobs' migrations.

The same folder, inside the package, serves `alembic upgrade head` from the repository root
(alembic.ini points here) and `pgjobs migrate` from an installed wheel. pgjobs keeps its own version
table, ``pgjobs_alembic_version``, so its history lives beside an application's own Alembic
history in the same database.
"""

from __future__ import annotations

import re
from typing import Any

from alembic import context
from sqlalchemy import Connection

from pgjobs.db.connections import sqlalchemy_engine
from pgjobs.db.dsn import Dsn, normalize_dsn, resolve_dsn
from pgjobs.migrate import take_turn
from pgjobs.schema import metadata

VERSION_TABLE = "pgjobs_alembic_version"
#: How long one statement may wait for a lock before the migration fails (and can be re-run),
#: instead of queueing every worker behind it. `-x lock_timeout=10s`, or `pgjobs migrate
#: --lock-timeout 10s`; 0 waits forever.
DEFAULT_LOCK_TIMEOUT = "5s"
_DURATION = re.compile(r"\d+(\.\d+)?\s*(us|ms|s|min|h|d)?")
config = context.config


def lock_timeout() -> str:
    """The lock_timeout of this run: `-x lock_timeout=`, then the caller's (pgjobs.migrate)."""
    value = (
        context.get_x_argument(as_dictionary=True).get("lock_timeout")
        or config.attributes.get("lock_timeout")
        or DEFAULT_LOCK_TIMEOUT
    ).strip()
    if not _DURATION.fullmatch(value):
        raise ValueError(f"lock_timeout {value!r}: expected a duration such as 5s, 500ms or 0")
    return value


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Compare only pgjobs' own tables, so an application's tables never look like drift."""
    if type_ == "table":
        return name in metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in metadata.tables


def _dsn() -> Dsn | None:
    """The DSN of this run (`-x dsn=`, then sqlalchemy.url), None when neither names one."""
    raw = context.get_x_argument(as_dictionary=True).get("dsn") or config.get_main_option(
        "sqlalchemy.url"
    )
    return normalize_dsn(raw, "the migration DSN") if raw else None


def _options() -> dict[str, Any]:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "include_object": include_object,
        "compare_type": True,
        "transaction_per_migration": True,
    }


def run_offline() -> None:
    # Offline SQL needs only the dialect, never a server.
    context.configure(url="postgresql+psycopg://", literal_binds=True, **_options())
    context.execute(f"SET lock_timeout = '{lock_timeout()}'")
    with context.begin_transaction():
        context.run_migrations()


def _set_lock_timeout(connection: Connection) -> None:
    # Session-wide, so that it holds in autocommit blocks too; committed at once so that
    # Alembic's own transactions (one per migration) start on a clean connection.
    connection.exec_driver_sql(f"SET lock_timeout = '{lock_timeout()}'")
    connection.commit()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _set_lock_timeout(connection)
        context.configure(connection=connection, **_options())
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = sqlalchemy_engine(_dsn() or resolve_dsn(None))
    with engine.connect() as connection:
        # One migration at a time (pgjobs.migrate takes the same lock on the connection it
        # passes); released when this connection closes.
        take_turn(connection)
        _set_lock_timeout(connection)
        context.configure(connection=connection, **_options())
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
