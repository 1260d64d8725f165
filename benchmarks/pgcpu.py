"""Group f: PostgreSQL CPU seconds per 1,000 jobs processed.

Read from /proc during each processing run of group b (the same runs when both groups run): the
CPU of the backends serving the benchmark database, sampled every 20 ms while the run lasts, so
that other databases on a shared server do not count. Background processes (WAL writer,
checkpointer) are left out; the backends write and flush their own WAL at commit.

Each pgjobs figure is beside two references: the one-trip raw loop on pgjobs' own tables, and
the narrow loop on the narrowest tables (``benchmarks/raw.py``). Group b prints these rows from
its own runs; when it ran, this group adds none.
"""

from __future__ import annotations

from benchmarks import processing
from benchmarks.harness import Context
from benchmarks.processing import Run, Setup
from benchmarks.report import Figure, Row, ratio_limit_target


def _figure(runs: list[Run]) -> Figure | None:
    values = [run.pg_cpu_per_1k for run in runs]
    if any(value is None for value in values):
        return None
    return Figure("CPU s/1k jobs", [value for value in values if value is not None])


#: Server CPU per job against the one-trip loop (the performance issue's target).
GOAL = 1.2
#: Server CPU per job against the narrow loop (performance round 3's target).
NARROW_GOAL = 1.3
#: pgjobs' setup, the one-trip loop and the narrow loop beside it (as many processes).
TRIOS = (("c32", "trip_1", "narrow_1"), ("2x32", "trip_2", "narrow_2"))
#: Set in the context once the rows are printed (by group b), so that they print once.
SHOWN = "pgcpu_rows_shown"


def _ratio(figure: Figure | None, reference: Figure | None) -> float | None:
    if figure is None or reference is None or not reference.median:
        return None
    return figure.median / reference.median


def rows(ctx: Context, named: dict[str, Setup], runs: dict[str, list[Run]]) -> list[Row]:
    """The rows of PostgreSQL's CPU per 1,000 jobs from processing ``runs`` (by setup name)."""
    ctx.cache[SHOWN] = True
    result = []
    for name, reference, narrow in TRIOS:
        pgjobs = _figure(runs[name])
        raw = _figure(runs[reference])
        narrow_figure = _figure(runs[narrow])
        note = "" if pgjobs is not None else "server not on this machine: /proc unavailable"
        result.append(
            Row(
                "pg cpu",
                f"PostgreSQL CPU per 1,000 jobs: {named[name].label()}",
                pgjobs,
                raw,
                named[reference].label(),
                ratio_limit_target(f"≤ {GOAL}x of raw", _ratio(pgjobs, raw), GOAL),
                note,
                {"jobs": named[name].jobs},
                narrow=narrow_figure,
                narrow_name=named[narrow].label(),
                narrow_target=ratio_limit_target(
                    f"≤ {NARROW_GOAL}x of narrow raw", _ratio(pgjobs, narrow_figure), NARROW_GOAL
                ),
            )
        )
    return result


def run(ctx: Context) -> list[Row]:
    if ctx.cache.get(SHOWN):
        return []
    named = processing.setups(ctx)
    wanted = [name for trio in TRIOS for name in trio]
    results = processing.measure(ctx, [named[name] for name in wanted])
    return rows(ctx, named, {name: results[named[name]] for name in wanted})
