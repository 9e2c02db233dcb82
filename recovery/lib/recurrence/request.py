"""What a person asks the guarded launcher for: a range of a dataset, recomputed by named code.

Validated (pydantic) before anything reads the warehouse; every failure is one
``SpecError`` naming the field and the fix. The id defaults to a hash of the request's
substance, so launching the same request twice is the same backfill (idempotent).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recovery.lib.dataset_spec.loader import validation_error
from recovery.lib.identifiers import check_identifier

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_RECOMPUTE = re.compile(r"^(transform|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$")


class BackfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    start: str = Field(description="First partition of the range, e.g. 2024-06-01.")
    end: str = Field(description="Last partition of the range, inclusive.")
    recompute: str = Field(
        "transform",
        description="'transform' (the spec's transform over the fixed source snapshot) "
        "or 'package.module:function' computing the range.",
    )
    requested_by: str = Field(min_length=1, description="Who launches the backfill.")
    approved_by: list[str] = Field(default_factory=list, description="Named approvers (the policy says how many).")
    allow_current_partitions: bool = Field(
        False, description="Acknowledge that the range reaches partitions normal ingestion is writing."
    )
    backfill_id: str | None = Field(None, description="Id of the backfill (default: derived from the request).")
    expect_change: list[str] = Field(
        default_factory=list,
        description="Columns the backfill is meant to change (declared "
        "intent): they may change; any other column may not.",
    )
    expected_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of the range's keys the backfill is meant to "
        "change (of the declared columns, or of every column).",
    )
    notes: str = ""

    @field_validator("start", "end")
    @classmethod
    def _part(cls, v: str) -> str:
        v = str(v).strip()
        if not v or len(v) > 64 or "'" in v:
            raise ValueError("give a partition value, e.g. 2024-06-01")
        return v

    @field_validator("recompute")
    @classmethod
    def _recompute(cls, v: str) -> str:
        if not _RECOMPUTE.match(v):
            raise ValueError(f"{v!r} is neither 'transform' nor 'package.module:function'")
        return v

    @field_validator("backfill_id")
    @classmethod
    def _id(cls, v: str | None) -> str | None:
        if v is not None and not _ID.match(v):
            raise ValueError("use letters, digits, '-', '_' and '.' (at most 100), starting with a letter or digit")
        return v

    @field_validator("expect_change")
    @classmethod
    def _declared(cls, v: list[str]) -> list[str]:
        v = [c.strip() for c in v if c.strip()]
        if len(set(v)) != len(v):
            raise ValueError("names a column twice")
        for c in v:
            check_identifier(c, "column")
        return v

    @field_validator("approved_by")
    @classmethod
    def _approvers(cls, v: list[str]) -> list[str]:
        v = [a.strip() for a in v if a.strip()]
        if len(set(v)) != len(v):
            raise ValueError("names an approver twice")
        return v

    @model_validator(mode="after")
    def _self_approval(self):
        if self.requested_by in self.approved_by:
            raise ValueError("approved_by: the requester cannot approve their own backfill")
        return self

    @property
    def id(self) -> str:
        if self.backfill_id:
            return self.backfill_id
        substance: list[Any] = [self.start, self.end, self.recompute]
        if self.declared:  # a declared relaunch of a refused backfill is a new backfill
            substance.append(self.declared)
        h = hashlib.sha256(json.dumps(substance).encode()).hexdigest()[:8]
        return f"bf-{self.start}-{self.end}-{h}"

    @property
    def declared(self) -> dict:
        """The declared intent as the approval record stores it (empty when nothing was declared)."""
        if not self.expect_change and self.expected_share is None:
            return {}
        return {"expect_change": list(self.expect_change), "expected_share": self.expected_share}

    @property
    def generation(self) -> str:
        return f"guarded-{self.id}"

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def request_from_mapping(raw: dict, *, source: str = "run config") -> BackfillRequest:
    try:
        return BackfillRequest.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as e:
        raise validation_error(e, source) from None
