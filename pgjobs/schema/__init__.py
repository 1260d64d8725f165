"""pgjobs' schema as SQLAlchemy Core tables, one module per entity: the job tables (``jobs``),
the fleet's (``fleet``), the groups' (``groups``) and those of jobs that wait on others
(``flows``), all on one ``metadata`` (``base``).

Alembic migrations create this schema; ``tests/integration/schema/test_migrations.py`` proves
that the migrated database and these modules do not drift apart.
"""

from __future__ import annotations

from pgjobs.schema.base import NAMING_CONVENTION, metadata
from pgjobs.schema.fleet import pgjobs_limit_states, pgjobs_queues, pgjobs_schedules, pgjobs_workers
from pgjobs.schema.flows import (
    pgjobs_batches,
    pgjobs_dependencies,
    pgjobs_event_waits,
    pgjobs_events,
    pgjobs_waiting,
    pgjobs_workflow_history,
)
from pgjobs.schema.groups import (
    pgjobs_group_holds,
    pgjobs_group_starts,
    pgjobs_group_states,
    pgjobs_groups,
    pgjobs_throttles,
)
from pgjobs.schema.jobs import archived_jobs, dead_letter, pgjobs_job_edits, queued_jobs

__all__ = [
    "NAMING_CONVENTION",
    "archived_jobs",
    "dead_letter",
    "metadata",
    "pgjobs_batches",
    "pgjobs_dependencies",
    "pgjobs_event_waits",
    "pgjobs_events",
    "pgjobs_group_holds",
    "pgjobs_group_starts",
    "pgjobs_group_states",
    "pgjobs_groups",
    "pgjobs_job_edits",
    "pgjobs_limit_states",
    "pgjobs_queues",
    "pgjobs_schedules",
    "pgjobs_throttles",
    "pgjobs_waiting",
    "pgjobs_workers",
    "pgjobs_workflow_history",
    "queued_jobs",
]
