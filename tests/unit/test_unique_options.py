"""``submission.check_unique_options``: what the CLI and the HTTP API check before a job with a
unique key is built (on_conflict and debounce need a unique key; debounce needs
on_conflict="debounce")."""

from __future__ import annotations

import pytest

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_unique_options


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((None, None, None), (None, None, None)),
        (("k", None, None), ("k", None, None)),
        (("k", "keep", None), ("k", "keep", None)),
        (("k", "replace", None), ("k", "replace", None)),
        (("k", "debounce", 30), ("k", "debounce", 30.0)),
        (("k", "debounce", None), ("k", "debounce", None)),
    ],
)
def test_accepted(given, expected):
    assert check_unique_options(*given) == expected


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (("", None, None), "unique_key"),
        (("k" * 513, None, None), "unique_key"),
        (("a\x00", None, None), "unique_key"),
        ((None, "keep", None), "on_conflict"),
        ((None, None, 5), "debounce"),
        (("k", "merge", None), "on_conflict"),
        (("k", None, 5), "debounce"),
        (("k", "replace", 5), "debounce"),
        (("k", "debounce", -1), "debounce"),
        (("k", "debounce", float("inf")), "debounce"),
        (("k", "debounce", True), "debounce"),
    ],
)
def test_refused_naming_the_field(given, field):
    with pytest.raises(ConfigurationError) as caught:
        check_unique_options(*given)
    assert caught.value.field == field
    assert "\n" not in str(caught.value)
