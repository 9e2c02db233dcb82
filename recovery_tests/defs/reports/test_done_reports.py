"""The three reports' Done checklists on a second dataset (the orders dataset: composite key,
string partitions, renamed metadata columns), recovered end to end through Dagster.

One consumer had no materialization before the repair (as a consumer added after the
damage): its original outcome is computed from the preserved damaged generation, so the
ledger and the recovery report still hold original and corrected values. The worked
example's reports are checked the same way by ``test_recover_end_to_end``.
"""

from __future__ import annotations

import shutil

import dagster as dg
from rich.console import Console

from recovery.config import PROJECT_ROOT
from recovery.launch.recover import run_recovery
from recovery.lib.control.plane import SCHEMA
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.restatement.ledger import ledger_table
from recovery_tests.support.repaired_small import build_damaged
from recovery_tests.support.report_checks import check_done_reports


def test_the_orders_datasets_reports_prove_every_done_item_and_hide_no_phase_that_ran(tmp_path, monkeypatch):
    r = build_damaged(tmp_path / "orders")
    late = r.spec.downstream[1].name  # never materialized while the damage was exposed
    with r.engine.transaction() as s:
        s.execute(f"DROP VIEW consumers.{late}")
        s.execute(f"DELETE FROM {SCHEMA}.consumer_builds WHERE consumer = ?", [late])
        for table in ("pointers", "pointer_history", "namespaces"):
            s.execute(f"DELETE FROM {SCHEMA}.{table} WHERE public_name = ?", [f"consumers.{late}"])
        s.execute(f"DROP TABLE consumers.{late}__g0001")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(r.spec_path))
    from recovery.definitions import defs

    incident = parse_incident(r.incident_path)
    spec = check_incident(incident)
    with dg.DagsterInstance.get() as instance:
        run = run_recovery(incident, spec, instance=instance, defs=defs(), console=Console(quiet=True), wave_size=5)
    run_ids = {rid for p in run.phases for rid in p.run_ids}
    result = check_done_reports(
        incident.reports_dir(spec),
        evidence_dir=incident.evidence_dir(spec),
        run_ids=run_ids,
        consumers=[c.name for c in spec.downstream],
        computed_originals={late},
        qualified={"ranges": "intended_range", "runs": "carry no run id", "retries": "run log"},
        concurrent_writes=False,
    )
    # (bf-7 was written outside Dagster with no declared range: those items are qualified, saying why; no
    # ingestion wrote during this repair, so the publish gate had no key to compare: not verified, saying so)

    # the ledger holds original and corrected values for every consumer
    rows = dict(
        r.fetch(
            f"SELECT consumer, count(*) FILTER (WHERE original_value IS NOT NULL AND corrected_value IS NOT NULL) "
            f"FROM {ledger_table(spec)} WHERE incident_id = ? GROUP BY 1",
            [incident.incident_id],
        )
    )
    assert set(rows) == {c.name for c in spec.downstream} and all(n > 0 for n in rows.values()), rows
    # decision impact: each declared decision, with materiality and remediation, and original vs corrected
    recon, recovery = result["pages"]["reconciliation"], result["pages"]["recovery"]
    declared = {d.name: (c.name, d.remediation) for c in spec.downstream for d in c.decisions}
    impact = {row[0]: row for row in recon.tables["decision-impact"][1:]}
    assert {k: (v[1], v[4]) for k, v in impact.items()} == declared
    material = dict(
        r.fetch(
            f'SELECT consumer, count(*) FILTER (WHERE material) FROM {SCHEMA}."impact__orders" '
            f"WHERE incident_id = ? GROUP BY 1",
            [incident.incident_id],
        )
    )
    for name, row in impact.items():
        n = material.get(row[1], 0)
        assert row[2] == ("yes" if n else "no") and int(row[3].replace(",", "")) == n, row
    assert any(row[2] == "yes" for row in impact.values())
    corrected = {row[0]: row for row in recovery.tables["decision-corrections"][1:]}
    assert set(corrected) == set(declared)
    totals = dict(
        r.fetch(
            f"SELECT consumer, original_total FROM {SCHEMA}.restatements WHERE incident_id = ?", [incident.incident_id]
        )
    )
    recorded = {
        d: (c, m, rem)
        for c, d, m, rem in r.fetch(
            f"SELECT consumer, decision, material, remediation FROM {SCHEMA}.restatement_decisions "
            "WHERE incident_id = ?",
            [incident.incident_id],
        )
    }
    assert set(recorded) == set(declared)
    for name, row in corrected.items():
        consumer, material_now, remediation = recorded[name]
        assert row[1] == declared[name][0] == consumer
        assert row[5] == remediation == (declared[name][1] if material_now else "none: below materiality")
        assert float(row[2].replace(",", "")) == round(totals[row[1]], 2)
    assert any(m for _, m, _ in recorded.values())
    # the out_of_order basis: the orders target keeps a write log
    assert "write log" in result["lists"]["reconciliation"]["concurrent"]["evidence"]
