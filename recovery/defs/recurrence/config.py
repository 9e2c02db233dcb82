"""Typed run configuration of a guarded backfill (the launchpad form); validated like the CLI's flags."""

import dagster as dg
from pydantic import Field

from recovery.lib.recurrence.request import BackfillRequest, request_from_mapping


class BackfillConfig(dg.Config):
    """Which range of the served dataset to backfill, with which code, asked for and approved by whom."""

    start: str = Field(description="First partition of the range, e.g. 2024-06-01.")
    end: str = Field(description="Last partition of the range, inclusive.")
    recompute: str = Field(
        "transform",
        description="'transform' (the spec's transform over the fixed source snapshot) "
        "or 'package.module:function' writing the range.",
    )
    requested_by: str = Field(description="Who launches the backfill.")
    approved_by: list[str] = Field(
        default_factory=list,
        description="Named approvers; the spec's recurrence.approval says how many the scope needs.",
    )
    allow_current_partitions: bool = Field(
        False, description="Acknowledge that the range reaches the partitions normal ingestion is writing."
    )
    backfill_id: str | None = Field(None, description="Backfill id (default: derived from the range and the code).")
    expect_change: list[str] = Field(
        default_factory=list,
        description="Columns the backfill is meant to change (declared "
        "intent, stored in the approval record); any other "
        "column changing is refused by the values gate.",
    )
    expected_share: float | None = Field(None, description="Share of the range's keys the backfill is meant to change.")
    notes: str = Field("", description="Free text kept in the manifest.")


def resolve_request(config: BackfillConfig) -> BackfillRequest:
    """The same validation as ``recovery backfill``: raises ``SpecError`` naming the field."""
    return request_from_mapping(config.model_dump())
