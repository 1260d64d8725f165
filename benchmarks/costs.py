"""Group q: what each part of pgjobs' schema costs per processed job, one change at a time.

The loop is pgjobs' own worker statement (``queries.JOB_SUCCEED_AND_CLAIM``: archive the last
batch of 100, claim the next) run by a lean client on pgjobs' own tables, so that the server's
work is the worker's and the client's is next to nothing. Each variant changes one thing, and
each of its runs is paired with a run of the unchanged loop just before it (the ratio is read
within the pair, so drift on a shared machine cancels out):

* each index of ``queued_jobs`` but its primary key and the claim's, dropped (listed from
  pg_indexes, so a new index is measured without a change here), then all of them at once;
* each index of ``archived_jobs``, dropped; then none at all (as the narrow reference's archive);
* the trigger on ``archived_jobs`` (``pgjobs_job_ended``: its WHEN is evaluated for every row);
* the archive insert carrying only the narrow reference's columns instead of every column a job
  takes with it (``queries._MOVED_COLUMNS``);
* the archive insert going straight to today's partition instead of through the parent;
* a fill factor on ``queued_jobs``;
* the lean statement of ``benchmarks/raw.py`` (``ARCHIVE_AND_CLAIM``) instead of pgjobs' own.

Each row prints the variant's rate against the unchanged loop's, and in its note PostgreSQL's
CPU per job against it (the backends' CPU from /proc, as group f reads it) and the share of the
updates of ``queued_jobs`` that were HOT (heap-only: no index entry written). A last row puts
`pgjobs work` and the unchanged loop beside the narrow reference, with their HOT shares.

The consumer runs as a subprocess::

    python -m benchmarks.costs --dsn URL [--statement pgjobs|narrow_columns|partition|lean]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks import QUEUE, harness, raw
from benchmarks.harness import BenchmarkError, Context, say
from benchmarks.report import Figure, Row
from pgjobs import queries
from pgjobs.completer.arrays import int_array
from pgjobs.completer.params import ClaimParams
from pgjobs.models import ArchivedStatus

#: The archive insert of pgjobs' worker statement, as ``queries._SUCCEED_MANY`` writes it.
_ARCHIVE_INSERT = (
    f"INSERT INTO archived_jobs ({queries._MOVED_COLUMNS}, status, result, last_error, worker)\n"
    f"    SELECT {queries._MOVED_COLUMNS}, '{ArchivedStatus.SUCCEEDED}', result, last_error, "
    "lease_owner FROM succeeded"
)

#: The same insert with only the columns the narrow reference's archive has.
_NARROW_COLUMNS = "id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at"
_ARCHIVE_INSERT_NARROW = (
    f"INSERT INTO archived_jobs ({_NARROW_COLUMNS}, status, worker)\n"
    f"    SELECT {_NARROW_COLUMNS}, '{ArchivedStatus.SUCCEEDED}', lease_owner FROM succeeded"
)


def statement(kind: str, partition: str) -> str:
    """The worker statement of a consumer ``kind`` (``partition``: today's archive partition)."""
    pgjobs = queries.JOB_SUCCEED_AND_CLAIM
    if _ARCHIVE_INSERT not in pgjobs:
        raise BenchmarkError("the archive insert of JOB_SUCCEED_AND_CLAIM changed: update costs.py")
    if kind == "narrow_columns":
        return pgjobs.replace(_ARCHIVE_INSERT, _ARCHIVE_INSERT_NARROW)
    if kind == "partition":
        return pgjobs.replace("INSERT INTO archived_jobs (", f"INSERT INTO {partition} (")
    return pgjobs


def _worker_trip(
    conn: psycopg.Connection[Any], kind: str, owner: str, batch: int
) -> tuple[str, dict[str, Any]]:
    """Statement ``kind`` and the parameters of its first trip (nothing to archive yet, claim
    ``batch``), on ``conn`` set up as the worker's claim connections are: one generic plan,
    timestamps in UTC."""
    conn.execute(queries.SESSION_HOT)
    row = conn.execute(
        "SELECT 'archived_jobs_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')"
    ).fetchone()
    assert row is not None
    params = ClaimParams(owner, [QUEUE]).bind(batch)
    params.update(ok_ids="{}", ok_attempts="{}", ok_results=None)
    return statement(kind, row[0]), params


def consume(dsn: str, kind: str, batch: int, cpu_file: str | None = None) -> None:
    """Archive the last batch and claim the next with statement ``kind`` until no job is ready;
    with ``cpu_file``, write there the CPU seconds its backend used from connection to the end
    (read from /proc: the server is on this machine), exact where sampling from outside would
    miss the last tens of milliseconds of a short run."""
    owner = f"costs:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.info.backend_pid
        started = harness.process_cpu(backend) if cpu_file else None
        if kind == "lean":
            params: dict[str, Any] = {"owner": owner, "queue": QUEUE, "limit": batch, "ids": []}
            while jobs := conn.execute(raw.ARCHIVE_AND_CLAIM, params, prepare=True).fetchall():
                params["ids"] = [job[0] for job in jobs]
        else:
            query, params = _worker_trip(conn, kind, owner, batch)
            while True:
                rows = conn.execute(query, params, prepare=True).fetchall()
                jobs = rows[:-1]  # the last row is the trip's: what it archived, its status
                if not jobs:
                    break
                params["ok_ids"] = int_array([job[0] for job in jobs])
                params["ok_attempts"] = int_array([job[6] for job in jobs])
        ended = harness.process_cpu(backend) if cpu_file else None
    if cpu_file and started is not None and ended is not None:
        with open(cpu_file, "w") as out:
            out.write(f"{ended - started!r}\n")


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(found for child in node.get("Plans", []) for found in _walk(child))]


def _counts(plan: dict[str, Any]) -> list[float]:
    """Buffers, dirtied buffers, WAL records, bytes and full-page images of a whole statement
    from its EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON): the top node, plus each CTE no part
    of the statement reads (PostgreSQL runs those after the top node, outside its counts)."""
    nodes = _walk(plan)
    read = {node["CTE Name"] for node in nodes if "CTE Name" in node}
    counted = [plan]
    for node in nodes:
        name = node.get("Subplan Name", "")
        if name.startswith("CTE ") and name.removeprefix("CTE ") not in read:
            counted.append(node)
    keys = ("Shared Hit Blocks", "Shared Dirtied Blocks", "WAL Records", "WAL Bytes", "WAL FPI")
    return [sum(node[key] for node in counted) for key in keys]


def explain_trip(dsn: str, kind: str, batch: int = 100) -> dict[str, float]:
    """Buffers and WAL per job of one trip (archive ``batch`` jobs, claim ``batch``) of the
    consumer ``kind`` (or "narrow": the narrow reference) from EXPLAIN (ANALYZE, BUFFERS, WAL)
    after a few trips: counts, not times, so the same on a busy machine as on a quiet one. Needs
    at least 7 batches of ready jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        params: dict[str, Any] = {"owner": "costs", "queue": QUEUE, "limit": batch, "ids": []}
        if kind in ("lean", "narrow"):
            query = raw.ARCHIVE_AND_CLAIM if kind == "lean" else raw.NARROW_TRIP
            for _ in range(6):
                rows = conn.execute(query, params, prepare=True).fetchall()
                params["ids"] = [job[0] for job in rows]
        else:
            query, params = _worker_trip(conn, kind, "costs:explain", batch)
            for _ in range(6):  # past the custom plans, to the generic one the worker runs
                rows = conn.execute(query, params, prepare=True).fetchall()[:-1]
                params["ok_ids"] = int_array([job[0] for job in rows])
                params["ok_attempts"] = int_array([job[6] for job in rows])
        explained = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF, FORMAT JSON) " + query, params
        ).fetchone()
        assert explained is not None
    counts = _counts(explained[0][0]["Plan"])
    names = ("buffers", "dirtied", "wal_records", "wal_bytes", "wal_fpi")
    return {name: value / batch for name, value in zip(names, counts, strict=True)}


@dataclass(frozen=True, slots=True)
class Variant:
    """One change to the unchanged loop: DDL run before the fill (``setup``) and after the run
    (``undo``), and the consumer's statement."""

    name: str
    setup: tuple[str, ...] = ()
    undo: tuple[str, ...] = ()
    statement: str = "pgjobs"


@dataclass(frozen=True, slots=True)
class Run:
    rate: float
    #: PostgreSQL CPU per job (µs), None when the server is not on this machine.
    pg_us: float | None
    #: Updates of queued_jobs during the run, and how many of them were HOT.
    updates: int
    hot: int


#: The unchanged loop.
BASE = Variant("pgjobs' worker statement, pgjobs' full schema")


def _recreate(indexdef: str) -> str:
    # An index of the partitioned archive is listed ON ONLY the parent: recreated on the
    # partitions too.
    return indexdef.replace(" ON ONLY ", " ON ")


def variants(db: harness.BenchDatabase) -> list[Variant]:
    """The variants, the indexes read from the migrated database."""
    indexes = db.conn.execute(
        "SELECT tablename, indexname, indexdef FROM pg_indexes "
        "WHERE schemaname = current_schema() AND tablename IN ('queued_jobs', 'archived_jobs') "
        "ORDER BY tablename DESC, indexname"
    ).fetchall()
    result = []
    queued = [
        (name, definition)
        for table, name, definition in indexes
        if table == "queued_jobs" and name not in ("pk_queued_jobs", "ix_queued_jobs_claim")
    ]
    for name, definition in queued:
        result.append(
            Variant(f"queued_jobs without {name}", (f"DROP INDEX {name}",), (definition,))
        )
    result.append(
        Variant(
            f"queued_jobs without its {len(queued)} indexes above (primary key and claim's kept)",
            tuple(f"DROP INDEX {name}" for name, _ in queued),
            tuple(definition for _, definition in queued),
        )
    )
    archived = [(name, d) for table, name, d in indexes if table == "archived_jobs"]
    for name, definition in archived:
        drop = (
            "ALTER TABLE archived_jobs DROP CONSTRAINT pk_archived_jobs"
            if name == "pk_archived_jobs"
            else f"DROP INDEX {name}"
        )
        undo = (
            "ALTER TABLE archived_jobs ADD CONSTRAINT pk_archived_jobs "
            "PRIMARY KEY (id, finished_at)"
            if name == "pk_archived_jobs"
            else _recreate(definition)
        )
        result.append(Variant(f"archived_jobs without {name}", (drop,), (undo,)))
    result.append(
        Variant(
            "archived_jobs without any index (as the narrow archive)",
            tuple(v.setup[0] for v in result[-len(archived) :]),
            tuple(v.undo[0] for v in result[-len(archived) :]),
        )
    )
    trigger = db.scalar(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
        "WHERE tgrelid = 'archived_jobs'::regclass AND tgname = 'pgjobs_job_ended'"
    )
    if trigger:
        result.append(
            Variant(
                "archived_jobs without the trigger pgjobs_job_ended",
                ("DROP TRIGGER pgjobs_job_ended ON archived_jobs",),
                (trigger,),
            )
        )
    result.append(Variant("archive insert of the narrow columns only", statement="narrow_columns"))
    result.append(Variant("archive insert straight into today's partition", statement="partition"))
    for fill in (90, 80, 70):
        result.append(
            Variant(
                f"queued_jobs with fillfactor {fill}",
                (f"ALTER TABLE queued_jobs SET (fillfactor = {fill})",),
                ("ALTER TABLE queued_jobs RESET (fillfactor)",),
            )
        )
    result.append(Variant("raw.py's lean one-trip statement, same schema", statement="lean"))
    return result


def _updates(db: harness.BenchDatabase, table: str) -> tuple[int, int]:
    schema, _, name = table.rpartition(".")
    row = db.conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = coalesce(nullif(%s, ''), current_schema()) AND relname = %s",
        (schema, name),
    ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def run_once(ctx: Context, variant: Variant | str, jobs: int) -> Run:
    """Process ``jobs`` pre-filled jobs with ``variant`` (or "worker": `pgjobs work`, "narrow":
    the narrow reference) and read its rate, PostgreSQL CPU and HOT updates."""
    db = ctx.db
    db.reset()
    cpu_file = os.path.join(tempfile.gettempdir(), f"pgjobs-bench-costs-{os.getpid()}.cpu")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cpu_file)
    if variant == "narrow":
        raw.narrow_reset(db.conn)
        marker = raw.narrow_fill(db.conn, jobs)
        command = harness.raw_client("narrow", db.url, "--batch", "100")
        table = "narrow.queued_jobs"
    else:
        if isinstance(variant, Variant):
            for ddl in variant.setup:
                db.conn.execute(ddl)
            command = [sys.executable, "-m", "benchmarks.costs", "--dsn", db.url]
            command += ["--statement", variant.statement, "--cpu-file", cpu_file]
        else:
            command = harness.pgjobs_worker(db.url, 32)
        marker = db.fill_ready(jobs)
        table = "queued_jobs"
    before = _updates(db, table)
    proc = ctx.procs.start(command)
    try:
        # Counted from the consumer's first connection on (a short run would end before
        # BackendCpu lists new backends), so its start-up is left out.
        harness.wait_until(
            lambda: bool(db.other_backends()) or proc.poll() is not None, 30, "a connection", 0.005
        )
        cpu = harness.BackendCpu(db) if db.local else None
        deadline = time.monotonic() + 120 + jobs / 300
        while proc.poll() is None:
            if cpu is not None:
                cpu.sample()
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{proc.describe()} still running after the deadline")
            time.sleep(0.02)
        if proc.returncode != 0:
            raise BenchmarkError(f"{proc.describe()} exited with {proc.returncode}")
        db.wait_for_disconnects()
    finally:
        if isinstance(variant, Variant):
            for ddl in variant.undo:
                db.conn.execute(ddl)
    window = db.archived_window(
        marker, "narrow.archived_jobs" if variant == "narrow" else "archived_jobs"
    )
    if window.count != jobs:
        raise BenchmarkError(f"{window.count} of {jobs} jobs archived: {proc.describe()}")
    after = _updates(db, table)
    pg_cpu = None if cpu is None else cpu.seconds()
    if os.path.exists(cpu_file):  # the consumer's own reading of its backend, when it made one
        with open(cpu_file) as reading:
            pg_cpu = float(reading.read())
        os.unlink(cpu_file)
    return Run(
        window.rate,
        None if pg_cpu is None else pg_cpu / jobs * 1e6,
        after[0] - before[0],
        after[1] - before[1],
    )


def counts(ctx: Context, variant: Variant | str) -> dict[str, float]:
    """``explain_trip`` of ``variant`` (or "narrow") on 1,000 ready jobs."""
    db = ctx.db
    db.reset()
    if variant == "narrow":
        raw.narrow_reset(db.conn)
        raw.narrow_fill(db.conn, 1_000)
        return explain_trip(db.url, "narrow")
    assert isinstance(variant, Variant)
    for ddl in variant.setup:
        db.conn.execute(ddl)
    try:
        db.fill_ready(1_000)
        return explain_trip(db.url, variant.statement)
    finally:
        for ddl in variant.undo:
            db.conn.execute(ddl)


def _per_job(found: dict[str, float]) -> str:
    return (
        f"{found['wal_records']:.1f} WAL records, {found['wal_bytes']:.0f} WAL bytes, "
        f"{found['buffers']:.1f} buffers"
    )


def _hot(runs: list[Run]) -> str:
    updates = sum(run.updates for run in runs)
    return f"{sum(run.hot for run in runs) / updates:.0%}" if updates else "n/a"


def _cpu(runs: list[Run]) -> float | None:
    known = [run.pg_us for run in runs if run.pg_us is not None]
    return statistics.median(known) if known else None


def _paired(pairs: list[tuple[Run, Run]]) -> tuple[float, float | None]:
    """Median ratios variant/unchanged of the rate and of PostgreSQL CPU per job, pair by pair."""
    rate = statistics.median(v.rate / b.rate for b, v in pairs)
    cpu = [v.pg_us / b.pg_us for b, v in pairs if v.pg_us and b.pg_us]
    return rate, statistics.median(cpu) if cpu else None


def run(ctx: Context) -> list[Row]:
    jobs = ctx.size(30_000, 20_000)
    listed = variants(ctx.db)
    pairs: dict[str, list[tuple[Run, Run]]] = {v.name: [] for v in listed}
    others: dict[str, list[Run]] = {"worker": [], "narrow": [], "base": []}
    explained = {v.name: counts(ctx, v) for v in [BASE, *listed]}
    explained["narrow"] = counts(ctx, "narrow")
    say(f"  per job: {BASE.name}: {_per_job(explained[BASE.name])}")
    say(f"  per job: narrow: {_per_job(explained['narrow'])}")
    for repeat in range(ctx.repeats):
        say(f"  round {repeat + 1} of {ctx.repeats}: {len(listed)} variants, each after the base")
        for name in ("worker", "narrow", "base"):
            others[name].append(run_once(ctx, BASE if name == "base" else name, jobs))
        for variant in listed:
            base = run_once(ctx, BASE, jobs)
            changed = run_once(ctx, variant, jobs)
            pairs[variant.name].append((base, changed))
            said = (
                f", PG CPU {changed.pg_us / base.pg_us:.2f}x"
                if changed.pg_us and base.pg_us
                else ""
            )
            say(f"    {variant.name}: rate {changed.rate / base.rate:.2f}x{said}")
    rows = []
    for variant in listed:
        done = pairs[variant.name]
        rate, cpu = _paired(done)
        base_cpu, var_cpu = _cpu([b for b, _ in done]), _cpu([v for _, v in done])
        cpu_note = (
            "PG CPU/job n/a"
            if cpu is None or base_cpu is None or var_cpu is None
            else f"PG CPU/job {cpu:.2f}x ({var_cpu:.1f} vs {base_cpu:.1f} µs)"
        )
        rows.append(
            Row(
                "costs",
                variant.name,
                Figure("jobs/s", [v.rate for _, v in done]),
                Figure("jobs/s", [b.rate for b, _ in done]),
                BASE.name,
                note=(
                    f"paired: rate {rate:.2f}x, {cpu_note}; HOT updates "
                    f"{_hot([v for _, v in done])}; per job (EXPLAIN of one trip): "
                    f"{_per_job(explained[variant.name])} (full schema: "
                    f"{_per_job(explained[BASE.name])})"
                ),
                details={
                    "rate_ratio": rate,
                    "pg_cpu_ratio": cpu,
                    "pg_cpu_us": [v.pg_us for _, v in done],
                    "base_pg_cpu_us": [b.pg_us for b, _ in done],
                    "updates": sum(v.updates for _, v in done),
                    "hot_updates": sum(v.hot for _, v in done),
                    "per_job": explained[variant.name],
                },
            )
        )
    rows.append(_summary(others, explained[BASE.name], explained["narrow"]))
    return rows


def _summary(
    runs: dict[str, list[Run]], base_counts: dict[str, float], narrow_counts: dict[str, float]
) -> Row:
    """`pgjobs work` (--concurrency 32) and the unchanged loop beside the narrow reference."""
    worker, base, narrow = runs["worker"], runs["base"], runs["narrow"]

    def cpu(runs: list[Run]) -> str:
        value = _cpu(runs)
        return "n/a" if value is None else f"{value:.1f} µs"

    return Row(
        "costs",
        "1 process, --concurrency 32, beside the narrow loop",
        Figure("jobs/s", [run.rate for run in worker]),
        Figure("jobs/s", [run.rate for run in base]),
        BASE.name,
        note=(
            f"PG CPU/job: pgjobs {cpu(worker)}, its statement {cpu(base)}, narrow {cpu(narrow)}; "
            f"HOT updates of queued_jobs: pgjobs {_hot(worker)}, its statement {_hot(base)}, "
            f"narrow {_hot(narrow)}; per job (EXPLAIN of one trip): full schema "
            f"{_per_job(base_counts)}, narrow {_per_job(narrow_counts)}"
        ),
        narrow=Figure("jobs/s", [run.rate for run in narrow]),
        narrow_name="the narrow loop, 1 process",
        details={
            name: {"pg_cpu_us": [r.pg_us for r in value], "hot": [r.hot for r in value]}
            for name, value in runs.items()
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument(
        "--statement", choices=["pgjobs", "narrow_columns", "partition", "lean"], default="pgjobs"
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--cpu-file", help="write the backend's CPU seconds there")
    args = parser.parse_args()
    consume(args.dsn, args.statement, args.batch, args.cpu_file)


if __name__ == "__main__":
    main()
