"""Typed payloads and payload versions as a task declares them: the checks built from a handler's
annotations, its model, and its upgrade chain. No database."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest

from pgjobs.errors import ConfigurationError, NonRetryableError
from pgjobs.payloads import compile_check
from pgjobs.tasks import Task, UpgradeFailed, make_task


def task_of(fn: Any, **options: Any) -> Task:
    return make_task(
        fn,
        name=fn.__name__,
        queue="default",
        max_attempts=5,
        retry_base=1.0,
        retry_cap=60.0,
        lease=30.0,
        **options,
    )


@pytest.mark.parametrize(
    ("annotation", "value", "problem"),
    [
        (int, 3, None),
        (int, True, "payload.x: expected int, got bool"),
        (int, 3.5, "payload.x: expected int, got float"),
        (float, 3, None),
        (float, 2.5, None),
        (float, "abc", "payload.x: expected float, got str"),
        (float, False, "payload.x: expected float, got bool"),
        (bool, True, None),
        (bool, 1, "payload.x: expected bool, got int"),
        (str, "a", None),
        (str, None, "payload.x: expected str, got None"),
        (None, None, None),
        (Optional[int], None, None),  # noqa: UP045 (the spelling is what is tested)
        (Optional[int], "1", "payload.x: expected int, got str"),  # noqa: UP045
        (int | str, "a", None),
        (int | str, 1.5, "payload.x: expected int | str, got float"),
        (list[int], [1, 2], None),
        (list[int], [1, "2"], "payload.x[1]: expected int, got str"),
        (list[int], {"a": 1}, "payload.x: expected list[int], got dict"),
        (dict[str, float], {"a": 1, "b": 2.5}, None),
        (dict[str, float], {"a": "b"}, "payload.x['a']: expected float, got str"),
        (dict, {"any": ["thing"]}, None),
        (list, [1, "a", None], None),
        (
            list[dict[str, list[int]]],
            [{"a": [1, "x"]}],
            "payload.x[0]['a'][1]: expected int, got str",
        ),
        (Literal["a", "b"], "b", None),
        (Literal["a", "b"], "c", "payload.x: expected Literal['a', 'b'], got str 'c'"),
        (Literal[1], True, "payload.x: expected Literal[1], got bool 'True'"),
        (Annotated[int, "meta"], "1", "payload.x: expected int, got str"),
        (Any, object(), None),
    ],
)
def test_a_check_names_the_path_the_expected_and_the_received_type(
    annotation: Any, value: Any, problem: str | None
) -> None:
    check = compile_check(annotation)
    found = None if check is None else check(value, "payload.x")
    assert found == problem


def typed(amount: float, count: int, tags: list[str] | None = None, note="free") -> None: ...


def untyped(amount, count): ...


def test_checks_are_decided_at_registration_and_untyped_handlers_have_none() -> None:
    assert task_of(untyped).types is None and task_of(untyped).model is None
    task = task_of(typed)
    assert task.types is not None
    assert [name for name, _ in task.types.checks] == ["amount", "count", "tags"]
    assert task.check_payload({"amount": 1, "count": 2}) is None
    assert task.check_payload({"amount": "abc", "count": 2}) == (
        "payload.amount: expected float, got str"
    )
    problem = task.payload_problem({"amount": 1.5, "count": 2, "tags": ["a", 3]})
    assert problem is not None and problem.field == "payload.tags"
    assert problem.message == "payload.tags[1]: expected str, got int"
    # Which keys the handler takes is still checked (by the worker): a missing one is named.
    missing = task.payload_problem({"amount": 1.5})
    assert missing is not None and missing.field == "payload" and "count" in missing.message
    # At enqueue (complete=False) only the values given are checked.
    assert task.payload_problem({"amount": 1.5}, complete=False) is None


def unresolvable(when: NotImportedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821


def test_an_annotation_that_cannot_be_resolved_is_not_checked_and_says_so_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="pgjobs"):
        task = task_of(unresolvable)
    assert task.types is None and task.model is None
    assert "annotations not resolved" in caplog.text and "NotImportedAnywhere" in caplog.text
    assert task.check_payload({"when": "anything"}) is None


class Unsupported:
    pass


def partly(known: int, other: Unsupported) -> None: ...


def test_an_unsupported_annotation_is_left_unchecked_and_the_others_checked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="pgjobs"):
        task = task_of(partly)
    assert task.types is not None and [name for name, _ in task.types.checks] == ["known"]
    assert "other" in caplog.text


@dataclasses.dataclass
class Order:
    id: int
    total: float
    lines: list[str] = dataclasses.field(default_factory=list)


def takes_order(order: Order) -> None: ...


class Invoice(pydantic.BaseModel):
    number: int
    amount: float


def takes_invoice(invoice: Invoice) -> None: ...


def test_a_dataclass_parameter_is_built_from_the_payload_whose_fields_are_checked() -> None:
    task = task_of(takes_order)
    assert task.model is not None and task.model.param == "order" and not task.model.pydantic
    assert task.arguments({"id": 1, "total": 2}) == ({"order": Order(1, 2)}, None)
    assert task.arguments({"id": "1", "total": 2}) == ({}, "payload.id: expected int, got str")
    assert task.arguments({"total": 2})[1] == "payload.id: required by Order, missing"
    assert task.arguments({"id": 1, "total": 2, "x": 0})[1] == "payload.x: Order has no field 'x'"
    assert task.model.dump(Order(1, 2.5, ["a"])) == {"id": 1, "total": 2.5, "lines": ["a"]}


def test_a_pydantic_parameter_is_validated_by_the_model() -> None:
    task = task_of(takes_invoice)
    assert task.model is not None and task.model.pydantic
    kwargs, problem = task.arguments({"number": 7, "amount": "12.5"})
    assert problem is None and kwargs == {"invoice": Invoice(number=7, amount=12.5)}
    found = task.payload_problem({"number": 7, "amount": "abc"})
    assert found is not None and found.field == "payload.amount"
    assert found.message.startswith("payload.amount: ") and "(got str)" in found.message
    assert task.model.dump(Invoice(number=1, amount=2)) == {"number": 1, "amount": 2.0}


def to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {"cents": round(payload["amount"] * 100)}


def to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "currency": "EUR"}


def charge(cents: int, currency: str) -> None: ...


def test_upgrades_chain_from_the_stored_version_to_the_task_s() -> None:
    task = task_of(charge, version=3, upgrade={1: to_v2, 2: to_v3})
    assert task.upgrade({"amount": 12.5}, 1) == {"cents": 1250, "currency": "EUR"}
    assert task.upgrade({"cents": 5}, 2) == {"cents": 5, "currency": "EUR"}
    assert task.upgrade({"cents": 5, "currency": "USD"}, 3) == {"cents": 5, "currency": "USD"}


def test_an_upgrade_that_raises_names_its_step_and_is_not_retried() -> None:
    task = task_of(charge, version=3, upgrade={1: to_v2, 2: to_v3})
    with pytest.raises(UpgradeFailed) as failed:
        task.upgrade({"no_amount": 1}, 1)
    assert isinstance(failed.value, NonRetryableError)
    assert str(failed.value) == (
        "upgrade of charge's payload from version 1 to 2 failed: KeyError: 'amount'"
    )
    assert isinstance(failed.value.__cause__, KeyError)
    returns_list = task_of(charge, version=2, upgrade={1: lambda payload: [payload]})
    with pytest.raises(UpgradeFailed, match="from version 1 to 2 failed: it returned list"):
        returns_list.upgrade({}, 1)


def test_a_version_older_than_the_chain_has_no_upgrade() -> None:
    task = task_of(charge, version=3, upgrade={2: to_v3})
    with pytest.raises(ValueError, match=r"version 1 is too old .* from version 2 on"):
        task.upgrade({}, 1)
    bare = task_of(charge, version=2)
    with pytest.raises(ValueError, match="declares no upgrade"):
        bare.upgrade({}, 1)


@pytest.mark.parametrize(
    ("version", "upgrade", "words"),
    [
        (0, None, "version must be a whole number >= 1"),
        (True, None, "version must be a whole number >= 1"),
        ("2", None, "version must be a whole number >= 1"),
        (2, {2: to_v3}, "upgrade keys are the versions a payload is upgraded from, 1..1"),
        (1, {1: to_v2}, "1..0"),
        (2, {1: "to_v2"}, "upgrade[1] must be a function"),
        (4, {1: to_v2, 3: to_v3}, "every version from 1 to 3 needs its step"),
    ],
)
def test_bad_versions_are_refused_at_registration(version: Any, upgrade: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words.replace("[", r"\[")) as refused:
        task_of(charge, version=version, upgrade=upgrade)
    assert refused.value.field in ("version", "upgrade")
