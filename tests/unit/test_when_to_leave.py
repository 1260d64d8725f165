""" "When to leave" quotes the measured ceiling from the Performance page: every figure it gives is
printed there, as it is printed there, so that a new benchmark run cannot leave it behind."""

from __future__ import annotations

import re

from tests.support.helpers import REPO

DOCS = REPO / "docs" / "explanation"
#: Thousands with separators (32,076) and decimals (0.031): the measured figures.
FIGURE = re.compile(r"\d{1,3}(?:,\d{3})+|\d+\.\d+")


def ceiling_paragraph() -> str:
    text = (DOCS / "when-to-leave.md").read_text(encoding="utf-8")
    start = text.index("**The measured ceiling here.**")
    paragraph = text[start : text.index("\n\n", start)]
    # What follows is an example worked from the figures, not a measurement.
    return paragraph[: paragraph.index(", so a queue that runs")]


def test_every_figure_of_the_ceiling_is_the_performance_pages():
    performance = (DOCS / "performance.md").read_text(encoding="utf-8")
    figures = FIGURE.findall(ceiling_paragraph())
    assert len(figures) >= 5, figures
    missing = [figure for figure in figures if figure not in performance]
    assert missing == [], f"when-to-leave.md quotes figures performance.md does not: {missing}"


def test_the_figures_are_checked_as_figures():
    # The check finds a number however it is written, so a rounded copy cannot slip through.
    assert FIGURE.findall("about 32,000 jobs/s, 62,000 in batches, 0.03 s") == [
        "32,000",
        "62,000",
        "0.03",
    ]
