"""The three reports of an incident, re-rendered after any phase.

It only reads (the control plane through one read-only session, Dagster's run
history through the instance), so it can be materialized at any point: sections
whose phase has not run yet say "not run yet". It writes ``timeline``,
``reconciliation`` and ``recovery`` as ``.html`` (self-contained: plots and styles
inline) and ``.md`` into ``reports/<incident>/`` beside the warehouse, or into
``out_dir``; the Markdown is shown as this asset's metadata in the UI.
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from recovery.dagster_history import run_history_for
from recovery.defs.containment.config import IncidentConfig
from recovery.defs.incident_step import IncidentStep, incident_asset
from recovery.defs.timeline.assets import TIMELINE_KEY
from recovery.lib.incident.phases import REPORT
from recovery.lib.reports import build_reports, write_reports
from recovery.lib.timeline import build_timeline

REPORTS_KEY = dg.AssetKey(["incident", "reports"])
DECISION_KEY = dg.AssetKey(["incident", "decision"])


class ReportsConfig(IncidentConfig):
    out_dir: str | None = Field(
        None, description="Where to write the reports (default: reports/<incident> beside the warehouse)."
    )


@incident_asset(
    key=REPORTS_KEY,
    deps=[DECISION_KEY, TIMELINE_KEY],
    config=ReportsConfig,
    kinds={"duckdb", "html"},
    description="The incident's three reports (timeline, reconciliation, recovery and recurrence) as self-contained "
    "HTML files, with their Markdown here.",
)
def incident_reports(context: dg.AssetExecutionContext, step: IncidentStep[ReportsConfig]) -> dg.MaterializeResult:
    incident, spec, engine, config = step.incident, step.spec, step.engine, step.config
    timeline = build_timeline(
        incident, spec, engine, run_history_for(context.instance, engine, incident.failed_generations)
    )
    default_dir = incident.reports_dir(spec)
    out = Path(config.out_dir) if config.out_dir else default_dir
    summary_json = next((p for p in (out / "summary.json", default_dir / "summary.json") if p.exists()), None)
    reports = build_reports(incident, spec, engine, timeline, summary_json=summary_json)
    paths = write_reports(reports, out)
    metadata: dict[str, dg.MetadataValue] = {
        f"{name}_report": dg.MetadataValue.md(reports.markdown[name]) for name in paths
    }
    metadata.update({f"{name}_html": dg.MetadataValue.path(str(path)) for name, path in paths.items()})
    metadata["summary"] = dg.MetadataValue.md("\n".join(f"- {line}" for line in reports.summary()))
    return dg.MaterializeResult(metadata=metadata)


render_reports = dg.define_asset_job(
    REPORT.job,
    selection=dg.AssetSelection.assets(REPORTS_KEY),
    executor_def=dg.in_process_executor,
    description="Write an incident's timeline, reconciliation and recovery reports (HTML + Markdown).",
)
