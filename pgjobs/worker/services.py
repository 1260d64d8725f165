"""What a worker runs beside its claim loop: its row in the worker registry (every worker, for
`pgjobs stats`) and, with ``WorkerConfig.maintenance``, the periodic services."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjobs.maintenance import Service
from pgjobs.maintenance.expirer import Expirer
from pgjobs.maintenance.groups import GroupRows
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.maintenance.limits import LapsedLimits
from pgjobs.maintenance.mailboxes import Mailboxes
from pgjobs.maintenance.partitions import ArchivePartitions
from pgjobs.maintenance.registry import Heartbeat, WorkerIdentity, WorkerRegistry
from pgjobs.maintenance.retainer import Retainer
from pgjobs.maintenance.scheduler import Scheduler
from pgjobs.maintenance.throttles import ThrottleRows
from pgjobs.tasks import Task
from pgjobs.worker.config import WorkerConfig
from pgjobs.worker.metrics import WorkerMetrics

if TYPE_CHECKING:
    from pgjobs.app import App


class _ObservedRegistry(WorkerRegistry):
    """The worker registry, telling the worker's metrics about each heartbeat."""

    def __init__(self, identity: WorkerIdentity, metrics: WorkerMetrics) -> None:
        super().__init__(identity)
        self._metrics = metrics

    async def run_once(self, conn: Any) -> Heartbeat:
        beat = await super().run_once(conn)
        self._metrics.heartbeat()
        return beat


def registry(
    worker_id: str, queues: Sequence[str], concurrency: int, metrics: WorkerMetrics | None
) -> WorkerRegistry:
    """The registry service of worker ``worker_id``, telling ``metrics`` (when counted) about
    each heartbeat.

    Example: ``registry(worker.id, worker.queues, 8, None)``
    """
    identity = WorkerIdentity(
        worker_id, socket.gethostname(), os.getpid(), queues, concurrency, datetime.now(UTC)
    )
    if metrics is None:
        return WorkerRegistry(identity)
    return _ObservedRegistry(identity, metrics)


def maintenance(
    app: App, config: WorkerConfig, queues: Sequence[str], tasks: Iterable[Task]
) -> list[Service[Any]]:
    """The periodic services a worker of ``app`` running ``tasks`` runs with
    ``config.maintenance`` (none without).

    Example: ``maintenance(app, worker.config, worker.queues, worker.tasks.values())``
    """
    if not config.maintenance:
        return []
    services: list[Service[Any]] = [
        LeaseRescuer(config.rescuer_config()),
        Expirer(config.expirer_config()),
        ArchivePartitions(),
        GroupRows(queues),
        Mailboxes(),
    ]
    tasks = list(tasks)
    throttled = [t for t in tasks if t.throttle is not None]
    if throttled:
        services.append(
            ThrottleRows([t.name for t in throttled], [t.throttle or 0.0 for t in throttled])
        )
    unlimited = [t.name for t in tasks if not t.limited]
    if unlimited:
        services.append(LapsedLimits(queues, unlimited))
    # Whatever queues this worker serves: the schedules' row locks let any number of workers
    # run it.
    if app.periodics:
        services.append(Scheduler(app.periodics.values(), app.enqueue_many_async))
    # Off unless a period is configured; the workers take turns on an advisory lock.
    policy = app.retention.merged(config.retention) if app.retention else config.retention
    if policy is not None and policy.active:
        services.append(Retainer(policy, app.dsn))
    return services
