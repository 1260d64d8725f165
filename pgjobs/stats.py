"""What `pgjobs stats` shows: per-queue counts, throughput and retry rate over the last minute,
the live workers and the jobs each one runs, and (``--verbose``) the health of the tables.

``snapshot`` reads it all in one round of queries; ``render`` draws it with rich (once, or again
and again under ``--watch``); ``as_json`` gives it to machines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pgjobs import archive, db, queries
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import ArchivePartition, QueueStats, TableHealth, WorkerInfo


@dataclass(frozen=True, slots=True)
class OrphanedLeases:
    """Running jobs leased to workers that are not live (crashed, hung or cut off): their leases
    free them when they expire."""

    jobs: int
    owners: int
    #: Seconds until the first and the last of these leases expire (negative: already expired,
    #: waiting for the lease rescuer).
    first_expiry: float | None
    last_expiry: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One reading of everything `pgjobs stats` shows."""

    queues: list[QueueStats]
    workers: list[WorkerInfo]
    orphaned: OrphanedLeases
    #: Only with ``verbose``.
    tables: list[TableHealth] | None = None
    partitions: list[ArchivePartition] | None = None
    #: Rows in archived_jobs' DEFAULT partition (normally 0: the archive-partitions service
    #: creates each day's partition ahead of time).
    default_rows: int | None = None


def snapshot(conn: psycopg.Connection[Any], *, verbose: bool = False) -> Snapshot:
    """Read the queues, the live workers and, with ``verbose``, the tables' health.

    Example: ``snapshot(conn).queues[0].throughput``
    """
    # One snapshot for every query, so that running jobs add up across the tables.
    with db.translate_errors(), conn.transaction():
        conn.execute(queries.STATS_SNAPSHOT)
        return _read(conn, verbose)


def _read(conn: psycopg.Connection[Any], verbose: bool) -> Snapshot:
    stale = {"stale_after": STALE_AFTER}
    queues = [QueueStats(*row) for row in db.fetch_all(conn, queries.QUEUE_STATS)]
    workers = [WorkerInfo(*row) for row in db.fetch_all(conn, queries.WORKERS_LIVE, stale)]
    orphaned = OrphanedLeases(*db.fetch_all(conn, queries.LEASES_WITHOUT_LIVE_WORKER, stale)[0])
    if not verbose:
        return Snapshot(queues, workers, orphaned)
    tables = [TableHealth(*row) for row in db.fetch_all(conn, queries.TABLE_HEALTH)]
    partitions = archive.list_partitions(conn)
    default = archive.default_partition(partitions)
    default_rows = None if default is None else archive.default_rows(conn, default)
    return Snapshot(queues, workers, orphaned, tables, partitions, default_rows)


# -- JSON ----------------------------------------------------------------------------------------


def queue_json(stats: QueueStats) -> dict[str, Any]:
    """One queue as `pgjobs stats --json` prints it."""
    out = dataclasses.asdict(stats)
    out["throughput_per_second"] = round(stats.throughput, 3)
    out["retry_rate"] = None if stats.retry_rate is None else round(stats.retry_rate, 4)
    return out


def as_json(snap: Snapshot, *, verbose: bool = False) -> Any:
    """The list of queues; with ``verbose``, an object with queues, workers, orphaned leases,
    tables and partitions."""
    queues = [queue_json(q) for q in snap.queues]
    if not verbose:
        return queues
    return {
        "queues": queues,
        "workers": [dataclasses.asdict(w) for w in snap.workers],
        "orphaned_leases": dataclasses.asdict(snap.orphaned),
        "tables": [
            {**dataclasses.asdict(t), "dead_ratio": t.dead_ratio} for t in snap.tables or []
        ],
        "archive_partitions": [dataclasses.asdict(p) for p in snap.partitions or []],
        "archive_default_rows": snap.default_rows,
    }


# -- rich ----------------------------------------------------------------------------------------


def age(seconds: float | None) -> str:
    """``age(75) == "75.0s"``, ``age(300) == "5.0m"``, ``age(None) == "-"``"""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def size(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def queues_table(snap: Snapshot, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    for column in ("ready", "scheduled", "running", "dead", "done 1h", "failed 1h"):
        table.add_column(column, justify="right")
    table.add_column("jobs/s 1m", justify="right")
    table.add_column("retry 1m", justify="right")
    table.add_column("oldest ready", justify="right")
    for s in snap.queues:
        table.add_row(
            escape(s.queue),
            f"{s.ready:,}",
            f"{s.scheduled:,}",
            f"{s.running:,}",
            f"[red]{s.dead:,}[/red]" if s.dead else "0",
            f"{s.finished_last_hour:,}",
            f"[red]{s.failed_last_hour:,}[/red]" if s.failed_last_hour else "0",
            f"{s.throughput:,.1f}",
            "-" if s.retry_rate is None else f"{s.retry_rate:.0%}",
            age(s.oldest_ready_age),
        )
    if not snap.queues:
        table.caption = "no jobs yet"
    return table


def workers_table(snap: Snapshot) -> RenderableType:
    if not snap.workers:
        table: RenderableType = Text("no live workers", style="yellow")
    else:
        grid = Table(title="live workers", title_justify="left")
        grid.add_column("worker")
        grid.add_column("host")
        grid.add_column("pid", justify="right")
        grid.add_column("queues")
        for column in ("concurrency", "running", "up", "last seen"):
            grid.add_column(column, justify="right")
        for w in snap.workers:
            grid.add_row(
                escape(w.id),
                escape(w.host),
                str(w.pid),
                escape(",".join(w.queues)),
                str(w.concurrency),
                f"{w.running:,}",
                age(w.uptime),
                f"{age(w.last_seen_age)} ago",
            )
        table = grid
    orphaned = snap.orphaned
    if not orphaned.jobs:
        return table
    first, last = max(orphaned.first_expiry or 0, 0), orphaned.last_expiry or 0
    if last <= 0:
        expiry = "their leases have expired; the lease rescuer frees them"
    elif last - first < 1:
        expiry = f"their leases expire in {age(last)}"
    else:
        expiry = f"their leases expire in {age(first)} to {age(last)}"
    note = Text(
        f"{orphaned.jobs:,} running job(s) leased to {orphaned.owners} worker(s) that are not "
        f"live (no heartbeat for {STALE_AFTER:.0f}s): {expiry}",
        style="red",
    )
    return Group(table, note)


def health_table(snap: Snapshot) -> RenderableType:
    table = Table(title="tables", title_justify="left")
    table.add_column("table")
    for column in ("live rows", "dead rows", "dead/live", "last autovacuum", "autovacuums"):
        table.add_column(column, justify="right")
    table.add_column("size", justify="right")
    for t in snap.tables or []:
        name = t.table + (f" ({t.partitions} partitions)" if t.partitions else "")
        ratio = "-" if t.dead_ratio is None else f"{t.dead_ratio:.1%}"
        if t.dead_ratio is not None and t.dead_ratio >= 10:
            ratio = f"{t.dead_ratio:,.0f}x"
        if t.dead_ratio is not None and t.dead_ratio > 0.2:
            ratio = f"[red]{ratio}[/red]"
        table.add_row(
            name,
            f"{t.live_rows or 0:,}",
            f"{t.dead_rows or 0:,}",
            ratio,
            _when(t.last_autovacuum),
            f"{t.autovacuum_count or 0:,}",
            size(t.total_bytes),
        )
    lines: list[RenderableType] = [table]
    for t in snap.tables or []:
        if t.options:
            lines.append(Text(f"{t.table} storage options: {', '.join(t.options)}", style="dim"))
    partitions = snap.partitions or []
    dated = [p for p in partitions if not p.is_default]
    if dated:
        oldest, newest = dated[0], dated[-1]
        since = "the beginning" if oldest.lower is None else _when(oldest.lower)
        stranded = ""
        if snap.default_rows:
            stranded = (
                f"; [red]{snap.default_rows:,} row(s) in the DEFAULT partition[/red] (moved out "
                "by the archive-partitions service)"
            )
        lines.append(
            Text.from_markup(
                f"archived_jobs partitions: {len(dated)} from {since} to {_when(newest.upper)}"
                f" (oldest {oldest.name}){stranded}"
            )
        )
    return Group(*lines)


def render(snap: Snapshot, title: str, *, verbose: bool = False) -> RenderableType:
    """Everything `pgjobs stats` draws, as one rich renderable."""
    parts: list[RenderableType] = [queues_table(snap, title), workers_table(snap)]
    if verbose:
        parts.append(health_table(snap))
    return Group(*parts)
