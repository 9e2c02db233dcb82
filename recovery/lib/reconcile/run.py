"""Run a reconciliation end to end: classify, summarize, record on the timeline, export."""

from __future__ import annotations

from pathlib import Path

from recovery.lib import faults
from recovery.lib.catalog_checks import remember_source_checks
from recovery.lib.control.plane import EventSource, ensure_control_plane
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.pointers.namespaces import is_managed
from recovery.lib.reconcile.classify import ReconcileInputs, reconcile
from recovery.lib.reconcile.export import write_outputs
from recovery.lib.reconcile.summary import ReconciliationSummary, summarize
from recovery.lib.retry import retrying


def run_reconciliation(
    spec: DatasetSpec,
    failed_generations: list[str],
    *,
    incident_id: str,
    out_dir: Path | None = None,
    actor: str = "recovery",
    run_id: str | None = None,
    full: bool | None = True,
    partitions: tuple | None = None,
) -> tuple[ReconciliationSummary, dict[str, Path]]:
    """Classify every key in one transaction, so the result is one consistent snapshot.

    Before containment (the target is not managed yet) responders still size the damage
    first: the classification then runs in a read-only session, its results live only in
    temp tables and the files written, and the summary says the target was not fenced.

    ``full=False`` reconciles the failed generations' footprint only (``footprint.py``; ``partitions``:
    the incident's range, start and end); ``full=None`` their footprint where there is one, else the whole
    target (the reconciliation phase's default)."""
    engine = open_engine(spec.warehouse)
    with engine.session(read_only=True) as s:
        managed = is_managed(s, spec)
    inputs = ReconcileInputs(
        spec, tuple(failed_generations), incident_id=incident_id, persist=managed, full=full, partitions=partitions
    )
    if not managed:
        with engine.session(read_only=True) as s:
            facts = reconcile(s, inputs)
            summary = summarize(s, inputs, facts)
            files = write_outputs(s, inputs, summary, out_dir) if out_dir else {}
            return summary, files

    def txn():
        with engine.transaction() as s:
            ensure_control_plane(s)
            remember_source_checks(s, spec)
            facts = reconcile(s, inputs)
            summary = summarize(s, inputs, facts)
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor, run_id=run_id).record(
                s,
                "reconciliation",
                f"{summary.damaged_keys:,} damaged keys in {len(summary.damaged_partitions)} partitions "
                f"({', '.join(f'{k} {v:,}' for k, v in summary.labels.items())})" + _scope_note(summary),
            )
            files = write_outputs(s, inputs, summary, out_dir) if out_dir else {}
            faults.checkpoint("reconcile:recorded")  # the results and the event written, not committed
            return summary, files

    result = retrying(txn)
    faults.checkpoint("reconcile:committed")
    return result


def _scope_note(summary: ReconciliationSummary) -> str:
    """What the timeline says about the scope: a footprint run's range, a whole run's drift outside it."""
    rng = " .. ".join(summary.footprint_range or [])
    if summary.scope == "footprint":
        return f"; footprint only (partitions {rng} and the failed generations' keys)"
    drift = sum((summary.drift_outside_footprint or {}).values())
    return f"; {drift:,} of them outside the backfill's footprint ({rng}): drift" if drift else ""
