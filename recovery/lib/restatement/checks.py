"""The restatement's own checks, one per consumer, recorded so the reports and the exit code read them.

A restatement promises two things per consumer: the corrected output is right, and the
ledger holds what changed. For a SQL consumer the first is measured (its corrected
output against its SQL over the source's expected rows); for a Dagster asset, the team's
code computes it, so the check is that every affected partition was re-materialized by a
successful run and the corrected rows hold each key once (else the ledger cannot say
which value a key had). The second is cross-checked against the impact: a consumer in
which the impact found material rows yet whose ledger is empty was restated from the
wrong original. A failed check stops the restatement's run with one sentence (exit 1):
the rows are recorded, but nothing says "done".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import SCHEMA, utcnow
from recovery.lib.control.tables import RESTATEMENT_CHECKS as CHECKS
from recovery.lib.control.tables import RESTATEMENT_CHECKS_DDL
from recovery.lib.engine.base import Session


class RestatementCheck(BaseModel):
    """One consumer's restatement check: ``details`` is one sentence, what failed or what held."""

    model_config = ConfigDict(frozen=True)
    consumer: str
    check: str
    passed: bool
    observed: int  # what failed (rows differing, runs failed, ...), 0 when it passed
    details: str


@dataclass(frozen=True)
class MaterializationRun:
    """One Dagster run that re-materialized a downstream asset's partition."""

    partition: str | None
    run_id: str
    success: bool
    reason: str = ""  # one line, when it failed


def sql_consumer_check(
    consumer: str, *, mismatches: int | None, ledger_rows: int, impact_material: int
) -> RestatementCheck:
    """The corrected output equals the consumer over the source's expected rows, and the ledger is
    not empty where the impact found material rows."""
    if mismatches is None:
        return RestatementCheck(
            consumer=consumer,
            check="equals_consumer_on_source",
            passed=False,
            observed=0,
            details=f"{consumer}: its corrected output was not compared with the consumer on the source's "
            "expected rows",
        )
    if mismatches != 0:
        what = "has other columns than" if mismatches < 0 else f"has {mismatches:,} rows that differ from"
        return RestatementCheck(
            consumer=consumer,
            check="equals_consumer_on_source",
            passed=False,
            observed=abs(mismatches),
            details=f"{consumer}: the corrected output {what} the consumer on the source's expected rows",
        )
    if impact_material > 0 and ledger_rows == 0:
        return RestatementCheck(
            consumer=consumer,
            check="equals_consumer_on_source",
            passed=False,
            observed=impact_material,
            details=f"{consumer}: the ledger is empty while the impact found {impact_material:,} material rows, "
            f"so its original output was not the one the damage reached",
        )
    return RestatementCheck(
        consumer=consumer,
        check="equals_consumer_on_source",
        passed=True,
        observed=0,
        details=f"{consumer}: the corrected output equals the consumer on the source's expected rows; "
        f"{ledger_rows:,} ledger rows",
    )


def asset_check(
    consumer: str, runs: Sequence[MaterializationRun], *, partitions: int, duplicate_keys: int, ledger_rows: int
) -> RestatementCheck:
    """Every affected partition re-materialized by a successful run, each key once in the result."""
    failed = [r for r in runs if not r.success]
    if not runs:
        return RestatementCheck(
            consumer=consumer,
            check="rematerialized",
            passed=False,
            observed=0,
            details=f"{consumer}: no partition was re-materialized, so nothing was corrected",
        )
    if failed:
        first = failed[0]
        where = f"partition {first.partition}" if first.partition is not None else "the asset"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return RestatementCheck(
            consumer=consumer,
            check="rematerialized",
            passed=False,
            observed=len(failed),
            details=f"{consumer}: the re-materialization of {where} failed{more} in run {first.run_id[:8]}: "
            f"{first.reason}",
        )
    if duplicate_keys:
        return RestatementCheck(
            consumer=consumer,
            check="rematerialized",
            passed=False,
            observed=duplicate_keys,
            details=f"{consumer}: {duplicate_keys:,} keys have more than one row after the re-materialization, "
            f"so the ledger cannot say which value each holds; declare the key its table is unique by",
        )
    return RestatementCheck(
        consumer=consumer,
        check="rematerialized",
        passed=True,
        observed=0,
        details=f"{consumer}: {partitions:,} partitions re-materialized by {len(runs):,} successful runs; "
        f"{ledger_rows:,} ledger rows",
    )


def record_checks(
    s: Session, dataset: str, incident_id: str, checks: Sequence[RestatementCheck], *, run_id: str | None
) -> None:
    """Replace the incident's check of each consumer; the caller owns the transaction."""
    s.execute(RESTATEMENT_CHECKS_DDL)
    for c in checks:
        s.execute(
            f"DELETE FROM {CHECKS} WHERE incident_id = ? AND dataset = ? AND consumer = ?",
            [incident_id, dataset, c.consumer],
        )
        s.execute(
            f"INSERT INTO {CHECKS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [incident_id, dataset, c.consumer, c.check, c.passed, c.observed, c.details, run_id, utcnow()],
        )


def recorded_checks(s: Session, dataset: str, incident_id: str) -> list[RestatementCheck]:
    """The incident's latest check per consumer ([] before any)."""
    if s.object_kind(SCHEMA, "restatement_checks") is None:
        return []
    rows = s.fetchall(
        f"SELECT consumer, check_name, passed, observed, details FROM {CHECKS} "
        f"WHERE incident_id = ? AND dataset = ? ORDER BY consumer",
        [incident_id, dataset],
    )
    return [RestatementCheck(consumer=r[0], check=r[1], passed=r[2], observed=r[3], details=r[4]) for r in rows]


def refusal(checks: Sequence[RestatementCheck]) -> str | None:
    """One sentence when any check failed (the run's failure, the command's exit 1), else None."""
    failed = [c for c in checks if not c.passed]
    if not failed:
        return None
    return (
        f"the restatement's check failed for {len(failed)} of {len(checks)} consumers: "
        + "; ".join(c.details for c in failed)
        + ". The rows are recorded in the ledger; fix what the check names and run recovery restate again"
    )
