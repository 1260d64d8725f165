"""An app whose task limits its groups, for `pgjobs stats --app`."""

from pgjobs import App

app = App()


@app.task(name="cli.limited", group_concurrency=1)
def limited() -> None: ...
