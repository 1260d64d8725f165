"""Group g: retention of a 1M-row archive.

``archived_jobs`` holds 1M jobs that finished over the last 40 days, each day in its own
partition (as the archive-partitions service leaves them); `pgjobs prune --older-than 30d` drops
the 10 oldest days, 250k rows. The reference is the design without partitions: the same rows in
an unpartitioned copy, deleted by a batched ``DELETE`` (10,000 rows per transaction, oldest
first, as a pruner of a plain table would), plus the ``VACUUM`` that the dead rows then need
(the table does not shrink either way). A second pgjobs figure prunes with ``--export`` (one CSV
file per partition, fsynced before the drop).

Run alone: ``python -m benchmarks.prune [--quick] [--dsn URL]``; or as a group of
``python -m benchmarks`` once it is listed in ``benchmarks/cli.py``'s GROUPS.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import BenchDatabase, Context, say
from benchmarks.report import Figure, Row, render
from pgjobs import retention
from pgjobs.db.dsn import normalize_dsn, resolve_dsn

DAYS = 40
KEEP_DAYS = 30
#: Rows one DELETE of the reference removes (one transaction each).
DELETE_BATCH = 10_000


def _fill(bench: BenchDatabase, rows: int) -> None:
    """``rows`` archived jobs spread evenly over the last DAYS days, in daily partitions."""
    bench.reset()
    bench.create_archive_days(DAYS)
    bench.conn.execute(
        "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, status, worker, created_at, finished_at) "
        "SELECT g, 'history', 'bench.noop', '{\"n\": 1}', 0, t, 1, 5, 'succeeded', 'bench', t, t "
        "FROM generate_series(1, %(rows)s) AS g, "
        "LATERAL (SELECT now() - %(days)s * interval '1 day' * g / %(rows)s) AS x(t)",
        {"rows": rows, "days": DAYS},
    )
    bench.vacuum("archived_jobs")


def _prune(bench: BenchDatabase, export: Path | None) -> tuple[float, retention.PruneReport]:
    started = time.perf_counter()
    report = retention.prune(bench.dsn, timedelta(days=KEEP_DAYS), export=export)
    return (time.perf_counter() - started) * 1000, report


def _archive_mib(bench: BenchDatabase) -> float:
    size = bench.scalar(
        "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('archived_jobs')"
    )
    return float(size) / 2**20


def _batched_delete(bench: BenchDatabase) -> tuple[float, float, int, float]:
    """The plain-table design on a copy of the archive: (delete ms, vacuum ms, rows deleted,
    MiB the table still takes after both)."""
    conn = bench.conn
    conn.execute("DROP TABLE IF EXISTS bench_plain_archive")
    conn.execute("CREATE TABLE bench_plain_archive (LIKE archived_jobs INCLUDING ALL)")
    conn.execute("INSERT INTO bench_plain_archive SELECT * FROM archived_jobs")
    bench.vacuum("bench_plain_archive")
    cutoff = bench.scalar(f"SELECT now() - interval '{KEEP_DAYS} days'")
    deleted = 0
    started = time.perf_counter()
    while True:
        cur = conn.execute(
            "DELETE FROM bench_plain_archive WHERE ctid = ANY(ARRAY("
            "SELECT ctid FROM bench_plain_archive WHERE finished_at < %s "
            "ORDER BY finished_at LIMIT %s))",
            (cutoff, DELETE_BATCH),
        )
        deleted += cur.rowcount
        if cur.rowcount < DELETE_BATCH:
            break
    delete_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    conn.execute("VACUUM bench_plain_archive")
    vacuum_ms = (time.perf_counter() - started) * 1000
    mib = bench.scalar("SELECT pg_total_relation_size('bench_plain_archive')") / 2**20
    conn.execute("DROP TABLE bench_plain_archive")
    return delete_ms, vacuum_ms, deleted, mib


def run(ctx: Context) -> list[Row]:
    bench = ctx.db
    rows = ctx.size(1_000_000, 200_000)
    label = f"{rows // 1_000_000}M" if rows >= 1_000_000 else f"{rows // 1000}k"
    plain: list[float] = []
    pruned: list[float] = []
    exported: list[float] = []
    details: dict[str, float | int] = {}
    for _ in range(ctx.runs(2)):
        say(f"  filling archived_jobs with {label} rows over {DAYS} daily partitions")
        _fill(bench, rows)
        delete_ms, vacuum_ms, deleted, plain_mib = _batched_delete(bench)
        before_mib = _archive_mib(bench)
        plain.append(delete_ms + vacuum_ms)
        say(
            f"  batched DELETE of {deleted:,} rows: {delete_ms:,.0f} ms + VACUUM {vacuum_ms:,.0f} ms"
        )
        ms, report = _prune(bench, None)
        pruned.append(ms)
        say(f"  prune: {len(report.pruned)} partitions, {report.rows:,} rows in {ms:,.1f} ms")
        details = {
            "archive_mib_before": round(before_mib, 1),
            "archive_mib_after_prune": round(_archive_mib(bench), 1),
            "plain_mib_after_delete_and_vacuum": round(plain_mib, 1),
            "rows": rows,
            "partitions_dropped": len(report.pruned),
            "rows_dropped": report.rows,
            "delete_ms": round(delete_ms, 1),
            "vacuum_ms": round(vacuum_ms, 1),
        }
        _fill(bench, rows)
        with tempfile.TemporaryDirectory(prefix="pgjobs-bench-prune-") as folder:
            ms, report = _prune(bench, Path(folder))
            written = sum(f.stat().st_size for f in Path(folder).iterdir())
        exported.append(ms)
        details["export_mib"] = round(written / 2**20, 1)
        say(f"  prune --export: {report.rows:,} rows, {written / 2**20:,.1f} MiB in {ms:,.0f} ms")
    bench.reset()
    reference = "batched DELETE (10k rows/txn) + VACUUM, unpartitioned copy"
    what = (
        f"{details['rows_dropped']:,} of {label} rows, {details['partitions_dropped']} partitions"
    )
    return [
        Row(
            "prune",
            f"pgjobs prune --older-than {KEEP_DAYS}d ({what})",
            Figure("ms", pruned),
            Figure("ms", plain),
            reference,
            None,
            f"no dead rows, nothing to vacuum; archive {details['archive_mib_before']} -> "
            f"{details['archive_mib_after_prune']} MiB (plain copy stays at "
            f"{details['plain_mib_after_delete_and_vacuum']} MiB)",
            details,
        ),
        Row(
            "prune",
            f"pgjobs prune --older-than {KEEP_DAYS}d --export DIR (CSV per partition)",
            Figure("ms", exported),
            Figure("ms", plain),
            reference,
            None,
            f"{details['export_mib']} MiB of CSV, fsynced before each drop",
            details,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prune", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL server URL (a throwaway database is created)")
    parser.add_argument("--quick", action="store_true", help="200k rows instead of 1M")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    server = normalize_dsn(args.dsn, "--dsn") if args.dsn else resolve_dsn(None)
    bench = BenchDatabase(server)
    try:
        with harness.procs() as group:
            rows = run(Context(bench, args.quick, args.repeats, group))
    finally:
        bench.drop()
    render(rows, [f"prune benchmark on {server.redacted}"], harness.progress)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
