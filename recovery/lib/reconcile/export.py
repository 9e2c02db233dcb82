"""Reconciliation outputs a person or a script can take away: Parquet of the keys, JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote_all
from recovery.lib.reconcile.classify import ReconcileInputs, recon_table
from recovery.lib.reconcile.summary import ReconciliationSummary


def write_outputs(
    s: Session, inputs: ReconcileInputs, summary: ReconciliationSummary, out_dir: Path
) -> dict[str, Path]:
    """``reconciliation.parquet`` (one row per damaged key) and ``summary.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet = out_dir / "reconciliation.parquet"
    # ordered by the key, which is unique among an incident's rows: the order ``ORDER BY ALL`` gave,
    # without comparing every column of the ties it never has
    s.export_parquet(
        f"SELECT * EXCLUDE (incident_id) FROM {recon_table(inputs.spec, inputs.persist)} WHERE incident_id = ? "
        f"ORDER BY {quote_all(inputs.spec.key)}",
        str(parquet),
        [inputs.incident_id],
    )
    per_partition = s.fetchall(
        f"SELECT CAST(coalesce(actual_partition, expected_partition) AS VARCHAR) AS p, label, count(*) "
        f"FROM {recon_table(inputs.spec, inputs.persist)} WHERE incident_id = ? GROUP BY ALL ORDER BY ALL",
        [inputs.incident_id],
    )
    labels_by_partition: dict[str, dict[str, int]] = {}
    for p, label, n in per_partition:
        labels_by_partition.setdefault(p, {})[label] = n
    doc = summary.model_dump(mode="json")
    doc["labels_by_partition"] = labels_by_partition
    doc["damaged_keys"] = summary.damaged_keys
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return {"parquet": parquet, "summary": summary_path}
