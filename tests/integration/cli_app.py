"""A small app for the CLI tests: ``pgjobs work --app tests.integration.cli_app:app``."""

from __future__ import annotations

from pgjobs import App

# No DSN here: the CLI binds the app to --dsn (or $PGJOBS_DATABASE_URL).
app = App()


@app.task(name="cli.add")
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="cli.shout", queue="loud")
def shout(text: str) -> str:
    return text.upper()
