"""Migrations: up, down, up again on a fresh database, and no drift between the migrated schema
and ``pgjobs.schema``."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pgjobs import App, migrate
from pgjobs.schema import metadata
from tests.support.helpers import REPO

ALEMBIC = Path(sys.executable).with_name("alembic")
PGJOBS_TABLES = {"queued_jobs", "archived_jobs", "dead_letter"}


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """The filter of pgjobs/migrations/env.py: only pgjobs' own tables count (env.py cannot be
    imported outside an Alembic run)."""
    if type_ == "table":
        return name in metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in metadata.tables


def drift(dsn) -> list[Any]:
    """What Alembic's autogenerate would change to make the database match ``schema.py``."""
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"include_object": include_object, "compare_type": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def tables(dsn) -> set[str]:
    with psycopg.connect(dsn.url) as c:
        rows = c.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_then_no_drift_then_downgrade_then_upgrade_again(create_database):
    fresh = create_database()
    assert migrate.current(fresh) is None

    migrate.upgrade(fresh)
    assert migrate.current(fresh) == migrate.head()
    assert tables(fresh) >= PGJOBS_TABLES
    assert drift(fresh) == []

    migrate.downgrade(fresh, "base")
    assert tables(fresh) & PGJOBS_TABLES == set()
    assert migrate.current(fresh) is None

    migrate.upgrade(fresh)
    assert migrate.current(fresh) == migrate.head()
    assert drift(fresh) == []
    with App(fresh.url, check_task_names=False) as app:
        job_id = app.enqueue("t", {"after": "re-upgrade"})
    assert isinstance(job_id, int)


def test_every_revision_downgrades_and_upgrades_step_by_step(create_database):
    fresh = create_database()
    migrate.upgrade(fresh)
    revisions = []
    while (now := migrate.current(fresh)) is not None:
        revisions.append(now)
        migrate.downgrade(fresh, "-1")
    assert revisions[0] == migrate.head()
    assert tables(fresh) & PGJOBS_TABLES == set()
    for revision in reversed(revisions):
        migrate.upgrade(fresh, revision)
        assert migrate.current(fresh) == revision
    assert drift(fresh) == []


def test_drift_check_sees_a_changed_schema_but_not_the_applications_tables(create_database):
    fresh = create_database()
    migrate.upgrade(fresh)
    with psycopg.connect(fresh.url, autocommit=True) as c:
        c.execute("CREATE TABLE app_users (id int PRIMARY KEY, email text)")
        assert drift(fresh) == [], "an application's own table is not pgjobs' drift"
        c.execute("ALTER TABLE queued_jobs ADD COLUMN surprise int")
        c.execute("DROP INDEX ix_dead_letter_failed_at")
    found = drift(fresh)
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in found}
    assert "remove_column" in kinds
    assert "add_index" in kinds


def test_upgrade_keeps_an_applications_tables(create_database):
    fresh = create_database()
    with psycopg.connect(fresh.url, autocommit=True) as c:
        c.execute("CREATE TABLE app_users (id int PRIMARY KEY)")
        c.execute("INSERT INTO app_users VALUES (1)")
    migrate.upgrade(fresh)
    migrate.downgrade(fresh, "base")
    with psycopg.connect(fresh.url) as c:
        assert c.execute("SELECT count(*) FROM app_users").fetchone() == (1,)


def test_offline_sql_for_a_reviewed_deploy():
    ddl = migrate.sql("head")
    assert "CREATE TABLE queued_jobs" in ddl
    assert "CREATE TABLE archived_jobs" in ddl
    assert "CREATE TABLE dead_letter" in ddl
    assert "pgjobs_alembic_version" in ddl
    down = migrate.sql(f"{migrate.head()}:base", downgrade=True)
    assert "DROP TABLE queued_jobs" in down


@pytest.fixture
def alembic_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    return env


def _alembic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ALEMBIC), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_alembic_command_line_upgrade_and_check(create_database, alembic_env):
    fresh = create_database()
    alembic_env["PGJOBS_DATABASE_URL"] = fresh.url

    upgraded = _alembic("upgrade", "head", env=alembic_env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert migrate.current(fresh) == migrate.head()

    checked = _alembic("check", env=alembic_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr

    with psycopg.connect(fresh.url, autocommit=True) as c:
        c.execute("ALTER TABLE dead_letter ADD COLUMN surprise int")
    drifted = _alembic("check", env=alembic_env)
    assert drifted.returncode != 0
    assert "surprise" in drifted.stdout + drifted.stderr


def test_the_head_workers_check_is_the_newest_migration():
    """Workers compare the database with ``migrate.HEAD`` without loading Alembic; a new
    migration without a new HEAD would let workers run on a schema one revision behind."""
    assert migrate.migrations_head() == migrate.HEAD


def test_the_server_is_a_supported_major(database):
    """pgjobs needs PostgreSQL 14 or newer (docs/getting-started.md, "Supported PostgreSQL
    versions"). A run for
    one major (`make test-pg14`, `make test-pg18`) names it in $PGJOBS_TEST_PG_MAJOR, so that it
    cannot pass on another server by mistake."""
    with psycopg.connect(database.url) as c:
        version = int(c.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
    assert version >= 140000
    expected = os.environ.get("PGJOBS_TEST_PG_MAJOR")
    if expected:
        assert version // 10000 == int(expected), f"the tests ran on {version}, not {expected}"


def test_the_manuals_include_object_keeps_autogenerate_off_pgjobs_tables(create_database):
    """docs/snippets/alembic_include_object.py, which Deploy and upgrade shows: an application's
    autogenerate, with that filter and only its own metadata, proposes nothing about pgjobs'
    tables, their partitions or their version table, and still sees the application's tables."""
    snippet = runpy.run_path(str(REPO / "docs" / "snippets" / "alembic_include_object.py"))
    fresh = create_database()
    migrate.upgrade(fresh)
    with psycopg.connect(fresh.url, autocommit=True) as c:
        c.execute("CREATE TABLE app_users (id int PRIMARY KEY)")
    app_metadata = sqlalchemy.MetaData()
    sqlalchemy.Table(
        "app_users", app_metadata, sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True)
    )
    engine = sqlalchemy.create_engine(fresh.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.connect() as connection:
            opts = {"include_object": snippet["include_object"]}
            assert (
                list(
                    compare_metadata(
                        MigrationContext.configure(connection, opts=opts), app_metadata
                    )
                )
                == []
            )
            unfiltered = compare_metadata(MigrationContext.configure(connection), app_metadata)
            assert {d[1].name for d in unfiltered if d[0] == "remove_table"} >= PGJOBS_TABLES
    finally:
        engine.dispose()
