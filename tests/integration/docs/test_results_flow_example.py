"""examples/results_flow.py, which docs/guides/workflows.md includes: a dependent reads its
dependencies' results by name, sync and async, and a batch's callback adds up its members'
results page by page."""

from __future__ import annotations

import runpy
from collections.abc import Iterator
from typing import Any

import pytest

import pgjobs
from pgjobs.db.dsn import Dsn
from pgjobs.testing import drain
from tests.support.helpers import REPO


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, dsn: Dsn) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("PGJOBS_DATABASE_URL", dsn.url)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    found = runpy.run_path(str(REPO / "examples" / "results_flow.py"))
    yield found
    found["app"].close()


def test_results_flow_from_dependencies_and_batch_members(example: dict[str, Any]) -> None:
    app: pgjobs.App = example["app"]
    shipped = example["checkout"](42, 1999)
    charged = app.enqueue("shop.charge", {"order": 7, "cents": 5})
    shipped_async = app.enqueue("shop.ship_async", {"order": 7}, after={"charge": charged})
    batch_id = example["import_files"](["a.csv", "bb.csv", "c.bad"])
    result = drain(app)
    assert [d.reason for d in result.dead] == ["non_retryable"]
    assert app.wait(shipped, timeout=0) == "order 42: rcpt-42-1999, from shelf 2"
    assert app.wait(shipped_async, timeout=0) == "order 7: rcpt-7-5"
    status = app.batch_status(batch_id)
    assert status.callback_job_id is not None
    members = [m.id for m in app.batch_results(batch_id)]
    assert app.wait(status.callback_job_id, timeout=0) == {"rows": 11, "failed": [members[2]]}
