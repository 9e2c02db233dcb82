"""The incident timeline asset: the story so far, as Markdown in the UI and a report file.

It only reads (the control plane read-only, the Dagster instance through its
APIs), so it can be re-materialized after every phase; each rendering replaces
``reports/<incident>/timeline.md`` and ``timeline.json`` beside the warehouse, the
files later reports include. It runs after the evidence bundle when both are
selected, so the timeline tells that the evidence was preserved.
"""

import dagster as dg

from recovery.dagster_history import run_history_for
from recovery.defs.evidence.assets import EVIDENCE_KEY
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.lib.incident.phases import TIMELINE
from recovery.lib.timeline import build_timeline, render_markdown, write_timeline

TIMELINE_KEY = dg.AssetKey(["incident", "timeline"])


@incident_asset(
    key=TIMELINE_KEY,
    deps=[EVIDENCE_KEY],
    description="Incident timeline: request, approval, input snapshot, code, configuration, ranges, runs, retries, "
    "writes, alerts, decisions and containment, in time order with real run ids.",
)
def incident_timeline(context: dg.AssetExecutionContext, step: IncidentStep) -> dg.MaterializeResult:
    history = run_history_for(context.instance, step.engine, step.incident.failed_generations)
    timeline = build_timeline(step.incident, step.spec, step.engine, history)
    paths = write_timeline(timeline, step.incident.reports_dir(step.spec))
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(timeline.events),
            "timeline": dg.MetadataValue.md(render_markdown(timeline)),
            "report": dg.MetadataValue.path(str(paths["markdown"])),
            "kinds": ", ".join(f"{k} {n}" for k, n in timeline.kind_counts.items()),
            "not_recorded_yet": ", ".join(timeline.missing_kinds) or "none",
            "run_ids": len(timeline.run_ids),
        }
    )


render_timeline = dg.define_asset_job(
    TIMELINE.job,
    selection=dg.AssetSelection.assets(TIMELINE_KEY),
    executor_def=dg.in_process_executor,
    description="Rebuild an incident's timeline from the control plane and Dagster's event log.",
)
