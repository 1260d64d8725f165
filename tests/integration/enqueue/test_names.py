"""Names that look alike are one name, and what cannot be seen is refused: task, queue and
schedule names are stored in Unicode's composed form (NFC), so the composed and decomposed
spellings of one name are one queue; a name or an idempotency key holding an invisible character
(zero-width space, BOM, line separator, controls, format characters) or a space at either end is
refused with a ``PgjobsError`` naming the field, from every entry point, and nothing is written.
Keys are never rewritten: one not in NFC is refused."""

from __future__ import annotations

import unicodedata
from datetime import timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgjobs import App, ConfigurationError, JobSpec, PgjobsError, queues
from pgjobs.db.dsn import Dsn
from pgjobs.periodic import Periodic
from pgjobs.tasks import make_task
from pgjobs.worker import WorkerConfig
from tests.support.helpers import assert_one_line_error, run

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

# Visible characters, combining marks included (what composes), none of those that render as
# nothing although Unicode files them as letters or marks.
_VISIBLE = st.characters(
    categories=("L", "M", "N", "P", "S"),
    exclude_characters="\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u3164"
    "\ufe00\ufe01\ufe02\ufe03\ufe04\ufe05\ufe06\ufe07\ufe08\ufe09\ufe0a\ufe0b\ufe0c\ufe0d\ufe0e"
    "\ufe0f\uffa0",
).filter(lambda c: not 0xE0100 <= ord(c) <= 0xE01EF)
_SPELLED = st.sampled_from(["café", "Ångström", "ñandú", "Ω", "ệ", "가", "ﬁ"])
VISIBLE = st.one_of(
    _SPELLED,
    st.text(_VISIBLE, min_size=1, max_size=12),
    st.builds("{} {}".format, _SPELLED, st.text(_VISIBLE, min_size=1, max_size=6)),
)
# What cannot be seen: the named troublemakers, then any character Unicode files as a control,
# a format character, a separator other than the space, private use or a surrogate.
INVISIBLE = st.one_of(
    st.sampled_from(
        [
            "\u200b",
            "\u200c",
            "\u200d",
            "\u2060",
            "\ufeff",
            "\u2028",
            "\u2029",
            "\u00a0",
            "\u00ad",
            "\u202e",
            "\u3000",
            "\x00",
            "\t",
            "\n",
            "\x1b",
            "\u034f",
            "\u3164",
            "\ufe0f",
            "\U000e0001",
            "\ud800",
        ]
    ),
    st.characters(categories=("Cc", "Cf", "Zl", "Zp", "Co", "Cs")),
    st.characters(categories=["Zs"]).filter(lambda c: c != " "),
)


@pytest.fixture(scope="module")
def db(create_database: Any) -> Dsn:
    """A database of this module's own, migrated once: examples empty its tables themselves."""
    from pgjobs import migrate

    dsn: Dsn = create_database()
    migrate.upgrade(dsn)
    return dsn


def _rows(dsn: Dsn, sql: LiteralString) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _empty(dsn: Dsn) -> None:
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}, pgjobs_queues")


def _nothing_written(dsn: Dsn) -> bool:
    return all(_rows(dsn, f"SELECT count(*) FROM {t}") == [(0,)] for t in TABLES)


def _with(name: str, char: str, at: int) -> str:
    at = at % (len(name) + 1)
    return name[:at] + char + name[at:]


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(name=VISIBLE)
def test_names_that_render_the_same_are_one_queue_and_one_task(db: Dsn, name: str) -> None:
    _empty(db)
    composed, decomposed = (unicodedata.normalize(form, name) for form in ("NFC", "NFD"))
    with App(db.url, check_task_names=False, pool_size=1) as app:
        app.enqueue(composed, {}, queue=composed)
        app.enqueue(decomposed, {}, queue=decomposed)
        app.enqueue_many([JobSpec(decomposed, queue=decomposed)] * 2)
        app.enqueue_many([JobSpec(decomposed, queue=decomposed)] * 70)  # by COPY
        queues.pause(db, decomposed)
        assert queues.queue(db, composed).paused
    assert _rows(db, "SELECT DISTINCT queue, task FROM queued_jobs") == [(composed, composed)]
    assert _rows(db, "SELECT name FROM pgjobs_queues") == [(composed,)]


@SETTINGS
@given(name=VISIBLE)
def test_a_task_declared_in_one_form_takes_jobs_enqueued_in_the_other(db: Dsn, name: str) -> None:
    _empty(db)
    composed, decomposed = (unicodedata.normalize(form, name) for form in ("NFC", "NFD"))
    app = App(db.url, pool_size=1)

    @app.task(name=decomposed, queue=decomposed)
    def handler() -> None: ...

    assert set(app.tasks) == {composed} and app.tasks[composed].queue == composed
    with app:
        app.enqueue(composed, {})  # the registry knows the task under its NFC name
    assert WorkerConfig(queues=[decomposed]).queues == [composed]
    schedule = Periodic(decomposed, decomposed, every=timedelta(hours=1))
    assert (schedule.name, schedule.task) == (composed, composed)


@SETTINGS
@given(name=VISIBLE, char=INVISIBLE, at=st.integers(0, 20))
def test_a_name_or_key_with_an_invisible_character_is_refused(
    db: Dsn, name: str, char: str, at: int
) -> None:
    _empty(db)
    bad = _with(name, char, at)
    attempts: dict[str, Any] = {
        "task": lambda app: app.enqueue(bad, {}),
        "queue": lambda app: app.enqueue("t", {}, queue=bad),
        "idempotency_key": lambda app: app.enqueue("t", {}, idempotency_key=bad),
        "jobs[1].queue": lambda app: app.enqueue_many([JobSpec("t"), JobSpec("t", queue=bad)]),
    }
    with App(db.url, check_task_names=False, pool_size=1) as app:
        for field, attempt in attempts.items():
            with pytest.raises(PgjobsError) as raised:
                attempt(app)
            assert raised.value.field == field
            assert "\n" not in str(raised.value)
    for declare in (
        lambda: queues.pause(db, bad),
        lambda: queues.limit(db, bad, concurrency=1),
        lambda: make_task(lambda: None, name=bad),
        lambda: make_task(lambda: None, name="t", queue=bad),
        lambda: Periodic(bad, "t", every=timedelta(hours=1)),
        lambda: WorkerConfig(queues=[bad]),
    ):
        with pytest.raises(ConfigurationError, match=r"cannot be seen|non-empty"):
            declare()
    assert _nothing_written(db)
    assert _rows(db, "SELECT count(*) FROM pgjobs_queues") == [(0,)]


@pytest.mark.parametrize("bad", [" emails", "emails ", " ", "a\u200b", "\ufeffa"])
@pytest.mark.parametrize("field", ["task", "queue", "idempotency_key"])
def test_spaces_at_either_end_are_refused(db: Dsn, bad: str, field: str) -> None:
    _empty(db)
    options: dict[str, Any] = {"task": "t", field: bad}
    with App(db.url, check_task_names=False, pool_size=1) as app:
        task = options.pop("task")
        with pytest.raises(ConfigurationError) as raised:
            app.enqueue(task, {}, **options)
    assert raised.value.field == field
    assert _nothing_written(db)


def test_a_key_is_stored_as_given_and_one_not_in_nfc_is_refused(db: Dsn) -> None:
    _empty(db)
    with App(db.url, check_task_names=False, pool_size=1) as app:
        first = app.enqueue("t", {}, idempotency_key="café ☕ 👍🏽")
        with pytest.raises(ConfigurationError, match="NFC") as raised:
            app.enqueue("t", {}, idempotency_key="cafe\u0301 ☕ 👍🏽")
        assert raised.value.field == "idempotency_key"
        assert app.enqueue("t", {}, idempotency_key="café ☕ 👍🏽") == first
    assert _rows(db, "SELECT idempotency_key FROM queued_jobs") == [("café ☕ 👍🏽",)]


@pytest.mark.usefixtures("no_dsn_in_env")
@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "t\u200b"],
        ["enqueue", "t", "--queue", "q\u2028"],
        ["enqueue", "t", "--queue", "q "],
        ["enqueue", "t", "--idempotency-key", "k\ufeff"],
        ["queue", "pause", "q\u200d"],
        ["queue", "limit", "q\u2060", "2"],
        ["work", "--app", "tests.integration.cli_app:app", "--queue", "q\u200b", "--burst"],
    ],
)
def test_the_cli_refuses_in_one_line(capsys, db: Dsn, argv: list[str]) -> None:
    _empty(db)
    code, _, err = run(capsys, *argv, "--dsn", db.url)
    assert code == 2, err
    assert_one_line_error(code, err, "cannot be seen")
    assert _nothing_written(db)


@pytest.mark.usefixtures("no_dsn_in_env")
def test_the_cli_stores_one_queue_for_both_forms(capsys, db: Dsn) -> None:
    _empty(db)
    for queue in ("caf\u00e9", "cafe\u0301"):
        code, _, err = run(capsys, "enqueue", "t", "--queue", queue, "--dsn", db.url)
        assert code == 0, err
    assert _rows(db, "SELECT DISTINCT queue FROM queued_jobs") == [("caf\u00e9",)]
