"""What a benchmark produces (rows of figures, each beside its raw-SQL reference) and how it is
shown: one rich table for humans, JSON for machines."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

#: Units of figures, and whether a larger value is the better one.
HIGHER_IS_BETTER = {
    "jobs/s": True,
    "ms": False,
    "MiB": False,
    "CPU s/1k jobs": False,
    "CPU ms/s": False,
    "µs/job": False,
    "TPS": True,
}


@dataclass
class Figure:
    """One quantity measured in several runs; shown as the median with the min-max range."""

    unit: str
    runs: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "runs": self.runs,
        }


@dataclass
class Target:
    """A goal of the performance issue, checked against what was measured.

    ``shown`` is the measured value in the target's own terms (a ratio, a latency), ``met`` is
    None when the figure could not be measured.
    """

    goal: str
    shown: str
    met: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"goal": self.goal, "measured": self.shown, "met": self.met}


@dataclass
class Row:
    """One line of the table: pgjobs' figure beside the leanest raw-SQL figure for the same work."""

    group: str
    name: str
    pgjobs: Figure | None
    raw: Figure | None = None
    #: What the raw reference does, e.g. "one autocommit INSERT per job".
    raw_name: str = ""
    target: Target | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    #: What the reference column holds for this row: raw SQL, or (the api group) pgjobs' own
    #: Python API measured in the same run.
    reference: str = "raw"
    #: The second reference of the processing, enqueue and PostgreSQL CPU rows: the narrowest
    #: raw SQL (``benchmarks/raw.py``'s narrow tables), what it does, and the issue's target
    #: against it.
    narrow: Figure | None = None
    narrow_name: str = ""
    narrow_target: Target | None = None
    #: Further targets of the row (the tenants group's "smaller drop than beside PgQueuer").
    more_targets: list[Target] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """pgjobs' median over the raw median."""
        return _ratio(self.pgjobs, self.raw)

    @property
    def narrow_ratio(self) -> float | None:
        """pgjobs' median over the narrow reference's median."""
        return _ratio(self.pgjobs, self.narrow)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "pgjobs": self.pgjobs.to_json() if self.pgjobs else None,
            "raw": self.raw.to_json() if self.raw else None,
            "raw_name": self.raw_name,
            "reference": self.reference,
            "ratio": self.ratio,
            "target": self.target.to_json() if self.target else None,
            "narrow": self.narrow.to_json() if self.narrow else None,
            "narrow_name": self.narrow_name,
            "narrow_ratio": self.narrow_ratio,
            "narrow_target": self.narrow_target.to_json() if self.narrow_target else None,
            "more_targets": [target.to_json() for target in self.more_targets],
            "note": self.note,
            "details": self.details,
        }


def _ratio(figure: Figure | None, reference: Figure | None) -> float | None:
    if figure is None or reference is None or not reference.median:
        return None
    return figure.median / reference.median


def ratio_target(goal: str, ratio: float | None, at_least: float) -> Target:
    """A target of the form "pgjobs reaches at least ``at_least`` of a reference"."""
    if ratio is None:
        return Target(goal, "n/a", None)
    return Target(goal, f"{ratio:.0%}", ratio >= at_least)


def ratio_limit_target(goal: str, ratio: float | None, at_most: float) -> Target:
    """A target of the form "pgjobs costs at most ``at_most`` times a reference"."""
    if ratio is None:
        return Target(goal, "n/a", None)
    return Target(goal, f"{ratio:.2f}x", ratio <= at_most)


def limit_target(goal: str, figure: Figure | None, at_most: float) -> Target:
    """A target of the form "the median stays at or below ``at_most``"."""
    if figure is None:
        return Target(goal, "n/a", None)
    return Target(goal, format_value(figure.median, figure.unit), figure.median <= at_most)


def format_value(value: float, unit: str) -> str:
    if unit == "jobs/s":
        return f"{value:,.0f}/s"
    if unit == "CPU s/1k jobs":
        return f"{value:.3f} s"
    if unit == "CPU ms/s":
        return f"{value:.2f} ms/s"
    if unit == "ms":
        return f"{value:.1f} ms" if value < 100 else f"{value:,.0f} ms"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "µs/job":
        return f"{value:.1f} µs"
    if unit == "TPS":
        return f"{value:,.0f} TPS"
    return f"{value:g} {unit}"


def _compact(value: float, unit: str) -> str:
    if unit in ("jobs/s", "TPS"):
        return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:,.0f}"
    if unit == "CPU s/1k jobs":
        return f"{value:.3f}"
    if unit in ("ms", "MiB", "CPU ms/s", "µs/job"):
        return f"{value:.1f}" if value < 100 else f"{value:,.0f}"
    return f"{value:g}"


def format_figure(figure: Figure | None) -> Text:
    if figure is None:
        return Text("—", style="dim")
    text = Text(format_value(figure.median, figure.unit))
    if len(figure.runs) > 1:
        low, high = _compact(figure.low, figure.unit), _compact(figure.high, figure.unit)
        text.append(f"\n{low}-{high}", style="dim")
    return text


def _format_ratio(row: Row, ratio: float | None) -> Text:
    if ratio is None or row.pgjobs is None:
        return Text("—", style="dim")
    better = HIGHER_IS_BETTER.get(row.pgjobs.unit, True)
    # For "lower is better" units a ratio above 1 means pgjobs costs more than raw SQL.
    return Text(f"{ratio:.2f}x", style="" if better else "italic")


def _format_target(*targets: Target | None) -> Text:
    text = Text("")
    for target in targets:
        if target is None:
            continue
        if text:
            text.append("\n")
        mark, style = {True: ("✓", "green"), False: ("✗", "red"), None: ("?", "yellow")}[target.met]
        text.append(f"{mark} ", style=style)
        text.append(target.goal)
        text.append(f"\n{target.shown}", style="dim")
    return text


def render(rows: list[Row], machine: list[str], console: Console) -> None:
    """Print the machine description, then one table of every row."""
    for line in machine:
        console.print(line, highlight=False)
    table = Table(title="pgjobs benchmarks: median of runs (min-max below)", show_lines=True)
    table.add_column("group", style="bold")
    table.add_column("measurement")
    table.add_column("pgjobs", justify="right")
    table.add_column("raw SQL", justify="right")
    table.add_column("pgjobs/raw", justify="right")
    narrow = any(row.narrow is not None or row.narrow_name for row in rows)
    if narrow:
        table.add_column("narrow raw", justify="right")
        table.add_column("pgjobs/narrow", justify="right")
    table.add_column("target")
    table.add_column("notes", style="dim")
    for row in rows:
        name = Text(row.name)
        if row.raw_name:
            name.append(f"\n{row.reference}: {row.raw_name}", style="dim")
        if row.narrow_name:
            name.append(f"\nnarrow raw: {row.narrow_name}", style="dim")
        cells = [format_figure(row.pgjobs), format_figure(row.raw), _format_ratio(row, row.ratio)]
        if narrow:
            cells += [format_figure(row.narrow), _format_ratio(row, row.narrow_ratio)]
        table.add_row(
            row.group,
            name,
            *cells,
            _format_target(row.target, row.narrow_target, *row.more_targets),
            row.note,
        )
    console.print(table)
