"""Reading the control plane for reports: only tables that exist, only this incident's rows."""

from __future__ import annotations

import json

from recovery.lib.control.plane import SCHEMA
from recovery.lib.engine.base import Session

NOT_RUN = "not run yet"


def exists(s: Session, name: str) -> bool:
    """Whether ``_recovery.<name>`` exists (``name`` unquoted, e.g. ``recon__transactions``)."""
    return s.object_kind(SCHEMA, name) is not None


def qualified(name: str) -> str:
    return f'{SCHEMA}."{name}"'


def rows_as_dicts(s: Session, sql: str, params: list | None = None) -> list[dict]:
    """Rows as dicts, values as JSON gives them (timestamps as text): for display only.

    Through ``fetchall`` rather than Arrow: DuckDB 2 refuses a relation query on a
    connection whose previous result (e.g. ``object_kind``'s ``fetchone``) is unfinished."""
    return [json.loads(r[0]) for r in s.fetchall(f"SELECT CAST(to_json(__r) AS VARCHAR) FROM ({sql}) __r", params)]


def incident_rows(
    s: Session, name: str, incident_id: str, *, order_by: str | None = None, limit: int = 200
) -> tuple[list[str], list[dict], int]:
    """Columns, up to ``limit`` rows and the row count of a control-plane table for one incident
    (all rows when the table has no ``incident_id`` column). For sections whose table is owned by
    a phase still taking shape: the report shows whatever that phase recorded."""
    columns = [c for c, _ in s.columns(qualified(name))]
    where, params = ("WHERE incident_id = ?", [incident_id]) if "incident_id" in columns else ("", [])
    shown = [c for c in columns if c != "incident_id"]
    order = f"ORDER BY {order_by}" if order_by else ""
    total = int(s.scalar(f"SELECT count(*) FROM {qualified(name)} {where}", params) or 0)
    rows = rows_as_dicts(
        s,
        f"SELECT * EXCLUDE (incident_id) FROM {qualified(name)} {where} {order} LIMIT {int(limit)}"
        if "incident_id" in columns
        else f"SELECT * FROM {qualified(name)} {order} LIMIT {int(limit)}",
        params,
    )
    return shown, rows, total
