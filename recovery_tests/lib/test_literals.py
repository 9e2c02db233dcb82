"""Every Python value becomes SQL text in one module (``recovery.lib.identifiers``): quotes are
escaped, an aware time is converted to UTC (not truncated), and DuckDB reads back the value."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pytest

from recovery.lib.identifiers import sql_literal, str_list, string_literal, ts_literal
from recovery_tests.support.rows import present


def _read(literal: str):
    return present(duckdb.connect().execute(f"SELECT {literal}").fetchone())[0]


def test_an_aware_time_is_converted_to_utc_not_truncated():
    paris = dt.timezone(dt.timedelta(hours=2))
    assert ts_literal(dt.datetime(2024, 6, 3, 12, 0, tzinfo=paris)) == "TIMESTAMP '2024-06-03 10:00:00'"
    assert _read(ts_literal(dt.datetime(2024, 6, 3, 12, 0, 5, 123456))) == dt.datetime(2024, 6, 3, 12, 0, 5, 123456)


def test_text_with_quotes_reads_back_unchanged():
    nasty = "O'Brien's \"shop\"; DROP TABLE x; --"
    assert _read(string_literal(nasty)) == nasty
    assert present(duckdb.connect().execute(f"SELECT [{str_list(['a', nasty])}]").fetchone())[0] == ["a", nasty]


@pytest.mark.parametrize("value", [None, True, 7, 2.5, Decimal("12.30"), dt.date(2024, 2, 29), "x'y", [1, 2]])
def test_each_parameter_type_reads_back_as_itself(value):
    assert _read(sql_literal(value)) == value


def test_a_watermark_must_be_a_time_not_text():
    with pytest.raises(TypeError, match="must be a datetime"):
        ts_literal("2024-01-01")  # type: ignore[arg-type]
