"""`pgjobs job show`, `pgjobs job edit`, `pgjobs replay` and `pgjobs cancel`: one job, wherever
it is."""

from __future__ import annotations

import dataclasses
import getpass
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

import typer

from pgjobs import admin, dependencies, editing, flow
from pgjobs.cli import parse, render
from pgjobs.cli.enqueue import _parse_payload
from pgjobs.cli.options import (
    DsnOption,
    JobIdArgument,
    JsonFlag,
    app_option,
    database,
    find_app,
    use_database,
)
from pgjobs.errors import (
    ConfigurationError,
    InvalidPayload,
    JobNotFound,
    JobStateConflict,
    UnknownTask,
)
from pgjobs.models import JobHistory, JobStatus
from pgjobs.submission import check_seconds
from pgjobs.text import clipped, printable, progress_text
from pgjobs.workflow_entries import WorkflowEntry, WorkflowEntryKind, WorkflowEntryStatus
from pgjobs.workflows import history as workflow_history

job_cli = typer.Typer(help="Look up one job wherever it is.", no_args_is_help=True)


@job_cli.command("show")
def job_show_command(
    job_id: JobIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """A job wherever it is (queued, archived or dead), and its whole story."""
    target = database(dsn)
    job = admin.job(target, job_id)
    graph = dependencies.of(target, job_id)
    steps = workflow_history.of(target, job_id)
    edits = editing.edits(target, job_id)
    shown = flow.shown(flow.of(target, job_id)) if graph.after else {}
    if as_json:
        edges = dataclasses.asdict(graph)
        for edge in edges["after"]:
            edge["result"] = shown.get(edge["id"])
            edge["result_omitted"] = (
                edge["status"] == JobStatus.SUCCEEDED and edge["id"] not in shown
            )
        render.print_json(
            {
                **dataclasses.asdict(job),
                **edges,
                "workflow": [_entry_json(entry) for entry in steps],
                "edits": [dataclasses.asdict(e) for e in edits],
            }
        )
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
            ("snoozes", job.snoozes or None),
            ("progress", progress_text(job.progress, render.when)),
            ("started", _started(job)),
            ("running", running),
            ("finished" if job.status is not JobStatus.DEAD else "failed", finished),
            ("result", None if job.result is None else json.dumps(job.result)),
            ("error type", job.error_type),
            ("redriven", render.redrives(job.redrive_count, job.redriven_at)),
            ("replay of", job.replay_of),
            ("replays", ", ".join(map(str, job.replays)) or None),
            ("idempotency", job.idempotency_key),
            ("group", job.group_key),
            ("unique key", job.unique_key),
            ("tags", ", ".join(job.tags) or None),
            ("after", _edges(graph.after)),
            ("waiting for", _waiting(graph)),
            ("dependents", _edges(graph.dependents)),
        ]
    )
    render.print_block("results of after", _results(graph.after, shown))
    _print_workflow(steps)
    render.print_block("edits", _edit_lines(edits))
    render.print_block("last error", job.last_error)
    render.print_block("traceback", job.traceback)


def _entry_json(entry: WorkflowEntry) -> dict[str, object]:
    return {**dataclasses.asdict(entry), "seconds": entry.seconds}


def _print_workflow(entries: list[WorkflowEntry]) -> None:
    """A workflow's history, one line per entry: its place, kind, name, status, attempts,
    duration, and its result, error or wake time."""
    if not entries:
        return
    typer.echo("workflow:")
    for entry in entries:
        typer.echo(f"  {printable(clipped(_entry_line(entry)))}")


def _entry_line(entry: WorkflowEntry) -> str:
    """One entry of a workflow's history as ``job show`` prints it."""
    place = f"{entry.seq:>4}  {entry.kind:<9}"
    if entry.kind is WorkflowEntryKind.SLEEP:
        return f"{place}{'':<20} wakes {render.when(entry.wake_at)}"
    waiting = entry.status is WorkflowEntryStatus.WAITING
    if entry.kind is WorkflowEntryKind.EVENT:
        if waiting:
            until = "no timeout" if entry.wake_at is None else f"until {render.when(entry.wake_at)}"
            return f"{place}{entry.name:<20} waiting  ({until})"
        said = json.dumps(entry.result) if entry.status is WorkflowEntryStatus.DONE else entry.error
        return f"{place}{entry.name:<20} {entry.status:<8} {said}"
    if entry.kind is WorkflowEntryKind.CHILDREN:
        ids = list((entry.result or {}).get("ids", ()))
        return (
            f"{place}{entry.name:<20} {entry.status:<8} {len(ids)} child job"
            f"{'' if len(ids) == 1 else 's'} (batch {(entry.result or {}).get('batch')})"
        )
    seconds = entry.seconds
    took = "" if seconds is None else f"{seconds * 1000:.0f}ms"
    tries = f"{entry.attempts} attempt{'' if entry.attempts == 1 else 's'}"
    said = json.dumps(entry.result) if entry.status is WorkflowEntryStatus.DONE else entry.error
    tx = " tx" if entry.transactional else ""
    return f"{place}{entry.name:<20} {entry.status:<8} {tries}, {took}{tx}  {said}"


def _edit_lines(edits: tuple[editing.JobEdit, ...]) -> str | None:
    """One line per edit, oldest first: when, by whom, each field old -> new."""
    return "\n".join(
        f"{render.when(e.edited_at)} by {e.edited_by}: {render.edit_changes(e.changes)}"
        for e in edits
    )


@job_cli.command("edit")
def job_edit_command(
    job_id: JobIdArgument,
    priority: Annotated[
        int | None, typer.Option(help="Higher runs first.", min=-32768, max=32767)
    ] = None,
    run_at: Annotated[
        str | None,
        typer.Option(
            help="When to run it: ISO 8601 with a timezone, or now. A job waiting for its "
            "dependencies runs then once they have succeeded."
        ),
    ] = None,
    run_in: Annotated[
        str | None, typer.Option(help="Run it this long from now: 30s, 10m, 2h, 1d.")
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            "-p",
            help="The new payload, a JSON object of the handler's arguments (it replaces the "
            "whole payload); @FILE or @- reads it.",
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(help="Attempts before dead_letter (more than it has spent already).", min=1),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="Its tags become these; repeat for more."),
    ] = None,
    no_tags: Annotated[bool, typer.Option("--no-tags", help="Remove its tags.")] = False,
    by: Annotated[
        str | None, typer.Option(help="Who edits, for the record (default: user@host).")
    ] = None,
    app_ref: Annotated[
        str | None,
        app_option("holding your tasks: a new payload is checked against the job's handler"),
    ] = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Change a queued job that is not running: its priority, run time, payload, max attempts
    or tags. The edit is recorded (who, when, each field old -> new) and shown by `job show`."""
    if tag and no_tags:
        raise ConfigurationError("give --tag or --no-tags, not both")
    if run_at is not None and run_in is not None:
        raise ConfigurationError("give --run-at or --run-in, not both")
    options: dict[str, Any] = {
        "priority": priority,
        "max_attempts": max_attempts,
        "tags": [] if no_tags else tag or None,
        "by": by if by is not None else _who(),
    }
    if run_at is not None and run_at.strip().lower() == "now":
        options["run_in"] = 0.0
    elif run_at is not None:
        options["run_at"] = parse.iso_time("--run-at", run_at)
    if run_in is not None:
        options["run_in"] = parse.age("--run-in", run_in).total_seconds()
    if payload is not None:
        options["payload"] = _parse_payload(payload)
    found = find_app(app_ref)
    if found is not None:
        use_database(found, dsn)
        options["tasks"] = found.tasks
    target = found.dsn if found is not None else database(dsn)
    with _refusals_exit_2():
        done = editing.edit(target, job_id, **options)
    if as_json:
        edit = None if done.edit is None else dataclasses.asdict(done.edit)
        render.print_json({**dataclasses.asdict(done.job), "edit": edit})
    elif done.edit is None:
        typer.echo(f"job {job_id} unchanged: it has these values already")
    else:
        typer.echo(
            f"job {job_id} edited ({done.job.status}): {render.edit_changes(done.edit.changes)}"
        )


@contextmanager
def _refusals_exit_2() -> Iterator[None]:
    """An edit refused (the job's state, an unknown id, a payload that does not fit) is bad
    input: one line and exit 2, as a bad option is."""
    try:
        yield
    except (JobStateConflict, JobNotFound, InvalidPayload, UnknownTask) as exc:
        raise ConfigurationError(str(exc)) from None


def _who() -> str:
    """user@host of whoever runs the command, for the record of an edit."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without one): the host alone says enough
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


#: Jobs of a dependency list `job show` names; the rest are counted.
_SHOWN_EDGES = 20


def _edges(edges: tuple[dependencies.Edge, ...]) -> str | None:
    """``12 (succeeded), 13 (ready)``, the first ``_SHOWN_EDGES`` of them; None when none."""
    if not edges:
        return None
    text = ", ".join(
        (f"{e.name}={e.id}" if e.name else str(e.id)) + f" ({e.status or 'purged'})"
        for e in edges[:_SHOWN_EDGES]
    )
    more = len(edges) - _SHOWN_EDGES
    return text + (f" and {more:,} more" if more > 0 else "")


#: Bytes of one dependency's result `job show` prints (``--json`` gives the whole).
_SHOWN_RESULT = 200


def _results(edges: tuple[dependencies.Edge, ...], shown: dict[int, object]) -> str | None:
    """One line per dependency that succeeded: ``charge=41: {"receipt": "r-1"}``, each result
    cut to ``_SHOWN_RESULT`` bytes, the first ``_SHOWN_EDGES`` of them."""
    lines = []
    for edge in [e for e in edges if e.status is JobStatus.SUCCEEDED][:_SHOWN_EDGES]:
        label = f"{edge.name}={edge.id}" if edge.name else str(edge.id)
        if edge.id in shown:
            value = clipped(json.dumps(shown[edge.id], ensure_ascii=False), _SHOWN_RESULT)
        else:
            value = f"(left out: see `pgjobs job show {edge.id}`)"
        lines.append(f"{label}: {value}")
    return "\n".join(lines) or None


def _waiting(graph: dependencies.Dependencies) -> str | None:
    """How many of its dependencies a waiting job still waits for."""
    if graph.waiting_on is None:
        return None
    return f"{graph.waiting_on} of {len(graph.after)} dependencies (not succeeded yet)"


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


def replay_command(
    job_id: JobIdArgument,
    expires_at: Annotated[
        str | None,
        typer.Option(help="The copy expires (archived unrun) after this time (ISO 8601)."),
    ] = None,
    expires_in: Annotated[
        float | None, typer.Option(help="The copy expires this many seconds from now.", min=0)
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Enqueue a finished or dead job again as a new job (replay_of = ID); prints the new id.
    The copy of an expired job is archived at once as expired, unless a new expiry is given."""
    if expires_in is not None:
        check_seconds("--expires-in", expires_in)
    if expires_at is not None and expires_in is not None:
        raise ConfigurationError("give --expires-at or --expires-in, not both")
    at = None if expires_at is None else parse.iso_time("--expires-at", expires_at)
    target = database(dsn)
    new_id = admin.replay(target, job_id, expires_at=at, expires_in=expires_in)
    typer.echo(new_id)
    if admin.job(target, new_id).status is JobStatus.EXPIRED:
        render.warning(
            f"job {new_id} was archived at once as expired, unrun: its expiry has passed; "
            "give a later --expires-in or --expires-at for a copy that runs"
        )


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
