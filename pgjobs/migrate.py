"""`pgjobs migrate`: Alembic commands on pgjobs' own migrations, wherever they are installed."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from pgjobs import db
from pgjobs.errors import ConfigurationError

VERSION_TABLE = "pgjobs_alembic_version"
# A lock_timeout as PostgreSQL reads it: 5s, 500ms, 1min, 0 (no limit); the same rule as env.py.
_DURATION = re.compile(r"\d+(\.\d+)?\s*(us|ms|s|min|h|d)?")


def migrations_dir() -> Path:
    """The folder of env.py and versions/: inside the installed package (``pgjobs/migrations``,
    as the wheel ships it), else the repository's top-level ``alembic/``."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(f"pgjobs' migrations are missing from {package}; reinstall pgjobs")


def _config(output: io.StringIO | None = None) -> Config:
    config = Config(output_buffer=output) if output is not None else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def head() -> str:
    """The newest revision pgjobs ships."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision


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


def _run(dsn: db.Dsn, action: str, revision: str, lock_timeout: str | None) -> None:
    config = _config()
    _lock_timeout(config, lock_timeout)
    engine = db.sqlalchemy_engine(dsn)
    try:
        # A connection outside any transaction: env.py runs each migration in a transaction of
        # its own, and migrations with autocommit blocks (CREATE INDEX CONCURRENTLY) need that.
        with (
            _callers_alembic_context_kept(),
            db.translate_errors(dsn),
            engine.connect() as connection,
        ):
            config.attributes["connection"] = connection
            getattr(command, action)(config, revision)
    finally:
        engine.dispose()


def upgrade(dsn: db.Dsn, revision: str = "head", *, lock_timeout: str | None = None) -> None:
    """Upgrade the database's pgjobs schema to ``revision``. ``lock_timeout`` (a PostgreSQL
    duration, default ``5s``, ``0`` waits forever) bounds every lock wait of the migrations.

    Example: ``upgrade(resolve_dsn(None), lock_timeout="10s")``
    """
    _run(dsn, "upgrade", revision, lock_timeout)


def downgrade(dsn: db.Dsn, revision: str, *, lock_timeout: str | None = None) -> None:
    """Downgrade the database's pgjobs schema to ``revision`` (``base`` removes it)."""
    _run(dsn, "downgrade", revision, lock_timeout)


def sql(revision_range: str, *, downgrade: bool = False, lock_timeout: str | None = None) -> str:
    """The DDL of ``revision_range`` (e.g. ``head`` or ``0001:head``), for a reviewed deploy."""
    out = io.StringIO()
    config = _config(out)
    _lock_timeout(config, lock_timeout)
    if downgrade:
        command.downgrade(config, revision_range, sql=True)
    else:
        command.upgrade(config, revision_range, sql=True)
    return out.getvalue()


def current(dsn: db.Dsn) -> str | None:
    """The database's pgjobs revision, or None when pgjobs was never migrated there."""
    engine = db.sqlalchemy_engine(dsn)
    try:
        with db.translate_errors(dsn), engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()
