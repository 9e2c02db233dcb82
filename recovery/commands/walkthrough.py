"""``make run``: the worked example's incident, from the failed backfill to the verified repair.

The failed backfill is built for real (``recovery demo``'s first half), then every
phase runs as the Dagster job a person would launch from the UI, against the
project's instance (``recovery.launch.recover``), and the figures that matter are printed:
damage per label and per consumer, before/after counts, corrected consumer totals.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from rich.console import Console

from recovery.commands.restate import restatement_table
from recovery.launch.recover import run_recovery
from recovery.lib.consumers.impact import impact_summary
from recovery.lib.dataset_spec.models import parse_spec
from recovery.lib.engine import open_engine
from recovery.lib.incident.model import check_incident, parse_incident
from recovery.lib.repair.diffs import label_diffs, partition_diffs
from recovery.lib.restatement.summary import restatement_summary


@dataclass(frozen=True)
class Walkthrough:
    warehouse: Path
    evidence: Path
    reports: Path
    run_ids: dict[str, list[str]]


def _forget_previous_run(incident, spec, console: Console) -> None:
    """The example's warehouse is generated anew, so an earlier ``make run``'s evidence bundle and
    reports describe an incident that no longer exists here: they go with it (evidence preservation
    refuses to overwrite a bundle, and would keep the stale one)."""
    for folder in (incident.evidence_dir(spec), incident.reports_dir(spec)):
        if folder.exists():
            shutil.rmtree(folder)
            console.print(f"[dim]removed {folder} of an earlier run of the example[/]")


def run_walkthrough(
    spec_path: Path,
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    events: int,
    seed: int,
    console: Console,
    recover: bool = True,
) -> Walkthrough:
    """Build the failed backfill, then (unless ``recover`` is False: the incident is left for a
    person to work through, from the CLI or the UI) run every phase of its recovery."""
    # the example's generator and truth (slow imports) only when the example runs: every command
    # imports this module to build the CLI's parser
    from recovery.example.demo import build_failed_backfill, ingest_during_repair, print_before_after, print_damage

    incident = parse_incident(spec_path.with_name("incident.yaml"))
    _forget_previous_run(incident, parse_spec(spec_path), console)
    result = build_failed_backfill(spec_path, instance=instance, defs=defs, events=events, seed=seed, console=console)
    spec = check_incident(incident)
    if not recover:
        return Walkthrough(result.warehouse, incident.evidence_dir(spec), incident.reports_dir(spec), result.run_ids)
    console.rule(f"recovery of {incident.incident_id}")
    recovered = run_recovery(
        incident,
        spec,
        instance=instance,
        defs=defs,
        console=console,
        after_canary=lambda: ingest_during_repair(spec, instance=instance),
    )

    reports = incident.reports_dir(spec)
    summary = json.loads((reports / "summary.json").read_text())
    with open_engine(spec.warehouse).session(read_only=True) as s:
        print_damage(console, summary, impact_summary(s, spec, incident_id=incident.incident_id))
        print_before_after(console, label_diffs(s, incident.incident_id), partition_diffs(s, incident.incident_id))
        console.print(
            restatement_table(
                restatement_summary(s, spec, incident.incident_id),
                "Consumers restated: corrected totals and material changes",
            )
        )
    console.rule("summary")
    console.print(recovered.report_summary, highlight=False, soft_wrap=True)
    return Walkthrough(result.warehouse, incident.evidence_dir(spec), reports, recovered.run_ids)
