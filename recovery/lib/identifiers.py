"""Plain identifiers only, always quoted.

DuckDB's ``execute()`` runs stacked statements, so an identifier that reaches SQL
unquoted is an injection vector. Every table and column name from a spec passes
through :func:`check_identifier` (a plain identifier: letters, digits, underscore)
and is rendered with sqlglot's quoting, never with string formatting alone.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from dataclasses import dataclass
from typing import Any

import sqlglot.expressions as exp

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def is_plain_identifier(name: object) -> bool:
    return isinstance(name, str) and bool(_PLAIN.match(name))


def check_identifier(name: object, field: str) -> str:
    """Return ``name`` if it is a plain identifier, else raise ValueError naming the field."""
    if not is_plain_identifier(name):
        raise ValueError(
            f"{name!r} is not a plain identifier (letters, digits and underscores, "
            f"starting with a letter or underscore, at most 63 characters)"
        )
    return name  # type: ignore[return-value]


def quote(name: str, dialect: str = "duckdb") -> str:
    """Quote one identifier for ``dialect``."""
    check_identifier(name, "identifier")
    return exp.to_identifier(name, quoted=True).sql(dialect=dialect)


def quote_all(names: list[str] | tuple[str, ...], dialect: str = "duckdb") -> str:
    return ", ".join(quote(n, dialect) for n in names)


@dataclass(frozen=True)
class TableName:
    """A schema-qualified table name whose parts are plain identifiers."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, default_schema: str = "main") -> TableName:
        if not isinstance(text, str):
            raise ValueError(f"{text!r} is not a table name")
        parts = text.split(".")
        if len(parts) == 1:
            parts = [default_schema, parts[0]]
        if len(parts) != 2:
            raise ValueError(f"{text!r} is not a table name of the form schema.table")
        for p in parts:
            check_identifier(p, "table")
        return cls(parts[0], parts[1])

    def sql(self, dialect: str = "duckdb") -> str:
        return f"{quote(self.schema, dialect)}.{quote(self.name, dialect)}"

    def with_name(self, name: str) -> TableName:
        return TableName(self.schema, check_identifier(name, "table"))

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


# ---- literals: the one place a Python value becomes SQL text ------------------------------------


def naive_utc(value: dt.datetime | dt.date) -> dt.datetime:
    """A moment as the naive UTC the warehouse and the control plane store: an aware datetime is converted,
    not truncated; a naive one is taken as UTC; a date is its midnight."""
    if not isinstance(value, dt.datetime):
        return dt.datetime(value.year, value.month, value.day)
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value


def string_literal(text: str) -> str:
    """A quoted string literal (sqlglot escapes it)."""
    return exp.Literal.string(text).sql(dialect="duckdb")


def ts_literal(value: dt.datetime) -> str:
    """A timestamp literal built from a datetime object (never from user text), in UTC."""
    if not isinstance(value, dt.datetime):
        raise TypeError(f"watermark must be a datetime, got {type(value).__name__}")
    return f"TIMESTAMP '{naive_utc(value).isoformat(sep=' ')}'"


def str_list(values: list[str] | tuple[str, ...]) -> str:
    """Comma-separated string literals, for ``IN (...)``."""
    return ", ".join(string_literal(str(v)) for v in values)


def sql_literal(value: Any) -> str:
    """A Python value as a DuckDB-dialect literal (the Spark route transpiles it with the rest)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float, decimal.Decimal)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, dt.datetime):
        return ts_literal(value)
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    return string_literal(str(value))
