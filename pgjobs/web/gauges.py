"""Gauges of what is live now, drawn from the domain's rows for ``pgjobs.web.metrics``: the jobs
by state, the oldest ready job's age and the dead letters (the figures OpenTelemetry's gauges
show too), the workers and their slots, the orphaned leases, the groups at their limit. None is
labelled by anything unbounded (a job, a group): one series per worker or per queue."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from pgjobs.instruments import QueueFigures
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import OrphanedLeases, WorkerInfo


def queued(figures: QueueFigures) -> Iterator[Metric]:
    """The jobs of queued_jobs by queue, task and state, the oldest ready job's age by queue,
    the jobs of dead_letter by queue and task."""
    jobs = GaugeMetricFamily(
        "pgjobs_jobs",
        "Jobs in queued_jobs by state (ready, scheduled, running).",
        labels=["queue", "task", "state"],
    )
    for queue, task, state, value in figures.depth:
        jobs.add_metric([queue, task, state], value)
    yield jobs
    age = GaugeMetricFamily(
        "pgjobs_oldest_ready_age_seconds",
        "Seconds since the run_at of the oldest ready job of the queue (0: none is ready).",
        labels=["queue"],
    )
    for queue, seconds in figures.oldest_ready_age:
        age.add_metric([queue], seconds)
    yield age
    dead = GaugeMetricFamily(
        "pgjobs_dead_letter_jobs",
        "Jobs in dead_letter, waiting for a human (redrive or purge).",
        labels=["queue", "task"],
    )
    for queue, task, value in figures.dead_letter:
        dead.add_metric([queue, task], value)
    yield dead


def workers(workers: Sequence[WorkerInfo], orphaned: OrphanedLeases) -> Iterator[Metric]:
    """The live workers (count, slots, running jobs, heartbeat age) and the orphaned leases."""
    yield GaugeMetricFamily(
        "pgjobs_workers_live",
        f"Worker processes whose heartbeat is younger than {STALE_AFTER:g} seconds.",
        value=len(workers),
    )
    slots = GaugeMetricFamily(
        "pgjobs_worker_slots", "Slots (--concurrency) of a live worker.", labels=["worker"]
    )
    running = GaugeMetricFamily(
        "pgjobs_worker_running", "Jobs a live worker holds a lease on.", labels=["worker"]
    )
    heartbeat = GaugeMetricFamily(
        "pgjobs_worker_last_heartbeat_age_seconds",
        "Seconds since a live worker's last heartbeat.",
        labels=["worker"],
    )
    for worker in workers:
        slots.add_metric([worker.id], worker.concurrency)
        running.add_metric([worker.id], worker.running)
        heartbeat.add_metric([worker.id], max(worker.last_seen_age, 0.0))
    yield slots
    yield running
    yield heartbeat
    yield GaugeMetricFamily(
        "pgjobs_orphaned_leases",
        "Running jobs leased to workers that are not live; their leases expire and free them.",
        value=orphaned.jobs,
    )


def groups_at_limit(at_limit: Mapping[str, int]) -> Metric:
    """Per queue ever seen with grouped jobs, its groups at their limit now (``at_limit``: 0
    once none is, rather than a series that vanishes). Labelled by queue only: a label per group
    would make a series per customer."""
    family = GaugeMetricFamily(
        "pgjobs_groups_at_limit",
        "Groups of the queue whose running jobs reached their group concurrency (the queue's, "
        "or a task's when the server has the app); their ready jobs wait.",
        labels=["queue"],
    )
    for queue, groups in sorted(at_limit.items()):
        family.add_metric([queue], groups)
    return family
