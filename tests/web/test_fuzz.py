"""A property-based fuzz of the OpenAPI document (schemathesis): every operation, with generated
valid and invalid input, answers no 500, only the status codes and content types it declares,
and bodies that match its declared schemas. Derandomized and bounded, so CI runs the same
examples every time in well under two minutes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from pgjobs.db.dsn import Dsn
from pgjobs.web import create_app
from tests.web.conftest import AUTH, READ_TOKEN, TOKEN

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

#: Examples per operation, derandomized: CI sends the same requests every time.
FUZZ = settings(
    max_examples=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)

# The schema is read from the app when the module loads, before any database exists; each test
# then points the app at the test database (its pool opens on the first request).
WEB = create_app(
    dsn=Dsn("postgresql://nobody@127.0.0.1:1/not-yet", "test"),
    tokens=[TOKEN],
    read_only_tokens=[READ_TOKEN],
    pool_size=2,
)
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", WEB)


@pytest.fixture(autouse=True)
def _on_the_test_database(dsn: Dsn) -> Iterator[None]:
    backend = WEB.state.pgjobs
    backend.dsn = dsn
    yield
    backend.close()


@schema.parametrize()
@FUZZ
def test_every_operation_conforms(case: Any) -> None:
    case.call_and_validate(headers=AUTH, checks=CHECKS)


def test_the_fuzz_reaches_past_authentication() -> None:
    """The fuzz must reach the routes' logic, not stop at the door (401) for every example: the
    fuzz's own strategies and settings, sent again here (so that this holds alone and in any
    order), get a success from most operations."""
    statuses: Counter[tuple[str, int]] = Counter()
    for found in schema.get_all_operations():
        if isinstance(found, Err):
            raise found.err()
        send_examples(found.ok(), statuses)
    succeeded = {label for (label, status), _ in statuses.items() if status < 400}
    assert len(succeeded) >= 10, statuses
    # Schemathesis also sends requests without the token on purpose: those alone are 401.
    unauthenticated = sum(n for (_, status), n in statuses.items() if status == 401)
    assert unauthenticated < sum(statuses.values()) / 4, statuses


def send_examples(operation: Any, statuses: Counter[tuple[str, int]]) -> None:
    """Send the fuzz's examples of ``operation`` with the token; count the statuses answered."""

    @FUZZ
    @given(case=operation.as_strategy())
    def send(case: Any) -> None:
        statuses[(operation.label, case.call(headers=AUTH).status_code)] += 1

    send()
