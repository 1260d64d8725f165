"""The pooler mode without a database: where it comes from (``PGJOBS_POOLER``, ``App(pooler=...)``,
``--pooler``), what it turns off on connections, where workers LISTEN, and the one-line errors of
a bad value."""

from __future__ import annotations

import pytest

from pgjobs import App
from pgjobs.db import connections
from pgjobs.db.dsn import Dsn, normalize_dsn
from pgjobs.db.pooler import Pooler, parse_pooler
from pgjobs.errors import ConfigurationError
from tests.support.helpers import assert_one_line_error, run

URL = "postgresql://app@pgbouncer:6432/app"
DIRECT = "postgresql://app@db:5432/app"


@pytest.fixture(autouse=True)
def no_pooler_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGJOBS_POOLER", raising=False)
    monkeypatch.delenv("PGJOBS_LISTEN_DSN", raising=False)


def test_the_mode_comes_from_the_environment_unless_the_app_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert normalize_dsn(URL, "--dsn").pooler is Pooler.SESSION
    monkeypatch.setenv("PGJOBS_POOLER", "Transaction")
    assert normalize_dsn(URL, "--dsn").transaction_pooled
    assert App(URL).dsn.transaction_pooled
    assert not App(URL, pooler="session").dsn.transaction_pooled
    monkeypatch.setenv("PGJOBS_POOLER", "session")
    app = App(URL, pooler="transaction")
    assert app.dsn.transaction_pooled
    # --pooler (bind) wins over App(pooler=...); a DSN bound later keeps the app's mode.
    app.bind(normalize_dsn(URL, "--dsn"), pooler=Pooler.SESSION)
    assert not app.dsn.transaction_pooled
    moved = App(URL, pooler="transaction")
    moved.bind(DIRECT)
    assert moved.dsn.url == DIRECT and moved.dsn.transaction_pooled


@pytest.mark.parametrize("where", ["env", "app", "parse"])
def test_a_bad_mode_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    with pytest.raises(ConfigurationError, match="choose session or transaction") as raised:
        if where == "env":
            monkeypatch.setenv("PGJOBS_POOLER", "statement")
            normalize_dsn(URL, "--dsn")
        elif where == "app":
            App(URL, pooler="statement")
        else:
            parse_pooler("statement", "--pooler")
    assert raised.value.field == "pooler"


def test_no_prepared_statement_through_a_transaction_pooler() -> None:
    session = Dsn(URL, "test", Pooler.SESSION)
    pooled = Dsn(URL, "test", Pooler.TRANSACTION)
    assert "prepare_threshold" not in connections._connect_kwargs(session)
    assert connections._connect_kwargs(pooled)["prepare_threshold"] is None


def test_workers_listen_on_the_listen_dsn_or_poll() -> None:
    assert App(URL).listen_dsn == App(URL).dsn  # session mode: the database itself
    assert App(URL, pooler="transaction").listen_dsn is None  # polls
    listen = App(URL, pooler="transaction", listen_dsn=DIRECT).listen_dsn
    assert listen is not None and listen.url == DIRECT and not listen.transaction_pooled


def test_listen_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGJOBS_LISTEN_DSN", DIRECT)
    listen = App(URL, pooler="transaction").listen_dsn
    assert listen is not None and listen.url == DIRECT


def test_work_refuses_a_bad_pooler_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "work", "--app", "tests.integration.cli_app:app", "--pooler", "x")
    assert_one_line_error(code, err, "--pooler", "session or transaction")
