"""Generated input through the enqueue API and `pgjobs enqueue`: every submission either is
refused (a ``PgjobsError`` / one line and exit 2) with nothing written, or becomes one job that
loads again as given and that a worker claims and finishes. Never another exception, never a
partial write."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pgjobs import App, ConfigurationError, InvalidPayload, JobSpec, PgjobsError
from pgjobs.db.dsn import Dsn
from pgjobs.enqueue import MAX_PAYLOAD_DEPTH
from pgjobs.worker import Worker, WorkerConfig
from tests.support.helpers import run

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

# CI explores the same examples on every run, so that its verdict depends on the code alone; a
# developer's run explores new ones (`--hypothesis-seed` reproduces one).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Text with the characters that break things over-represented: NUL, ESC, lone surrogates, a
# non-BMP character, the halves of a surrogate pair (that may meet), quotes and backslashes.
_AWKWARD = st.sampled_from(
    [
        "\x00",
        "\x1b",
        "\n",
        "\ud800",
        "\udfff",
        "\ud83d",
        "\ude00",
        "\U0001f600",
        "é",
        "'",
        '"',
        "\\",
    ]
)
_CHARS = st.one_of(st.characters(codec=None, exclude_categories=[]), _AWKWARD)
TEXT = st.one_of(st.text(max_size=12), st.text(_CHARS, max_size=12), st.text(_CHARS, max_size=600))
PLAIN = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30)
NAMES = st.one_of(PLAIN, PLAIN, PLAIN, TEXT, st.integers(190, 210).map(lambda n: "n" * n))


def _option(usual: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
    """An option left unset half of the time, usual a third, hostile a sixth: with ten options,
    enough submissions get through whole to reach the worker."""
    return st.one_of(st.none(), st.none(), st.none(), usual, usual, hostile)


def _nested(levels: int) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for _ in range(levels - 1):
        payload = {"a": payload}
    return payload


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT)
_OBJECTS = st.dictionaries(
    TEXT,
    st.recursive(
        _SCALARS,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
        max_leaves=12,
    ),
    max_size=5,
)
_DEEP = st.integers(MAX_PAYLOAD_DEPTH - 2, MAX_PAYLOAD_DEPTH + 2).map(_nested)
PAYLOAD_OBJECTS = st.one_of(_OBJECTS, _OBJECTS, _OBJECTS, _DEEP)
PAYLOADS = st.one_of(PAYLOAD_OBJECTS, st.builds(_nested, st.just(20_000)))
# JSON text for the CLI: any payload above that json can write (NaN included), deep nesting as
# text (json.dumps cannot write it), and text that is no JSON at all.
CLI_PAYLOADS = st.one_of(
    PAYLOAD_OBJECTS.map(json.dumps),
    st.integers(MAX_PAYLOAD_DEPTH - 2, 2_000).map(
        lambda n: '{"a":' * (n - 1) + "{}" + "}" * (n - 1)
    ),
    st.just("[" * 100_000),
    TEXT,
)
OFFSETS = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23.9), max_value=timedelta(hours=23.9))
)
MOMENTS = st.one_of(
    st.datetimes(timezones=OFFSETS),
    st.datetimes(timezones=OFFSETS, min_value=datetime(9999, 12, 30)),
    st.datetimes(timezones=OFFSETS, max_value=datetime(1, 1, 2)),
    st.datetimes(),  # naive
)
SECONDS = st.one_of(
    st.floats(),
    st.floats(0, 4e9),
    st.integers(-(2**64), 2**64),
    st.timedeltas(),
)
KEYS = st.one_of(TEXT, st.integers(505, 520).map(lambda n: "k" * n))
SOON = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=OFFSETS)


@pytest.fixture(scope="module")
def db(create_database: Any) -> Dsn:
    """A database of this module's own, migrated once: examples empty its tables themselves."""
    from pgjobs import migrate

    dsn: Dsn = create_database()
    migrate.upgrade(dsn)
    return dsn


def _counts(dsn: Dsn) -> dict[str, int]:
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}  # type: ignore[index]


def _empty(dsn: Dsn) -> None:
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, pgjobs_workers")


def _numbers_by_value(value: Any) -> Any:
    """``value`` with every number as a float: jsonb keeps a number's decimal value, not its
    Python type, so a float with an integral value (``6.341989376134025e+16``) loads as an int."""
    if isinstance(value, dict):
        return {key: _numbers_by_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers_by_value(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def _finish(dsn: Dsn, job_id: int, task: str, queue: str, payload: dict[str, Any]) -> None:
    """Run the job with a burst worker whose handler takes any payload; it must end archived as
    succeeded, having received the payload as stored."""
    app = App(dsn.url, pool_size=1)
    seen: list[dict[str, Any]] = []

    @app.task(name=task, queue=queue)
    def handler(**arguments: Any) -> None:
        seen.append(arguments)

    with psycopg.connect(dsn.url, autocommit=True) as conn:
        # Scheduled or expiring jobs are made ready now: a burst worker waits for scheduled ones.
        # Any other job (the valid one of a batch) is not this test's concern.
        conn.execute("DELETE FROM queued_jobs WHERE id <> %s", [job_id])
        conn.execute(
            "UPDATE queued_jobs SET run_at = now(), expires_at = NULL WHERE id = %s", [job_id]
        )
        with app:
            config = WorkerConfig(burst=True, poll_interval=0.02, maintenance=False, queues=[queue])
            assert Worker(app, config).run() == 0
        status = conn.execute("SELECT status FROM archived_jobs WHERE id = %s", [job_id]).fetchone()
    assert status == ("succeeded",), _counts(dsn)
    assert [_numbers_by_value(x) for x in seen] == [
        _numbers_by_value(json.loads(json.dumps(payload)))
    ]


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    task=NAMES,
    payload=st.one_of(st.none(), PAYLOAD_OBJECTS, PAYLOADS),
    queue=_option(PLAIN, NAMES),
    priority=st.one_of(st.integers(-5, 5), st.integers(-40_000, 40_000)),
    run_at=_option(SOON, MOMENTS),
    run_in=_option(st.floats(0, 3600), SECONDS),
    max_attempts=_option(st.integers(1, 10), st.integers(-5, 2**40)),
    expires_at=_option(SOON, MOMENTS),
    expires_in=_option(st.floats(0, 3600), SECONDS),
    key=_option(PLAIN, KEYS),
    many=st.booleans(),
)
def test_enqueue_refuses_cleanly_or_makes_a_job_a_worker_finishes(
    db: Dsn,
    task: str,
    payload: dict[str, Any] | None,
    queue: str | None,
    priority: int,
    run_at: datetime | None,
    run_in: Any,
    max_attempts: int | None,
    expires_at: datetime | None,
    expires_in: Any,
    key: str | None,
    many: bool,
) -> None:
    _empty(db)
    spec = JobSpec(
        task, payload, queue, priority, run_at, run_in, max_attempts, expires_at, expires_in, key
    )
    with App(db.url, check_task_names=False, pool_size=1) as app:
        try:
            if many:  # behind a valid job: the batch is refused whole or written whole
                ids = app.enqueue_many([JobSpec("ok", queue="ok"), spec])
                job_id = ids[1]
            else:
                options = spec._asdict()
                del options["task"], options["payload"]
                job_id = app.enqueue(task, payload, **options)
        except PgjobsError as exc:
            event(f"refused: {type(exc).__name__}")
            # Refused at the door, not by the database after a round trip.
            assert isinstance(exc, ConfigurationError | InvalidPayload), repr(exc)
            assert str(exc) and "\n" not in str(exc)
            assert _counts(db) == dict.fromkeys(TABLES, 0)
            return
        job = app.job(job_id)
    event("enqueued and finished")
    assert _counts(db)["queued_jobs"] == (2 if many else 1)
    if run_at is not None:
        assert job.run_at == run_at
    if expires_at is not None:
        assert job.expires_at == expires_at
    _finish(db, job_id, task, job.queue, payload or {})


def _cli_value(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # capsys is read (and so reset) by every example
    ],
)
@given(
    task=NAMES,
    # Not "@...": that reads a file or stdin (tested in test_cli.py).
    payload=CLI_PAYLOADS.filter(lambda p: not p.startswith("@")),
    options=st.dictionaries(
        st.sampled_from(
            [
                "--queue",
                "--run-at",
                "--delay",
                "--max-attempts",
                "--expires-at",
                "--expires-in",
                "--idempotency-key",
                "--priority",
            ]
        ),
        st.one_of(NAMES, MOMENTS, SECONDS, st.integers(-(2**40), 2**40)),
        max_size=3,
    ),
)
def test_cli_enqueue_exits_2_in_one_line_or_makes_a_job_a_worker_finishes(
    db: Dsn, capsys: pytest.CaptureFixture[str], task: str, payload: str, options: dict[str, Any]
) -> None:
    _empty(db)
    argv = ["enqueue", task, "--payload", payload, "--dsn", db.url]
    for option, value in options.items():
        argv += [option, _cli_value(value)]
    code, out, err = run(capsys, *argv)
    event(f"exit {code}")
    if code != 0:
        assert code == 2, err
        assert len(err.splitlines()) == 1 and err.startswith("pgjobs: error: "), err
        assert _counts(db) == dict.fromkeys(TABLES, 0)
        return
    job_id = int(out)
    with App(db.url, pool_size=1) as app:
        queue = app.job(job_id).queue
    _finish(db, job_id, task, queue, json.loads(payload))
