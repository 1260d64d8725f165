"""Passwords never reach output: every command's title, summary and error with a DSN whose
password holds the characters URL parsers trip on (``# ? / @ % :``), written percent-encoded
(valid) or raw (invalid: libpq echoes pieces of it in its messages)."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from pgjobs import App, ConfigurationError, DatabaseUnavailable
from pgjobs.db.dsn import Dsn
from tests.support.helpers import assert_one_line_error, run
from tests.support.urls import url_with

PASSWORDS = ["p#?/@%:x", "sec%ret", "p@ss:wqrd", "zq x7w k"]

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def leaks(text: str, password: str) -> list[str]:
    """The pieces (4 characters or more) of ``password``, raw or percent-encoded, in ``text``."""
    found = []
    for secret in {password, quote(password, safe="")}:
        for size in range(4, len(secret) + 1):
            found += [secret[i : i + size] for i in range(len(secret) - size + 1)]
    return sorted({piece for piece in found if piece in text})


def with_password(dsn: Dsn, password: str, *, encoded: bool, port: int | None = None) -> str:
    """The test database's URL with ``password``; with ``port``, a URL of the same shape on
    127.0.0.1 at that port instead, where nothing listens."""
    secret = quote(password, safe="") if encoded else password
    if port is not None:
        return f"postgresql://postgres:{secret}@127.0.0.1:{port}/pgjobs"
    return url_with(dsn.url, user="postgres", raw_password=secret)


@pytest.mark.parametrize("password", PASSWORDS)
def test_migrate_and_stats_print_the_dsn_without_its_password(capsys, create_database, password):
    fresh = create_database()
    url = with_password(fresh, password, encoded=True)
    for argv in (["migrate"], ["migrate"], ["migrate", "--current"], ["stats"]):
        code, out, err = run(capsys, *argv, "--dsn", url)
        assert code == 0, err
        assert leaks(out + err, password) == [], (argv, out, err)
    assert "postgres:***@" in out  # the stats title names the database, redacted


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "argv",
    [
        ["migrate"],
        ["stats"],
        ["dead", "list"],
        ["job", "show", "1"],
        ["prune", "--older-than", "30d"],
    ],
)
def test_a_dsn_libpq_cannot_read_is_bad_input_and_its_password_is_not_echoed(
    capsys, database, password, argv
):
    url = with_password(database, password, encoded=False)
    code, out, err = run(capsys, *argv, "--dsn", url)
    assert code == 2, (out, err)
    assert_one_line_error(code, err, "--dsn")
    assert leaks(out + err, password) == [], err


@pytest.mark.parametrize("password", PASSWORDS)
def test_an_unreachable_database_is_named_without_its_password(capsys, database, password):
    url = with_password(database, password, encoded=True, port=1)
    code, out, err = run(capsys, "stats", "--dsn", url)
    assert_one_line_error(code, err, "postgres:***@127.0.0.1:1/")
    assert leaks(out + err, password) == [], err


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_library_refuses_an_unreadable_dsn_without_echoing_it(database, password):
    with pytest.raises(ConfigurationError) as refused:
        App(with_password(database, password, encoded=False)).enqueue("t")
    assert leaks(str(refused.value), password) == [], refused.value
    with pytest.raises(DatabaseUnavailable) as unreachable:
        App(with_password(database, password, encoded=True, port=1)).enqueue("t")
    assert leaks(str(unreachable.value), password) == [], unreachable.value
