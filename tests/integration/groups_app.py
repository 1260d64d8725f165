"""An app whose tasks limit their groups (one by its group concurrency, two ordered), for `pgjobs
stats --app`."""

from pgjobs import App

app = App()


@app.task(name="cli.limited", group_concurrency=1)
def limited() -> None: ...


@app.task(name="cli.ordered", ordered=True)
def ordered() -> None: ...


@app.task(name="cli.held", ordered="hold")
def held() -> None: ...
