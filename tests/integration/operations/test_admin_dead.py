"""Dead-letter triage, read side: `pgjobs dead list / show / group` and the same in
``pgjobs.admin``; error fingerprints that fold one outage into one line."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from pgjobs import App, JobSpec, admin
from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError, JobNotFound
from pgjobs.models import DeadReason
from tests.support.admin_factories import bury
from tests.support.factories import db_now, work
from tests.support.helpers import assert_one_home, assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def test_a_real_outage_folds_into_one_group_per_task_and_error(make_app, conn, dsn, capsys):
    app: App = make_app()

    @app.task(name="sync.push", max_attempts=1)
    def push(n: int) -> None:
        raise ConnectionError(f"connection to 10.0.{n % 7}.{n} port 5432 refused (request {n})")

    @app.task(name="images.resize", max_attempts=1)
    def resize(n: int) -> None:
        raise ValueError(f"image '{uuid.uuid4()}' is corrupt")

    specs = [JobSpec("sync.push", {"n": n}) for n in range(60)]
    pushed = app.enqueue_many([*specs, *(JobSpec("images.resize", {"n": n}) for n in range(3))])
    assert work(app, concurrency=8) == 0
    assert set(assert_one_home(conn, pushed).values()) == {"dead_letter"}

    groups = admin.dead_groups(dsn)
    assert [(g.task, g.fingerprint, g.count) for g in groups] == [
        ("sync.push", "ConnectionError: connection to <n> port <n> refused (request <n>)", 60),
        ("images.resize", "ValueError: image <str> is corrupt", 3),
    ]
    assert groups[0].queues == ("default",)
    assert groups[0].first_failed_at <= groups[0].last_failed_at
    assert groups[0].latest_id == max(pushed[:60])

    code, out, err = run(capsys, "dead", "group", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert "sync.push" in out and "60" in out and groups[0].fingerprint_id in out
    assert "63 dead job(s) in 2 group(s)" in out

    code, out, _ = run(
        capsys, "dead", "group", "--json", "--task", "images.resize", "--dsn", dsn.url
    )
    assert code == 0
    parsed = json.loads(out)
    assert [(g["task"], g["count"], g["fingerprint_id"]) for g in parsed] == [
        ("images.resize", 3, groups[1].fingerprint_id)
    ]

    # The same filters as every other dead command: --fingerprint too.
    code, out, err = run(
        capsys, "dead", "group", "--fingerprint", groups[0].fingerprint_id, "--dsn", dsn.url
    )
    assert (code, err) == (0, "")
    assert "60 dead job(s) in 1 group(s)" in out and "images.resize" not in out


@pytest.mark.parametrize(
    ("errors", "fingerprint"),
    [
        (
            ["ValueError: image 1 is corrupt", "ValueError: image 40213 is corrupt"],
            "ValueError: image <n> is corrupt",
        ),
        (
            [f"KeyError: user {uuid.uuid4()} missing from 'shard-{n}'" for n in (1, 22)],
            "KeyError: user <uuid> missing from <str>",
        ),
        (
            [
                "RuntimeError: lock 3f9a2b1c held by 0x7fa3",
                "RuntimeError: lock 12345678 held by 0x1",
            ],
            "RuntimeError: lock <n> held by <n>",
        ),
        (
            ['OperationalError: connection to server at "db-1", port 5432 failed: timeout 2.5s'],
            "OperationalError: connection to server at <str>, port <n> failed: timeout <n>s",
        ),
        (["TypeError: can't convert   'x'\nsecond line 99"], "TypeError: can't convert <str>"),
    ],
)
def test_fingerprint_replaces_what_varies_between_occurrences(conn, dsn, errors, fingerprint):
    bury(conn, len(errors), error=errors.__getitem__)
    assert [(g.fingerprint, g.count) for g in admin.dead_groups(dsn)] == [
        (fingerprint, len(errors))
    ]


def test_jobs_without_an_exception_are_fingerprinted_by_reason(conn, dsn):
    bury(
        conn,
        3,
        task="t.lost",
        reason=DeadReason.LEASE_EXPIRED,
        error_type=None,
        error=lambda n: f"lease of worker web-{n}:{4000 + n}:deadbee{n} expired on attempt 3 of 3",
    )
    (group,) = admin.dead_groups(dsn)
    assert group.fingerprint == (
        f"{DeadReason.LEASE_EXPIRED}: lease of worker web-<n>:<n>:<n> expired on attempt <n> of <n>"
    )
    assert group.count == 3


def test_dead_list_filters_newest_first(conn, dsn, capsys):
    old = bury(conn, 2, task="a", queue="q1", error=lambda n: f"ValueError: old {n}")
    conn.execute("UPDATE dead_letter SET failed_at = now() - interval '3 hours'")
    new = bury(conn, 3, task="b", queue="q2", error=lambda n: f"TimeoutError: slow {n}")
    before = db_now(conn)

    assert [j.id for j in admin.dead_jobs(dsn)] == [*reversed(new), *reversed(old)]
    assert [j.id for j in admin.dead_jobs(dsn, DeadFilter(queue="q1"))] == list(reversed(old))
    assert [j.id for j in admin.dead_jobs(dsn, DeadFilter(task="b"), limit=2)] == new[:0:-1]
    assert [j.id for j in admin.dead_jobs(dsn, DeadFilter(error="TIMEOUTERROR: SLOW 1"))] == [
        new[1]
    ]
    hour_ago = before - timedelta(hours=1)
    assert {j.id for j in admin.dead_jobs(dsn, DeadFilter(since=hour_ago))} == set(new)
    assert {j.id for j in admin.dead_jobs(dsn, DeadFilter(until=hour_ago))} == set(old)
    listed = admin.dead_jobs(dsn, DeadFilter(ids=(old[0],)))
    assert [j.id for j in listed] == [old[0]]
    assert listed[0].traceback is None, "listings leave the traceback out"
    assert listed[0].reason is DeadReason.EXHAUSTED
    fingerprint = listed[0].fingerprint_id
    assert {j.id for j in admin.dead_jobs(dsn, DeadFilter(fingerprint=fingerprint))} == set(old)
    assert {j.id for j in admin.dead_jobs(dsn, DeadFilter(fingerprint="ValueError: old <n>"))} == (
        set(old)
    )

    code, out, err = run(capsys, "dead", "list", "--queue", "q2", "--since", "1h", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    code, weeks, err = run(
        capsys, "dead", "list", "--queue", "q2", "--since", "2w", "--dsn", dsn.url
    )
    assert (code, err, weeks) == (0, "", out), "ages in weeks, as --older-than takes them"
    assert "TimeoutError: slow 2" in out and "ValueError" not in out
    assert "3 shown" in out

    code, out, _ = run(capsys, "dead", "list", "--json", "--limit", "1", "--dsn", dsn.url)
    assert code == 0
    (only,) = json.loads(out)
    assert only["id"] == new[-1]
    assert only["task"] == "b" and only["reason"] == DeadReason.EXHAUSTED and only["attempts"] == 3
    assert only["failed_at"].startswith(str(before.year))

    code, out, _ = run(capsys, "dead", "list", "--task", "nope", "--dsn", dsn.url)
    assert code == 0 and "no dead job matches" in out


def test_dead_show_prints_payload_error_and_traceback(conn, dsn, capsys):
    (job_id,) = bury(conn, 1, error=lambda n: "ValueError: image 7 is corrupt")

    code, out, err = run(capsys, "dead", "show", str(job_id), "--dsn", dsn.url)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"job {job_id}: dead (exhausted)"
    assert '{"n": 0}' in out
    assert "3 of 3" in out
    assert "builtins.ValueError" in out
    assert "ValueError: image <n> is corrupt" in out
    assert "Traceback (most recent call last):" in out

    shown = admin.dead_job(dsn, job_id)
    assert shown.traceback is not None and shown.traceback.startswith("Traceback")
    code, out, _ = run(capsys, "dead", "show", str(job_id), "--json", "--dsn", dsn.url)
    assert json.loads(out)["traceback"] == shown.traceback


def test_unknown_or_living_ids_and_bad_filters_are_one_line_errors(make_app, conn, dsn, capsys):
    app: App = make_app(check_task_names=False)
    queued = app.enqueue("t", {})

    code, _, err = run(capsys, "dead", "show", "999999", "--dsn", dsn.url)
    assert_one_line_error(code, err, "no job 999999")
    code, _, err = run(capsys, "dead", "show", str(queued), "--dsn", dsn.url)
    assert_one_line_error(code, err, f"job {queued} is not in dead_letter", "ready")
    with pytest.raises(JobNotFound):
        admin.dead_job(dsn, queued)

    code, _, err = run(capsys, "dead", "list", "--since", "yesterday", "--dsn", dsn.url)
    assert_one_line_error(code, err, "--since", "ISO 8601", "or an age such as 90m")
    assert code == 2
    code, _, err = run(capsys, "dead", "list", "--since", "1h", "--until", "2h", "--dsn", dsn.url)
    assert_one_line_error(code, err, "since", "not before until")
    code, _, err = run(capsys, "dead", "list", "--limit", "0", "--dsn", dsn.url)
    assert_one_line_error(code, err, "--limit")
    with pytest.raises(ConfigurationError):
        DeadFilter(ids=())
