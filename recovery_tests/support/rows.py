"""Narrowing for the tests: a value a test's setup guarantees (the row an aggregate query returns, the
run or plan the test just created) is checked for ``None`` once, here, and typed without it."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None) -> T:
    """``value``, which the test's own setup guarantees: a missing one fails the test, naming why."""
    assert value is not None, "expected a value (a row, a run, a plan) the test's setup guarantees; got None"
    return value
