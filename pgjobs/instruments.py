"""OpenTelemetry metrics of pgjobs: the instruments of `/metrics`, recorded through the meter
provider the application configures (``opentelemetry-api`` only: the SDK and its exporter are the
application's choice).

Two sources, each in one place:

* ``JobInstruments``: what a worker records as it records its outcomes (``pgjobs work
  --otel-metrics``, ``WorkerConfig(otel_metrics=True)``): jobs by outcome, their run time and
  their pickup latency, per queue and task. Every worker records its own jobs; the backend sums
  them.
* ``QueueGauges``: observable gauges of what the tables hold (depth by state, the oldest ready
  job's age, dead letters, groups at their limit), read by one process (`pgjobs serve
  --otel-metrics`), from the reading `/metrics` makes, once per collection.

Like ``tracing``, this module imports ``opentelemetry`` inside its functions only, and only once
metrics were asked for: a worker without them loads nothing of it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgjobs.errors import ConfigurationError, PgjobsError

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

log = logging.getLogger("pgjobs.instruments")

#: The instrumentation scope of pgjobs' instruments.
METER_NAME = "pgjobs"
#: The environment variable that turns OpenTelemetry metrics on for `pgjobs work` and `pgjobs
#: serve` (and ``create_app``) when their option is not given: 1/true/yes or 0/false/no.
ENV = "PGJOBS_OTEL_METRICS"

#: Counter: jobs that left a worker's slots, by ``outcome`` (the worker's ``Outcome``:
#: succeeded, retried, dead, released, snoozed, delivered).
JOB_OUTCOMES = "pgjobs.job.outcomes"
#: Histogram, seconds: how long a job occupied a slot (its handler's run, or its delivery), by
#: outcome; a job that never ran (unknown task, a payload that does not fit) has none.
JOB_DURATION = "pgjobs.job.duration"
#: Histogram, seconds: from a job's ``run_at`` to its claim.
JOB_PICKUP_LATENCY = "pgjobs.job.pickup_latency"
#: Gauge: jobs in ``queued_jobs`` by queue, task and ``state`` (ready, scheduled, running).
QUEUE_DEPTH = "pgjobs.queue.depth"
#: Gauge, seconds: since the ``run_at`` of the queue's oldest ready job (0: none is ready).
QUEUE_OLDEST_READY_AGE = "pgjobs.queue.oldest_ready_age"
#: Gauge: jobs in ``dead_letter`` by queue and task.
DEAD_LETTER_DEPTH = "pgjobs.dead_letter.depth"
#: Gauge: groups of the queue whose running jobs reached their group concurrency.
QUEUE_GROUPS_AT_LIMIT = "pgjobs.queue.groups_at_limit"

#: Upper bounds (seconds) of the histograms' buckets, advised to the SDK (a View overrides
#: them): those of `/metrics`, from a no-op job to an hour. The SDK's own default (0 to 10,000)
#: is meant for milliseconds.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0
)  # fmt: skip

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def check_provider(value: object, field: str = "otel_metrics") -> object:
    """``value`` when it says where metrics go: False (nowhere), True (the global meter
    provider) or a meter provider (anything with ``get_meter``); else a ``ConfigurationError``.

    Example: ``check_provider(True)``
    """
    if isinstance(value, bool) or callable(getattr(value, "get_meter", None)):
        return value
    raise ConfigurationError(
        f"{field} must be True, False or an OpenTelemetry MeterProvider, got "
        f"{type(value).__name__}",
        field=field,
    )


def enabled_from_env() -> bool:
    """Whether ``$PGJOBS_OTEL_METRICS`` turns OpenTelemetry metrics on (unset: no); a value
    that is not a yes or a no is a ``ConfigurationError``.

    Example: ``WorkerConfig(otel_metrics=enabled_from_env())``
    """
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigurationError(f"${ENV}={raw[:40]!r}: use 1 or 0 (true or false)", field=ENV)


def meter(provider: object = True) -> Meter:
    """pgjobs' meter from ``provider`` (True: the global one, which the application sets with
    ``opentelemetry.metrics.set_meter_provider``, before or after this call); a
    ``ConfigurationError`` when the ``otel`` extra is not installed.

    Example: ``instruments = JobInstruments(meter())``
    """
    try:
        from opentelemetry import metrics
    except ImportError:
        raise ConfigurationError(
            "OpenTelemetry metrics need the otel extra (opentelemetry-api is missing): "
            "pip install 'pgjobs-queue[otel]', and an SDK with an exporter",
            field="otel_metrics",
        ) from None
    if provider is True:
        return metrics.get_meter(METER_NAME, _version())
    get_meter: Callable[..., Meter] = getattr(check_provider(provider), "get_meter")  # noqa: B009
    return get_meter(METER_NAME, _version())


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("pgjobs-queue")
    except metadata.PackageNotFoundError:  # run from a source tree
        return ""


# -- what a worker records ----------------------------------------------------------------------


class JobInstruments:
    """The counter and histograms a worker records into as its jobs are claimed and finish;
    called on the worker's event loop (``pgjobs.worker.metrics.WorkerMetrics`` calls it, with
    the task of an unregistered name already replaced, so the attributes stay bounded).

    Example::

        instruments = JobInstruments(meter())
        instruments.picked_up("emails", "emails.send", 0.012)
        instruments.finished("emails", "emails.send", "succeeded", 0.250)
    """

    def __init__(self, meter: Meter) -> None:
        self._outcomes = meter.create_counter(
            JOB_OUTCOMES,
            unit="{job}",
            description="Jobs that left a worker's slots, by outcome (succeeded, retried, dead, "
            "released, snoozed, delivered).",
        )
        self._duration = meter.create_histogram(
            JOB_DURATION,
            unit="s",
            description="Seconds a job occupied a worker's slot: its handler's run, or its "
            "delivery to an external task's downstream.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._pickup = meter.create_histogram(
            JOB_PICKUP_LATENCY,
            unit="s",
            description="Seconds from a job's run_at to its claim by a worker.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        # One attributes mapping per series, built once: the hot path builds no dict.
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}

    def _of(self, *key: str) -> dict[str, str]:
        attributes = self._attributes.get(key)
        if attributes is None:
            names = ("queue", "task", "outcome")[: len(key)]
            # str(): an outcome is a StrEnum, and exporters want plain text
            attributes = self._attributes[key] = {
                n: str(v) for n, v in zip(names, key, strict=True)
            }
        return attributes

    def picked_up(self, queue: str, task: str, seconds: float) -> None:
        """A job of ``task`` on ``queue`` was claimed ``seconds`` after its run_at."""
        self._pickup.record(seconds, self._of(queue, task))

    def finished(self, queue: str, task: str, outcome: str, seconds: float | None) -> None:
        """A job of ``task`` on ``queue`` left its slot with ``outcome`` after ``seconds`` in it
        (None: it never ran)."""
        attributes = self._of(queue, task, outcome)
        self._outcomes.add(1, attributes)
        if seconds is not None:
            self._duration.record(seconds, attributes)


# -- what the tables hold -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One reading of the queue gauges, as `/metrics` shows it (a queue or task once seen reads
    0 when it empties, rather than vanishing)."""

    #: (queue, task, state, jobs) for the states ready, scheduled, running.
    depth: Sequence[tuple[str, str, str, int]]
    #: (queue, seconds)
    oldest_ready_age: Sequence[tuple[str, float]]
    #: (queue, task, jobs)
    dead_letter: Sequence[tuple[str, str, int]]
    #: (queue, groups)
    groups_at_limit: Sequence[tuple[str, int]]


class QueueGauges:
    """Observable gauges of the queues, all fed by one reading per collection: ``read`` is
    called by the first gauge a collection asks, and the others answer from the same reading
    (a gauge asked a second time means a new collection began). ``read`` returns None when there
    is nothing to show (the database could not be read yet); it is called on the thread that
    collects (the SDK's reader), never on the caller's.

    Suspended workflows will be one more gauge here, read in the same reading.

    Example::

        gauges = QueueGauges(meter(), lambda: metrics.figures(pool))
        ...
        gauges.close()  # the callbacks observe nothing more
    """

    def __init__(self, meter: Meter, read: Callable[[], QueueFigures | None]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._figures: QueueFigures | None = None
        #: The gauges that answered from ``_figures``.
        self._served: set[str] = set()
        self._closed = False
        self._failing = False
        self.reads = 0
        for name, unit, description, pick in (
            (
                QUEUE_DEPTH,
                "{job}",
                "Jobs in queued_jobs by queue, task and state (ready, scheduled, running).",
                _depth,
            ),
            (
                QUEUE_OLDEST_READY_AGE,
                "s",
                "Seconds since the run_at of the queue's oldest ready job (0: none is ready).",
                _oldest,
            ),
            (
                DEAD_LETTER_DEPTH,
                "{job}",
                "Jobs in dead_letter, waiting for a human (redrive or purge).",
                _dead,
            ),
            (
                QUEUE_GROUPS_AT_LIMIT,
                "{group}",
                "Groups of the queue whose running jobs reached their group concurrency; their "
                "ready jobs wait.",
                _groups,
            ),
        ):
            meter.create_observable_gauge(
                name, callbacks=[self._callback(name, pick)], unit=unit, description=description
            )

    def close(self) -> None:
        """Observe nothing more (the API has no way to remove an instrument)."""
        with self._lock:
            self._closed = True
            self._figures = None

    def _callback(
        self, name: str, pick: Callable[[QueueFigures], Iterable[tuple[float, dict[str, str]]]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            from opentelemetry.metrics import Observation

            figures = self._figures_for(name)
            if figures is None:
                return []
            return [Observation(value, attributes) for value, attributes in pick(figures)]

        return observe

    def _figures_for(self, name: str) -> QueueFigures | None:
        with self._lock:
            if self._closed:
                return None
            if self._figures is None or name in self._served:
                self._figures, self._served = self._reading(), set()
            self._served.add(name)
            return self._figures

    def _reading(self) -> QueueFigures | None:
        self.reads += 1
        try:
            figures = self._read()
        except PgjobsError as exc:
            if not self._failing:  # once per outage
                log.warning("OpenTelemetry queue gauges: cannot read the database: %s", exc)
                self._failing = True
            return None
        self._failing = False
        return figures


def _depth(f: QueueFigures) -> Iterable[tuple[float, dict[str, str]]]:
    return [(n, {"queue": q, "task": t, "state": s}) for q, t, s, n in f.depth]


def _oldest(f: QueueFigures) -> Iterable[tuple[float, dict[str, str]]]:
    return [(seconds, {"queue": q}) for q, seconds in f.oldest_ready_age]


def _dead(f: QueueFigures) -> Iterable[tuple[float, dict[str, str]]]:
    return [(n, {"queue": q, "task": t}) for q, t, n in f.dead_letter]


def _groups(f: QueueFigures) -> Iterable[tuple[float, dict[str, str]]]:
    return [(n, {"queue": q}) for q, n in f.groups_at_limit]


def describe(provider: object) -> str:
    """What a log line says of where the metrics go."""
    if provider is True:
        return "the global meter provider"
    return type(provider).__name__
