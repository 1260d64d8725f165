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
