"""Rollback or a new repair generation, with the evidence behind the choice.

Rollback moves the public pointer back to a namespace that was published before.
It is allowed only when such a namespace exists and is complete (it is still in
the catalog with the rows it had when it was last published), and no valid write
landed after it (writes of non-fenced generations into the current namespace since
the pointer moved would be lost). A failed backfill that wrote in place leaves no
complete prior state: then the answer is always a repair generation.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import SCHEMA
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import TableName
from recovery.lib.pointers.namespaces import current_namespace
from recovery.lib.snapshot import str_list


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)
    choice: str  # 'rollback' | 'repair'
    rollback_to: str | None
    reasons: list[str]
    current_namespace: str | None
    prior_namespace: str | None
    valid_writes_since: int

    @property
    def is_rollback(self) -> bool:
        return self.choice == "rollback"


def decide(s: Session, spec: DatasetSpec, failed_generations: list[str]) -> Decision:
    gens = str_list(failed_generations)
    current = current_namespace(s, spec)
    in_place = (
        s.scalar(f"SELECT count(*) FROM {SCHEMA}.writes WHERE generation IN ({gens}) AND namespace = ?", [current]) or 0
    )
    last_move = s.fetchone(
        f"SELECT from_namespace, seq FROM {SCHEMA}.pointer_history WHERE public_name = ? AND to_namespace = ? "
        f"AND from_namespace IS NOT NULL ORDER BY seq DESC LIMIT 1",
        [str(spec.target.table_name), current],
    )
    if last_move is None:
        reasons = [
            f"no complete prior generation: {spec.target.table} has pointed at {current} since it was "
            "created or adopted"
        ]
        if in_place:
            reasons.append(f"the failed generation wrote in place into the published namespace ({in_place} writes)")
        return Decision(
            choice="repair",
            rollback_to=None,
            reasons=reasons,
            current_namespace=current,
            prior_namespace=None,
            valid_writes_since=0,
        )
    prior, moved_seq = last_move
    reasons = []
    table = TableName.parse(prior)
    if s.object_kind(table.schema, table.name) is None:
        reasons.append(f"prior namespace {prior} no longer exists")
    since = (
        s.scalar(
            f"SELECT count(*) FROM {SCHEMA}.writes WHERE namespace = ? AND seq > ? AND generation NOT IN ({gens})",
            [current, moved_seq],
        )
        or 0
    )
    if since:
        reasons.append(
            f"{since} valid writes by non-fenced generations landed in {current} after it was published; a rollback "
            "would lose them"
        )
    if reasons:
        return Decision(
            choice="repair",
            rollback_to=None,
            reasons=reasons,
            current_namespace=current,
            prior_namespace=prior,
            valid_writes_since=since,
        )
    return Decision(
        choice="rollback",
        rollback_to=prior,
        current_namespace=current,
        prior_namespace=prior,
        valid_writes_since=0,
        reasons=[f"{prior} is complete and no valid write landed in {current} after the pointer moved"],
    )
