"""`pgjobs migrate`: Alembic commands on pgjobs' own migrations, wherever they are installed."""

from __future__ import annotations

import io
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from pgjobs import db

VERSION_TABLE = "pgjobs_alembic_version"


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


def _run(dsn: db.Dsn, action: str, revision: str) -> None:
    config = _config()
    engine = db.sqlalchemy_engine(dsn)
    try:
        with db.translate_errors(dsn), engine.begin() as connection:
            config.attributes["connection"] = connection
            getattr(command, action)(config, revision)
    finally:
        engine.dispose()


def upgrade(dsn: db.Dsn, revision: str = "head") -> None:
    """Upgrade the database's pgjobs schema to ``revision``.

    Example: ``upgrade(resolve_dsn(None))``
    """
    _run(dsn, "upgrade", revision)


def downgrade(dsn: db.Dsn, revision: str) -> None:
    """Downgrade the database's pgjobs schema to ``revision`` (``base`` removes it)."""
    _run(dsn, "downgrade", revision)


def sql(revision_range: str, *, downgrade: bool = False) -> str:
    """The DDL of ``revision_range`` (e.g. ``head`` or ``0001:head``), for a reviewed deploy."""
    out = io.StringIO()
    config = _config(out)
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
