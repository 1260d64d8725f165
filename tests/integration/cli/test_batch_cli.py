"""`pgjobs batch show`: a batch's counts, its callback and its members by status, as text and
JSON; an unknown or bad id is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from pgjobs import App
from tests.support.factories import work
from tests.support.helpers import assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture
def app(make_app) -> App:
    app: App = make_app()

    @app.task(name="reports.render")
    def render(page: int) -> None: ...

    @app.task(name="reports.summarise", queue="summaries")
    def summarise(batch: dict[str, int]) -> None: ...

    return app


def test_batch_show_prints_counts_callback_and_members(capsys, app, dsn):
    with app.batch(on_complete="reports.summarise") as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.render", {"page": 2}, queue="later")  # no worker serves it
    work(app, queues=["default"])
    code, out, err = run(capsys, "batch", "show", str(batch.id), "--dsn", dsn.url)
    assert code == 0, err
    assert f"batch {batch.id}: 1 of 2 pending" in out
    assert "reports.summarise on queue summaries (enqueued when the last member ends)" in out
    assert "1 ready, 1 succeeded" in out

    app.cancel(batch.ids[1])
    code, out, err = run(capsys, "batch", "show", str(batch.id), "--json", "--dsn", dsn.url)
    assert code == 0, err
    shown = json.loads(out)
    callback_id = shown["callback_job_id"]
    assert isinstance(callback_id, int)
    assert {k: shown[k] for k in ("id", "total", "pending", "succeeded", "dead", "cancelled")} == {
        "id": batch.id,
        "total": 2,
        "pending": 0,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 1,
    }
    assert shown["members"] == {"succeeded": 1, "cancelled": 1}
    assert shown["completed_at"] is not None and shown["callback_task"] == "reports.summarise"
    code, out, _ = run(capsys, "batch", "show", str(batch.id), "--dsn", dsn.url)
    assert f"batch {batch.id}: complete" in out
    assert f"job {callback_id}" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["424242"], ["no batch 424242"]),
        (["0"], ["out of range"]),
        (["seven"], ["valid integer"]),
        ([str(2**63)], ["out of range"]),
    ],
)
def test_batch_show_of_an_unknown_or_bad_id_is_one_line_and_exit_2(capsys, dsn, argv, words):
    code, _, err = run(capsys, "batch", "show", *argv, "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, *words)
