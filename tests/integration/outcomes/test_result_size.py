"""A result larger than the worker's bound (``WorkerConfig.max_result_bytes``) is not stored:
the job succeeds, and its result is a short note saying why, so that one huge result cannot slow
the round trip that carries every other job's outcome."""

from __future__ import annotations

import json

import pytest

from pgjobs import App
from pgjobs.errors import ConfigurationError
from pgjobs.text import SHOWN_BYTES
from pgjobs.worker import WorkerConfig
from tests.support.factories import insert_dead_raw, work
from tests.support.helpers import assert_one_home, run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

MIB = 1024 * 1024


def test_a_result_beyond_the_bound_is_a_note_and_the_job_succeeds(make_app, conn):
    app: App = make_app()

    @app.task(name="t.big")
    def big(n: int) -> dict[str, str]:
        return {"blob": "x" * n}

    huge = app.enqueue("t.big", {"n": 5 * MIB})
    fits = app.enqueue("t.big", {"n": 1000})

    assert work(app, max_result_bytes=MIB) == 0

    assert assert_one_home(conn, [huge, fits]) == dict.fromkeys([huge, fits], "archived_jobs")
    statuses = "SELECT status FROM archived_jobs WHERE id = %s"
    assert scalar(conn, statuses, [huge]) == scalar(conn, statuses, [fits]) == "succeeded"
    note = scalar(conn, "SELECT result FROM archived_jobs WHERE id = %s", [huge])
    assert isinstance(note, str) and note.startswith("result not stored")
    assert f"more than the {MIB:,}" in note and len(note) < 200
    assert scalar(conn, "SELECT result FROM archived_jobs WHERE id = %s", [fits]) == {
        "blob": "x" * 1000
    }


@pytest.mark.parametrize("bound", [0, 1023, -1, 1.5])
def test_a_bound_too_small_for_the_note_is_refused(bound):
    with pytest.raises(ConfigurationError, match="max_result_bytes"):
        WorkerConfig(max_result_bytes=bound)


def test_the_cli_shows_a_bounded_part_of_a_huge_value_and_json_the_whole(dsn, conn, capsys):
    payload = {"blob": "é" * MIB}  # 2 MB of UTF-8
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 300_000
    job_id = insert_dead_raw(conn, payload=json.dumps(payload), traceback=trace)

    for command in (["job", "show"], ["dead", "show"]):
        code, out, err = run(capsys, *command, str(job_id), "--dsn", dsn.url)
        assert (code, err) == (0, "")
        # Two values clipped, the traceback's lines indented (2 bytes a line of 8 here), the rest.
        assert len(out.encode()) < 2 * SHOWN_BYTES * 5 // 4 + 4096
        assert out.count("bytes more: the API") == 2
    code, out, _ = run(capsys, "job", "show", str(job_id), "--json", "--dsn", dsn.url)
    whole = json.loads(out)
    assert whole["payload"] == payload and whole["traceback"] == trace


def test_the_bound_defaults_to_the_environment(monkeypatch):
    assert WorkerConfig().max_result_bytes == MIB
    monkeypatch.setenv("PGJOBS_MAX_RESULT_BYTES", "4096")
    assert WorkerConfig().max_result_bytes == 4096
    assert WorkerConfig(max_result_bytes=2048).max_result_bytes == 2048
    monkeypatch.setenv("PGJOBS_MAX_RESULT_BYTES", "1MB")
    with pytest.raises(ConfigurationError, match="PGJOBS_MAX_RESULT_BYTES"):
        WorkerConfig()
