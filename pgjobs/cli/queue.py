"""`pgjobs queue ...`: pause and resume a queue, list every known queue with its settings."""

from __future__ import annotations

import dataclasses
import getpass
import socket
from typing import Annotated, Any

import typer

from pgjobs import queues
from pgjobs.cli import parse, render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.errors import ConfigurationError
from pgjobs.models import QueueState
from pgjobs.rates import rate_text
from pgjobs.text import printable

queue_cli = typer.Typer(
    help="Pause and resume queues, limit them; list every queue with its settings.",
    no_args_is_help=True,
)

QueueArgument = Annotated[str, typer.Argument(help="The queue's name.", show_default=False)]


@queue_cli.command("pause")
def pause_command(
    name: QueueArgument,
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="Why (shown by stats and queue list).")
    ] = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Stop workers from claiming the queue's jobs (they stay ready); running jobs finish.
    Takes effect at each worker's next claim. A queue without jobs can be paused too."""
    change = queues.pause(database(dsn), name, reason=reason, by=_who())
    _report(change, as_json, "paused" if change.changed else "was already paused")


@queue_cli.command("resume")
def resume_command(name: QueueArgument, as_json: JsonFlag = False, dsn: DsnOption = None) -> None:
    """Let workers claim the queue's jobs again; idle workers are woken at once."""
    change = queues.resume(database(dsn), name)
    _report(change, as_json, "resumed" if change.changed else "was not paused")


@queue_cli.command("limit")
def limit_command(
    name: QueueArgument,
    concurrency: Annotated[
        str | None,
        typer.Argument(
            help="The most jobs of the queue running at once across every worker, or 'none' "
            "to remove the limit. Left out: unchanged.",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="The most jobs that start per period: 100/s, 10/m, 5/10s, 1000/h; 'none' "
            "removes it. Left out: unchanged.",
            show_default=False,
        ),
    ] = None,
    group_concurrency: Annotated[
        str | None,
        typer.Option(
            "--group-concurrency",
            help="The most jobs of one group (enqueue --group) running at once; 'none' "
            "removes it. Left out: unchanged.",
            show_default=False,
        ),
    ] = None,
    group_rate: Annotated[
        str | None,
        typer.Option(
            "--group-rate",
            help="The most jobs of one group that start per period, in any window of the "
            "period: 10/m, 100/h; 'none' removes it. Left out: unchanged.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Limit how many of the queue's jobs run at once, how many start per period, and how many
    of one group's jobs run at once and start per period, for every worker from its next claim
    on (no restart). Jobs held back stay ready.

    Example: pgjobs queue limit emails 10 --rate 100/s --group-concurrency 2 --group-rate 10/m"""
    if concurrency is None and rate is None and group_concurrency is None and group_rate is None:
        raise ConfigurationError(
            "give a concurrency limit (a number, or none), --rate (e.g. 100/s, or none), "
            "--group-concurrency (a number, or none) and/or --group-rate (e.g. 10/m, or none)",
            field="concurrency",
        )
    group = (
        queues.KEEP
        if group_concurrency is None
        else parse.limit(group_concurrency, "--group-concurrency")
    )
    change = queues.limit(
        database(dsn),
        name,
        concurrency=queues.KEEP if concurrency is None else parse.limit(concurrency),
        rate=queues.KEEP if rate is None else parse.rate(rate),
        group_concurrency=group,
        group_rate=queues.KEEP if group_rate is None else parse.rate(group_rate, "--group-rate"),
    )
    _report(change, as_json, "limits set" if change.changed else "limits unchanged")


@queue_cli.command("list")
def list_command(as_json: JsonFlag = False, dsn: DsnOption = None) -> None:
    """Every known queue (holding jobs, or with settings): paused or active, since when, by
    whom, why."""
    found = queues.list_queues(database(dsn))
    if as_json:
        render.print_json([_state_json(q) for q in found])
    else:
        render.wide_console().print(render.queue_states_table(found))


def _report(change: queues.Change, as_json: bool, what: str) -> None:
    if as_json:
        render.print_json({**_state_json(change.queue), "changed": change.changed})
        return
    state = change.queue
    line = f"queue {printable(state.name)} {what}"
    if state.limited:
        line += f": {render.queue_limits(state)}"
    if not state.has_jobs:
        line += " (it holds no job now)"
    typer.echo(line)


def _state_json(state: QueueState) -> dict[str, Any]:
    return {
        **dataclasses.asdict(state),
        "paused": state.paused,
        "rate": rate_text(state.rate_jobs, state.rate_seconds),
        "group_rate": rate_text(state.group_rate_jobs, state.group_rate_seconds),
    }


def _who() -> str:
    """user@host of whoever runs the command, for the record of a pause."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without one): the host alone says enough
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
