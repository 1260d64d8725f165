"""A demo app: `python -m examples.demo enqueue 300` then `pgjobs work --app examples.demo:app`.

One job in ten fails for good, one in ten fails once and then succeeds, the rest succeed.
"""

from __future__ import annotations

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
    if fail == "once" and random.random() < 0.7:
        raise TimeoutError(f"storage timed out reading image {image}")
    return {"image": image, "width": 640}


@app.task(name="demo.send_email", queue="emails", retry_base=0.2, retry_cap=1.0)
async def send_email(to: str) -> None:
    import asyncio

    await asyncio.sleep(random.uniform(0.001, 0.02))


def enqueue(count: int) -> None:
    jobs = []
    for n in range(count):
        fail = "always" if n % 10 == 0 else "once" if n % 10 == 1 else "never"
        jobs.append(pgjobs.JobSpec("demo.resize", {"image": n, "fail": fail}))
        if n % 3 == 0:
            jobs.append(pgjobs.JobSpec("demo.send_email", {"to": f"user{n}@example.com"}))
    with app:
        ids = app.enqueue_many(jobs)
    print(f"enqueued {len(ids)} jobs (ids {ids[0]}..{ids[-1]})")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "enqueue" or not sys.argv[2].isdigit():
        sys.exit("usage: python -m examples.demo enqueue COUNT")
    enqueue(int(sys.argv[2]))
