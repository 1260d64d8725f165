"""How `pgjobs dead list` and `dead group` print their rows.

At a terminal, each row takes two lines that fit its width: the short fields and the names on the
first (cropped at the line's end, never folded onto another line), the error on the second,
shortened at a word. Into a pipe or a file, each row is one line of tab-separated fields, whole,
for grep, cut and awk, under a header line; the title and the count are comment lines (``#``).
Job data is passed through ``printable`` either way, so a tab or a newline in it cannot make a
field or a line of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from pgjobs.cli.render import cell_time, when
from pgjobs.models import DeadGroup, DeadJob
from pgjobs.text import printable

#: Columns the second line (the error, the fingerprint) is indented by.
INDENT = 4
ELLIPSIS = "…"


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells, cut at a word when there is one in its second
    half, with an ellipsis when cut.

    Example: ``shorten("connection refused by the server", 20) == "connection refused…"``
    """
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    kept, used = [], 0
    for char in text:
        used += cell_len(char)
        if used > width - 1:
            break
        kept.append(char)
    cut = "".join(kept)
    space = cut.rfind(" ")
    if space >= len(cut) // 2:
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS


def _line(fields: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    """Fields padded to their widths (right-aligned where ``right``), two spaces apart; the last
    field is not padded."""
    cells = []
    for n, value in enumerate(fields):
        if n == len(fields) - 1:
            cells.append(value)
            continue
        pad = " " * (widths[n] - cell_len(value))
        cells.append(pad + value if right[n] else value + pad)
    return "  ".join(cells)


def _print_two_line_rows(
    console: Console,
    title: str,
    header: Sequence[str],
    right: Sequence[bool],
    rows: Sequence[tuple[Sequence[str], str]],
    caption: str,
) -> None:
    """A title, a header, then each row's fields on one line (cropped with an ellipsis at the
    console's width) and its detail shortened on the next."""
    width = console.width
    widths = [max([cell_len(h)] + [cell_len(r[0][n]) for r in rows]) for n, h in enumerate(header)]
    console.print(Text(title, style="bold"), soft_wrap=True)
    head = Text(_line(header, widths, right), style="bold")
    head.truncate(width, overflow="ellipsis")
    console.print(head, no_wrap=True, crop=True)
    for fields, detail in rows:
        first = Text(_line(fields, widths, right))
        first.truncate(width, overflow="ellipsis")
        console.print(first, no_wrap=True, crop=True)
        second = Text(" " * INDENT + shorten(detail, width - INDENT), style="dim")
        console.print(second, no_wrap=True, crop=True)
    console.print(Text(caption, style="italic"), soft_wrap=True)


def _print_tab_rows(
    console: Console, title: str, header: Sequence[str], rows: list[list[str]], caption: str
) -> None:
    """The title, a header, one line per row (tab-separated fields, never wrapped), the caption;
    the title and caption as comment lines, which ``grep -v '^#'`` or awk's ``/^#/`` skip."""
    lines = [f"# {title}", "\t".join(header), *("\t".join(fields) for fields in rows)]
    console.file.write("\n".join([*lines, f"# {caption}"]) + "\n")


def dead_jobs(console: Console, jobs: list[DeadJob], limit: int) -> None:
    """`pgjobs dead list`: two lines a job at a terminal, one tab-separated line into a pipe."""
    title = "dead jobs, newest first (times in UTC)"
    caption = "no dead job matches" if not jobs else f"{len(jobs)} shown (--limit {limit})"
    if not console.is_terminal:
        header = ("id", "failed", "queue", "task", "tries", "reason", "error")
        _print_tab_rows(
            console,
            title,
            header,
            [
                [
                    str(job.id),
                    when(job.failed_at),
                    printable(job.queue),
                    printable(job.task),
                    f"{job.attempts}/{job.max_attempts}",
                    job.reason,
                    printable(job.last_error or ""),
                ]
                for job in jobs
            ],
            caption,
        )
        return
    rows = [
        (
            [
                str(job.id),
                cell_time(job.failed_at),
                f"{job.attempts}/{job.max_attempts}",
                job.reason,
                printable(job.queue),
                printable(job.task),
            ],
            printable(job.last_error or "(no error recorded)"),
        )
        for job in jobs
    ]
    _print_two_line_rows(
        console,
        f"{title}; the error below each",
        ("id", "failed", "tries", "reason", "queue", "task"),
        (True, False, True, False, False, False),
        rows,
        caption,
    )


def dead_groups(console: Console, groups: list[DeadGroup], title: str) -> None:
    """`pgjobs dead group`, and what a dry-run redrive or purge would take: two lines a group at
    a terminal (the fingerprint on the second), one tab-separated line into a pipe."""
    total = sum(group.count for group in groups)
    caption = f"{total:,} dead job(s) in {len(groups):,} group(s)"
    if not console.is_terminal:
        header = ("count", "task", "fingerprint_id", "first_failed", "last_failed", "fingerprint")
        _print_tab_rows(
            console,
            f"{title} (times in UTC)",
            header,
            [
                [
                    str(group.count),
                    printable(group.task),
                    printable(group.fingerprint_id),
                    when(group.first_failed_at),
                    when(group.last_failed_at),
                    printable(group.fingerprint),
                ]
                for group in groups
            ],
            caption,
        )
        return
    rows = [
        (
            [
                f"{group.count:,}",
                printable(group.fingerprint_id),
                cell_time(group.first_failed_at),
                cell_time(group.last_failed_at),
                printable(group.task),
            ],
            printable(group.fingerprint),
        )
        for group in groups
    ]
    _print_two_line_rows(
        console,
        f"{title} (times in UTC); the error fingerprint below each",
        ("count", "id", "first failed", "last failed", "task"),
        (True, False, False, False, False),
        rows,
        caption,
    )
