"""Hostile input: names and payloads never reach SQL as text, passwords never reach output,
and very large payloads either work or are refused whole."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pgjobs import App, InvalidPayload, JobSpec
from pgjobs.cli import main
from pgjobs.enqueue import checks
from tests.support.factories import counts, work
from tests.support.helpers import assert_one_home
from tests.support.urls import url_with

NASTY = "x'); DROP TABLE queued_jobs; --"


def test_sql_in_names_and_payloads_is_data(make_app: Callable[..., App], conn):
    app = make_app()
    seen: list[str] = []

    @app.task(name=NASTY, queue=NASTY)
    def nasty(text: str) -> str:
        seen.append(text)
        return text

    job_id = app.enqueue(NASTY, {"text": NASTY})
    ids = app.enqueue_many([JobSpec(NASTY, {"text": f"{NASTY}{n}"}) for n in range(3)])
    assert work(app) == 0
    assert sorted(seen) == sorted([NASTY, *(f"{NASTY}{n}" for n in range(3))])
    where = assert_one_home(conn, [job_id, *ids])
    assert set(where.values()) == {"archived_jobs"}
    queue, task = conn.execute(
        "SELECT queue, task FROM archived_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert queue == task == NASTY


def test_password_never_printed_on_connection_errors(capsys):
    secret = "s3cr3t-pw"
    code = main(["stats", "--dsn", f"postgresql://postgres:{secret}@127.0.0.1:1/nowhere"])
    out, err = capsys.readouterr()
    assert code != 0
    assert err.startswith("pgjobs: error:") and err.count("\n") == 1
    assert secret not in out + err
    assert "***" in err


def test_password_never_printed_by_commands(dsn, capsys):
    secret = "s3cr3t-pw"
    url = url_with(dsn.url, password=secret)  # trust auth: the password is sent but not needed
    assert main(["migrate", "--dsn", url]) == 0
    assert main(["enqueue", "cli.add", "--payload", '{"a": 1, "b": 2}', "--dsn", url]) == 0
    assert main(["stats", "--dsn", url]) == 0
    assert main(["stats", "--json", "--dsn", url]) == 0
    assert main(["work", "--app", "tests.integration.cli_app:app", "--burst", "--dsn", url]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert "***" in out


def test_ten_megabyte_payload_round_trips(make_app: Callable[..., App], conn):
    app = make_app()
    blob = "x" * (10 * 1024 * 1024)
    lengths: list[int] = []

    @app.task(name="big")
    def big(blob: str) -> None:
        lengths.append(len(blob))

    job_id = app.enqueue("big", {"blob": blob})
    assert work(app) == 0
    assert lengths == [len(blob)]
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_payload_over_the_limit_is_refused_whole(make_app, conn, monkeypatch):
    monkeypatch.setattr(checks, "MAX_PAYLOAD_BYTES", 1024)
    app = make_app(check_task_names=False)
    specs = [JobSpec("t", {"n": 1}), JobSpec("t", {"blob": "y" * 2000})]
    with pytest.raises(InvalidPayload, match="limit is 1,024"):
        app.enqueue_many(specs)
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}
