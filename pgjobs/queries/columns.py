"""The column lists the statements share: a job's columns, and those that move with it between the
three tables.
"""

from __future__ import annotations

# The sequence of queued_jobs' ids, looked up once per statement (an uncorrelated subquery runs
# once): nextval(pg_get_serial_sequence(...)) looked it up again for every row, about 6 us each.
_NEXT_JOB_ID_SEQ = "(SELECT CAST(pg_get_serial_sequence('queued_jobs', 'id') AS regclass))"

# Columns of queued_jobs in the order models.Job takes them.
JOB_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, lease_owner, "
    "lease_expires_at, last_error, created_at, expires_at, idempotency_key, payload_version, "
    "trace_context, group_key, unique_key, snoozes"
)

# Columns the three tables share, copied as-is when a row moves between them (the redrive record,
# the replay link, the start of the latest attempt, the payload version and the trace context
# travel with the job).
_MOVED_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, "
    "created_at, expires_at, idempotency_key, redrive_count, redriven_at, replay_of, started_at, "
    "payload_version, trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, "
    "watched"
)

# _MOVED_COLUMNS as a row enters dead_letter: a task name too long for the (task, failed_at)
# index (btree entries hold ~2700 bytes; another producer or hand-written SQL may have stored one)
# is clipped to its first 200 characters and says so, so that one such job cannot make the move
# of a whole batch fail.
_INTO_DEAD = _MOVED_COLUMNS.replace(
    ", task, ",
    ", CASE WHEN octet_length(task) <= 2000 THEN task"
    " ELSE left(task, 200) || format('... (%%s characters clipped)', length(task) - 200) END, ",
)

# The columns a job enqueued for a versioned task, or under a traced span, adds to an insert
# (migration 0007). The other inserts leave them out, so that a producer that uses neither keeps
# working against a database not yet migrated that far.
_VERSIONED_COLUMNS = ", payload_version, trace_context"
