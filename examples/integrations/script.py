"""A plain script: enqueue a batch in the script's own transaction, then work it off with a
burst worker in the same process, and print what happened.

    PGJOBS_DATABASE_URL=postgresql://... python -m examples.integrations.script 100
"""

from __future__ import annotations

import os
import sys

import psycopg

import pgjobs

DATABASE_URL = os.environ.get("PGJOBS_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
app = pgjobs.App(DATABASE_URL)


@app.task(name="script.square")
def square(n: int) -> int:
    return n * n


def main(count: int) -> None:
    with psycopg.connect(DATABASE_URL) as conn:  # one transaction: all the jobs or none
        ids = app.enqueue_many(
            [pgjobs.JobSpec("script.square", {"n": n}) for n in range(count)], connection=conn
        )
    pgjobs.Worker(app, pgjobs.WorkerConfig(concurrency=4, burst=True, maintenance=False)).run()
    total = sum(app.job(job_id).result for job_id in ids)
    print(f"{len(ids)} jobs done, sum of squares {total}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
