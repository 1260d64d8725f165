"""The CLI never prints a traceback: what used to escape as one (a bad revision target, a schema
newer than the code, a DSN with a bad port, an `--app` module that fails to import, a role that
cannot read the version table, any bug) is one line on stderr and an exit code; `--debug` (or
PGJOBS_DEBUG=1) shows the traceback of an unexpected error."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from psycopg import sql

from pgjobs import migrate
from pgjobs.errors import SchemaMissing
from tests.support.helpers import assert_one_line_error, run
from tests.support.urls import url_with

APP = "tests.integration.cli_app:app"

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.mark.parametrize(
    "argv",
    [
        ["migrate", "--revision", "zzz"],
        ["migrate", "--downgrade", "zzz"],
        ["migrate", "--sql", "--revision", "zzz"],
        ["migrate", "--sql", "--downgrade", "zzz"],
    ],
)
def test_an_unknown_revision_target_is_bad_input(capsys, database, argv):
    code, _, err = run(capsys, *argv, "--dsn", database.url)
    assert code == 2
    assert_one_line_error(code, err, "revision", "zzz", "0001 to")


def test_a_schema_newer_than_this_pgjobs_says_to_upgrade_pgjobs(capsys, create_database):
    fresh = create_database()
    migrate.upgrade(fresh)
    with psycopg.connect(fresh.url, autocommit=True) as conn:
        conn.execute("UPDATE pgjobs_alembic_version SET version_num = '9999'")
    for argv in (["migrate"], ["migrate", "--downgrade", "base"], ["work", "--app", APP]):
        code, out, err = run(capsys, *argv, "--dsn", fresh.url)
        assert code == 1, (argv, out)
        assert_one_line_error(code, err, "this pgjobs is older than the database schema", "9999")
        assert "upgrade pgjobs" in err and "run `pgjobs migrate`" not in err
    with pytest.raises(SchemaMissing, match="older than the database schema"):
        migrate.require_head(fresh)


@pytest.mark.parametrize("port", ["abc", "99999", "0"])
@pytest.mark.parametrize("argv", [["migrate"], ["migrate", "--current"], ["stats"]])
def test_a_dsn_with_a_bad_port_is_bad_input(capsys, port, argv):
    code, _, err = run(capsys, *argv, "--dsn", f"postgresql://postgres@127.0.0.1:{port}/x")
    assert code == 2
    assert_one_line_error(code, err, "port", port)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\ndef broken(:\n", "SyntaxError"),
        (
            "def load():\n    raise RuntimeError('no config')\n\n\nload()\n",
            "RuntimeError: no config",
        ),
        ("import pgjobs_no_such_module_anywhere\n", "pgjobs_no_such_module_anywhere"),
    ],
)
def test_an_app_module_that_fails_to_import_is_one_line_with_where(
    capsys, dsn, tmp_path, monkeypatch, source, expected
):
    name = f"hostile_app_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for argv in (["work"], ["enqueue", "t"]):
        code, _, err = run(capsys, *argv, "--app", f"{name}:app", "--dsn", dsn.url)
        assert code == 2
        assert_one_line_error(code, err, "--app", expected)
        if expected != "pgjobs_no_such_module_anywhere":
            assert f"{name}.py:" in err  # where it failed: file and line


@pytest.fixture
def reader_without_version_table(database):
    role = f"pgjobs_noread_{secrets.token_hex(4)}"
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT ON queued_jobs TO {}").format(sql.Identifier(role)))
    yield url_with(database.url, user=role)
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize(
    "argv", [["migrate"], ["migrate", "--current"], ["migrate", "--check"], ["work", "--app", APP]]
)
def test_a_role_that_cannot_read_the_version_table_gets_one_line(
    capsys, reader_without_version_table, argv
):
    code, _, err = run(capsys, *argv, "--dsn", reader_without_version_table)
    assert code == 1
    assert_one_line_error(code, err, "permission denied", "pgjobs_alembic_version")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no")


@pytest.mark.parametrize("exception", [RuntimeError("a bug"), KeyError("k"), Unprintable()])
def test_any_unexpected_error_is_one_line_and_exit_1(capsys, monkeypatch, exception):
    def broken(*args, **kwargs):
        raise exception

    monkeypatch.setattr(migrate, "sql", broken)
    monkeypatch.delenv("PGJOBS_DEBUG", raising=False)
    code, _, err = run(capsys, "migrate", "--sql")
    assert_one_line_error(code, err, "unexpected error", type(exception).__name__, "--debug")
    assert code == 1


def test_debug_shows_the_traceback_of_an_unexpected_error(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(migrate, "sql", broken)
    monkeypatch.delenv("PGJOBS_DEBUG", raising=False)
    code, _, err = run(capsys, "--debug", "migrate", "--sql")
    assert code == 1
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.splitlines()[-1] == "pgjobs: error: unexpected error: RuntimeError: a bug"

    monkeypatch.setenv("PGJOBS_DEBUG", "1")
    code, _, err = run(capsys, "migrate", "--sql")
    assert code == 1 and "Traceback (most recent call last)" in err

    monkeypatch.delenv("PGJOBS_DEBUG")
    code, _, err = run(capsys, "migrate", "--sql")  # --debug does not outlive its run
    assert code == 1 and "Traceback" not in err


@pytest.mark.parametrize("job_id", ["99999999999999999999", "9223372036854775808", "0"])
@pytest.mark.parametrize(
    "command",
    [
        ["job", "show"],
        ["cancel"],
        ["replay"],
        ["dead", "show"],
        ["dead", "redrive"],
        ["dead", "purge"],
    ],
)
def test_a_job_id_outside_bigint_is_bad_input(capsys, database, command, job_id):
    code, _, err = run(capsys, *command, job_id, "--dsn", database.url)
    assert code == 2, err
    assert_one_line_error(code, err, job_id, "range")
