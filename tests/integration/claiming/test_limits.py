"""Limits at the door: every value that could not be stored, claimed, settled or shown again is
refused at enqueue (API and CLI) with a pgjobs error naming the field and the limit, and nothing
is written; values at the limits go all the way through a worker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from pgjobs import App, ConfigurationError, InvalidPayload, JobSpec, submission
from pgjobs.enqueue import MAX_PAYLOAD_DEPTH
from tests.support.factories import counts, work
from tests.support.helpers import assert_one_home, assert_one_line_error, run

NOTHING = {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}
PLUS_14 = timezone(timedelta(hours=14))
MINUS_14 = timezone(timedelta(hours=-14))


def nested(levels: int) -> dict[str, Any]:
    """A payload whose objects nest ``levels`` deep (the payload itself is level 1)."""
    payload: dict[str, Any] = {}
    for _ in range(levels - 1):
        payload = {"a": payload}
    return payload


REFUSED = [
    pytest.param(
        {"run_at": datetime(1, 1, 1, tzinfo=PLUS_14)}, ConfigurationError, "run_at", id="bc-run-at"
    ),
    pytest.param(
        {"expires_at": datetime(9999, 12, 31, 23, tzinfo=MINUS_14)},
        ConfigurationError,
        "expires_at",
        id="year-10000-expires-at",
    ),
    pytest.param({"expires_in": 1e300}, ConfigurationError, "expires_in", id="huge-expires-in"),
    pytest.param({"run_in": 1e300}, ConfigurationError, "run_in", id="huge-run-in"),
    pytest.param(
        {"run_in": timedelta.max}, ConfigurationError, "run_in", id="huge-timedelta-run-in"
    ),
    pytest.param({"max_attempts": 2**31}, ConfigurationError, "max_attempts", id="int4-attempts"),
    pytest.param({"queue": "q\x1b[2J"}, ConfigurationError, "queue", id="escape-in-queue"),
    pytest.param({"queue": "q\ud800"}, ConfigurationError, "queue", id="surrogate-in-queue"),
    pytest.param(
        {"idempotency_key": "k" * (submission.MAX_KEY_BYTES + 1)},
        ConfigurationError,
        "idempotency_key",
        id="long-key",
    ),
    pytest.param(
        {"idempotency_key": "é" * (submission.MAX_KEY_BYTES // 2 + 1)},
        ConfigurationError,
        "bytes",
        id="long-key-in-bytes",
    ),
    pytest.param(
        {"idempotency_key": "k\udcff"}, ConfigurationError, "surrogate", id="surrogate-key"
    ),
    pytest.param({"idempotency_key": "k\x00"}, ConfigurationError, "NUL", id="nul-key"),
    pytest.param({"payload": {"s": "\ud800"}}, InvalidPayload, "surrogate", id="surrogate-value"),
    pytest.param({"payload": {"\udfff": 1}}, InvalidPayload, "surrogate", id="surrogate-name"),
    pytest.param(
        {"payload": nested(100_000)}, InvalidPayload, "levels deep", id="100k-deep-payload"
    ),
    pytest.param(
        {"payload": nested(MAX_PAYLOAD_DEPTH + 1)}, InvalidPayload, "levels deep", id="101-deep"
    ),
]


@pytest.mark.parametrize(("options", "error", "words"), REFUSED)
def test_values_beyond_the_limits_are_refused_and_nothing_is_written(
    make_app: Callable[..., App], conn, options, error, words
):
    app = make_app()
    fields = {"payload": options.pop("payload", None), **options}
    with pytest.raises(error, match=words) as raised:
        app.enqueue("t", **fields)
    assert "\n" not in str(raised.value)
    with pytest.raises(error, match=r"job #1: .*" + words):
        app.enqueue_many([JobSpec("t"), JobSpec("t", **fields)])
    assert counts(conn) == NOTHING


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("t" * (submission.MAX_NAME_LENGTH + 1), id="long"),
        pytest.param("t" * 5000, id="five-thousand"),
        pytest.param("t\x1b]0;owned\x07", id="escape"),
        pytest.param("t\ud800", id="surrogate"),
        pytest.param("t\x00", id="nul"),
    ],
)
def test_task_names_beyond_the_limits_are_refused(make_app: Callable[..., App], conn, name):
    app = make_app()
    with pytest.raises(ConfigurationError, match="task name"):
        app.enqueue(name)
    with pytest.raises(ConfigurationError, match="task name"):
        app.task(name=name)(lambda: None)
    assert counts(conn) == NOTHING


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"lease": float("inf")}, id="infinite-lease"),
        pytest.param({"lease": float("nan")}, id="nan-lease"),
        pytest.param({"lease": 1e300}, id="huge-lease"),
        pytest.param({"retry_base": float("nan")}, id="nan-retry-base"),
        pytest.param({"retry_cap": float("inf")}, id="infinite-retry-cap"),
        pytest.param({"max_attempts": 10**12}, id="huge-max-attempts"),
        pytest.param({"queue": "q" * 300}, id="long-queue"),
    ],
)
def test_task_declarations_beyond_the_limits_are_refused(make_app: Callable[..., App], options):
    app = make_app()
    with pytest.raises(ConfigurationError):
        app.task(name="t", **options)(lambda: None)
    assert "t" not in app.tasks


def test_values_at_the_limits_go_through_a_worker(make_app: Callable[..., App], conn):
    app = make_app()
    name = "é" * submission.MAX_NAME_LENGTH
    queue = "q" * submission.MAX_NAME_LENGTH
    seen: list[dict[str, Any]] = []

    @app.task(
        name=name, queue=queue, lease=submission.MAX_SECONDS, retry_cap=submission.MAX_SECONDS
    )
    def handler(**payload: Any) -> None:
        seen.append(payload)

    deep = nested(MAX_PAYLOAD_DEPTH)
    ids = [
        app.enqueue(name, deep, idempotency_key="k" * submission.MAX_KEY_BYTES),
        app.enqueue(name, {"emoji": "\U0001f600", "pair": "\ud83d\ude00"}),
        app.enqueue(name, max_attempts=submission.MAX_ATTEMPTS_LIMIT),
        app.enqueue(name, expires_at=datetime(9999, 12, 31, 23, 59, tzinfo=UTC)),
    ]
    # Scheduled at the edges of the range: stored, and loadable again.
    early = app.enqueue(name, run_at=datetime(1, 1, 1, 14, tzinfo=PLUS_14), max_attempts=1)
    late = app.enqueue(name, run_at=datetime(9999, 12, 31, 9, tzinfo=MINUS_14))
    assert app.job(late).run_at == datetime(9999, 12, 31, 23, tzinfo=UTC)
    assert app.job(early).run_at == datetime(1, 1, 1, tzinfo=UTC)
    app.cancel(late)  # a burst worker waits for scheduled jobs
    assert work(app, queues=[queue]) == 0
    assert deep in seen and {"emoji": "\U0001f600", "pair": "\U0001f600"} in seen
    where = assert_one_home(conn, [*ids, early, late])
    assert [where[i] for i in ids] == ["archived_jobs"] * 4
    assert where[early] == where[late] == "archived_jobs"


CLI_REFUSED = [
    pytest.param(["--expires-in", "1e300"], ["--expires-in", "century"], id="huge-expires-in"),
    pytest.param(["--delay", "inf"], ["--delay", "finite"], id="infinite-delay"),
    pytest.param(["--delay", "nan"], ["--delay"], id="nan-delay"),
    pytest.param(["--max-attempts", str(2**40)], ["max_attempts"], id="huge-max-attempts"),
    pytest.param(["--run-at", "0001-01-01T00:00:00+14:00"], ["--run-at", "1..9999"], id="bc"),
    pytest.param(
        ["--expires-at", "9999-12-31T23:00:00-14:00"], ["--expires-at", "1..9999"], id="y10000"
    ),
    pytest.param(["--queue", "q" * 201], ["queue", "200"], id="long-queue"),
    pytest.param(["--idempotency-key", "k" * 600], ["idempotency_key", "512"], id="long-key"),
    pytest.param(["--payload", '{"s": "\\ud800"}'], ["surrogate"], id="surrogate-payload"),
    pytest.param(["--payload", "[" * 100_000], ["--payload", "deep"], id="100k-deep-json"),
    pytest.param(["--payload", '{"a":' * 200 + "1" + "}" * 200], ["levels"], id="200-deep"),
]


@pytest.mark.parametrize(("extra", "words"), CLI_REFUSED)
def test_cli_refuses_values_beyond_the_limits_in_one_line_with_exit_2(
    capsys, dsn, conn, extra, words
):
    code, _, err = run(capsys, "enqueue", "t", *extra, "--dsn", dsn.url)
    assert_one_line_error(code, err, *words)
    assert code == 2
    assert counts(conn) == NOTHING


def test_cli_refuses_bad_task_names_and_payload_files(capsys, dsn, conn, tmp_path: Path):
    for name in ["t" * 5000, "t\x1b[31m"]:
        code, _, err = run(capsys, "enqueue", name, "--dsn", dsn.url)
        assert_one_line_error(code, err, "task name")
        assert code == 2 and "\x1b" not in err
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"name": "caf\xe9"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    for path, words in [(latin1, "UTF-8"), (deep, "deep")]:
        code, _, err = run(capsys, "enqueue", "t", "--payload", f"@{path}", "--dsn", dsn.url)
        assert_one_line_error(code, err, words)
        assert code == 2
    assert counts(conn) == NOTHING


def test_offsets_finer_than_a_second_are_stored_as_the_same_instant(make_app, conn):
    app = make_app()
    odd = timezone(timedelta(hours=5, seconds=1, microseconds=7))
    at = datetime(2030, 1, 1, 12, tzinfo=odd)
    job_id = app.enqueue("t", run_at=at, expires_at=at + timedelta(days=1))
    job = app.job(job_id)
    assert (job.run_at, job.expires_at) == (at, at + timedelta(days=1))
