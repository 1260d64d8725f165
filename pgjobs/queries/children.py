"""A workflow's children (``ctx.map``, ``ctx.run``): the batch of child jobs it waits for, and
how each child ended, in the order they were enqueued."""

from __future__ import annotations

#: Make batch %(batch_id)s the children of workflow job %(job_id)s: the trigger
#: pgjobs_children_ended makes the job ready when its last member ends.
CHILDREN_ADOPT = "UPDATE pgjobs_batches SET parent_job_id = %(job_id)s WHERE id = %(batch_id)s"

#: The children that have not ended yet, read under the batch row's lock, which a child's end
#: takes too: either the end is seen here, or it comes after the workflow suspended and wakes it.
CHILDREN_PENDING = "SELECT pending FROM pgjobs_batches WHERE id = %(batch_id)s FOR UPDATE"

#: How each of the children %(ids)s ended, in their order: (position, home, status, result,
#: error, error_type); home NULL for a child found in no table (pruned, or still queued).
CHILDREN_ENDS = """
SELECT c.n, e.home, e.status, e.result, e.error, e.error_type
FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS c(id, n)
LEFT JOIN LATERAL (
    SELECT 'archived_jobs' AS home, a.status, a.result, a.last_error AS error,
           NULL::text AS error_type
    FROM archived_jobs a WHERE a.id = c.id
    UNION ALL
    SELECT 'dead_letter', 'dead', NULL::jsonb, d.last_error, d.error_type
    FROM dead_letter d WHERE d.id = c.id
    UNION ALL
    SELECT 'queued_jobs', 'queued', NULL::jsonb, NULL, NULL
    FROM queued_jobs q WHERE q.id = c.id
    LIMIT 1
) e ON true
ORDER BY c.n
"""
