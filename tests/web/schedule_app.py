"""The app of the schedule action tests: one hourly schedule, run as
``pgjobs schedule run reports.hourly --app tests.web.schedule_app:app`` and served by
``create_app(app)``."""

from __future__ import annotations

import pgjobs

app = pgjobs.App()  # DSN from --dsn, or create_app's


@app.periodic(
    "0 * * * *", name="reports.hourly", payload={"kind": "sales"}, priority=3, max_attempts=2
)
@app.task(name="reports.build", queue="reports")
def build(kind: str) -> None: ...
