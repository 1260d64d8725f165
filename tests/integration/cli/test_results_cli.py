"""`pgjobs job show` names a dependent's dependencies and prints their results; `pgjobs batch
results` prints a batch's members with their outcomes a page at a time, as text and JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgjobs import App, NonRetryableError
from pgjobs.testing import drain
from tests.support.helpers import assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="shop.charge")
    def charge(order: int) -> dict[str, str]:
        return {"receipt": f"r-{order}"}

    @app.task(name="shop.ship")
    def ship(order: int) -> None: ...

    @app.task(name="rows.count", max_attempts=1)
    def count_rows(n: int) -> int:
        if n < 0:
            raise NonRetryableError("negative")
        return n

    return app


def test_job_show_names_the_dependencies_and_prints_their_results(capsys, app, dsn):
    charge = app.enqueue("shop.charge", {"order": 8})
    first = app.enqueue("shop.charge", {"order": 9})
    drain(app)
    ship = app.enqueue("shop.ship", {"order": 8}, after={"charge": charge})
    by_id = app.enqueue("shop.ship", {"order": 9}, after=[first])
    code, out, err = run(capsys, "job", "show", str(ship), "--dsn", dsn.url)
    assert code == 0, err
    assert f"charge={charge} (succeeded)" in out
    assert "results of after:" in out and f'charge={charge}: {{"receipt": "r-8"}}' in out
    code, out, err = run(capsys, "job", "show", str(by_id), "--dsn", dsn.url)
    assert f"{first} (succeeded)" in out and f'{first}: {{"receipt": "r-9"}}' in out
    code, out, err = run(capsys, "job", "show", str(ship), "--json", "--dsn", dsn.url)
    assert code == 0, err
    (edge,) = json.loads(out)["after"]
    assert edge == {
        "id": charge,
        "status": "succeeded",
        "name": "charge",
        "result": {"receipt": "r-8"},
        "result_omitted": False,
    }


def test_batch_results_pages_the_members_with_their_outcomes(capsys, app, dsn):
    with app.batch() as batch:
        for n in (5, -1, 6):
            batch.enqueue("rows.count", {"n": n})
    drain(app)
    code, out, err = run(
        capsys, "batch", "results", str(batch.id), "--limit", "2", "--dsn", dsn.url
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [str(batch.ids[0]), "succeeded", "rows.count", "5"]
    assert lines[1].split()[:4] == [str(batch.ids[1]), "dead", "rows.count", "non_retryable:"]
    assert lines[1].endswith("non_retryable: NonRetryableError: negative")
    assert lines[2] == f"next: pgjobs batch results {batch.id} --after {batch.ids[1]}"
    code, out, err = run(
        capsys, "batch", "results", str(batch.id), "--after", str(batch.ids[1]), "--dsn", dsn.url
    )
    assert out.split() == [str(batch.ids[2]), "succeeded", "rows.count", "6"]
    code, out, err = run(
        capsys,
        "batch",
        "results",
        str(batch.id),
        "--all",
        "--limit",
        "1",
        "--json",
        "--dsn",
        dsn.url,
    )
    assert code == 0, err
    pages = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00")]
    assert [p["next_after"] for p in pages] == [batch.ids[0], batch.ids[1], None]
    assert [m["result"] for p in pages for m in p["results"]] == [5, None, 6]


def test_batch_results_of_an_unknown_batch_is_one_line_and_exit_2(capsys, app, dsn):
    code, _, err = run(capsys, "batch", "results", "999", "--dsn", dsn.url)
    assert_one_line_error(code, err, "no batch 999")
