"""The worker: claims jobs, runs them in its slots and hands their outcomes to the completer.

``loop`` holds ``Worker`` (the claim loop, signals, stop); ``slots`` starts and ends the runs;
``pacing`` decides when to claim and how many jobs; ``burst`` when a burst worker is done;
``config`` holds ``WorkerConfig``. ``threads``, ``http`` with ``metrics``, and ``external`` are
the worker's own: its handler threads, its `--http` endpoint, its deliveries to external tasks.

Example: ``Worker(app, WorkerConfig(concurrency=8)).run()``
"""

from pgjobs.worker.config import WorkerConfig
from pgjobs.worker.loop import Worker

__all__ = ["Worker", "WorkerConfig"]
