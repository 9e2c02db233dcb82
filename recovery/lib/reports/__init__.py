"""The three documents that prove a recovery (runbook "Done"), as self-contained HTML and Markdown.

- *Incident timeline* (:mod:`.timeline`): the story of the failed backfill and its
  containment, from :mod:`recovery.lib.timeline`;
- *Reconciliation* (:mod:`.reconciliation`): keys, partitions, versions, damage per
  label, a per-partition heatmap, consumer impact with materiality, decisions;
- *Recovery and recurrence* (:mod:`.recovery`): repair, idempotency, concurrent
  writes, waves and gates, before/after totals, corrections, convergence and the
  recurrence gates; each section says "not run yet" until its phase has run.

Each report is built in two steps: section functions read the control plane
through one read-only session and return plain dicts; templates render them. No
report loads a script, style or image from the network: plots are embedded as
base64 PNG and the stylesheet is inline, so a report opens offline and can be
attached to a ticket or an evidence bundle as one file. Dagster-free.
"""

from recovery.lib.reports.build import REPORT_NAMES, IncidentReports, build_reports, write_reports

__all__ = ["REPORT_NAMES", "IncidentReports", "build_reports", "write_reports"]
