"""The commands of ``pgjobs``, each imported only when it runs.

A command module imports what its command needs (the app, the driver, rich, uvicorn), so
importing them all would make ``pgjobs --help`` pay for every command and a worker carry the
admin and rendering code. ``COMMANDS`` names each command's module and object and the line
``pgjobs --help`` shows for it; ``LazyGroup`` imports a command's module when the command is
looked up to run, and lists the others from the table (a unit test keeps the table equal to the
commands' own help).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer import _click
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class Entry:
    """Where a command lives: ``pgjobs.cli.<module>.<attribute>``, a command function or a
    ``typer.Typer`` of subcommands, and the first paragraph of its help."""

    module: str
    attribute: str
    help: str


COMMANDS: dict[str, Entry] = {
    "migrate": Entry(
        "migrate",
        "migrate_command",
        "Create or upgrade pgjobs' tables (Alembic, shipped inside the package).",
    ),
    "enqueue": Entry("enqueue", "enqueue_command", "Enqueue one job and print its id."),
    "producer": Entry(
        "producer",
        "producer_command",
        "Enqueue TASK every --every, --batch jobs at a time, until --count jobs or "
        "SIGTERM/Ctrl-C; one line per batch, then the total.",
    ),
    "work": Entry(
        "work", "work_command", "Run workers: claim jobs, run their handlers, record the outcomes."
    ),
    "stats": Entry(
        "stats",
        "stats_command",
        "Per queue: ready, scheduled, running, dead, finished in the last hour, throughput and "
        "retry rate over the last minute, oldest ready job; the live workers and what each one "
        "runs; for queues with grouped jobs, the groups with the most ready jobs and how many "
        "are at their limit.",
    ),
    "prune": Entry(
        "prune",
        "prune_command",
        "Drop whole partitions of archived_jobs older than a cutoff (optionally exported first).",
    ),
    "doctor": Entry(
        "doctor",
        "doctor_command",
        "Check the database for what pgjobs needs: schema, autovacuum, vacuum held back, NOTIFY "
        "queue, poolers, connection budget, archive partitions and retention, stale workers "
        "and orphaned leases.",
    ),
    "serve": Entry(
        "serve",
        "serve_command",
        "Serve the HTTP API (/api/v1, token required), /healthz, /readyz and /metrics.",
    ),
    "replay": Entry(
        "job",
        "replay_command",
        "Enqueue a finished or dead job again as a new job (replay_of = ID); prints the new id. "
        "The copy of an expired job is archived at once as expired, unless a new expiry is "
        "given.",
    ),
    "cancel": Entry(
        "job",
        "cancel_command",
        "Archive a queued job as cancelled, unrun (a running one only with --force).",
    ),
    "dead": Entry(
        "dead", "dead_cli", "Triage dead jobs: list, show, group by error, redrive, purge."
    ),
    "job": Entry("job", "job_cli", "Look up one job wherever it is."),
    "batch": Entry("batch", "batch_cli", "Look at batches (app.batch)."),
    "event": Entry("event", "event_cli", "Send events to durable workflows."),
    "queue": Entry(
        "queue",
        "queue_cli",
        "Pause and resume queues, limit them; list every queue with its settings.",
    ),
    "schedule": Entry(
        "schedule",
        "schedule_cli",
        "Periodic schedules (@app.periodic). Without a command: list them (expression, "
        "timezone, next and last run in UTC, whether a running worker declares them, paused or "
        "not). Pause, resume or run one now with its command.",
    ),
}


def load(name: str) -> _click.Command:
    """The click command ``name`` as typer builds it, its module imported now.

    Example: ``load("enqueue").params`` are the options ``pgjobs enqueue`` parses.
    """
    entry = COMMANDS[name]
    target: Any = getattr(importlib.import_module(f"pgjobs.cli.{entry.module}"), entry.attribute)
    # Registered on a group of its own exactly as on the root, so typer builds the same command.
    holder = typer.Typer(add_completion=False)
    holder.callback()(_nothing)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    group = typer.main.get_command(holder)
    assert isinstance(group, TyperGroup)
    return group.commands[name]


def _nothing() -> None:
    """The holder group's callback (a typer app with a callback is always a group)."""


class LazyGroup(TyperGroup):
    """The root group: lists every command from ``COMMANDS`` and imports one only to run it
    (or to show its own help). ``adjust`` is applied to each command as it loads."""

    adjust: Any = None
    #: Called once a command's module has loaded (``pgjobs.cli.run``: the imports are done).
    loaded: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict[str, _click.Command] = {}
        self._listing = False

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing and cmd_name not in self._loaded:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        if cmd_name not in self._loaded:
            command = load(cmd_name)
            if self.loaded is not None:
                self.loaded()
            if self.adjust is not None and isinstance(command, TyperGroup | TyperCommand):
                self.adjust(command)
            self._loaded[cmd_name] = command
        return self._loaded[cmd_name]

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        """The root's help lists the commands from the table, importing none of them."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
