"""`pgjobs prune`: drop whole partitions of archived_jobs older than a cutoff."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgjobs import retention
from pgjobs.cli import parse
from pgjobs.cli.options import DsnOption, database
from pgjobs.cli.render import when


def prune_command(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Drop the archive partitions whose jobs all finished longer ago than this "
            "age: 30d, 12h, 2w...",
            show_default=False,
        ),
    ],
    export: Annotated[
        Path | None,
        typer.Option(
            help="Copy each partition out before dropping it: into FOLDER/<partition>.csv when "
            "this is a folder, else appended to this file.",
            metavar="FILE|FOLDER",
        ),
    ] = None,
    export_format: Annotated[
        str, typer.Option("--format", help="Export format: csv (with a header) or text (COPY's).")
    ] = "csv",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be dropped; drop nothing.")
    ] = False,
    lock_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to keep trying for the lock on archived_jobs, per partition. Each try "
            "waits at most 50 ms, so workers' archive inserts queued behind it stall no longer.",
            min=0.01,
        ),
    ] = 60.0,
    dsn: DsnOption = None,
) -> None:
    """Drop whole partitions of archived_jobs older than a cutoff (optionally exported first)."""
    age = parse.age("--older-than", older_than)
    resolved = database(dsn)
    verb = "would drop" if dry_run else "dropped"

    def report(done: retention.PrunedPartition) -> None:
        p = done.partition
        since = "the beginning" if p.lower is None else when(p.lower)
        line = f"{verb} {p.name} ({since} .. {when(p.upper)}): {done.rows:,} rows"
        if done.exported_to is not None:
            line += f", exported to {done.exported_to}"
        typer.echo(line)

    result = retention.prune(
        resolved,
        age,
        export=export,
        export_format=export_format,
        dry_run=dry_run,
        lock_timeout=lock_timeout,
        on_pruned=report,
    )
    typer.echo(
        f"{verb} {len(result.pruned)} partition(s), {result.rows:,} rows finished before "
        f"{when(result.cutoff)}"
    )
    for p in result.straddling:
        typer.echo(
            f"kept {p.name}: it also holds jobs finished after the cutoff (until "
            f"{when(p.upper)}); it goes once all of them are older than {older_than}"
        )
    if result.default_rows_older:
        typer.echo(
            f"kept {result.default_rows_older:,} old row(s) of the DEFAULT partition: workers "
            "move them into partitions of their own days, which the next prune drops"
        )
