"""Every enqueue option composes with every other: each pair of options (and a sample of
triples) is enqueued on a real PostgreSQL, and each option's meaning is checked on what was
written, on what a claim would take (the job's status: ready, scheduled or waiting), and on what a
second enqueue of a key returns. The combinations refused are in ``test_refused_combinations``
and in the guide's "How options combine" table.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, ConfigurationError, JobSpec, Ref
from pgjobs.enqueue import COPY_MIN_ROWS
from pgjobs.models import JobStatus


@dataclass
class Call:
    """One enqueue as the options of a case make it."""

    key: str
    options: dict[str, Any] = field(default_factory=dict)
    versioned: bool = False
    once: bool = False
    after: bool = False
    batch: bool = False
    transaction: bool = False
    many: bool = False
    copy: bool = False

    @property
    def task(self) -> str:
        return "m.versioned" if self.versioned else "m.once" if self.once else "m.plain"


@dataclass(frozen=True)
class Option:
    """One value of one option: how it shapes a call, and what it means for the written row."""

    dimension: str
    apply: Callable[[Call], None]
    check: Callable[[dict[str, Any], Call, Any], None]


SOON = timedelta(hours=2)


def _set(**options: Any) -> Callable[[Call], None]:
    def apply(call: Call) -> None:
        call.options.update(
            {k: (v.replace("%", call.key) if isinstance(v, str) else v) for k, v in options.items()}
        )

    return apply


def _flag(name: str) -> Callable[[Call], None]:
    def apply(call: Call) -> None:
        setattr(call, name, True)

    return apply


def _due(row: dict[str, Any], waiting: Any) -> datetime:
    """When the job runs: its run_at, or while it waits the run_at it is released with."""
    due: datetime = waiting if row["run_at"] is None else row["run_at"]
    return due


def _nothing(row: dict[str, Any], call: Call, waiting: Any) -> None:
    return None


def _check_run_in(row: dict[str, Any], call: Call, waiting: Any) -> None:
    delay = (_due(row, waiting) - row["created_at"]).total_seconds()
    assert 3590 <= delay <= 3610, delay


def _check_run_at(row: dict[str, Any], call: Call, waiting: Any) -> None:
    assert _due(row, waiting) == call.options["run_at"]


def _check_expires(row: dict[str, Any], call: Call, waiting: Any) -> None:
    assert 3590 <= (row["expires_at"] - row["created_at"]).total_seconds() <= 3610


def _check_debounce(row: dict[str, Any], call: Call, waiting: Any) -> None:
    assert (_due(row, waiting) - row["created_at"]).total_seconds() >= 59


OPTIONS: dict[str, Option] = {
    "queue": Option("queue", _set(queue="q2"), lambda r, c, w: assert_eq(r["queue"], "q2")),
    "priority": Option("priority", _set(priority=7), lambda r, c, w: assert_eq(r["priority"], 7)),
    "run_in": Option("time", _set(run_in=3600), _check_run_in),
    "run_at": Option("time", lambda c: c.options.update(run_at=_moment()), _check_run_at),
    "expires_in": Option("expires", _set(expires_in=3600), _check_expires),
    "max_attempts": Option(
        "attempts", _set(max_attempts=2), lambda r, c, w: assert_eq(r["max_attempts"], 2)
    ),
    "idempotency_key": Option(
        "idempotency",
        _set(idempotency_key="i-%"),
        lambda r, c, w: assert_eq(r["idempotency_key"], f"i-{c.key}"),
    ),
    "group": Option("group", _set(group="g"), lambda r, c, w: assert_eq(r["group_key"], "g")),
    "unique_keep": Option(
        "unique", _set(unique_key="u-%"), lambda r, c, w: assert_eq(r["unique_key"], f"u-{c.key}")
    ),
    "unique_replace": Option(
        "unique",
        _set(unique_key="u-%", on_conflict="replace"),
        lambda r, c, w: assert_eq(r["unique_key"], f"u-{c.key}"),
    ),
    "unique_debounce": Option(
        "unique", _set(unique_key="u-%", on_conflict="debounce", debounce=60), _check_debounce
    ),
    "tags": Option("tags", _set(tags=["a", "b"]), lambda r, c, w: assert_eq(r["tags"], ["a", "b"])),
    "after": Option("after", _flag("after"), _nothing),
    "batch": Option("batch", _flag("batch"), lambda r, c, w: assert_is_set(r["batch_id"])),
    "version": Option(
        "version", _flag("versioned"), lambda r, c, w: assert_eq(r["payload_version"], 2)
    ),
    "at_most_once": Option("once", _flag("once"), lambda r, c, w: assert_eq(r["task"], "m.once")),
    "transaction": Option("transaction", _flag("transaction"), _nothing),
    "many": Option("many", _flag("many"), _nothing),
    "copy": Option("copy", _flag("copy"), _nothing),
}

#: Options that cannot be asked of one task at once (a task is versioned or at-most-once here; a
#: task may be both, but one task per call keeps the checks apart).
_APART = {frozenset({"version", "at_most_once"})}


def assert_eq(value: Any, expected: Any) -> None:
    assert value == expected, (value, expected)


def assert_is_set(value: Any) -> None:
    assert value is not None


def _moment() -> datetime:
    return (datetime.now(UTC) + SOON).replace(microsecond=0)


def _cases() -> list[tuple[str, ...]]:
    names = list(OPTIONS)

    def fits(combo: tuple[str, ...]) -> bool:
        dimensions = [OPTIONS[name].dimension for name in combo]
        pairs = {frozenset(p) for p in itertools.combinations(combo, 2)}
        return len(set(dimensions)) == len(dimensions) and not pairs & _APART

    pairs = [c for c in itertools.combinations(names, 2) if fits(c)]
    triples = [c for c in itertools.combinations(names, 3) if fits(c)]
    return pairs + random.Random(38).sample(triples, 40)


CASES = _cases()


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app: App = make_app()
    for name in ("m.plain", "m.dependency"):
        app.task(name=name)(lambda n=0, v=0: None)
    app.task(name="m.versioned", version=2, upgrade={1: lambda p: p})(lambda n=0, v=0: None)
    app.task(name="m.once", at_most_once=True)(lambda n=0, v=0: None)
    return app


def _specs(call: Call, dependency: int | None, version: int) -> list[JobSpec]:
    """The call's jobs: the one under test first, then the fillers of a many or COPY call."""
    options = dict(call.options)
    if call.after:
        options["after"] = [dependency]
    subject = JobSpec(call.task, {"v": version}, **options)
    count = COPY_MIN_ROWS if call.copy else 2 if call.many else 1
    return [subject, *(JobSpec("m.plain", {"n": n}) for n in range(1, count))]


def _enqueue(app: App, conn: Any, call: Call, specs: list[JobSpec]) -> int:
    """Enqueue ``specs`` as ``call`` says; the id of the first."""
    connection = conn if call.transaction else None
    if call.batch:
        batch = app.batch(connection=connection)
        app.enqueue_many(specs, batch=batch)
        return batch.ids[0]
    if len(specs) > 1:
        return app.enqueue_many(specs, connection=connection)[0]
    (spec,) = specs
    options = {k: getattr(spec, k) for k in spec._fields[2:] if getattr(spec, k) is not None}
    return app.enqueue(spec.task, spec.payload, connection=connection, **options)


# A waiting job's run_at ('infinity', which psycopg does not load) reads as NULL.
_COLUMNS = """
SELECT task, queue, priority, CASE WHEN run_at = 'infinity' THEN NULL ELSE run_at END AS run_at,
       created_at, expires_at, max_attempts, idempotency_key, group_key, unique_key, tags,
       batch_id, payload_version, payload
FROM queued_jobs WHERE id = %s
"""


def _row(conn: psycopg.Connection[Any], job_id: int) -> tuple[dict[str, Any], Any]:
    cursor = conn.execute(_COLUMNS, (job_id,))
    names = [c.name for c in cursor.description or ()]
    found = cursor.fetchone()
    assert found is not None, f"job {job_id} is not in queued_jobs"
    waiting = conn.execute("SELECT run_at FROM pgjobs_waiting WHERE job_id = %s", (job_id,))
    released = waiting.fetchone()
    return dict(zip(names, found, strict=True)), None if released is None else released[0]


@pytest.mark.parametrize("combo", CASES, ids=["+".join(c) for c in CASES])
def test_options_compose(app: App, conn: psycopg.Connection[Any], dsn: Any, combo: tuple[str, ...]):
    call = Call(key="-".join(combo))
    for name in combo:
        OPTIONS[name].apply(call)
    dependency = app.enqueue("m.dependency", {}) if call.after else None
    specs = _specs(call, dependency, 1)
    if call.transaction:
        with psycopg.connect(dsn.url) as caller:
            job_id = _enqueue(app, caller, call, specs)
            unseen = conn.execute("SELECT count(*) FROM queued_jobs WHERE id = %s", (job_id,))
            assert unseen.fetchone() == (0,), "seen before the caller's commit"
            caller.commit()
    else:
        job_id = _enqueue(app, None, call, specs)
    written = conn.execute("SELECT count(*) FROM queued_jobs").fetchone()
    assert written == (len(specs) + (dependency is not None),)
    row, waiting = _row(conn, job_id)
    for name in combo:
        OPTIONS[name].check(row, call, waiting)
    status = app.job(job_id).status
    if call.after:
        assert status is JobStatus.WAITING
        edge = conn.execute(
            "SELECT depends_on FROM pgjobs_dependencies WHERE job_id = %s", (job_id,)
        )
        assert edge.fetchall() == [(dependency,)]
    elif {"run_in", "run_at", "unique_debounce"} & set(combo):
        assert status is JobStatus.SCHEDULED
    else:
        assert status is JobStatus.READY
    keyed = call.options.get("idempotency_key") or call.options.get("unique_key")
    if keyed:
        _check_second_enqueue(app, conn, call, dependency, job_id)


def _check_second_enqueue(
    app: App, conn: psycopg.Connection[Any], call: Call, dependency: int | None, job_id: int
) -> None:
    """A second enqueue of the key returns the first job; a replace gives it the new payload."""
    again = _specs(call, dependency, 2)[:1]
    second = Call(**{**call.__dict__, "many": False, "copy": False, "transaction": False})
    assert _enqueue(app, None, second, again) == job_id
    payload = conn.execute("SELECT payload FROM queued_jobs WHERE id = %s", (job_id,)).fetchone()
    replaced = call.options.get("on_conflict") in ("replace", "debounce")
    if replaced and not call.options.get("idempotency_key"):
        assert payload == ({"v": 2},)
    else:
        assert payload == ({"v": 1},)


REFUSED: dict[str, Callable[[App], object]] = {
    "run_at with run_in": lambda app: app.enqueue("m.plain", run_at=_moment(), run_in=5),
    "expires_at with expires_in": lambda app: app.enqueue(
        "m.plain", expires_at=_moment(), expires_in=5
    ),
    "on_conflict without unique_key": lambda app: app.enqueue("m.plain", on_conflict="replace"),
    "debounce without unique_key": lambda app: app.enqueue("m.plain", debounce=5),
    "debounce with on_conflict keep": lambda app: app.enqueue(
        "m.plain", unique_key="u", on_conflict="keep", debounce=5
    ),
    "after a Ref in enqueue": lambda app: app.enqueue("m.plain", after=[Ref(0)]),
    "after a later job": lambda app: app.enqueue_many(
        [JobSpec("m.plain", after=[Ref(1)]), JobSpec("m.plain")]
    ),
    "after itself": lambda app: app.enqueue_many([JobSpec("m.plain", after=[Ref(0)])]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_combinations_write_nothing(app: App, conn: psycopg.Connection[Any], case: str):
    with pytest.raises(ConfigurationError) as raised:
        REFUSED[case](app)
    assert raised.value.field
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
@pytest.mark.parametrize("key", ["idempotency_key", "unique_key"])
def test_keys_in_a_snapshot_transaction_are_refused(app: App, dsn: Any, conn: Any, level, key):
    with psycopg.connect(dsn.url) as caller:
        caller.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        with pytest.raises(ConfigurationError, match=level.upper()):
            options: dict[str, Any] = {key: "k"}
            app.enqueue("m.plain", connection=caller, **options)
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)
