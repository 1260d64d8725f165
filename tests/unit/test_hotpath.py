"""libpq: the hot statement's placeholders as libpq's positional parameters, and the text
each parameter is sent as."""

from __future__ import annotations

import re

import pytest

from pgjobs import queries
from pgjobs.db import libpq


def test_named_placeholders_become_positional_ones_in_order_of_first_use():
    text, order = libpq.positional("SELECT %(b)s, %(a)s::int[], %(b)s LIMIT %(c)s")
    assert text == b"SELECT $1, $2::int[], $1 LIMIT $3"
    assert order == ("b", "a", "c")


def test_the_hot_statement_has_one_parameter_per_name():
    text, order = libpq.positional(queries.JOB_SUCCEED_AND_CLAIM)
    assert set(order) == set(re.findall(r"%\((\w+)\)s", queries.JOB_SUCCEED_AND_CLAIM))
    assert b"%(" not in text and f"${len(order)}".encode() in text


def test_a_literal_percent_is_refused():
    with pytest.raises(ValueError, match="literal %"):
        libpq.positional("SELECT 1 %% 2, %(a)s")


@pytest.mark.parametrize(
    ("value", "sent"),
    [(None, None), ("{1,2}", b"{1,2}"), ("été", "été".encode()), (32, b"32"), (0.1, b"0.1")],
)
def test_parameters_go_as_text(value, sent):
    assert libpq._text(value) == sent


def test_other_parameter_types_are_refused():
    with pytest.raises(TypeError):
        libpq._text(True)
