"""The claim: the worker's claim connections' settings, and the statement that leases the next
batch (and settles the last).
"""

from __future__ import annotations

from pgjobs.queries.columns import JOB_COLUMNS
from pgjobs.queries.groups import _GROUP_RATED, _GROUP_TASK_RATES
from pgjobs.queries.outcomes import _SUCCEED_MANY

#: The settings of the worker's claim connections (see db.connect_async): each prepared statement
#: planned once for the session, not at every execution (the hot statements have one good plan
#: whatever their parameters); no JIT compilation (a generic plan cannot know its LIMIT, so its
#: estimate grows with the table: past ~1M ready jobs the claim's crosses jit_above_cost, and
#: at 5M each claim of 32 jobs spent ~0.7 s compiling); no sequential scans (a plan made while
#: queued_jobs was empty, as after a drain or a TRUNCATE, read the whole table at every trip for
#: the rest of the session: a queue fed 20 jobs at a time spent 2-7 ms a trip reading the dead
#: rows of the jobs before); timestamps read in UTC (psycopg builds a datetime in UTC in a third
#: of the time it takes for a zone it must look up, such as the server's 'Etc/UTC').
SESSION_HOT = """
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('jit', 'off', false),
       set_config('enable_seqscan', 'off', false),
       set_config('TimeZone', 'UTC', false)
"""

#: ``SESSION_HOT`` through a transaction-mode pooler: the time zone only, a setting PgBouncer
#: tracks per client and applies to every server session the client's transactions run on.
SESSION_HOT_POOLED = """
SELECT set_config('TimeZone', 'UTC', false)
"""

# What a claim sets on each job it takes: one attempt used, leased to ``owner`` for its task's
# lease (else ``lease`` seconds), marked at-most-once for those tasks, the attempt recorded as
# delivered to a downstream for external tasks (NULL otherwise), and the attempt's start.
_CLAIM_SET = """SET attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_expires_at = now() + CASE
        WHEN cardinality(%(lease_tasks)s::text[]) = 0 THEN %(lease)s
        ELSE coalesce(
            (SELECT t.lease FROM unnest(%(lease_tasks)s::text[], %(lease_seconds)s::float8[])
                 AS t(task, lease)
             WHERE t.task = queued_jobs.task),
            %(lease)s)
    END * interval '1 second',
    at_most_once = task = ANY(%(at_most_once_tasks)s::text[]),
    external_attempt = CASE WHEN task = ANY(%(external_tasks)s::text[]) THEN attempts + 1 END,
    started_at = now()"""

# The ready jobs of one queue of the claim (w.queue), in claim order.
_READY_IN_QUEUE = """FROM queued_jobs
        WHERE queue = w.queue
          AND lease_expires_at IS NULL
          AND run_at <= now()
          AND (expires_at IS NULL OR expires_at > now())"""

_CLAIM_ORDER = "ORDER BY priority DESC, run_at, id"

# The claim order between groups: a group's first job before the second of any (``turn``; an
# ungrouped job is a group of one), within priority.
_TURN_ORDER = "ORDER BY priority DESC, turn, run_at, id"

# JOB_CLAIM_LIMITED's steps for jobs of a group (see there, 2b), ending with ``group_jobs`` (the
# groups' candidates, with their turn) and ``group_caps`` (the groups looked at).
_CLAIM_GROUPS = f"""
group_window AS MATERIALIZED (
    SELECT g.queue, g.group_key
    FROM queue_caps w
    CROSS JOIN LATERAL (
        SELECT s.queue, s.group_key
        FROM pgjobs_group_states s
        JOIN pgjobs_groups a ON a.group_key = s.group_key
        WHERE s.queue = w.queue AND w.cap > 0
          -- The rows as this statement's snapshot sees them: checked again, by the lock, on a
          -- row as last written when another claim or an enqueue wrote it since, which leaves
          -- the group out of this claim. So a group in the window is one whose running jobs this
          -- snapshot counts right: every claim that starts its jobs writes its (queue, group)
          -- row, and with it (pgjobs_group_touched) the group's row of every queue (a).
          AND s.xmin = (SELECT v.xmin FROM pgjobs_group_states v
                        WHERE v.queue = s.queue AND v.group_key = s.group_key)
          AND a.xmin = (SELECT v.xmin FROM pgjobs_groups v WHERE v.group_key = a.group_key)
          -- One probe of the group's ready range per group (a scalar subquery with a LIMIT is
          -- never planned as a join: an EXISTS could be, reading every ready job of the queue).
          AND (SELECT true FROM queued_jobs j
               WHERE j.queue = s.queue AND j.group_key = s.group_key
                 AND j.lease_expires_at IS NULL AND j.run_at <= now()
               LIMIT 1)
        ORDER BY s.last_claim_at
        LIMIT %(limit)s
        FOR UPDATE OF s, a SKIP LOCKED
    ) g
),
-- The window's groups' running jobs in every queue (a task's group concurrency and order hold
-- per (task, group), a queue's per (queue, group)).
group_running AS MATERIALIZED (
    SELECT j.queue, j.group_key, j.task, count(*) AS jobs
    FROM (SELECT DISTINCT group_key FROM group_window) r
    CROSS JOIN LATERAL (
        SELECT q.queue, q.group_key, q.task FROM queued_jobs q
        WHERE q.group_key = r.group_key AND q.lease_expires_at > now()
          AND q.id <> ALL({{settled}})
        UNION ALL
        -- Force-cancelled jobs whose handler may still run (JOB_CANCEL) keep their place.
        SELECT h.queue, h.group_key, h.task FROM pgjobs_group_holds h
        WHERE h.group_key = r.group_key AND h.lease_expires_at > now()
    ) j
    GROUP BY j.queue, j.group_key, j.task
),
group_caps AS MATERIALIZED (
    SELECT r.queue, r.group_key,
           -- least() passes over NULLs: without a limit, the other's room (NULL: neither).
           least(
               p.group_concurrency - coalesce(
                   (SELECT sum(x.jobs) FROM group_running x
                    WHERE x.queue = r.queue AND x.group_key = r.group_key), 0),
               -- The queue's group rate: its starts of the group in the last period.
               CASE WHEN p.group_rate_jobs IS NOT NULL THEN p.group_rate_jobs - coalesce(
                   (SELECT sum(x.jobs) FROM pgjobs_group_starts x
                    WHERE x.group_key = r.group_key AND x.kind = 'queue' AND x.name = r.queue
                      AND x.started_at > now() - p.group_rate_seconds * interval '1 second'),
                   0) END) AS room,
           p.group_rate_jobs, p.group_rate_seconds,
           -- Each group's share of the claim: the groups looked at take turns.
           ceil(%(limit)s::float8 / count(*) OVER ())::int AS share
    FROM group_window r
    LEFT JOIN pgjobs_queues p ON p.name = r.queue
),
{_GROUP_TASK_RATES}group_takes AS MATERIALIZED (
    SELECT k.*,
           greatest(least(k.share, coalesce(k.room, k.share)), 0) AS take,
           ARRAY(SELECT r.task FROM group_task_rates r
                 WHERE r.group_key = k.group_key AND r.room <= 0) AS rate_held
    FROM group_caps k
),
group_picked AS (
    SELECT c.*, k.room,
           row_number() OVER (PARTITION BY c.queue, c.group_key {_CLAIM_ORDER}) AS turn,
           row_number() OVER (PARTITION BY c.group_key, c.task {_CLAIM_ORDER}) AS task_turn
    FROM group_takes k
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.task, j.priority, j.run_at, j.group_key
        FROM queued_jobs j
        WHERE j.queue = k.queue AND j.group_key = k.group_key
          AND j.lease_expires_at IS NULL
          AND j.run_at <= now()
          AND (j.expires_at IS NULL OR j.expires_at > now())
          -- An ordered task's job only when it is its (task, group)'s oldest in every queue.
          AND (j.task <> ALL(%(ordered_tasks)s::text[]) OR NOT EXISTS (
                  SELECT 1 FROM queued_jobs o
                  WHERE o.group_key = j.group_key AND o.task = j.task AND o.id < j.id)
                  AND NOT EXISTS (
                  SELECT 1 FROM pgjobs_group_holds h
                  WHERE h.group_key = j.group_key AND h.task = j.task
                    AND h.lease_expires_at > now()))
          -- Not a task whose group rate allows no more starts of the group: the group's
          -- other tasks' jobs are reached past them.
          AND j.task <> ALL(k.rate_held)
          AND (j.task <> ALL(%(hold_tasks)s::text[]) OR NOT EXISTS (
                  SELECT 1 FROM dead_letter d
                  WHERE d.group_key = j.group_key AND d.task = j.task))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT k.take
        FOR UPDATE OF j SKIP LOCKED
    ) c
),
group_jobs AS (
    SELECT p.id, p.queue, p.task, p.priority, p.run_at, p.turn
    FROM group_picked p
    LEFT JOIN unnest(%(group_tasks)s::text[], %(group_limits)s::int[]) AS t(task, cap)
        ON t.task = p.task
    LEFT JOIN group_task_rates g ON g.group_key = p.group_key AND g.task = p.task
    WHERE (t.task IS NULL
           OR p.task_turn <= t.cap - coalesce(
                  (SELECT sum(x.jobs) FROM group_running x
                   WHERE x.group_key = p.group_key AND x.task = p.task), 0))
      AND (g.task IS NULL OR p.task_turn <= g.room)
)"""

# A queue with a setting a claim must obey: paused, or limited (JOB_CLAIM leaves such a queue to
# JOB_CLAIM_LIMITED, which reads its settings).
_QUEUE_RESTRICTED = (
    "(p.paused_at IS NOT NULL OR p.concurrency IS NOT NULL OR p.rate_jobs IS NOT NULL)"
)

# JOB_CLAIM's UPDATE (see there).
_CLAIM_PLAIN = f"""
UPDATE queued_jobs
{_CLAIM_SET}
WHERE id = ANY(ARRAY(
    SELECT c.id
    FROM (
        SELECT c.id, c.priority, c.run_at,
               row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS nth,
               c.attempts + 1 < c.max_attempts
                   AND c.task <> ALL(%(at_most_once_tasks)s::text[]) AS may_wait
        FROM unnest(%(queues)s::text[]) AS w(queue)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at, task, attempts, max_attempts
            {_READY_IN_QUEUE}
              AND limit_key IS NULL AND group_key IS NULL
              AND NOT EXISTS (
                  SELECT 1 FROM pgjobs_queues p WHERE p.name = w.queue AND {_QUEUE_RESTRICTED}
              )
            {_CLAIM_ORDER}
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) c
        -- Outside the scan, not in it: with a condition on task in the scan, the planner's
        -- estimate of a generic plan (a queue of one or two tasks) makes it sort the whole queue.
        WHERE c.task <> ALL(%(limit_tasks)s::text[])
    ) c
    WHERE c.nth <= %(slots)s OR c.may_wait
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
))
RETURNING {JOB_COLUMNS}
"""

# JOB_CLAIM_LIMITED's steps (see there), as common table expressions ending with ``claimed``
# (the jobs taken), ``held`` (ids held back) and ``spent`` (limits whose state was written).
# {settled}: the ids the same statement archives: they no longer count as running.
_CLAIM_LIMITED = f"""
scopes AS MATERIALIZED (
    SELECT 'task' AS kind, t.name, t.concurrency, t.rate_jobs, t.rate_seconds, false AS paused
    FROM unnest(%(limit_tasks)s::text[], %(limit_concurrency)s::int[],
                %(limit_rate_jobs)s::int[], %(limit_rate_seconds)s::float8[])
        AS t(name, concurrency, rate_jobs, rate_seconds)
    UNION ALL
    SELECT 'queue', p.name, p.concurrency, p.rate_jobs, p.rate_seconds, p.paused_at IS NOT NULL
    FROM pgjobs_queues p
    WHERE p.name = ANY(%(queues)s::text[]) AND {_QUEUE_RESTRICTED}
),
running AS MATERIALIZED (
    SELECT s.kind, s.name,
           CASE WHEN s.kind = 'task' THEN (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.limit_key = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL({{settled}})
                   LIMIT s.concurrency) r)
           ELSE (
               SELECT count(*) FROM (
                   SELECT 1 FROM queued_jobs q
                   WHERE q.queue = s.name AND q.lease_expires_at IS NOT NULL
                     AND q.id <> ALL({{settled}})
                   LIMIT s.concurrency) r)
           END AS jobs
    FROM scopes s
    WHERE s.concurrency IS NOT NULL AND NOT s.paused
),
seen AS MATERIALIZED (
    SELECT l.kind, l.name, l.xmin AS version
    FROM pgjobs_limit_states l
    JOIN scopes s ON s.kind = l.kind AND s.name = l.name
),
states AS MATERIALIZED (
    SELECT l.kind, l.name, l.xmin AS version, l.tokens, l.refilled_at,
           greatest(clock_timestamp(), l.refilled_at) AS clock
    FROM pgjobs_limit_states l
    JOIN scopes s ON s.kind = l.kind AND s.name = l.name
    LEFT JOIN running r ON r.kind = l.kind AND r.name = l.name
    WHERE NOT s.paused AND (s.rate_jobs IS NOT NULL OR r.jobs < s.concurrency)
    FOR UPDATE OF l SKIP LOCKED
),
new_states AS (
    INSERT INTO pgjobs_limit_states (kind, name)
    SELECT s.kind, s.name
    FROM scopes s
    WHERE NOT s.paused AND NOT EXISTS (
        SELECT 1 FROM seen WHERE seen.kind = s.kind AND seen.name = s.name
    )
    ON CONFLICT DO NOTHING
    RETURNING kind, name
),
measured AS (
    SELECT s.kind, s.name, s.concurrency, s.rate_jobs, s.rate_seconds, s.paused,
           r.jobs AS running, t.clock,
           -- A state created by this claim holds no tokens it could write back, but no claim
           -- under the limit can have committed before it: the count stands.
           t.kind IS NOT NULL OR (n.kind IS NOT NULL AND s.rate_jobs IS NULL) AS locked,
           coalesce(t.version = v.version, n.kind IS NOT NULL) AS fresh,
           CASE WHEN s.rate_jobs IS NOT NULL AND t.kind IS NOT NULL THEN
               least(s.rate_jobs::float8,
                     coalesce(t.tokens, s.rate_jobs) + s.rate_jobs / s.rate_seconds
                     * extract(epoch FROM t.clock - coalesce(t.refilled_at, t.clock)))
           END AS tokens
    FROM scopes s
    LEFT JOIN running r ON r.kind = s.kind AND r.name = s.name
    LEFT JOIN states t ON t.kind = s.kind AND t.name = s.name
    LEFT JOIN seen v ON v.kind = s.kind AND v.name = s.name
    LEFT JOIN new_states n ON n.kind = s.kind AND n.name = s.name
),
limits AS MATERIALIZED (
    SELECT m.kind, m.name, m.tokens, m.clock,
           m.concurrency IS NOT NULL OR m.rate_jobs IS NOT NULL AS limited,
           CASE WHEN m.paused THEN 0
                ELSE least(
                    %(limit)s,
                    CASE WHEN m.concurrency IS NULL THEN %(limit)s
                         WHEN m.running >= m.concurrency OR NOT (m.locked AND m.fresh) THEN 0
                         ELSE m.concurrency - m.running END,
                    CASE WHEN m.rate_jobs IS NULL THEN %(limit)s
                         WHEN NOT m.locked THEN 0
                         ELSE floor(m.tokens)::int END)
           END AS capacity,
           NOT m.paused
               AND (m.rate_jobs IS NOT NULL AND NOT m.locked
                    OR m.running < m.concurrency AND NOT (m.locked AND m.fresh))
               AS locked_out,
           CASE WHEN m.tokens < 1 THEN (1 - m.tokens) * m.rate_seconds / m.rate_jobs END
               AS retry_in
    FROM measured m
),
queue_caps AS (
    SELECT w.queue, coalesce(l.capacity, %(limit)s) AS cap
    FROM unnest(%(queues)s::text[]) AS w(queue)
    LEFT JOIN limits l ON l.kind = 'queue' AND l.name = w.queue
),
task_caps AS (
    SELECT l.name AS task, l.capacity FROM limits l WHERE l.kind = 'task'
),
{_CLAIM_GROUPS},
candidates AS (
    SELECT c.*, false AS was_held
    FROM queue_caps w
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        {_READY_IN_QUEUE}
          AND limit_key IS NULL AND group_key IS NULL
        {_CLAIM_ORDER}
        LIMIT w.cap
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.*, true
    FROM queue_caps w
    JOIN task_caps t ON w.cap > 0 AND t.capacity > 0
    CROSS JOIN LATERAL (
        SELECT id, queue, task, priority, run_at, 1::bigint AS turn
        {_READY_IN_QUEUE}
          AND limit_key = t.task AND group_key IS NULL
        {_CLAIM_ORDER}
        LIMIT least(w.cap, t.capacity)
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.id, c.queue, c.task, c.priority, c.run_at, c.turn, true
    FROM group_jobs c
),
ranked AS (
    SELECT c.*, t.capacity AS task_cap,
           row_number() OVER (PARTITION BY c.task {_TURN_ORDER}) AS nth
    FROM candidates c
    LEFT JOIN task_caps t ON t.task = c.task
),
allowed AS (
    SELECT r.id, r.queue, r.priority, r.run_at, r.turn,
           row_number() OVER (PARTITION BY r.queue {_TURN_ORDER}) AS nth
    FROM ranked r
    WHERE r.task_cap IS NULL OR r.nth <= r.task_cap
),
claimed AS (
    UPDATE queued_jobs
    {_CLAIM_SET},
    limit_key = CASE WHEN task = ANY(%(limit_tasks)s::text[]) THEN task END
    WHERE id = ANY(ARRAY(
        SELECT a.id
        FROM allowed a
        JOIN queue_caps w ON w.queue = a.queue
        WHERE a.nth <= w.cap
        ORDER BY a.priority DESC, a.turn, a.run_at, a.id
        LIMIT %(limit)s
    ))
    RETURNING {JOB_COLUMNS}
),
held AS (
    UPDATE queued_jobs
    SET limit_key = task
    WHERE id = ANY(ARRAY(SELECT r.id FROM ranked r WHERE NOT r.was_held AND r.nth > r.task_cap))
    RETURNING id
),
spent AS (
    UPDATE pgjobs_limit_states l
    SET tokens = k.tokens - u.used,
        refilled_at = CASE WHEN k.tokens IS NOT NULL THEN k.clock END,
        last_claim_at = now()
    FROM limits k
    JOIN (
        SELECT 'task' AS kind, task AS name, count(*) AS used FROM claimed GROUP BY task
        UNION ALL
        SELECT 'queue', queue, count(*) FROM claimed GROUP BY queue
    ) u ON u.kind = k.kind AND u.name = k.name
    WHERE l.kind = k.kind AND l.name = k.name
    RETURNING l.name
),
turned AS (
    UPDATE pgjobs_group_states g
    SET last_claim_at = now()
    WHERE (g.queue, g.group_key) IN (
        SELECT c.queue, c.group_key FROM claimed c WHERE c.group_key IS NOT NULL
        UNION
        SELECT k.queue, k.group_key FROM group_caps k
        WHERE NOT EXISTS (
            SELECT 1 FROM group_picked p WHERE p.queue = k.queue AND p.group_key = k.group_key)
    )
    RETURNING g.group_key
),
{_GROUP_RATED}"""

# The claimed jobs in JOB_COLUMNS, then the claim's status row: id NULL, its JSON in the payload
# column. {status}: its JSON.
_STATUS_ROW = "SELECT NULL, NULL, NULL, {status}, " + ", ".join(
    ["NULL"] * (JOB_COLUMNS.count(",") - 3)
)

# Whether some of the worker's queues have jobs of a group (JOB_CLAIM leaves them to
# JOB_CLAIM_LIMITED, which takes turns between groups).
_QUEUE_GROUPS = """EXISTS (
    SELECT 1 FROM pgjobs_group_states WHERE queue = ANY(%(queues)s::text[])
)"""

# Whether some of the worker's queues are limited or have groups (a plain claim's only status).
_QUEUE_LIMITS = f"""(EXISTS (
    SELECT 1 FROM pgjobs_queues
    WHERE name = ANY(%(queues)s::text[]) AND (concurrency IS NOT NULL OR rate_jobs IS NOT NULL)
) OR {_QUEUE_GROUPS})"""


def _claim_statement(*, limited: bool, succeed: bool) -> str:
    ctes = [_SUCCEED_MANY.strip()] if succeed else []
    if limited:
        settled = "%(ok_ids)s::bigint[]" if succeed else "'{}'::bigint[]"
        ctes.append(_CLAIM_LIMITED.format(settled=settled).strip())
        status, when = (
            f"""jsonb_build_object(
    -- Jobs held back, and groups whose whole share was claimed (they may hold more): claim
    -- again at once.
    'held', (SELECT count(*) FROM held) + (
        SELECT count(*) FROM group_takes k
        WHERE k.take > 0 AND k.take <= (SELECT count(*) FROM claimed c
                                       WHERE c.queue = k.queue AND c.group_key = k.group_key)),
    'locked_out', (SELECT coalesce(bool_or(locked_out), false) FROM limits),
    'retry_in', least((SELECT min(retry_in) FROM limits), (SELECT min(wait) FROM rate_waits)),
    'queue_limits', (SELECT coalesce(bool_or(limited), false) FROM limits WHERE kind = 'queue')
                    OR {_QUEUE_GROUPS})""",
            None,
        )
    else:
        ctes.append(f"claimed AS ({_CLAIM_PLAIN})")
        # Only when there is something to say.
        status, when = """'{"queue_limits": true}'::jsonb""", _QUEUE_LIMITS
    if succeed:
        # One row for the whole trip, not one per job archived: their ids in a JSON array.
        if when is not None:
            status = f"CASE WHEN {when} THEN {status} END"
        status, when = (
            f"""jsonb_build_object(
    'archived', coalesce((SELECT jsonb_agg(id) FROM archived), '[]'::jsonb),
    'status', {status})""",
            None,
        )
    row = _STATUS_ROW.format(status=status) + ("" if when is None else f"\nWHERE {when}")
    joined = ",\n".join(ctes)
    return f"WITH {joined}\nSELECT {JOB_COLUMNS} FROM claimed\nUNION ALL\n{row}\n"


#: Claim up to ``limit`` ready jobs of the given queues (priority, then run_at order across
#: them), lease them to ``owner`` (for their task's lease, else ``lease`` seconds), mark the
#: at-most-once ones, use up one attempt each and record when the attempt started. One index
#: range per queue (LATERAL), so the claim stays flat however large the backlog. A queue that is
#: paused or limited (pgjobs_queues) is left out before any of its rows is read or locked: one
#: primary-key probe per queue, in the same statement, so a pause holds from the next claim on.
#: Of ``limit`` jobs, those beyond the first ``slots`` are claimed ahead of the worker's free
#: slots (its read-ahead): a job on its last attempt, or of an at-most-once task, is never one of
#: them, so that a worker that dies with jobs claimed ahead never sends a job that has not run to
#: dead_letter (it is claimed for a free slot, later).
#: Jobs held back for a task's limit (limit_key set) are not in these ranges, and the jobs of
#: ``limit_tasks`` (the tasks the worker limits) are left where they are: only JOB_CLAIM_LIMITED
#: takes them (a claim that comes back short because of them is followed by one under limits,
#: which holds them back out of the way).
#: Returns the claimed jobs (JOB_COLUMNS), then, only when some of the queues are limited, a
#: status row (id NULL, payload ``{"queue_limits": true}``): the worker claims with
#: JOB_CLAIM_LIMITED from then on.
JOB_CLAIM = _claim_statement(limited=False, succeed=False)

#: Whether any of ``queues`` holds a ready job (not leased, its run_at passed), whatever its
#: limit, group or expiry: what an idle worker asks at each poll before it claims, since the
#: claim statements cost the server several times more (~0.37 ms against ~0.12 ms, mostly their
#: executor's start on the tables they would write). False means no claim could take a job;
#: true only means one might. Per queue, one probe of each of the three partial indexes that
#: hold the ready rows (ix_queued_jobs_claim, _group_ready, _limit_ready), each a scalar subquery
#: with a LIMIT (an EXISTS is planned as a hashed subplan that reads every ready row). Rows:
#: (bool,).
JOB_READY_IN_QUEUES = """
SELECT EXISTS (
    SELECT 1 FROM unnest(%(queues)s::text[]) AS w(queue)
    WHERE coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND limit_key IS NULL AND group_key IS NULL AND run_at <= now()
                    LIMIT 1), false)
       OR coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND group_key IS NOT NULL AND run_at <= now()
                    LIMIT 1), false)
       OR coalesce((SELECT true FROM queued_jobs
                    WHERE queue = w.queue AND lease_expires_at IS NULL
                      AND limit_key IS NOT NULL AND run_at <= now()
                    LIMIT 1), false)
)
"""

#: JOB_CLAIM for a worker that limits some of its tasks (``limit_tasks`` with their
#: ``limit_concurrency``, ``limit_rate_jobs`` and ``limit_rate_seconds``; NULL where a task has
#: no such limit) or serves limited queues. In one statement:
#:   1. each limit (the tasks' from the worker, the queues' from pgjobs_queues) says how many jobs
#:      it allows (``limits``): a concurrency limit counts its running jobs in this statement's
#:      snapshot (``running``) and trusts the count only when the limit's row in
#:      pgjobs_limit_states, locked FOR UPDATE SKIP LOCKED (``states``), is the version the
#:      snapshot saw (``seen``): every claim that starts jobs under a limit writes its row, so a
#:      claim committed after this snapshot is never missed; a rate refills its bucket (the same
#:      row, read as last committed through the lock). A row locked by another claim, or not
#:      there yet (``new_states`` creates it), allows nothing this time (``locked_out``);
#:   2. each queue's range gives at most its capacity, and each limited task's held-back range in
#:      that queue at most the task's capacity (FOR UPDATE SKIP LOCKED);
#:   2b. jobs of a group (``_CLAIM_GROUPS``): the queues' groups with ready jobs are looked at in
#:      turn order (pgjobs_group_states.last_claim_at, oldest first; ``limit`` groups at most),
#:      each group's row locked FOR UPDATE SKIP LOCKED and kept only when it is the version the
#:      snapshot saw (a group another claim started jobs of since is left to the next claim), so
#:      its running jobs, counted in the snapshot (``group_running``), are right; each group gives
#:      its share of the claim from its own range, at most what the queue's group_concurrency
#:      and group rate leave, then at most what each task's ``group_limits`` and group rate
#:      (``group_rate_tasks`` with ``group_rate_jobs`` per ``group_rate_seconds``:
#:      ``group_task_rates``) leave (``group_jobs``; a task whose rate allows no more starts of
#:      the group is passed over in the group's range); a group rate counts the group's starts of
#:      the last period in pgjobs_group_starts, trusted as the running jobs are (the group's
#:      rows locked and current), and each claim records the starts it makes there (``rated``,
#:      at its now(): the jobs' started_at), a sliding window; an
#:      ordered task's job only when no older job of its task and group is in queued_jobs (and,
#:      for ``hold_tasks``, none is in dead_letter); the groups that gave jobs, or had nothing to
#:      give, go to the back of the turn order (``turned``). A task's limit and order hold per
#:      (task, group) in every queue, a queue's group_concurrency per (queue, group): each group
#:      is taken only when its row of every queue (pgjobs_groups, written with each of its
#:      (queue, group) rows) is locked too and the version the snapshot saw, and its running
#:      jobs are counted in every queue;
#:   3. of those, at most each task's and each queue's capacity are taken, ``limit`` in all, in
#:      claim order, a group's first job before the second of any (``turn``); the jobs taken of
#:      limited tasks keep their limit_key (it counts them);
#:   4. jobs of a limited task met in a queue's range beyond its capacity are held back: their
#:      limit_key is set, which moves them out of the queue's range into the task's own, so the
#:      queue's other jobs are reached past them from the next claim on;
#:   5. every limit that gave jobs has its row written (``spent``): tokens less one per job taken,
#:      and last_claim_at.
#: Returns the claimed jobs, then one status row (id NULL, payload a JSON object): ``held`` (jobs
#: held back now, and groups that gave their whole share: claim again at once), ``locked_out``
#: (another worker claims under one of the limits right now: try again soon), ``retry_in``
#: (seconds until an empty bucket has a token, or the oldest start in the window of a group
#: held by its rate leaves it), ``queue_limits`` (some of the queues are limited
#: or hold groups). (``spent`` runs whether read or not, as every data-modifying part of a
#: statement does.)
JOB_CLAIM_LIMITED = _claim_statement(limited=True, succeed=False)

#: The worker's usual round trip in one statement, so one commit and no pipeline: archive the
#: successes of the last batch (fenced as in JOB_SETTLE_MANY) and claim the next batch (as
#: JOB_CLAIM; ``limit`` 0 claims nothing). The two parts touch different rows: a job being
#: archived is leased, a claimable one is not. ``ok_results`` may be NULL (no handler returned
#: a value). Returns the claimed jobs (JOB_COLUMNS), then the trip's row (id NULL, payload
#: ``{"archived": [ids], "status": JOB_CLAIM's status or null}``).
JOB_SUCCEED_AND_CLAIM = _claim_statement(limited=False, succeed=True)

#: JOB_SUCCEED_AND_CLAIM with JOB_CLAIM_LIMITED's claim (its status in the trip's row). The jobs
#: it archives no longer count against their limits.
JOB_SUCCEED_AND_CLAIM_LIMITED = _claim_statement(limited=True, succeed=True)
