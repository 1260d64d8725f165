"""`pgjobs producer` as a real process: it enqueues exactly --count jobs at --every, stops cleanly
on SIGTERM with the final count, and refuses bad input with one line and exit 2, enqueueing
nothing."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from tests.support.helpers import (
    assert_one_line_error,
    count,
    pgjobs_process,
    run,
    run_pgjobs,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def test_count_enqueues_exactly_that_many(conn: psycopg.Connection[Any], subprocess_env):
    done = run_pgjobs(
        subprocess_env,
        "producer",
        "demo.ping",
        "--payload",
        '{"n": 1}',
        "--every",
        "0.1s",
        "--count",
        "3",
        "--queue",
        "demo",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4, lines  # one per batch, then the total
    assert "enqueued 1 job(s) of demo.ping" in lines[0] and "3 in all" in lines[2]
    assert lines[-1] == "produced 3 job(s) of demo.ping"
    rows = conn.execute("SELECT task, queue, payload FROM queued_jobs").fetchall()
    assert rows == [("demo.ping", "demo", {"n": 1})] * 3


def test_batches_and_a_count_that_does_not_divide(conn: psycopg.Connection[Any], subprocess_env):
    done = run_pgjobs(
        subprocess_env,
        "producer",
        "demo.ping",
        "--every",
        "50ms",
        "--count",
        "7",
        "--batch",
        "3",
        "--quiet",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["produced 7 job(s) of demo.ping"]
    assert count(conn, "queued_jobs") == 7


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_cleanly(conn: psycopg.Connection[Any], subprocess_env, signum):
    with pgjobs_process(subprocess_env, "producer", "demo.ping", "--every", "0.2s") as proc:
        wait_until(lambda: count(conn, "queued_jobs") >= 2, timeout=30, procs=[proc])
        code = proc.stop(signum, timeout=30)
        assert code == 0, proc.describe()
        produced = count(conn, "queued_jobs")
        assert proc.out().splitlines()[-1] == f"produced {produced} job(s) of demo.ping"
        assert proc.err() == ""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--every", "soon"], ["--every", "250ms"]),
        (["--every", "0s"], ["--every"]),
        (["--payload", "[1, 2]"], ["--payload", "JSON object"]),
        (["--payload", "{bad"], ["--payload", "not valid JSON"]),
        (["--count", "0"], ["--count"]),
        (["--batch", "0"], ["--batch"]),
        (["--queue", "a\tb"], ["queue name"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_enqueues_nothing(
    capsys: pytest.CaptureFixture[str], conn: psycopg.Connection[Any], dsn, args, words
):
    count_option = [] if "--count" in args else ["--count", "1"]
    code, out, err = run(capsys, "producer", "demo.ping", *args, *count_option, "--dsn", dsn.url)
    assert code == 2, (out, err)
    assert_one_line_error(code, err, *words)
    assert count(conn, "queued_jobs") == 0


def test_an_unknown_task_of_the_app_is_bad_input(
    capsys: pytest.CaptureFixture[str], conn: psycopg.Connection[Any], dsn
):
    code, _, err = run(
        capsys,
        "producer",
        "no.such.task",
        "--app",
        "tests.acceptance.workload:app",
        "--count",
        "1",
        "--dsn",
        dsn.url,
    )
    assert code == 2
    assert_one_line_error(code, err, "unknown task 'no.such.task'")
    assert count(conn, "queued_jobs") == 0


def test_the_app_named_by_pgjobs_app_gives_the_queue_and_checks_the_payload(
    capsys: pytest.CaptureFixture[str],
    conn: psycopg.Connection[Any],
    dsn,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("PGJOBS_APP", "tests.integration.cli_app:app")
    argv = ("producer", "cli.shout", "--count", "2", "--dsn", dsn.url)
    code, _, err = run(capsys, *argv, "--payload", '{"text": "a", "volume": 11}')
    assert code == 2
    assert_one_line_error(code, err, "volume")
    assert count(conn, "queued_jobs") == 0
    code, _, err = run(capsys, *argv, "--payload", '{"text": "a"}')
    assert code == 0, err
    assert conn.execute("SELECT queue, count(*) FROM queued_jobs GROUP BY 1").fetchall() == [
        ("loud", 2)
    ]
