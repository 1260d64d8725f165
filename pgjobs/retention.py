"""Retention of ``archived_jobs``: `pgjobs prune` detaches and drops whole partitions whose rows
all finished before a cutoff, optionally copying each one to a file first; ``apply`` does the
same for a retention policy (the retention service's round), with batched deletes where a
partition cannot go whole (dead_letter, queues with shorter periods, the DEFAULT partition).

Dropping a partition costs the same for ten rows or ten million: no row is deleted, nothing is
left for VACUUM, and the table never bloats. The DDL needs a brief ACCESS EXCLUSIVE lock on
``archived_jobs``. While prune waits for it, every worker's archive insert waits behind prune's
request in the lock queue: so each try waits at most ``LOCK_WAIT`` (tens of milliseconds) and
prune tries again after a pause, for as long as its ``lock_timeout`` allows. A long reader of the
archive makes prune wait, and workers stall at most ``LOCK_WAIT`` at each try.
``DETACH PARTITION ... CONCURRENTLY`` (PostgreSQL 14+) avoids even that lock, but PostgreSQL
refuses it while a DEFAULT partition exists; pgjobs keeps one (an insert must never fail), so
prune uses it only where the DEFAULT partition was dropped.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgjobs import archive, db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, LockTimeout, PgjobsError, SchemaMissing
from pgjobs.models import ArchivePartition
from pgjobs.retention_policy import RetentionPolicy

#: Export formats: file extension and COPY options.
EXPORT_FORMATS = {"csv": ("csv", "FORMAT csv, HEADER true"), "text": ("txt", "FORMAT text")}
#: Seconds one try at the lock on archived_jobs waits in the lock queue: the longest a worker's
#: archive insert, queued behind that request, stalls.
LOCK_WAIT = 0.05
#: Seconds between tries: doubling from the first value up to the second.
LOCK_PAUSE = (0.05, 1.0)


@dataclass(frozen=True, slots=True)
class PrunedPartition:
    """A partition that prune dropped (or, in a dry run, would drop)."""

    partition: ArchivePartition
    rows: int
    #: The file its rows were copied to, if exported.
    exported_to: Path | None
    #: Detached with DETACH ... CONCURRENTLY (only possible without a DEFAULT partition).
    concurrently: bool


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What one `pgjobs prune` did."""

    #: Partitions whose rows all finished before this instant were dropped.
    cutoff: datetime
    dry_run: bool
    pruned: list[PrunedPartition]
    #: Partitions holding rows on both sides of the cutoff, kept whole until their newest row is
    #: older than the cutoff (e.g. ``archived_jobs_legacy``, history converted by migration 0004).
    straddling: list[ArchivePartition]
    #: Rows of the DEFAULT partition older than the cutoff: the archive-partitions service moves
    #: them into partitions of their own days, which a later prune drops.
    default_rows_older: int

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pruned)


def prune(
    dsn: Dsn,
    older_than: timedelta,
    *,
    export: Path | None = None,
    export_format: str = "csv",
    dry_run: bool = False,
    lock_timeout: float = 60.0,
    on_pruned: Callable[[PrunedPartition], None] | None = None,
) -> PruneReport:
    """Drop the partitions of ``archived_jobs`` whose rows all finished more than ``older_than``
    ago, oldest first. With ``export``, each partition is first copied (``export_format``:
    ``csv`` with a header, or ``text``, COPY's own format) to ``export``: into a file per
    partition named after it when ``export`` is a directory, else appended to that file; the
    file is flushed to disk before the partition is dropped. ``lock_timeout`` (seconds) bounds
    how long prune keeps trying for the lock on ``archived_jobs`` for each partition; each try
    waits at most ``LOCK_WAIT``, so workers' inserts queued behind it are never held longer.

    Example: ``prune(resolve_dsn(None), timedelta(days=30), export=Path("/backup"))``
    """
    if export_format not in EXPORT_FORMATS:
        raise ConfigurationError(
            f"export format {export_format!r}: choose {' or '.join(EXPORT_FORMATS)}"
        )
    if not lock_timeout > 0:
        raise ConfigurationError(f"lock timeout must be > 0 seconds, got {lock_timeout}")
    if export is not None and not export.is_dir() and not export.parent.is_dir():
        raise ConfigurationError(f"--export {export}: folder {export.parent} does not exist")
    db.require_session(dsn, "pgjobs prune")
    with db.connect(dsn) as conn:
        _, partitioned, _ = db.fetch_all(conn, queries.ARCHIVE_STATE)[0]
        if not partitioned:
            raise SchemaMissing(
                "archived_jobs is not partitioned (schema older than 0004): run `pgjobs migrate`"
            )
        report = _prune_on(
            conn, older_than, export, export_format, dry_run, lock_timeout, on_pruned
        )
    if report is None:
        raise PgjobsError("another `pgjobs prune` is running on this database; try later")
    return report


def _prune_on(
    conn: psycopg.Connection[Any],
    older_than: timedelta,
    export: Path | None,
    export_format: str,
    dry_run: bool,
    lock_timeout: float,
    on_pruned: Callable[[PrunedPartition], None] | None,
    stopping: Callable[[], bool] | None = None,
) -> PruneReport | None:
    """``prune`` on ``conn`` (of a partitioned archive); None when another prune holds the
    turn. Leaves the session's lock_timeout at ``LOCK_WAIT``."""
    taken = db.fetch_all(
        conn, queries.ARCHIVE_PRUNE_TRY_LOCK, {"key": queries.ARCHIVE_PRUNE_LOCK_KEY}
    )[0][0]
    if not taken:
        return None
    try:
        wait = min(LOCK_WAIT, lock_timeout)
        db.fetch_all(conn, queries.LOCK_TIMEOUT_SESSION, {"timeout": f"{int(wait * 1000)}ms"})
        now: datetime = db.fetch_all(conn, queries.ARCHIVE_STATE)[0][2]
        cutoff = now - older_than
        partitions = archive.list_partitions(conn)
        default = archive.default_partition(partitions)
        # DETACH CONCURRENTLY cannot run while the table has a DEFAULT partition.
        concurrently = default is None
        default_rows_older = 0
        if default is not None:
            default_rows_older = archive.default_rows(conn, default, before=cutoff)
        pruned = []
        for partition in archive.finished_before(partitions, cutoff):
            if stopping is not None and stopping():
                break
            rows = archive.partition_rows(conn, partition)
            exported_to = None
            if export is not None and not dry_run:
                exported_to = _export(conn, partition.name, export, export_format)
            if not dry_run:
                _drop(conn, partition, concurrently=concurrently, patience=lock_timeout)
            done = PrunedPartition(partition, rows, exported_to, concurrently)
            pruned.append(done)
            if on_pruned is not None:
                on_pruned(done)
    finally:
        with contextlib.suppress(PgjobsError):  # a lost connection gave the turn back already
            db.fetch_all(
                conn, queries.ARCHIVE_PRUNE_UNLOCK, {"key": queries.ARCHIVE_PRUNE_LOCK_KEY}
            )
    straddling = archive.straddling(partitions, cutoff)
    return PruneReport(cutoff, dry_run, pruned, straddling, default_rows_older)


@dataclass(frozen=True, slots=True)
class Applied:
    """What one application of a retention policy removed."""

    #: Partitions of archived_jobs dropped, and the rows they held.
    partitions: int
    partition_rows: int
    #: Rows deleted in batches from archived_jobs: of queues with shorter periods of their own,
    #: and of its DEFAULT partition.
    archive_rows: int
    #: Rows deleted in batches from dead_letter.
    dead_rows: int


def apply(
    dsn: Dsn,
    policy: RetentionPolicy,
    *,
    batch_size: int = 1000,
    lock_timeout: float = 60.0,
    stopping: Callable[[], bool] | None = None,
) -> Applied:
    """Remove what ``policy`` keeps no longer, on one connection of its own: dead_letter's rows
    and those of archived_jobs' queues with a period of their own in batches of ``batch_size``
    (``DELETE ... LIMIT``, oldest first), then whole partitions of archived_jobs as ``prune``
    drops them, at the longest archive period of the policy (so no queue loses a row early); the
    rows of the DEFAULT partition past that period in batches too. With ``policy.export``, every
    row is copied to that folder before it goes: a partition to ``<partition>.csv``, deleted
    rows appended to ``archived_jobs.csv`` or ``dead_letter.csv`` (each batch flushed to disk
    before its delete commits). Partitions are left for the next time while a `pgjobs prune`
    runs. Once ``stopping()`` is true, the batch or partition at hand is the last.

    Example: ``apply(dsn, RetentionPolicy.of({"archive": "30d", "dead_letter": "90d"}))``
    """
    db.require_session(dsn, "the retention service")
    with db.connect(dsn) as conn:
        _, partitioned, now = db.fetch_all(conn, queries.ARCHIVE_STATE)[0]
        removal = _Removal(conn, policy, now, batch_size, stopping or (lambda: False))
        dead_rows = removal.by_queue("dead_letter", "failed_at", "dead_letter", False)
        archive_rows = removal.by_queue("archived_jobs", "finished_at", "archive", partitioned)
        periods = [q.archive for q in policy.queues.values() if q.archive is not None]
        longest = max([policy.archive, *periods]) if policy.archive is not None else None
        if longest is None or not partitioned:
            return Applied(0, 0, archive_rows, dead_rows)
        default = archive.default_partition(archive.list_partitions(conn))
        if default is not None:
            archive_rows += removal.delete(
                default.name, "finished_at", "archived_jobs", now - longest, None, []
            )
        report = _prune_on(
            conn, longest, policy.export, policy.format, False, lock_timeout, None, stopping
        )
    if report is None:
        return Applied(0, 0, archive_rows, dead_rows)
    return Applied(len(report.pruned), report.rows, archive_rows, dead_rows)


class _Removal:
    """The batched deletes of one application of a policy, on ``conn``."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        policy: RetentionPolicy,
        now: datetime,
        batch: int,
        stopping: Callable[[], bool],
    ) -> None:
        self.conn, self.policy, self.now, self.batch = conn, policy, now, batch
        self.stopping = stopping

    def by_queue(self, table: str, at: str, key: str, partitions: bool) -> int:
        """Delete the rows of ``table`` past the period ``key`` of each queue that has one, and
        of the other queues past the table's period unless whole ``partitions`` take them
        (their period is the longest); returns how many."""
        own = {q: getattr(p, key) for q, p in self.policy.queues.items() if getattr(p, key)}
        done = 0
        for queue, period in own.items():
            done += self.delete(table, at, table, self.now - period, [queue], [])
        period = getattr(self.policy, key)
        # The archive's other queues lose their rows with the partitions, unless a longer queue
        # period keeps those partitions.
        if period is not None and (not partitions or any(p > period for p in own.values())):
            done += self.delete(table, at, table, self.now - period, None, list(own))
        return done

    def delete(
        self,
        table: str,
        at: str,
        export_name: str,
        cutoff: datetime,
        queues: list[str] | None,
        kept: list[str],
    ) -> int:
        """Delete ``table``'s rows before ``cutoff`` (of ``queues``, none of ``kept``), a batch
        per transaction, exported to ``<export_name>`` first with an export; returns how
        many."""
        delete = sql.SQL(queries.RETENTION_DELETE_OLDER).format(
            table=sql.Identifier(table), at=sql.Identifier(at)
        )
        params = {"cutoff": cutoff, "queues": queues, "kept": kept, "limit": self.batch}
        done = 0
        while True:
            if self.policy.export is None:
                statement = sql.SQL(queries.RETENTION_DELETE_COUNT).format(delete=delete)
                count = int(db.fetch_all(self.conn, statement.as_string(self.conn), params)[0][0])
            else:
                count = self._delete_exported(delete, params, export_name)
            done += count
            if count < self.batch or self.stopping():
                return done

    def _delete_exported(self, delete: sql.Composed, params: dict[str, Any], name: str) -> int:
        """One batch, its rows appended to ``<export>/<name>.<ext>`` and flushed to disk before
        the delete commits; a failed write is cut off again and deletes nothing."""
        assert self.policy.export is not None
        extension, options = EXPORT_FORMATS[self.policy.format]
        target = self.policy.export / f"{name}.{extension}"
        existed = target.exists()
        start = target.stat().st_size if existed else 0
        if self.policy.format == "csv" and start > 0:
            options = "FORMAT csv"  # the header once, at the top of the file
        statement = sql.SQL(queries.RETENTION_DELETE_COPY_OUT).format(
            delete=delete, options=sql.SQL(options)
        )
        try:
            # The file is flushed to disk (``_durable`` closes first) before the delete commits.
            with (
                db.translate_errors(),
                self.conn.transaction(),
                _durable(target, "ab") as out,
                self.conn.cursor() as cur,
            ):
                with cur.copy(statement, params) as copy:
                    for chunk in copy:
                        out.write(bytes(chunk))
                count = max(cur.rowcount, 0)
        except BaseException:
            _cut(target, start, existed)
            raise
        if count == 0:
            _cut(target, start, existed)  # nothing deleted: not even a header written
        else:
            _fsync_dir(self.policy.export)
        return count


def _cut(path: Path, size: int, existed: bool) -> None:
    """Take back what a failed or empty export appended to ``path``: cut it to ``size`` bytes,
    or remove it when it did not exist before."""
    with contextlib.suppress(OSError):
        if not existed:
            path.unlink()
            return
        with open(path, "r+b") as out:
            out.truncate(size)


def _export(
    conn: psycopg.Connection[Any], partition: str, export: Path, export_format: str
) -> Path:
    """Copy one partition to its file; returns the file, flushed to disk."""
    extension, options = EXPORT_FORMATS[export_format]
    statement = sql.SQL(queries.ARCHIVE_PARTITION_COPY_OUT).format(
        partition=sql.Identifier(partition), options=sql.SQL(options)
    )
    if export.is_dir():
        # A whole file per partition: written aside, renamed into place once complete.
        target = export / f"{partition}.{extension}"
        partial = target.with_name(target.name + ".partial")
        with _durable(partial, "wb") as out:
            _copy(conn, statement, out.write)
        partial.replace(target)
        _fsync_dir(export)
        return target
    # Appended to one file: a failed copy is cut off again, so that a re-run does not append
    # the same rows twice. A CSV header is written only at the top of the file.
    start = export.stat().st_size if export.exists() else 0
    if export_format == "csv" and start > 0:
        options = "FORMAT csv"
        statement = sql.SQL(queries.ARCHIVE_PARTITION_COPY_OUT).format(
            partition=sql.Identifier(partition), options=sql.SQL(options)
        )
    try:
        with _durable(export, "ab") as out:
            _copy(conn, statement, out.write)
    except BaseException:
        with contextlib.suppress(OSError), open(export, "r+b") as out:
            out.truncate(start)
        raise
    _fsync_dir(export.parent)
    return export


def _copy(
    conn: psycopg.Connection[Any], statement: sql.Composed, write: Callable[[bytes], Any]
) -> None:
    with db.translate_errors(), conn.cursor() as cur, cur.copy(statement) as copy:
        for chunk in copy:
            write(bytes(chunk))


@contextlib.contextmanager
def _durable(path: Path, mode: str) -> Iterator[Any]:
    try:
        out = open(path, mode)  # noqa: SIM115 - closed below, after fsync
    except OSError as exc:
        raise ConfigurationError(f"cannot write the export to {path}: {exc.strerror}") from None
    try:
        yield out
        out.flush()
        os.fsync(out.fileno())
    finally:
        out.close()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop(
    conn: psycopg.Connection[Any],
    partition: ArchivePartition,
    *,
    concurrently: bool,
    patience: float,
) -> None:
    """Detach and drop one partition, trying again after a pause when a try at its lock times
    out (the session's lock_timeout, ``LOCK_WAIT``), for ``patience`` seconds in all."""
    name = sql.Identifier(partition.name)

    def detach_and_drop() -> None:
        with db.translate_errors():
            if partition.detach_pending:
                conn.execute(
                    sql.SQL(queries.ARCHIVE_PARTITION_DETACH_FINALIZE).format(partition=name)
                )
            elif concurrently:
                conn.execute(
                    sql.SQL(queries.ARCHIVE_PARTITION_DETACH_CONCURRENTLY).format(partition=name)
                )
            else:
                with conn.transaction():
                    conn.execute(queries.ARCHIVE_DDL_LOCK, {"key": queries.ARCHIVE_DDL_LOCK_KEY})
                    conn.execute(sql.SQL(queries.ARCHIVE_PARTITION_DETACH).format(partition=name))
                    # A drop fires no trigger: the partition's workflow histories go first.
                    conn.execute(sql.SQL(queries.WORKFLOW_FORGET_PARTITION).format(partition=name))
                    conn.execute(sql.SQL(queries.ARCHIVE_PARTITION_DROP).format(partition=name))
                return
            conn.execute(sql.SQL(queries.WORKFLOW_FORGET_PARTITION).format(partition=name))
            conn.execute(sql.SQL(queries.ARCHIVE_PARTITION_DROP).format(partition=name))

    deadline = time.monotonic() + patience
    pause, longest = LOCK_PAUSE
    attempt = 0
    while True:
        attempt += 1
        try:
            detach_and_drop()
            return
        except LockTimeout as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(
                    f"could not lock archived_jobs to drop {partition.name} in {attempt} "
                    f"tries over {patience:g} s ({exc}): a long transaction holds it; retry "
                    "later or pass a longer --lock-timeout"
                ) from exc
            time.sleep(min(pause, left))
            pause = min(pause * 2, longest)
