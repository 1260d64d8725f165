"""A demo app: `python -m examples.demo enqueue 300` then `pgjobs work --app examples.demo:app`.

Of the image jobs, one in ten fails for good (its three attempts all fail: it ends in
dead_letter), one in ten fails once and succeeds on its second attempt, the rest succeed at
once; one e-mail job is sent for every third image, and always succeeds.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

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


def jobs(count: int) -> list[pgjobs.JobSpec]:
    """``count`` image jobs (image n fails for good when n % 10 == 0, once when n % 10 == 1) and
    an e-mail job for every third image."""
    specs = []
    for n in range(count):
        fail = "always" if n % 10 == 0 else "once" if n % 10 == 1 else "never"
        specs.append(pgjobs.JobSpec("demo.resize", {"image": n, "fail": fail}))
        if n % 3 == 0:
            specs.append(pgjobs.JobSpec("demo.send_email", {"to": f"user{n}@example.com"}))
    return specs


def enqueue(count: int) -> None:
    with app:
        ids = app.enqueue_many(jobs(count))
    print(
        f"enqueued {len(ids)} jobs (ids {ids[0]}..{ids[-1]}): {count} images, of which "
        f"{len(range(0, count, 10))} fail for good and {len(range(1, count, 10))} fail once, "
        f"and {len(range(0, count, 3))} e-mails"
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "enqueue" or not sys.argv[2].isdigit():
        sys.exit("usage: python -m examples.demo enqueue COUNT")
    enqueue(int(sys.argv[2]))
