"""The control plane: the warehouse's own record of generations, fences and pointers.

It lives in schema ``_recovery`` of the *same* database as the data, because the
fence must be checked in the same transaction as the write it guards (a fence in
another file could not be, and DuckDB cannot write two attached files in one
transaction). The ``clock`` row is a commit-order sequence: every write
transaction increments it, so two writers conflict on it and the sequence orders
commits exactly as they happened (a watermark taken from values allocated at
insert time would miss a slow transaction's rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recovery.lib.control.tables import (  # noqa: F401 - SOURCE_WATERMARKS* re-exported
    CONTROL_PLANE_DDL,
    SOURCE_WATERMARKS,
    SOURCE_WATERMARKS_DDL,
)
from recovery.lib.control_names import (  # noqa: F401 - the control plane's names, re-exported
    PER_DATASET_TABLES,
    SCHEMA,
    dataset_table,
    dataset_table_name,
    is_dataset_table_name,
)
from recovery.lib.engine.base import Session

DDL = CONTROL_PLANE_DDL


def utcnow() -> datetime:
    """Naive UTC now: every timestamp in the control plane is naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def ensure_control_plane(session: Session) -> None:
    """Create the control-plane schema; idempotent."""
    for stmt in DDL:
        session.execute(stmt)


def control_plane_exists(session: Session) -> bool:
    return session.object_kind(SCHEMA, "clock") is not None


def next_seq(session: Session) -> int:
    """Take the next commit sequence number; conflicts with any concurrent writer."""
    return int(session.scalar(f"UPDATE {SCHEMA}.clock SET seq = seq + 1 WHERE id = 1 RETURNING seq"))


def has_dataset_table(session: Session, kind: str, dataset: str) -> bool:
    return session.object_kind(SCHEMA, dataset_table_name(kind, dataset)) is not None


def delta_table(dataset: str) -> str:
    """Qualified name of a dataset's append-only delta log."""
    return dataset_table("delta", dataset)


@dataclass(frozen=True, kw_only=True)
class EventSource:
    """Who writes to the incident timeline: the dataset, incident, actor and run its events belong to.

    A phase builds one and records each of its events with one call; the timeline's one ``INSERT``."""

    dataset: str | None = None
    incident_id: str | None = None
    actor: str | None = None
    run_id: str | None = None

    def record(
        self,
        session: Session,
        kind: str,
        summary: str,
        details: str | dict[str, Any] | list[Any] | None = None,
        at: datetime | None = None,
    ) -> None:
        """Append one event to the timeline; ``details`` a JSON text, or a dict or list written as one."""
        if details is not None and not isinstance(details, str):
            details = json.dumps(details)
        session.execute(
            f"INSERT INTO {SCHEMA}.timeline VALUES (nextval('{SCHEMA}.timeline_seq'), ?, ?, ?, ?, ?, ?, ?, ?)",
            [self.incident_id, self.dataset, at or utcnow(), kind, self.actor, summary, details, self.run_id],
        )
