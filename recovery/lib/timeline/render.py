"""The timeline as a report: Markdown for people (and Dagster's UI), JSON for later reports."""

from __future__ import annotations

import json
from pathlib import Path

from recovery.lib.timeline.events import CLOCKS, TimelineEvent


def _cell(text: object) -> str:
    return "" if text is None else str(text).replace("|", "\\|").replace("\n", " ")


def _at(e: TimelineEvent) -> str:
    return e.at.isoformat(sep=" ", timespec="seconds") if e.at else "—"


def render_markdown(timeline) -> str:
    counts = timeline.kind_counts
    lines = [
        f"# Incident timeline: {timeline.incident_id} ({timeline.dataset})",
        "",
        f"Failed generations: {', '.join(timeline.failed_generations)}. Built "
        f"{timeline.built_at:%Y-%m-%d %H:%M:%S} UTC "
        f"from the warehouse's control plane and {timeline.orchestrator}'s event log.",
        "",
        "Events are in story order: by wall clock where an event has one, and by the control plane's commit "
        "sequence (`seq`) where it has only a declared time. Each event keeps its own timestamp and names its clock: "
        + "; ".join(f"`{k}`: {v}" for k, v in CLOCKS.items())
        + ".",
        "",
        "**Kinds present:** "
        + ", ".join(f"{k} ({n})" for k, n in counts.items())
        + ("  \n**Not recorded yet:** " + ", ".join(timeline.missing_kinds) if timeline.missing_kinds else ""),
    ]
    if timeline.notes:
        lines += ["", "**Notes:**"] + [f"- {_cell(n)}" for n in timeline.notes]
    lines += [
        "",
        "| # | at | clock | seq | kind | actor | summary | run id |",
        "| ---: | --- | --- | ---: | --- | --- | --- | --- |",
    ]
    for i, e in enumerate(timeline.events, 1):
        lines.append(
            f"| {i} | {_at(e)} | {e.clock} | {_cell(e.seq)} | {e.kind} | {_cell(e.actor)} | {_cell(e.summary)} | "
            f"{_cell(e.run_id)} |"
        )
    return "\n".join(lines) + "\n"


def write_timeline(timeline, out_dir: Path) -> dict[str, Path]:
    """Write ``timeline.md`` and ``timeline.json`` into ``out_dir`` (replacing an older rendering)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "timeline.md", out_dir / "timeline.json"
    for path, text in (
        (md, render_markdown(timeline)),
        (js, json.dumps(timeline.as_dict(), indent=2, default=str) + "\n"),
    ):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # readers never see half a report
    return {"markdown": md, "json": js}
