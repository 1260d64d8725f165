"""The tables of jobs that wait on others: dependencies, batches and durable workflows'
history."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from pgjobs.schema.base import _status_check, metadata
from pgjobs.workflow_entries import WorkflowEntryKind, WorkflowEntryStatus

# The dependencies of jobs enqueued with ``after=[...]``: one row per (job, job it depends on),
# kept after both have ended, for a job's page. Migration 0013.
pgjobs_dependencies = Table(
    "pgjobs_dependencies",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("depends_on", BigInteger, primary_key=True),
    # The name the dependent gave it (``after={"charge": 41}``), NULL when named by id only: the
    # dependent reads its results by it (``current_job().dependency_results()``). Migration 0018.
    Column("name", Text),
    # The trigger pgjobs_job_ended finds a job's dependents by it.
    Index("ix_pgjobs_dependencies_depends_on", "depends_on"),
)


# The jobs still waiting for dependencies, one row each. A waiting job sits in queued_jobs with
# run_at 'infinity', which no claim takes; when the last of its dependencies succeeds, the
# trigger deletes this row and sets the job's run_at to the time kept here (or now, if that has
# passed). Migration 0013.
pgjobs_waiting = Table(
    "pgjobs_waiting",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    # Its dependencies that have not succeeded yet.
    Column("waiting_on", Integer, nullable=False),
    # The run_at it was enqueued with.
    Column("run_at", DateTime(timezone=True), nullable=False),
)


# Batches (``app.batch(on_complete=...)``): the counts of the members' ends and the callback job
# the trigger pgjobs_job_ended enqueues, in the transaction that ended the last member. Its lock
# on this row serialises members ending at once, so the callback is enqueued once. Migration 0013.
pgjobs_batches = Table(
    "pgjobs_batches",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("total", Integer, nullable=False),
    # Members that have not ended yet.
    Column("pending", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False, server_default=text("0")),
    Column("dead", Integer, nullable=False, server_default=text("0")),
    # Cancelled or expired.
    Column("cancelled", Integer, nullable=False, server_default=text("0")),
    # The callback (NULL task: none): its payload gets a "batch" key with the id and counts.
    Column("callback_task", Text),
    Column("callback_queue", Text),
    Column("callback_payload", JSONB),
    Column("callback_priority", SmallInteger),
    Column("callback_max_attempts", Integer),
    Column("callback_payload_version", Integer),
    Column("callback_job_id", BigInteger),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # When the last member ended.
    Column("completed_at", DateTime(timezone=True)),
    # The workflow job that waits for the batch's members (its children: ``ctx.map``), made
    # ready by the trigger pgjobs_children_ended when the last one ends. Migration 0020.
    Column("parent_job_id", BigInteger),
    CheckConstraint("pending >= 0", name="pending_not_negative"),
)


# The history of durable workflows (``@app.workflow``): one row per step or sleep a run recorded,
# at its place (seq) in the run. Keyed by the job's id, it stays while the job moves between the
# three tables, and goes when the job is deleted for good (the triggers pgjobs_workflow_forget,
# and `pgjobs prune` before it drops an archive partition). The primary key is what makes a
# step's record happen once: a second run recording the same place waits for the first's
# transaction and then finds the place taken. Migration 0016.
pgjobs_workflow_history = Table(
    "pgjobs_workflow_history",
    metadata,
    Column("job_id", BigInteger, primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("status", Text, nullable=False),
    # A step's JSON result (NULL for None); a sleep's none.
    Column("result", JSONB),
    # A failed step's last error, one line, and its exception's qualified type name.
    Column("error", Text),
    Column("error_type", Text),
    # A step's attempts so far (1 for a sleep).
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    # Whether the step's own writes committed with its record (ctx.transaction()).
    Column("transactional", Boolean, nullable=False, server_default=text("false")),
    # When its first attempt started, and when it was recorded (the database's clock).
    Column("started_at", DateTime(timezone=True)),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # A sleep's wake time, from the database's clock.
    Column("wake_at", DateTime(timezone=True)),
    _status_check("kind", WorkflowEntryKind),
    _status_check("status", WorkflowEntryStatus),
    CheckConstraint("seq >= 0", name="seq_not_negative"),
)


# Events sent to workflow jobs (`app.send_event`), kept until the workflow's `ctx.wait_for`
# takes them (a taken event leaves; the workflow's history keeps its payload). Events of one
# name are taken oldest first. Mail of a job that has ended is swept by the maintenance round.
# Migration 0020.
pgjobs_events = Table(
    "pgjobs_events",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'null'::jsonb")),
    Column("sent_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Index("ix_pgjobs_events_job_id_name_id", "job_id", "name", "id"),
)

# The events a workflow job waits for (`ctx.wait_for`): while it has a row here, a send of that
# name makes the job ready at once; the row goes when the wait ends. Migration 0020.
pgjobs_event_waits = Table(
    "pgjobs_event_waits",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("name", Text, primary_key=True),
    # When the wait times out (the job is suspended until then).
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)
