"""The hot statements as the code renders them, checked in as SQL files beside the statements
(``pgjobs/queries/rendered/``), so that a change to a fragment shows in a diff as the SQL that
PostgreSQL will run. After a deliberate change, write them again with
``PGJOBS_WRITE_SNAPSHOTS=1 pytest tests/unit/test_query_snapshots.py`` and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgjobs import queries

RENDERED = Path(queries.__file__).parent / "rendered"

#: File name -> the statement it holds: the claim, the settle-and-claim round trip, the outcomes
#: of a batch, the queues a worker finds ready.
SNAPSHOTS = {
    "job_claim.sql": queries.JOB_CLAIM,
    "job_claim_limited.sql": queries.JOB_CLAIM_LIMITED,
    "job_succeed_and_claim.sql": queries.JOB_SUCCEED_AND_CLAIM,
    "job_succeed_and_claim_limited.sql": queries.JOB_SUCCEED_AND_CLAIM_LIMITED,
    "job_settle_many.sql": queries.JOB_SETTLE_MANY,
    "job_bury_many.sql": queries.JOB_BURY_MANY,
    "job_ready_in_queues.sql": queries.JOB_READY_IN_QUEUES,
}


def _as_file(statement: str) -> str:
    return statement.strip("\n") + "\n"


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_the_checked_in_text_is_what_the_code_renders(name: str) -> None:
    path = RENDERED / name
    rendered = _as_file(SNAPSHOTS[name])
    if os.environ.get("PGJOBS_WRITE_SNAPSHOTS") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} is missing: run PGJOBS_WRITE_SNAPSHOTS=1 pytest {__file__}"
    assert path.read_text() == rendered, (
        f"{name} no longer matches what the code renders: review the change, then run "
        f"PGJOBS_WRITE_SNAPSHOTS=1 pytest {__file__}"
    )


def test_every_checked_in_file_is_a_snapshot() -> None:
    assert sorted(p.name for p in RENDERED.glob("*.sql")) == sorted(SNAPSHOTS)
