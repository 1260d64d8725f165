"""The DBOS side of group w (durable workflows): the same two workloads on DBOS Transact, run by
``benchmarks.durable`` in a process of its own, with the Python of the peers' venv (``make
bench-peers`` installs ``dbos`` there; it is never a pgjobs dependency). Prints one JSON object.

- ``steps``: ``--workflows`` workflows of ``--steps`` no-op ``@DBOS.step`` steps, enqueued on a
  DBOS queue with concurrency 32 (the ``--concurrency`` of pgjobs' worker), in one process:
  recorded steps/s from the first enqueue to the last result.
- ``fan``: ``--fans`` parents, each enqueueing ``--width`` child workflows of one no-op step on a
  second queue (concurrency 32), waiting for all their results, then running one step: units/s
  (a unit is a parent, a child or the final step: ``fans * (width + 2)``). The parents have a
  queue of their own, without a limit, so that waiting parents never hold the children's slots.

Run: ``.venv/peers/bin/python -m benchmarks.dbos_peer --dsn URL`` on an empty database (DBOS
creates its system tables there).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from typing import Any

CONCURRENCY = 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dbos_peer")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fans", type=int, default=50)
    parser.add_argument("--width", type=int, default=100)
    args = parser.parse_args(argv)

    # The peers' venv only (not a pgjobs dependency): imported by name, its API untyped here.
    dbos: Any = importlib.import_module("dbos").DBOS
    dbos(config={"name": "pgjobs-bench", "system_database_url": args.dsn})

    def _noop() -> None:
        return None

    noop = dbos.step()(_noop)

    def _steps(n: int) -> None:
        for _ in range(n):
            noop()

    steps = dbos.workflow()(_steps)

    def _child(i: int) -> int:
        noop()
        return i

    child = dbos.workflow()(_child)

    def _fan(width: int) -> int:
        children = dbos.retrieve_queue("bench-children")
        handles = [children.enqueue(child, i) for i in range(width)]
        total = sum(int(h.get_result()) for h in handles)
        noop()
        return total

    fan = dbos.workflow()(_fan)

    dbos.launch()
    queue = dbos.register_queue("bench-steps", concurrency=CONCURRENCY)
    dbos.register_queue("bench-children", concurrency=CONCURRENCY)
    parents = dbos.register_queue("bench-parents")
    figures: dict[str, Any] = {}
    try:
        start = time.monotonic()
        handles = [queue.enqueue(steps, args.steps) for _ in range(args.workflows)]
        for handle in handles:
            handle.get_result()
        figures["steps_per_s"] = args.workflows * args.steps / (time.monotonic() - start)
        start = time.monotonic()
        handles = [parents.enqueue(fan, args.width) for _ in range(args.fans)]
        for handle in handles:
            handle.get_result()
        units = args.fans * (args.width + 2)
        figures["fan_units_per_s"] = units / (time.monotonic() - start)
    finally:
        dbos.destroy()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
