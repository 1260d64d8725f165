"""`pgjobs event send`: an event for a workflow job's ``ctx.wait_for`` (``pgjobs.events``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pgjobs import events
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.errors import ConfigurationError, InvalidPayload

event_cli = typer.Typer(help="Send events to durable workflows.", no_args_is_help=True)


@event_cli.command("send")
def event_send_command(
    job: Annotated[
        str,
        typer.Argument(
            help="The workflow job: its id, or the idempotency key it was enqueued with.",
            show_default=False,
        ),
    ],
    name: Annotated[str, typer.Argument(help="The event's name.", show_default=False)],
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            "-p",
            help="The event's payload, any JSON value (default null); @FILE or @- reads it.",
        ),
    ] = None,
    key: Annotated[
        bool, typer.Option("--key", help="JOB is an idempotency key even if it is all digits.")
    ] = False,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Put an event in a workflow job's mailbox: its ctx.wait_for(NAME) takes it (kept if it
    arrives first), and a workflow waiting for it is ready at once. Exit 2 for bad input, 1 for
    an unknown or ended job."""
    target: int | str = job if key or not job.isdigit() else int(job)
    value = None if payload is None else _parse(payload)
    try:
        sent = events.send(database(dsn), target, name, value)
    except InvalidPayload as exc:
        raise ConfigurationError(str(exc)) from None
    if as_json:
        render.print_json(
            {
                "id": sent.id,
                "job_id": sent.job_id,
                "name": sent.name,
                "sent_at": sent.sent_at.isoformat(),
                "woke": sent.woke,
            }
        )
        return
    state = "it was waiting: ready now" if sent.woke else "kept until the workflow waits for it"
    typer.echo(f"event {sent.name!r} sent to job {sent.job_id} ({state})")


def _parse(raw: str) -> Any:
    """``--payload``: JSON text, inline, from a file (``@FILE``) or from stdin (``@-``)."""
    source = "--payload"
    if raw.startswith("@"):
        path = Path(raw[1:])
        source = f"payload file {path}"
        try:
            raw = sys.stdin.read() if raw == "@-" else path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read {source}: {exc}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise ConfigurationError(f"{source} nests too deeply to read") from None
