"""Every option given in seconds is refused in one line, whatever number it is given."""

from __future__ import annotations

import pytest

import pgjobs
from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_seconds

HOSTILE = [10**400, -(10**400), float("inf"), float("nan"), -1, 10**10]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
@pytest.mark.parametrize("positive", [False, True])
def test_check_seconds_refuses_with_a_configuration_error(value: object, positive: bool) -> None:
    with pytest.raises(ConfigurationError, match="must be a finite number of seconds"):
        check_seconds("lease", value, positive=positive)


@pytest.mark.parametrize("option", ["retry_base", "retry_cap", "timeout", "lease"])
@pytest.mark.parametrize("value", [10**400, float("inf"), "soon"], ids=["10**400", "inf", "text"])
def test_a_task_option_in_seconds_refuses_a_huge_number(option: str, value: object) -> None:
    app = pgjobs.App("postgresql://postgres@127.0.0.1:1/unused")
    with pytest.raises(ConfigurationError, match=option):
        app.task(name="t", **{option: value})(lambda: None)  # type: ignore[call-overload]
