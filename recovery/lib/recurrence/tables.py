"""Control-plane tables of guarded backfills: one row per backfill (its manifest and status) and its gate results."""

from __future__ import annotations

from recovery.lib.control.plane import SCHEMA, ensure_control_plane
from recovery.lib.control.tables import BACKFILL_DDL, BACKFILLS  # noqa: F401 - re-exported
from recovery.lib.control.tables import BACKFILL_GATES as GATES  # noqa: F401 - re-exported
from recovery.lib.engine.base import Session


def ensure_backfill_tables(s: Session) -> None:
    ensure_control_plane(s)
    for stmt in BACKFILL_DDL:
        s.execute(stmt)


def tables_exist(s: Session) -> bool:
    return s.object_kind(SCHEMA, "backfills") is not None
