"""Benchmark group q (``python -m benchmarks --only costs``) is registered, and its variants of
pgjobs' worker statement change what they say; the measurements need a database (``make
bench``)."""

from __future__ import annotations

from benchmarks import costs, raw
from benchmarks.cli import GROUPS, _parse
from pgjobs import queries


def test_the_group_is_chosen_by_its_name_and_its_letter():
    assert GROUPS["costs"] == ("q", costs.run)
    assert _parse(["--only", "costs"]).groups == ["costs"]
    assert _parse(["--only", "q"]).groups == ["costs"]


def test_the_unchanged_loop_runs_the_workers_own_statement():
    assert costs.statement("pgjobs", "archived_jobs_p20260101") == queries.JOB_SUCCEED_AND_CLAIM


def test_the_narrow_archive_insert_leaves_out_the_columns_the_narrow_archive_lacks():
    narrow = costs.statement("narrow_columns", "archived_jobs_p20260101")
    assert "INSERT INTO archived_jobs (id, queue, task, payload," in narrow
    assert "trace_context" not in narrow.split("INSERT INTO archived_jobs")[1].split(")")[0]
    # The claim is untouched.
    assert narrow.split("claimed AS")[1] == queries.JOB_SUCCEED_AND_CLAIM.split("claimed AS")[1]


def test_the_partition_variant_inserts_into_the_days_partition():
    routed = costs.statement("partition", "archived_jobs_p20260101")
    assert "INSERT INTO archived_jobs_p20260101 (" in routed
    assert "INSERT INTO archived_jobs (" not in routed


def test_the_raw_claim_implies_the_claim_index_predicate():
    # ix_queued_jobs_claim holds only rows without a limit_key or a group_key.
    assert "limit_key IS NULL" in raw.CLAIM and "group_key IS NULL" in raw.CLAIM


def test_a_cte_no_part_reads_is_counted_beside_the_top_node():
    def node(hit: int, **extra: object) -> dict[str, object]:
        counts = dict.fromkeys(
            ("Shared Dirtied Blocks", "WAL Records", "WAL Bytes", "WAL FPI"), hit
        )
        return {"Shared Hit Blocks": hit, **counts, **extra}

    read = node(5, **{"Subplan Name": "CTE claimed"})
    unread = node(7, **{"Subplan Name": "CTE archived"})
    top = node(10, Plans=[read, unread, node(1, **{"CTE Name": "claimed"})])
    assert costs._counts(top) == [17, 17, 17, 17, 17]
