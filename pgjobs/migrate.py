"""`pgjobs migrate`: Alembic commands on pgjobs' own migrations, shipped in ``pgjobs/migrations``.

Alembic (and SQLAlchemy under it) is imported only by the functions that run it: a worker checks
the schema revision without them, which keeps ~24 MiB out of every worker process.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, SchemaMissing

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy import Connection

VERSION_TABLE = "pgjobs_alembic_version"
#: The newest revision in pgjobs' migrations (migrations/versions), the one a worker needs.
#: tests/integration/schema/test_migrations.py checks it against what Alembic reads from the folder.
HEAD = "0020"
# A lock_timeout as PostgreSQL reads it: 5s, 500ms, 1min, 0 (no limit); the same rule as env.py.
_DURATION = re.compile(r"\d+(\.\d+)?\s*(us|ms|s|min|h|d)?")


@dataclass(frozen=True, slots=True)
class Change:
    """A migration's revisions before and after (None: no pgjobs tables)."""

    before: str | None
    after: str | None


def migrations_dir() -> Path:
    """The folder of env.py and versions/, inside the package (``pgjobs/migrations``)."""
    return Path(__file__).resolve().parent / "migrations"


def _config(output: io.StringIO | None = None) -> Config:
    from alembic.config import Config

    config = Config(output_buffer=output) if output is not None else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def head() -> str:
    """The newest revision pgjobs ships (``HEAD``)."""
    return HEAD


def migrations_head() -> str | None:
    """The newest revision as Alembic reads it from the migrations folder."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


@contextlib.contextmanager
def _callers_alembic_context_kept() -> Iterator[None]:
    """Let an application's own Alembic env.py call ``upgrade()``: ``alembic.context`` and
    ``alembic.op`` are module-level proxies that a nested run leaves empty when it ends, which
    would break the caller's run; put the caller's back."""
    from alembic import context, op

    saved = [getattr(module, "_proxy", None) for module in (context, op)]
    try:
        yield
    finally:
        for proxy in saved:
            if proxy is not None:
                proxy._install_proxy()


def _lock_timeout(config: Config, value: str | None) -> None:
    """Pass ``value`` (a PostgreSQL duration) to env.py, which sets it before any migration."""
    if value is None:
        return
    if not _DURATION.fullmatch(value.strip()):
        raise ConfigurationError(
            f"lock timeout {value!r}: expected a duration such as 5s, 500ms or 0 (no limit)"
        )
    config.attributes["lock_timeout"] = value.strip()


def _run(dsn: Dsn, action: str, revision: str, lock_timeout: str | None) -> Change:
    from alembic import command

    config = _config()
    _lock_timeout(config, lock_timeout)
    db.require_session(dsn, f"pgjobs migrate ({action})")
    engine = db.sqlalchemy_engine(dsn)
    try:
        # A connection outside any transaction: env.py runs each migration in a transaction of
        # its own, and migrations with autocommit blocks (CREATE INDEX CONCURRENTLY) need that.
        with (
            _callers_alembic_context_kept(),
            db.translate_errors(dsn),
            engine.connect() as connection,
        ):
            # One migration at a time: a second waits here, then reads the first one's result.
            take_turn(connection)
            before = _revision(connection)
            connection.commit()
            _require_known(dsn, before)
            config.attributes["connection"] = connection
            with _revision_errors(revision):
                getattr(command, action)(config, revision)
            after = _revision(connection)
            connection.exec_driver_sql(
                queries.MIGRATION_UNLOCK, {"key": queries.MIGRATION_LOCK_KEY}
            )
            connection.commit()
    finally:
        engine.dispose()
    return Change(before, after)


def take_turn(connection: Connection) -> None:
    """Wait until no other migration runs, then hold the migration lock (session-level, released
    by ``MIGRATION_UNLOCK`` or closing ``connection``). Polls ``MIGRATION_TRY_LOCK``, committing
    after each try, so that nothing is held while waiting."""
    pause = 0.05
    while True:
        taken = connection.exec_driver_sql(
            queries.MIGRATION_TRY_LOCK, {"key": queries.MIGRATION_LOCK_KEY}
        ).scalar()
        connection.commit()
        if taken:
            return
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _require_known(dsn: Dsn, revision: str | None) -> None:
    """Refuse a database whose schema a newer pgjobs migrated: this one cannot read or undo it."""
    if revision is not None and revision.isdigit() and int(revision) > int(HEAD):
        raise SchemaMissing(
            f"this pgjobs is older than the database schema in {dsn.redacted} (revision "
            f"{revision}, this pgjobs knows up to {HEAD}): upgrade pgjobs"
        )


def upgrade(dsn: Dsn, revision: str = "head", *, lock_timeout: str | None = None) -> Change:
    """Upgrade the database's pgjobs schema to ``revision``. ``lock_timeout`` (a PostgreSQL
    duration, default ``5s``, ``0`` waits forever) bounds every lock wait of the migrations.
    Migrations run one at a time (an advisory lock): a second one waits for the first, then
    finds nothing to do. Returns the revisions before and after.

    Example: ``upgrade(resolve_dsn(None), lock_timeout="10s").after == head()``
    """
    return _run(dsn, "upgrade", revision, lock_timeout)


def downgrade(dsn: Dsn, revision: str, *, lock_timeout: str | None = None) -> Change:
    """Downgrade the database's pgjobs schema to ``revision`` (``base`` removes it)."""
    return _run(dsn, "downgrade", revision, lock_timeout)


def sql(revision_range: str, *, downgrade: bool = False, lock_timeout: str | None = None) -> str:
    """The DDL of ``revision_range`` (e.g. ``head`` or ``0001:head``), for a reviewed deploy."""
    from alembic import command

    out = io.StringIO()
    config = _config(out)
    _lock_timeout(config, lock_timeout)
    with _revision_errors(revision_range):
        if downgrade:
            command.downgrade(config, revision_range, sql=True)
        else:
            command.upgrade(config, revision_range, sql=True)
    return out.getvalue()


@contextlib.contextmanager
def _revision_errors(revision: str) -> Iterator[None]:
    """Alembic's refusal of a target (unknown revision, wrong direction) as bad input."""
    from alembic.util import CommandError

    try:
        yield
    except CommandError as exc:
        raise ConfigurationError(
            f"revision {revision!r}: {' '.join(str(exc).split())} "
            f"(pgjobs' revisions: base, 0001 to {HEAD}, head)"
        ) from None


def current(dsn: Dsn) -> str | None:
    """The database's pgjobs revision, or None when pgjobs was never migrated there."""
    engine = db.sqlalchemy_engine(dsn)
    try:
        with db.translate_errors(dsn), engine.connect() as connection:
            return _revision(connection)
    finally:
        engine.dispose()


def require_head(dsn: Dsn) -> None:
    """Raise ``SchemaMissing`` (saying to run `pgjobs migrate`) unless the database's pgjobs schema
    is at this release's revision, as a worker needs it to start; ``DatabaseUnavailable`` when the
    database cannot be reached.

    Example: ``require_head(resolve_dsn(None))`` returns quietly on a migrated database.
    """
    with db.connect(dsn) as conn, db.translate_errors(dsn):
        revision = db.schema_revision(conn)
    _require_known(dsn, revision)
    if revision is None:
        raise SchemaMissing(
            f"the pgjobs tables are missing in {dsn.redacted}: run `pgjobs migrate`"
        )
    if revision != head():
        raise SchemaMissing(
            f"the pgjobs schema in {dsn.redacted} is at revision {revision}, this pgjobs needs "
            f"{head()}: run `pgjobs migrate`"
        )
