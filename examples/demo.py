"""A demo app: `python -m examples.demo enqueue 300` then `pgjobs work --app examples.demo:app`
(`enqueue --fresh` first removes the jobs earlier demos left, as `make demo` does).

Of the image jobs, one in ten fails for good (its three attempts all fail: it ends in
dead_letter), one in ten fails once and succeeds on its second attempt, the rest succeed at
once; one e-mail job is sent for every third image, and always succeeds.

`python -m examples.demo produce` enqueues a few such jobs every 2 seconds until stopped (SIGTERM
or Ctrl-C): the producer of docker-compose.yml, which keeps the stats and the dashboard moving.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import threading
import time
from types import FrameType

import psycopg

import pgjobs

app = pgjobs.App()


@app.task(name="demo.resize", queue="images", max_attempts=3, retry_base=0.2, retry_cap=1.0)
def resize(image: int, fail: str = "never") -> dict[str, int]:
    time.sleep(random.uniform(0.001, 0.02))
    if fail == "always":
        raise ValueError(f"image {image} is corrupt")
    if fail == "once" and pgjobs.current_job().job.attempts == 1:
        raise TimeoutError(f"storage timed out reading image {image}")
    return {"image": image, "width": 640}


@app.task(name="demo.send_email", queue="emails", retry_base=0.2, retry_cap=1.0)
async def send_email(to: str) -> None:
    await asyncio.sleep(random.uniform(0.001, 0.02))


def jobs(count: int, first: int = 0) -> list[pgjobs.JobSpec]:
    """``count`` image jobs, images ``first``.. (image n fails for good when n % 10 == 0, once
    when n % 10 == 1) and an e-mail job for every third image."""
    specs = []
    for n in range(first, first + count):
        fail = "always" if n % 10 == 0 else "once" if n % 10 == 1 else "never"
        specs.append(pgjobs.JobSpec("demo.resize", {"image": n, "fail": fail}))
        if n % 3 == 0:
            specs.append(pgjobs.JobSpec("demo.send_email", {"to": f"user{n}@example.com"}))
    return specs


#: The demo's tasks: what ``clear`` removes (and nothing else).
TASKS = ("demo.resize", "demo.send_email")


def clear() -> int:
    """Remove the jobs of the demo's tasks that earlier runs left, wherever they are (ready,
    finished or dead), in one transaction, so that a demo that runs again ends with the counts
    it promises; other jobs in the database are left alone. Returns how many were removed."""
    removed = 0
    with psycopg.connect(app.dsn.url) as conn:
        for statement in (
            "DELETE FROM queued_jobs WHERE task = ANY(%s)",
            "DELETE FROM archived_jobs WHERE task = ANY(%s)",
            "DELETE FROM dead_letter WHERE task = ANY(%s)",
        ):
            removed += conn.execute(statement, [list(TASKS)]).rowcount
    return removed


def enqueue(count: int, *, fresh: bool = False) -> None:
    """Enqueue ``count`` image jobs and their e-mails; ``fresh``: first remove what earlier
    demos left (``clear``)."""
    if fresh and (removed := clear()):
        print(f"removed {removed} jobs an earlier demo left")
    with app:
        ids = app.enqueue_many(jobs(count))
    print(
        f"enqueued {len(ids)} jobs (ids {ids[0]}..{ids[-1]}): {count} images, of which "
        f"{len(range(0, count, 10))} fail for good and {len(range(1, count, 10))} fail once, "
        f"and {len(range(0, count, 3))} e-mails"
    )


# --8<-- [start:produce]
def produce(every: float, count: int, *, stop: threading.Event | None = None) -> int:
    """Enqueue ``count`` image jobs (and their e-mails) every ``every`` seconds until ``stop`` is
    set, SIGTERM arrives or Ctrl-C is pressed; returns the number of batches enqueued. A batch
    the database refuses (it restarts, say) is reported and the next one is tried on time."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()  # as PID 1 of a container, SIGTERM would otherwise be ignored

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
    batches = 0
    with app:
        while not stop.is_set():
            try:
                ids = app.enqueue_many(jobs(count, first=batches * count))
            except pgjobs.PgjobsError as exc:
                print(f"batch not enqueued: {exc}", flush=True)
            else:
                batches += 1
                print(f"batch {batches}: enqueued jobs {ids[0]}..{ids[-1]}", flush=True)
            stop.wait(every)
    return batches


# --8<-- [end:produce]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.demo")
    commands = parser.add_subparsers(dest="command", required=True)
    once = commands.add_parser("enqueue", help="enqueue COUNT image jobs and their e-mails")
    once.add_argument("count", type=int)
    once.add_argument(
        "--fresh", action="store_true", help="first remove the jobs earlier demos left"
    )
    loop = commands.add_parser("produce", help="enqueue a batch every few seconds until stopped")
    loop.add_argument("--every", type=float, default=2.0, help="seconds between batches")
    loop.add_argument("--count", type=int, default=5, help="image jobs per batch")
    args = parser.parse_args()
    if args.count < 1 or (args.command == "produce" and not 0 < args.every < 86400):
        parser.error("COUNT must be at least 1, and --every between 0 and 86400 seconds")
    if args.command == "enqueue":
        enqueue(args.count, fresh=args.fresh)
    else:
        produce(args.every, args.count)


if __name__ == "__main__":
    main()
