"""Periodic schedules: declare, lock what is due, advance, pause and resume."""

from __future__ import annotations

# Columns of pgjobs_schedules in the order of models.ScheduleInfo, and whether a worker declared
# the schedule within ``stale_after`` seconds.
_SCHEDULE_COLUMNS = """
name, task, queue, schedule, timezone, catch_up, next_run_at, last_run_at, last_enqueued_at,
last_job_id, declared_at, declared_at > now() - %(stale_after)s * interval '1 second',
paused_at, paused_by
"""

#: The database's clock, from which every scheduler computes the occurrences (workers' clocks
#: may disagree).
SCHEDULE_NOW = "SELECT now()"

#: Record the schedules a worker declares (parallel arrays, one element per schedule): new ones
#: start at ``next_run_ats`` (their first occurrence after now); a schedule whose expression or
#: timezone changed starts again there; the others keep their place. Rows are locked in name
#: order, so two workers declaring at once wait for each other instead of deadlocking. Rows:
#: (name, whether this statement added it) per schedule.
SCHEDULE_DECLARE = """
INSERT INTO pgjobs_schedules AS s
    (name, task, queue, schedule, timezone, catch_up, next_run_at, declared_at)
SELECT d.name, d.task, d.queue, d.schedule, d.timezone, d.catch_up, d.next_run_at, now()
FROM unnest(%(names)s::text[], %(tasks)s::text[], %(queues)s::text[], %(schedules)s::text[],
            %(timezones)s::text[], %(catch_ups)s::text[], %(next_run_ats)s::timestamptz[])
    AS d(name, task, queue, schedule, timezone, catch_up, next_run_at)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE
SET task = excluded.task,
    queue = excluded.queue,
    catch_up = excluded.catch_up,
    next_run_at = CASE WHEN (s.schedule, s.timezone) IS DISTINCT FROM
                            (excluded.schedule, excluded.timezone)
                       THEN excluded.next_run_at ELSE s.next_run_at END,
    schedule = excluded.schedule,
    timezone = excluded.timezone,
    declared_at = now()
RETURNING name, xmax = 0 AS added
"""

#: Whether any of the schedules among ``names`` is due and not paused: what a scheduler round
#: asks first, in one autocommitted statement, and it opens the transaction of SCHEDULE_LOCK_DUE
#: (three round trips: BEGIN, the lock, COMMIT) only when one is. Most rounds, a second apart in
#: every worker that declares schedules, find none due. Rows: (bool,).
SCHEDULE_ANY_DUE = """
SELECT EXISTS (
    SELECT 1 FROM pgjobs_schedules
    WHERE name = ANY(%(names)s::text[]) AND next_run_at <= now() AND paused_at IS NULL
)
"""

#: Lock the schedules among ``names`` that are due, not paused (`pgjobs schedule pause`), and
#: that no other worker holds (SKIP LOCKED: another worker enqueueing them now is left alone).
#: Held until the transaction ends, in which the occurrences are enqueued and SCHEDULE_ADVANCE
#: moves next_run_at. Rows: (name, next_run_at, the transaction's now()).
SCHEDULE_LOCK_DUE = """
SELECT name, next_run_at, now()
FROM pgjobs_schedules
WHERE name = ANY(%(names)s::text[]) AND next_run_at <= now() AND paused_at IS NULL
ORDER BY name
FOR UPDATE SKIP LOCKED
"""

#: Move locked schedules on (parallel arrays): their next occurrence, and the last one enqueued
#: with its job when this round enqueued one (NULL: keep the previous).
SCHEDULE_ADVANCE = """
UPDATE pgjobs_schedules s
SET next_run_at = a.next_run_at,
    last_run_at = coalesce(a.last_run_at, s.last_run_at),
    last_enqueued_at = CASE WHEN a.last_run_at IS NULL THEN s.last_enqueued_at ELSE now() END,
    last_job_id = coalesce(a.last_job_id, s.last_job_id)
FROM unnest(%(names)s::text[], %(next_run_ats)s::timestamptz[], %(last_run_ats)s::timestamptz[],
            %(last_job_ids)s::bigint[]) AS a(name, next_run_at, last_run_at, last_job_id)
WHERE s.name = a.name
RETURNING s.name
"""

#: Every schedule in the database, by name (models.ScheduleInfo).
SCHEDULE_LIST = f"SELECT {_SCHEDULE_COLUMNS} FROM pgjobs_schedules ORDER BY name"

#: Forget schedule ``name`` (a worker that still declares it records it again, from its next
#: occurrence). Rows: one when it existed.
SCHEDULE_DELETE = "DELETE FROM pgjobs_schedules WHERE name = %(name)s RETURNING name"

#: Schedule ``name`` (models.ScheduleInfo); no row when the database has none of that name.
SCHEDULE_GET = f"SELECT {_SCHEDULE_COLUMNS} FROM pgjobs_schedules WHERE name = %(name)s"

#: Pause schedule ``name``: from the scheduler's next round on, none of its occurrences is
#: enqueued (SCHEDULE_LOCK_DUE skips it). A paused schedule stays paused as it was (since, by
#: whom). ``by`` NULL records the database role; ``reason`` follows it after ": ". Rows:
#: (whether this statement paused it); none when there is no such schedule.
SCHEDULE_PAUSE = """
WITH before AS (SELECT paused_at FROM pgjobs_schedules WHERE name = %(name)s FOR UPDATE)
UPDATE pgjobs_schedules s
SET paused_at = coalesce(s.paused_at, now()),
    paused_by = CASE WHEN s.paused_at IS NULL
                     THEN coalesce(%(by)s::text, session_user) || coalesce(': ' || %(reason)s::text, '')
                     ELSE s.paused_by END
FROM before
WHERE s.name = %(name)s
RETURNING before.paused_at IS NULL
"""

#: Resume schedule ``name``: its occurrences missed while paused are due at once, and its
#: catch_up rule decides how many run (as for occurrences missed while no worker ran). Rows:
#: (whether it was paused); none when there is no such schedule.
SCHEDULE_RESUME = """
WITH before AS (SELECT paused_at FROM pgjobs_schedules WHERE name = %(name)s FOR UPDATE)
UPDATE pgjobs_schedules s
SET paused_at = NULL, paused_by = NULL
FROM before
WHERE s.name = %(name)s
RETURNING before.paused_at IS NOT NULL
"""
