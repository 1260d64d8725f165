"""How the commands print: times, ages, sizes and ratios, the rich tables of `pgjobs stats`, a
job's fields, and JSON for machines (the rows of `pgjobs dead`: ``render_dead``).

Times are printed in UTC, one way (``when``), or shortened for a table cell whose header says UTC
(``cell_time``).
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pgjobs.cli.messages import error as error
from pgjobs.cli.messages import warning as warning
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import (
    GroupHold,
    HoldReason,
    QueueGroups,
    QueueState,
    QueueStats,
    ScheduleInfo,
    Unloadable,
)
from pgjobs.rates import limits_text
from pgjobs.stats import Snapshot
from pgjobs.text import clipped, printable

# -- values --------------------------------------------------------------------------------------


def cell(text: str) -> str:
    """Job data for a rich table cell: control characters escaped, then rich markup."""
    return escape(printable(text))


def when(value: datetime | Unloadable | None, none: str = "-") -> str:
    """A time in UTC to the second: ``"2026-11-21 15:34:54 UTC"``; ``none`` for None; one
    Python cannot hold as PostgreSQL writes it (``"infinity"``)."""
    if isinstance(value, Unloadable):
        return printable(value.raw)
    return none if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def cell_time(value: datetime | Unloadable) -> str:
    """A time for a table cell (the header says UTC): the time alone when it is today."""
    if isinstance(value, Unloadable):
        return cell(value.raw)
    value = value.astimezone(UTC)
    if value.date() == datetime.now(UTC).date():
        return f"{value:%H:%M:%S}"
    return f"{value:%Y-%m-%d %H:%M}"


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
    """``size(2048) == "2.0 kB"``"""
    value = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def ratio(value: float | None) -> str:
    """A ratio as a percentage, whatever its size: ``ratio(0.053) == "5.3%"``,
    ``ratio(33) == "3,300%"``, ``ratio(None) == "-"``."""
    if value is None:
        return "-"
    return f"{value:.1%}" if value < 10 else f"{value:,.0%}"


# -- pgjobs stats --------------------------------------------------------------------------------


def wide_console() -> Console:
    """A console for tables: as wide as the terminal, or 140 columns into a pipe or file
    (rich's default of 80 would cut the headers of the stats tables)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=140)
    return console


def stats(snap: Snapshot, title: str, *, verbose: bool = False) -> RenderableType:
    """Everything `pgjobs stats` draws, as one rich renderable."""
    parts: list[RenderableType] = [_queues_table(snap, title)]
    parts.extend(groups_table(queue) for queue in snap.groups)
    parts.append(_workers_table(snap))
    if snap.schedules:
        parts.append(schedules_table(snap.schedules))
    if verbose:
        parts.append(_health_table(snap))
    return Group(*parts)


def _queues_table(snap: Snapshot, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    for column in ("ready", "scheduled", "waiting", "running", "dead", "done 1h", "failed 1h"):
        table.add_column(column, justify="right")
    table.add_column("jobs/s 1m", justify="right")
    table.add_column("retry 1m", justify="right")
    table.add_column("oldest ready", justify="right")
    unserved = set(snap.unserved)
    for s in snap.queues:
        name = cell(s.queue) + (" [bold yellow](paused)[/bold yellow]" if s.paused else "")
        if s.concurrency is not None or s.rate_jobs is not None:
            name += f" [cyan]({queue_limits(s)})[/cyan]"
        if s.queue in unserved:
            name += " [bold red](no live worker)[/bold red]"
        table.add_row(
            name,
            f"{s.ready:,}" + (f" [cyan]({s.held:,} held by limits)[/cyan]" if s.held else ""),
            f"{s.scheduled:,}",
            f"{s.waiting:,}",
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
    elif unserved:
        table.caption = (
            "no live worker serves the queues marked: their ready jobs wait until "
            "`pgjobs work` runs them"
        )
    return table


def schedules_table(schedules: list[ScheduleInfo]) -> Table:
    """The periodic schedules, with next and last run (`pgjobs schedule`, `pgjobs stats`)."""
    table = Table(title="schedules (times in UTC)", title_justify="left")
    for column in ("schedule", "task", "queue", "when", "timezone", "next run", "last run"):
        table.add_column(column)
    table.add_column("declared")
    table.add_column("paused")
    for s in schedules:
        table.add_row(
            cell(s.name),
            cell(s.task),
            cell(s.queue),
            cell(s.schedule),
            cell(s.timezone),
            cell_time(s.next_run_at),
            "-" if s.last_run_at is None else cell_time(s.last_run_at),
            "yes" if s.declared else "[yellow]no live worker declares it[/yellow]",
            "-" if s.paused_at is None else f"[red]paused[/red] {cell(s.paused_by or '')}",
        )
    if not schedules:
        table.caption = "no schedules: declare them with @app.periodic"
    return table


def queue_limits(state: QueueState | QueueStats) -> str:
    """A queue's limits in words: "at most 10 running, 100/s starts", or "-"."""
    if not isinstance(state, QueueState):
        return limits_text(state.concurrency, state.rate_jobs, state.rate_seconds) or "-"
    return (
        limits_text(
            state.concurrency,
            state.rate_jobs,
            state.rate_seconds,
            state.group_concurrency,
            state.group_rate_jobs,
            state.group_rate_seconds,
        )
        or "-"
    )


def groups_table(queue: QueueGroups) -> RenderableType:
    """A line of how many groups a queue has and how many are at their limit, then its groups
    with the most ready jobs and what holds their ready jobs back."""
    more = "+" if queue.groups_capped else ""
    title = (
        f"groups of {cell(queue.queue)}: {queue.groups:,}{more} group"
        f"{'' if queue.groups == 1 and not more else 's'}, {queue.at_limit:,} at "
        f"{'its' if queue.at_limit == 1 else 'their'} limit"
    )
    if queue.group_concurrency is not None:
        title += f" (at most {queue.group_concurrency} running per group)"
    table = Table()
    table.add_column("group")
    table.add_column("ready", justify="right")
    table.add_column("running", justify="right")
    table.add_column("at its limit")
    table.add_column("held by (times UTC)")
    for group in queue.top:
        table.add_row(
            cell(group.group_key),
            f"{group.ready:,}" + ("+" if group.ready_capped else ""),
            f"{group.running:,}",
            "[bold yellow]at limit[/bold yellow]" if group.at_limit else "no",
            "\n".join(hold_text(h) for h in group.held_by),
        )
    return Group(Text.from_markup(title, style="italic"), table)


def hold_text(hold: GroupHold) -> str:
    """What holds a group, for a table cell: "2 running jobs: 12, 13" or "ledger.post: job 12 waits
    for a retry at 15:34:54"."""
    ids = ", ".join(str(i) for i in hold.job_ids) + (
        ", ..." if hold.jobs > len(hold.job_ids) else ""
    )
    if hold.reason is HoldReason.LIMIT:
        return f"{hold.jobs:,} running job{'' if hold.jobs == 1 else 's'}: {ids}"
    task = cell(hold.task or "")
    if hold.reason is HoldReason.RUNNING:
        return f"{task}: job {ids} runs (ordered)"
    if hold.reason is HoldReason.DEAD:
        return f"{task}: dead job {ids} (redrive or purge it to release the group)"
    until = "" if hold.until is None else f" {cell_time(hold.until)}"
    if hold.reason is HoldReason.RATE:
        whose = f"{task}'s group rate" if hold.task else "the queue's group rate"
        starts = f"{hold.jobs:,} start{'' if hold.jobs == 1 else 's'}"
        return f"{whose} {hold.rate or ''}: {starts} in its window, the next at{until}"
    if hold.reason is HoldReason.RETRY:
        return f"{task}: job {ids} waits for a retry at{until} (ordered)"
    return f"{task}: job {ids} is scheduled for{until} (ordered)"


def queue_states_table(states: list[QueueState]) -> Table:
    """Every known queue and its settings (`pgjobs queue list`)."""
    table = Table(title="queues", title_justify="left")
    columns = (
        "queue",
        "state",
        "holds jobs",
        "limits",
        "paused since (UTC)",
        "paused by",
        "reason",
    )
    for column in columns:
        table.add_column(column)
    for q in states:
        table.add_row(
            cell(q.name),
            "[bold yellow]paused[/bold yellow]" if q.paused else "active",
            "yes" if q.has_jobs else "no",
            queue_limits(q),
            "-" if q.paused_at is None else cell_time(q.paused_at),
            cell(q.paused_by or "-"),
            cell(q.pause_reason or "-"),
        )
    if not states:
        table.caption = "no queue holds a job, none has settings"
    return table


def _workers_table(snap: Snapshot) -> RenderableType:
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
                cell(w.id),
                cell(w.host),
                str(w.pid),
                cell(",".join(w.queues)),
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


def _health_table(snap: Snapshot) -> RenderableType:
    table = Table(title="tables", title_justify="left")
    table.add_column("table")
    for column in ("live rows", "dead rows", "dead/live", "last autovacuum", "autovacuums"):
        table.add_column(column, justify="right")
    table.add_column("size", justify="right")
    for t in snap.tables or []:
        name = t.table + (f" ({t.partitions} partitions)" if t.partitions else "")
        dead = ratio(t.dead_ratio)
        if t.dead_ratio is not None and t.dead_ratio > 0.2:
            dead = f"[red]{dead}[/red]"
        table.add_row(
            name,
            f"{t.live_rows or 0:,}",
            f"{t.dead_rows or 0:,}",
            dead,
            when(t.last_autovacuum, none="never"),
            f"{t.autovacuum_count or 0:,}",
            size(t.total_bytes),
        )
    lines: list[RenderableType] = [table]
    for t in snap.tables or []:
        if t.options:
            lines.append(Text(f"{t.table} storage options: {', '.join(t.options)}", style="dim"))
    dated = [p for p in snap.partitions or [] if not p.is_default]
    if dated:
        oldest, newest = dated[0], dated[-1]
        since = "the beginning" if oldest.lower is None else when(oldest.lower)
        stranded = ""
        if snap.default_rows:
            stranded = (
                f"; [red]{snap.default_rows:,} row(s) in the DEFAULT partition[/red] (moved out "
                "by the archive-partitions service)"
            )
        lines.append(
            Text.from_markup(
                f"archived_jobs partitions: {len(dated)} from {since} to {when(newest.upper)}"
                f" (oldest {oldest.name}){stranded}"
            )
        )
    return Group(*lines)


# -- pgjobs dead and pgjobs job ------------------------------------------------------------------


def print_fields(fields: list[tuple[str, Any]]) -> None:
    """One ``name  value`` line per field that has a value (at most ``SHOWN_BYTES`` of it:
    ``--json`` prints the whole)."""
    for name, value in fields:
        if value is not None:
            typer.echo(f"  {name:<13}{printable(clipped(str(value)))}")


def print_block(title: str, text: str | None) -> None:
    """A multi-line text (an error, a traceback) under its title, indented; at most
    ``SHOWN_BYTES`` of it."""
    if text:
        typer.echo(f"{title}:")
        text = printable(clipped(text).replace("\r\n", "\n"), multiline=True)
        for line in text.rstrip("\n").split("\n"):
            typer.echo(f"  {line}")


def edit_changes(changes: dict[str, dict[str, Any]]) -> str:
    """What an edit changed, one field after another: ``priority 0 -> 7; tags a -> b, c``."""
    return "; ".join(
        f"{name} {_edited_value(change.get('old'))} -> {_edited_value(change.get('new'))}"
        for name, change in changes.items()
    )


def _edited_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and len(value) > 19 and value[10] == "T":
        with contextlib.suppress(ValueError):
            return when(datetime.fromisoformat(value))
    return str(value)


def redrives(count: int, last: datetime | None) -> str | None:
    """How often a job was redriven, for `show`; None when never."""
    return None if count == 0 else f"{count} time(s), last at {when(last)}"


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | Unloadable):  # a time Python cannot hold: as PostgreSQL has it
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as JSON, times in ISO 8601; ``indent=None`` for one line."""
    return json.dumps(value, indent=indent, default=_json_value)


def print_json(value: Any) -> None:
    """``value`` as indented JSON, times in ISO 8601."""
    typer.echo(json_text(value))


# -- pgjobs doctor -------------------------------------------------------------------------------

_DOCTOR_STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor_report(report: Any, title: str) -> None:
    """`pgjobs doctor`: one line per check (status, name, what was found), its fix indented
    under it, then the verdict. ``report`` is a ``pgjobs.doctor.Report``."""
    console = Console(highlight=False, soft_wrap=True)
    console.print(Text(printable(title), style="bold"))
    width = max((len(check.name) for check in report.checks), default=0)
    for check in report.checks:
        status = str(check.status)
        line = Text(f"{status.upper():<4}", style=_DOCTOR_STYLES.get(status, ""))
        line.append(f"  {check.name:<{width}}  {printable(check.message)}")
        console.print(line)
        if check.fix:
            console.print(Text(f"      {'':<{width}}  fix: {printable(check.fix)}", style="cyan"))
    summary = report.summary()
    verdict = {
        "pass": "every check passed",
        "warn": f"no check failed, {summary['warnings']} warning(s)",
        "fail": f"{summary['failed']} check(s) failed, {summary['warnings']} warning(s)",
    }[summary["status"]]
    console.print(Text(verdict, style=_DOCTOR_STYLES[summary["status"]]))
