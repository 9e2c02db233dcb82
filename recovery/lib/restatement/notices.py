"""Telling each owner what changed in their consumer: material items first, once per incident.

One notice per incident and affected consumer, to the consumer's owner, through the
code location's notifier. Its dedupe key (``ledger.notice_key``) is kept in the
control plane, so a re-run of the restatement, or of the whole job, never sends it
again; the delivery time is stamped on the ledger rows and the restatement record.
Owners with material changes are told first; within a notice, material items come
first, largest difference first.
"""

from __future__ import annotations

from collections.abc import Sequence

from recovery.lib import faults
from recovery.lib.consumers.outputs import RESTATEMENTS
from recovery.lib.control.plane import SCHEMA, utcnow
from recovery.lib.dataset_spec.models import Consumer, DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.notify import NOTIFICATIONS, NotificationError, Notifier, Severity
from recovery.lib.restatement.ledger import ledger_items, ledger_table, notice_key
from recovery.lib.retry import retrying

ITEMS_IN_NOTICE = 20


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:,.2f}"


def compose(spec: DatasetSpec, c: Consumer, row: tuple, items: list[tuple]) -> tuple[str, str, Severity]:
    """Subject, body and severity of one owner's notice (``row`` from the restatements record)."""
    incident, consumer, kind, owner, original_ns, corrected_ns, n, material, orig_total, corr_total = row
    column = c.materiality.column if c.materiality else None
    subject = f"{incident}: {consumer} restated, {material:,} material change(s) of {n:,}"
    lines = [
        f"Your {kind} {consumer} ({spec.dataset}) was restated for incident {incident}.",
        f"Original output kept in {original_ns}; corrected output published in {corrected_ns}.",
    ]
    if column:
        diff = None if orig_total is None or corr_total is None else corr_total - orig_total
        lines.append(
            f"Total {column}: original {_fmt(orig_total)}, corrected {_fmt(corr_total)} (difference {_fmt(diff)})."
        )
    shown_material = [i for i in items if i[5]]
    lines.append(f"Material changes: {material:,}" + (", largest first:" if material else "."))
    for key, change, orig, corr, diff, _, decision in shown_material:
        lines.append(f"  - {key}: {change}, {_fmt(orig)} -> {_fmt(corr)} (difference {_fmt(diff)}): {decision}")
    if material > len(shown_material):
        lines.append(f"  ... and {material - len(shown_material):,} more")
    lines.append(f"Changes below materiality: {n - material:,}.")
    lines.append(f"Every key is in {ledger_table(spec)} (incident_id = '{incident}', consumer = '{consumer}').")
    return subject, "\n".join(lines), ("warning" if material else "info")


def qualified_partitions(s, incident_id: str) -> list[tuple[str, str]]:
    """Partitions the incident's repair kept as they were because the source cannot speak for them."""
    if s.object_kind("_recovery", "repair_partitions") is None:
        return []
    return s.fetchall(
        "SELECT partition, qualified_reason FROM _recovery.repair_partitions "
        "WHERE incident_id = ? AND qualified_reason IS NOT NULL ORDER BY partition",
        [incident_id],
    )


def notify_owners(
    engine: Engine,
    spec: DatasetSpec,
    incident_id: str,
    notifier: Notifier,
    *,
    consumers: list[str] | None = None,
    extra: Sequence[Consumer] = (),
) -> list[str]:
    """Deliver each affected consumer's notice once; returns the deliveries that failed (retried next run).
    ``extra``: consumers the spec does not list (Dagster assets found in the code location's graph)."""
    known: dict[str, Consumer] = {c.name: c for c in [*spec.downstream, *spec.downstream_assets, *extra]}
    with engine.session(read_only=True) as s:
        rows = s.fetchall(
            "SELECT incident_id, consumer, kind, owner, original_namespace, corrected_namespace, ledger_rows, "
            "material_rows, "
            f"original_total, corrected_total FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ? "
            "AND ledger_rows > 0 "
            f"ORDER BY material_rows > 0 DESC, material_rows DESC, consumer",
            [incident_id, spec.dataset],
        )
        rows = [r for r in rows if (consumers is None or r[1] in consumers) and r[1] in known]
        items = {
            r[1]: ledger_items(s, spec, incident_id=incident_id, consumer=r[1], limit=ITEMS_IN_NOTICE) for r in rows
        }
        qualified = qualified_partitions(s, incident_id)
    failures = []
    for row in rows:
        consumer, owner = row[1], row[3]
        key = notice_key(spec, incident_id, consumer)
        if not notifier.already_delivered(key):
            subject, body, severity = compose(spec, known[consumer], row, items[consumer])
            if qualified:
                body += (
                    "\nQualified (the source holds no authoritative rows; kept as published, not corrected): "
                    + "; ".join(f"{p}: {why}" for p, why in qualified[:10])
                    + (f"; and {len(qualified) - 10} more" if len(qualified) > 10 else "")
                )
            try:
                notifier.notify(owner, subject, body, severity, key, incident_id=incident_id, dataset=spec.dataset)
            except NotificationError as err:
                failures.append(f"{consumer} (owner {owner}): {err}")
                continue
        _stamp(engine, spec, incident_id, consumer, key)
    return failures


def _stamp(engine: Engine, spec: DatasetSpec, incident_id: str, consumer: str, key: str) -> None:
    """Record when the owner was told (the delivery record's time; now, for a notifier without a warehouse)."""

    def txn() -> None:
        with engine.transaction() as s:
            at = (
                s.scalar(f"SELECT delivered_at FROM {NOTIFICATIONS} WHERE dedupe_key = ?", [key])
                if s.object_kind(SCHEMA, "notifications")
                else None
            )
            at = at or utcnow()
            s.update_rows(
                ledger_table(spec),
                [("notified_at", "?")],
                where="incident_id = ? AND consumer = ? AND notified_at IS DISTINCT FROM ?",
                params=[at, incident_id, consumer, at],
            )
            s.execute(
                f"UPDATE {RESTATEMENTS} SET notified_at = ? WHERE incident_id = ? AND dataset = ? AND consumer = ? "
                f"AND notified_at IS DISTINCT FROM ?",
                [at, incident_id, spec.dataset, consumer, at],
            )
            faults.checkpoint("notice:stamped")  # the ledger and the restatement stamped, not committed

    retrying(txn)
    faults.checkpoint("notice:committed")  # this consumer's notice stamped, the next ones not yet
