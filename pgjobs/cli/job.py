"""`pgjobs job show`, `pgjobs replay` and `pgjobs cancel`: one job, wherever it is."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Annotated

import typer

from pgjobs import admin
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JobIdArgument, JsonFlag, database
from pgjobs.models import JobHistory, JobStatus

job_cli = typer.Typer(help="Look up one job wherever it is.", no_args_is_help=True)


@job_cli.command("show")
def job_show_command(
    job_id: JobIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """A job wherever it is (queued, archived or dead), and its whole story."""
    job = admin.job(database(dsn), job_id)
    if as_json:
        render.print_json(dataclasses.asdict(job))
        return
    detail = job.reason if job.reason else job.table
    typer.echo(f"job {job.id}: {job.status} ({detail})")
    running = None
    if job.lease_owner is not None:
        running = f"on worker {job.lease_owner}, lease until {render.when(job.lease_expires_at)}"
    finished = None
    if job.finished_at is not None:
        finished = render.when(job.finished_at) + (f" on worker {job.worker}" if job.worker else "")
    render.print_fields(
        [
            ("task", job.task),
            ("queue", job.queue),
            ("priority", job.priority or None),
            ("payload", json.dumps(job.payload, ensure_ascii=False)),
            ("created", render.when(job.created_at)),
            ("run at", render.when(job.run_at)),
            ("expires", render.when(job.expires_at) if job.expires_at else None),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("started", _started(job)),
            ("running", running),
            ("finished" if job.status is not JobStatus.DEAD else "failed", finished),
            ("result", None if job.result is None else json.dumps(job.result)),
            ("error type", job.error_type),
            ("redriven", render.redrives(job.redrive_count, job.redriven_at)),
            ("replay of", job.replay_of),
            ("replays", ", ".join(map(str, job.replays)) or None),
            ("idempotency", job.idempotency_key),
        ]
    )
    render.print_block("last error", job.last_error)
    render.print_block("traceback", job.traceback)


def _started(job: JobHistory) -> str | None:
    """When the latest attempt started, with how long it ran when the job has finished."""
    if job.started_at is None:
        return None
    text = render.when(job.started_at)
    finished = job.finished_at
    if (
        isinstance(finished, datetime)
        and isinstance(job.started_at, datetime)
        and (finished >= job.started_at)
    ):
        seconds = (finished - job.started_at).total_seconds()
        text += f" (ran {seconds * 1000:.0f}ms)" if seconds < 1 else f" (ran {render.age(seconds)})"
    return text


def replay_command(job_id: JobIdArgument, dsn: DsnOption = None) -> None:
    """Enqueue a finished or dead job again as a new job (replay_of = ID); prints the new id."""
    typer.echo(admin.replay(database(dsn), job_id))


def cancel_command(
    job_id: JobIdArgument,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Cancel even a running job: its handler is asked to stop (async: cancelled; "
            "sync: current_job().cancelled), its outcome is discarded.",
        ),
    ] = False,
    dsn: DsnOption = None,
) -> None:
    """Archive a queued job as cancelled, unrun (a running one only with --force)."""
    job = admin.cancel(database(dsn), job_id, force=force)
    if job.worker:
        typer.echo(
            f"job {job.id} cancelled while running on worker {job.worker}: "
            "its handler was asked to stop, and its outcome will be discarded"
        )
    else:
        typer.echo(f"job {job.id} cancelled")
