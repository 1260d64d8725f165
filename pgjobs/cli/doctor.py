"""`pgjobs doctor`: checks the database and the deployment around it, one line per check (pass,
warn, fail, skip) with the fix; ``--json`` for machines. Exit 0 when nothing failed (warnings
included), 1 when a check failed, 2 on bad input."""

from __future__ import annotations

from typing import Annotated

import typer

from pgjobs import doctor
from pgjobs.cli import pooler as cli_pooler
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.cli.pooler import PoolerOption
from pgjobs.db.project import find_project


def doctor_command(
    dsn: DsnOption = None,
    as_json: JsonFlag = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Planning input: how many `pgjobs work` processes the connection budget must "
            "hold (default: the live workers).",
            show_default=False,
        ),
    ] = None,
    connections_per_worker: Annotated[
        int | None,
        typer.Option(
            "--connections-per-worker",
            help=f"Planning input, with --workers: connections each worker holds "
            f"(default {doctor.WORKER_CONNECTIONS}: two claim connections, one LISTEN, two for "
            "maintenance).",
            show_default=False,
        ),
    ] = None,
    pooler: PoolerOption = None,
) -> None:
    """Check the database for what pgjobs needs: schema, autovacuum, vacuum held back, NOTIFY
    queue, poolers, connection budget, archive partitions and retention, stale workers and
    orphaned leases."""
    # Checked as the workers and `pgjobs serve` would run: --pooler, else $PGJOBS_POOLER.
    cli_pooler.apply(pooler, None)
    plan = doctor.Plan(workers=workers, connections_per_worker=connections_per_worker)
    resolved = database(dsn)
    project = find_project()
    retention = project.retention if project is not None else None
    report = doctor.diagnose(resolved, plan=plan, retention=retention)
    if as_json:
        render.print_json(report.as_json())
    else:
        render.doctor_report(report, f"pgjobs doctor ({resolved.redacted})")
    if report.exit_code:
        raise typer.Exit(report.exit_code)
