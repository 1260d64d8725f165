"""How a claimed job runs, the same wherever it runs: a worker's slots (``pgjobs.worker.slots``)
and ``pgjobs.testing.drain`` both start jobs through ``Runs``, so that a change to how a job
starts holds in both at once.

``running`` holds ``Runs`` (start a job, stop it at its timeout or a force-cancel, hand its end
to the completer); ``start`` what a handler runs as (its span) and with; ``threads`` the
threads of sync handlers.

Example: ``runs = Runs(app.tasks, 1, completer, changed); runs.open(loop); runs.start(job)``
"""

from pgjobs.runs.running import STOP_GRACE, Runs
from pgjobs.runs.start import handler, no_extension

__all__ = ["STOP_GRACE", "Runs", "handler", "no_extension"]
