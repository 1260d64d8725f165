"""The worker: claims jobs, runs them in its slots and hands their outcomes to the completer.

``loop`` holds ``Worker`` (the claim loop, signals, stop); ``slots`` feeds the jobs claimed to
the slots, where each runs as ``pgjobs.runs`` runs it (as in drain); ``pacing`` decides when to
claim and how many jobs; ``burst`` when a burst worker is done; ``config`` holds
``WorkerConfig``. ``http`` with ``metrics``, and ``external`` are the worker's own: its `--http`
endpoint, its deliveries to external tasks.

Example: ``Worker(app, WorkerConfig(concurrency=8)).run()``
"""

from pgjobs.worker.config import WorkerConfig
from pgjobs.worker.loop import Worker

__all__ = ["Worker", "WorkerConfig"]
