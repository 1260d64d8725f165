"""What a worker counts for its `--http` ``/metrics``, and their rendering in Prometheus' text
format, without a metrics library (a plain worker loads none).

``WorkerMetrics`` exists only when ``--http`` or ``--otel-metrics`` is given: without either the
worker's hot path pays one ``is None`` test per job. With OpenTelemetry metrics it hands each
claim and outcome to a ``Recorder`` too (``pgjobs.instruments.JobInstruments``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from pgjobs.completer.outcomes import Outcome
from pgjobs.models import Job

#: Outcomes of a job as the worker counts them (``outcome`` label of
#: ``pgjobs_worker_jobs_finished_total``).
OUTCOMES = tuple(Outcome)
#: Upper bounds (seconds) of the run-duration and pickup-latency histograms' buckets.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0
)  # fmt: skip
#: The ``task`` label of jobs whose task this worker's app does not register: their names come
#: from the queue and could be anything, so each does not get series of its own.
UNKNOWN_TASK = "(unknown)"


class Histogram:
    """Counts of observations by bucket (``DURATION_BUCKETS``), their sum and number."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(DURATION_BUCKETS, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> Iterator[tuple[str, int]]:
        """(le, cumulative count) per bucket, "+Inf" last."""
        total = 0
        for bound, n in zip((*map(_number, DURATION_BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            yield bound, total


class Recorder(Protocol):
    """Where a worker's claims and outcomes are recorded besides its own counts (OpenTelemetry's
    instruments: ``pgjobs.instruments.JobInstruments``)."""

    def picked_up(self, queue: str, task: str, seconds: float) -> None: ...

    def finished(self, queue: str, task: str, outcome: str, seconds: float | None) -> None: ...


class _Series:
    """What is counted for one (queue, task)."""

    __slots__ = ("finished", "key", "pickup", "run")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.finished = dict.fromkeys(OUTCOMES, 0)
        self.run = Histogram()
        self.pickup = Histogram()


class WorkerMetrics:
    """The figures of one worker, counted on its event loop, rendered for ``/metrics``.

    Example::

        metrics = WorkerMetrics("host:42:ab12", slots=8, tasks={"send_email"})
        metrics.claimed(job, time.time())
        metrics.finished(job, Outcome.SUCCEEDED)
        text = metrics.render(busy=0, connected=True)
    """

    def __init__(
        self, worker: str, slots: int, tasks: Iterable[str], recorder: Recorder | None = None
    ) -> None:
        self.worker = worker
        #: Where claims and outcomes are recorded too (None: nowhere else).
        self.recorder = recorder
        self.slots = slots
        self._tasks = frozenset(tasks)
        self.trips = 0
        self.last_heartbeat: float | None = None  # seconds since the epoch
        self._series: dict[tuple[str, str], _Series] = {}
        # job id -> its series and time.monotonic() when its run began
        self._started: dict[int, tuple[_Series, float]] = {}

    def _of(self, job: Job) -> _Series:
        key = (job.queue, job.task if job.task in self._tasks else UNKNOWN_TASK)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(key)
        return series

    def trip(self) -> None:
        """A round trip to the database succeeded."""
        self.trips += 1

    def heartbeat(self) -> None:
        """The worker's row in ``pgjobs_workers`` was refreshed."""
        self.last_heartbeat = time.time()

    def claimed(self, job: Job, now: float) -> None:
        """``job`` was claimed at ``now`` (seconds since the epoch) and starts running."""
        series = self._of(job)
        latency = now - job.run_at.timestamp()
        if latency < 0.0:
            latency = 0.0
        series.pickup.observe(latency)
        self._started[job.id] = (series, time.monotonic())
        if self.recorder is not None:
            self.recorder.picked_up(*series.key, latency)

    def finished(self, job: Job, outcome: Outcome) -> None:
        """``job`` left its slot with ``outcome``, as the completer decided it."""
        started = self._started.pop(job.id, None)
        seconds = None
        if started is None:
            series = self._of(job)
        else:
            series = started[0]
            seconds = time.monotonic() - started[1]
            series.run.observe(seconds)
        series.finished[outcome] += 1
        if self.recorder is not None:
            self.recorder.finished(*series.key, outcome, seconds)

    def not_run(self, job: Job) -> None:
        """``job`` was claimed but never run (unknown task, payload that does not fit): it is
        counted as dead, without a run duration."""
        self._started.pop(job.id, None)
        self.finished(job, Outcome.DEAD)

    def render(self, *, busy: int, connected: bool) -> str:
        """Every metric in Prometheus' text exposition format (version 0.0.4)."""
        me = f'worker="{_label(self.worker)}"'
        out: list[str] = []
        _family(out, "pgjobs_worker_slots", "gauge", "Slots this worker runs jobs in.")
        out.append(f"pgjobs_worker_slots{{{me}}} {self.slots}")
        _family(out, "pgjobs_worker_slots_busy", "gauge", "Slots running a job now.")
        out.append(f"pgjobs_worker_slots_busy{{{me}}} {busy}")
        _family(
            out,
            "pgjobs_worker_trips_total",
            "counter",
            "Round trips to the database that settled outcomes and claimed jobs.",
        )
        out.append(f"pgjobs_worker_trips_total{{{me}}} {self.trips}")
        _family(
            out,
            "pgjobs_worker_last_heartbeat_timestamp_seconds",
            "gauge",
            "When this worker last refreshed its row in pgjobs_workers (Unix time).",
        )
        if self.last_heartbeat is not None:
            out.append(
                f"pgjobs_worker_last_heartbeat_timestamp_seconds{{{me}}} "
                f"{_number(self.last_heartbeat)}"
            )
        _family(
            out,
            "pgjobs_worker_connected",
            "gauge",
            "1 while the worker's claim connection to the database is up, else 0.",
        )
        out.append(f"pgjobs_worker_connected{{{me}}} {int(connected)}")
        series = sorted(self._series.items())
        _family(
            out,
            "pgjobs_worker_jobs_finished_total",
            "counter",
            "Jobs that left this worker's slots, by outcome: succeeded, retried, dead, "
            "released (given back), delivered (to an external task's downstream).",
        )
        for (queue, task), s in series:
            labels = f'{me},queue="{_label(queue)}",task="{_label(task)}"'
            for outcome, n in s.finished.items():
                if n:
                    out.append(
                        f'pgjobs_worker_jobs_finished_total{{{labels},outcome="{outcome}"}} {n}'
                    )
        for name, attr, what in (
            (
                "pgjobs_worker_run_duration_seconds",
                "run",
                "Seconds a job occupied a slot: its handler's run, or its delivery.",
            ),
            (
                "pgjobs_worker_pickup_latency_seconds",
                "pickup",
                "Seconds from a job's run_at to its claim by this worker.",
            ),
        ):
            _family(out, name, "histogram", what)
            for (queue, task), s in series:
                labels = f'{me},queue="{_label(queue)}",task="{_label(task)}"'
                histogram: Histogram = getattr(s, attr)
                if not histogram.count:
                    continue
                for le, n in histogram.cumulative():
                    out.append(f'{name}_bucket{{{labels},le="{le}"}} {n}')
                out.append(f"{name}_sum{{{labels}}} {_number(histogram.sum)}")
                out.append(f"{name}_count{{{labels}}} {histogram.count}")
        return "\n".join(out) + "\n"


def _family(out: list[str], name: str, kind: str, help_text: str) -> None:
    out.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
    out.append(f"# TYPE {name} {kind}")


def _label(value: str) -> str:
    """A label value escaped as the text format wants: backslash, double quote, line feed."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A float as Prometheus writes one: ``0.005``, ``1.0``, ``1700000000.123``."""
    return repr(float(value))
