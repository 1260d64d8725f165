"""`pgjobs migrate`: create, upgrade or downgrade pgjobs' tables, print their DDL or revision."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pgjobs import migrate as migrations
from pgjobs.cli.options import DsnOption, database


def migrate_command(
    dsn: DsnOption = None,
    revision: Annotated[
        str, typer.Option(help="Revision to upgrade to (or the range to print with --sql).")
    ] = "head",
    downgrade: Annotated[
        str | None,
        typer.Option(help="Downgrade to this revision instead ('base' removes pgjobs' tables)."),
    ] = None,
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the DDL instead of running it (no database).")
    ] = False,
    current: Annotated[
        bool, typer.Option("--current", help="Print the database's revision and exit.")
    ] = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 1 when the database is behind pgjobs' newest revision."),
    ] = False,
    lock_timeout: Annotated[
        str | None,
        typer.Option(
            help="Longest wait for a lock per statement, e.g. 5s, 500ms; 0 waits forever. "
            "Default: 5s.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create or upgrade pgjobs' tables (Alembic, shipped inside the package)."""
    if sql:
        target = downgrade if downgrade is not None else revision
        if downgrade is not None and ":" not in target:
            target = f"{migrations.head()}:{target}"
        sys.stdout.write(
            migrations.sql(target, downgrade=downgrade is not None, lock_timeout=lock_timeout)
        )
        return
    resolved = database(dsn)
    if current or check:
        now, head = migrations.current(resolved), migrations.head()
        typer.echo(f"current: {now or 'none (run `pgjobs migrate`)'}  head: {head}")
        if check and now != head:
            raise typer.Exit(1)
        return
    if downgrade is not None:
        change = migrations.downgrade(resolved, downgrade, lock_timeout=lock_timeout)
        verb = "downgraded"
    else:
        change = migrations.upgrade(resolved, revision, lock_timeout=lock_timeout)
        verb = "upgraded"
    before, after = change.before, change.after
    if before == after:
        where = f"head {after}" if after == migrations.head() else after or "none (no tables)"
        typer.echo(f"pgjobs schema already at {where} in {resolved.redacted}: nothing to do")
    else:
        if before is None:
            what = f"created at {after}"
        elif after is None:
            what = f"removed (was at {before})"
        else:
            what = f"{verb} {before} -> {after}"
        typer.echo(f"pgjobs schema {what} in {resolved.redacted}")
