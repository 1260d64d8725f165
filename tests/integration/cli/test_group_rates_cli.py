"""Group rates on the command line: `pgjobs queue limit --group-rate` set, listed and cleared,
its bad values one line, exit 2, nothing written; `pgjobs stats` says which groups their rate
holds, and until when."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from pgjobs import queues
from tests.integration.claiming.test_claim_groups import enqueue
from tests.support.factories import claim_limited, declared_task
from tests.support.helpers import assert_one_line_error, run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def test_queue_limit_group_rate_set_listed_and_cleared(capsys, dsn, conn):
    argv = ["queue", "limit", "emails", "--group-rate", "10/m", "--dsn", dsn.url]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")
    assert out.strip() == "queue emails limits set: 10/m starts per group (it holds no job now)"
    assert conn.execute(
        "SELECT group_rate_jobs, group_rate_seconds FROM pgjobs_queues WHERE name = 'emails'"
    ).fetchone() == (10, 60.0)
    # The other limits are kept, and the group rate with them.
    code, out, _ = run(capsys, "queue", "limit", "emails", "3", "--json", "--dsn", dsn.url)
    state = json.loads(out)
    assert (state["concurrency"], state["group_rate"], state["changed"]) == (3, "10/m", True)
    code, out, _ = run(capsys, "queue", "list", "--dsn", dsn.url)
    assert "at most 3 running, 10/m starts per group" in out
    code, out, _ = run(capsys, "queue", "list", "--json", "--dsn", dsn.url)
    assert {q["name"]: q["group_rate"] for q in json.loads(out)} == {"emails": "10/m"}

    code, out, _ = run(capsys, "queue", "limit", "emails", "--group-rate", "none", "--dsn", dsn.url)
    assert code == 0 and "per group" not in out
    state = queues.queue(dsn, "emails")
    assert (state.group_rate_jobs, state.group_rate_seconds, state.concurrency) == (None, None, 3)


@pytest.mark.parametrize("value", ["10", "0/m", "10/0s", "10/2d", "ten/m", "10/fortnight"])
def test_queue_limit_refuses_a_bad_group_rate(capsys, dsn, value):
    code, _, err = run(capsys, "queue", "limit", "emails", "--group-rate", value, "--dsn", dsn.url)
    assert_one_line_error(code, err, "--group-rate")
    assert code == 2
    assert queues.list_queues(dsn) == []


def test_stats_shows_the_groups_their_rate_holds_and_until_when(capsys, dsn, conn, monkeypatch):
    monkeypatch.delenv("PGJOBS_APP", raising=False)
    queues.limit(dsn, "q", group_rate="2/h")
    enqueue(conn, "cli.free", "c-1", 3, queue="q")
    enqueue(conn, "cli.rated", "c-2", 2, queue="q")
    enqueue(conn, "cli.free", "c-3", 1, queue="q")
    rated = declared_task("cli.rated", group_rate="1/h")
    free = declared_task("cli.free")
    claimed, _ = claim_limited(conn, [rated, free], queues=["q"])
    # c-1: 2 of 3 (the queue's rate); c-2: 1 of 2 (the task's rate), c-3: its one.
    assert len(claimed) == 4
    # The claim's now(): every job it started has it as started_at.
    first = scalar(conn, "SELECT min(started_at) FROM queued_jobs WHERE group_key = 'c-1'")

    code, out, err = run(capsys, "stats", "--dsn", dsn.url)
    assert code == 0, err
    lines = {line.split()[1]: line for line in out.splitlines() if " c-" in line}
    assert "the queue's group rate 2/h: 2 starts in its window, the next at" in lines["c-1"]
    assert "cli.rated's group rate 1/h: 1 start in its window" in lines["c-2"]
    assert "rate" not in lines.get("c-3", "")  # nothing ready: nothing held

    code, out, err = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    assert code == 0, err
    (q,) = json.loads(out)["groups"]
    held = {g["group_key"]: g["held_by"] for g in q["top"]}
    until = (first + timedelta(hours=1)).isoformat()
    assert held["c-1"] == [
        {"reason": "rate", "task": None, "job_ids": [], "jobs": 2, "until": until, "rate": "2/h"}
    ]
    (c2,) = held["c-2"]
    assert (c2["reason"], c2["task"], c2["jobs"], c2["rate"]) == ("rate", "cli.rated", 1, "1/h")
    assert c2["until"] == until  # started by the same claim


def test_python_api_sets_a_queues_group_rate(dsn, make_app):
    from pgjobs import Rate
    from pgjobs.errors import ConfigurationError

    change = make_app().limit_queue("emails", group_rate=Rate(5, 10.0))
    assert change.changed and change.queue.limited
    assert (change.queue.group_rate_jobs, change.queue.group_rate_seconds) == (5, 10.0)
    with pytest.raises(ConfigurationError) as caught:
        queues.limit(dsn, "emails", group_rate="5")
    assert caught.value.field == "group_rate"
    assert queues.queue(dsn, "emails").group_rate_jobs == 5  # the refused value wrote nothing
