"""`python -m benchmarks`: create a throwaway database, run the groups, print one table."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from benchmarks import (
    api,
    costs,
    dashboard,
    durable,
    enqueue,
    groups,
    growth,
    harness,
    idle,
    latency,
    limits,
    memory,
    pgcpu,
    pooler,
    processing,
    prune,
    retention_beside,
    supervise,
    tenants,
    workflows,
)
from benchmarks.harness import BenchDatabase, BenchmarkError, Context, say
from benchmarks.report import Row, render
from pgjobs.cli import DISTRIBUTION
from pgjobs.db.dsn import Dsn, normalize_dsn, resolve_dsn
from pgjobs.errors import PgjobsError

#: The groups in the order they run; letters as in the performance issue.
GROUPS: dict[str, tuple[str, Callable[[Context], list[Row]]]] = {
    "enqueue": ("a", enqueue.run),
    "processing": ("b", processing.run),
    "latency": ("c", latency.run),
    "memory": ("d", memory.run),
    "growth": ("e", growth.run),
    "pgcpu": ("f", pgcpu.run),
    "prune": ("g", prune.run),  # issue 5: retention of a 1M-row archive
    "api": ("h", api.run),  # issue 12: enqueue through `pgjobs serve`
    "dashboard": ("i", dashboard.run),  # issue 13: the dashboard's pages on a big database
    "limits": ("j", limits.run),  # issue 14: a task at its limit beside the queue's other jobs
    "supervise": ("k", supervise.run),  # issue 16: --processes start-up, burst exit
    "pooler": ("l", pooler.run),  # issue 25: through PgBouncer in transaction mode
    "groups": ("m", groups.run),  # issue 26: a limit per group, turns between groups
    "tenants": ("n", tenants.run),  # issue 28: pgbench beside a queue at 2,000 jobs/s
    "workflows": ("o", workflows.run),  # issue 27: a batch with a callback
    "idle": ("p", idle.run),  # issue 28: what 20 idle workers cost the server
    "costs": ("q", costs.run),  # issue 28: what each index and column costs per job
    "durable": ("w", durable.run),  # issue 39: recorded steps, resume after a sleep
    "retention": ("r", retention_beside.run),  # issue 42: the retention round beside processing
}
#: Environment variable naming the server to benchmark on (before pgjobs' own variables).
ENV_DSN = "PGJOBS_BENCH_DSN"
RESULTS = harness.REPO_ROOT / "benchmarks" / "results" / "latest.json"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark pgjobs against raw SQL on the same database and print a table.",
    )
    parser.add_argument(
        "--dsn",
        help=f"PostgreSQL server URL (a throwaway database is created there). Default: ${ENV_DSN}, "
        "then $PGJOBS_DATABASE_URL, then $DATABASE_URL, then the embedded server.",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs (~2 min)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this group (repeatable, or comma-separated): {', '.join(GROUPS)} "
        "(or their letters a-q)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="runs per throughput figure (default 5, quick 2; latency and growth take at most 3, "
        "memory at most 2)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help=f"where to save the JSON (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    letters = {letter: name for name, (letter, _) in GROUPS.items()}
    chosen: list[str] = []
    for item in ",".join(args.only or []).split(","):
        name = letters.get(item.strip(), item.strip())
        if not name:
            continue
        if name not in GROUPS:
            parser.error(f"--only {item!r}: choose from {', '.join(GROUPS)}")
        chosen.append(name)
    args.groups = [name for name in GROUPS if name in chosen] if chosen else list(GROUPS)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def _server(explicit: str | None) -> Dsn:
    if explicit:
        return normalize_dsn(explicit, "--dsn")
    if os.environ.get(ENV_DSN):
        return normalize_dsn(os.environ[ENV_DSN], f"${ENV_DSN}")
    return resolve_dsn(None)


def _machine(bench: BenchDatabase, server: Dsn) -> dict[str, Any]:
    conn = bench.conn
    settings: dict[str, str] = dict(
        conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (["server_version", "shared_buffers", "synchronous_commit", "fsync", "max_wal_size"],),
        ).fetchall()
    )
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "load_average_at_start": os.getloadavg()[0],
        "platform": platform.platform(),
        "postgresql": settings.pop("server_version"),
        "postgresql_settings": settings,
        "server": f"{server.redacted} ({server.source})",
        "server_on_this_machine": bench.local,
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "pgjobs": version(DISTRIBUTION),
    }


def _describe(machine: dict[str, Any], args: argparse.Namespace, repeats: int) -> list[str]:
    settings = ", ".join(f"{k}={v}" for k, v in machine["postgresql_settings"].items())
    where = "on this machine" if machine["server_on_this_machine"] else "remote"
    where += f", {machine['server']}"
    return [
        f"[bold]machine[/bold]: {machine['cores']} cores ({machine['cpu']}), load average "
        f"{machine['load_average_at_start']:.2f} at start; client and server share them",
        f"[bold]PostgreSQL[/bold] {machine['postgresql']} ({where}: {settings})",
        f"[bold]Python[/bold] {machine['python']}, psycopg {machine['psycopg']}, "
        f"pgjobs {machine['pgjobs']}",
        f"[bold]run[/bold]: {'quick' if args.quick else 'full'}, {repeats} runs per figure, "
        f"groups: {', '.join(args.groups)}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.monotonic()
    try:
        server = _server(args.dsn)
        say(f"creating a benchmark database on {server.redacted}")
        bench = BenchDatabase(server)
    except (PgjobsError, psycopg.Error) as exc:
        print(f"benchmarks: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    repeats = args.repeats or (2 if args.quick else 5)
    rows: list[Row] = []
    failures: list[str] = []
    try:
        with harness.procs() as group:
            ctx = Context(bench, args.quick, repeats, group)
            machine = _machine(bench, server)
            for name in args.groups:
                say(f"[bold]{name}[/bold]")
                group_started = time.monotonic()
                try:
                    rows += GROUPS[name][1](ctx)
                except (BenchmarkError, PgjobsError, psycopg.Error) as exc:
                    failures.append(f"{name}: {exc}")
                    say(f"[red]{name} failed:[/red] {exc}")
                    traceback.print_exc()
                    group.stop_all()
                say(f"  {name} took {time.monotonic() - group_started:.0f}s")
    finally:
        say(f"dropping {bench.name}")
        bench.drop()
    duration = time.monotonic() - started
    result = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_seconds": round(duration, 1),
        "quick": args.quick,
        "repeats": repeats,
        "machine": machine,
        "rows": [row.to_json() for row in rows],
        "failures": failures,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)  # a file or a pipe: no need to wrap at 80 columns
        render(rows, _describe(machine, args, repeats), console)
        for failure in failures:
            console.print(f"[red]failed[/red] {failure}", highlight=False)
        console.print(f"[dim]{duration:.0f}s; JSON saved to {args.output}[/dim]", highlight=False)
    return 1 if failures else 0
