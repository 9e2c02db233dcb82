"""What a backfill would change, for a person: one line per refusing gate, and an HTML preview.

The lines are what ``recovery backfill plan|run`` prints, what a failed blocking check
says in the UI and what the alert sensor sends: gate, partition, column, observed vs
allowed, and where the preview is. The preview (a self-contained HTML file, no
network) shows per column the share of keys that would change against what is
allowed (an SVG bar chart), per partition and column the keys that would change, and
a sample of before/after rows for each changed column.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.gates import GateResult
from recovery.lib.recurrence.gates.values import ValueReport


def headline(details: str, limit: int = 360) -> str:
    """The first clause of a gate's details (up to the first top-level '; ' or '. Fix'), on one line."""
    depth, cut = 0, len(details)
    for i, ch in enumerate(details):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and (details.startswith("; ", i) or details.startswith(". Fix", i)):
            cut = i
            break
    text = " ".join(details[:cut].split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def refusal_line(gate: GateResult, report: ValueReport | None = None, preview: Path | str | None = None) -> str:
    """One line: the gate, what it saw against what it allows, and where the preview is."""
    if gate.gate == "values" and report is not None and report.violations:
        v = report.violations[0]
        more = f" (+{len(report.violations) - 1} more value checks)" if len(report.violations) > 1 else ""
        text = f"{v.sentence()}{more}"
    else:
        text = headline(gate.details)
    return f"gate {gate.gate} refused: {text}" + (f"; preview: {preview}" if preview else "")


def refusal_lines(
    gates: Mapping[str, GateResult], report: ValueReport | None = None, preview: Path | str | None = None
) -> list[str]:
    return [refusal_line(g, report, preview) for g in gates.values() if not g.passed]


def preview_path(spec: DatasetSpec, backfill_id: str, stage: str) -> Path:
    """Beside the spec, under ``reports/backfills/`` (an output folder, never copied with the dataset)."""
    base = Path(spec.spec_path).parent if spec.spec_path else Path(spec.warehouse.path).parent
    return base / "reports" / "backfills" / f"{backfill_id}-{stage}.html"


def _bars(report: ValueReport) -> str:
    """Per column: the share of keys that would change (bar) and the share allowed (tick)."""
    rows = report.changes
    if not rows:
        return "<p>No column to compare.</p>"
    w, bar_h, left = 560, 18, 150
    height = bar_h * len(rows) + 30
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 60}" height="{height}" role="img" '
            f'aria-label="share of keys changed per column">'
        )
    ]
    for i, c in enumerate(rows):
        y = 10 + i * bar_h
        colour = "#c0392b" if c.refused else ("#2e86c1" if c.declared else "#7f8c8d")
        parts.append(
            f'<text x="{left - 6}" y="{y + 12}" text-anchor="end" font-size="11">{html.escape(c.column)}</text>'
        )
        parts.append(
            f'<rect x="{left}" y="{y + 2}" width="{max(c.share * w, 1):.1f}" height="{bar_h - 6}" fill="{colour}"/>'
        )
        parts.append(
            f'<line x1="{left + c.allowed * w:.1f}" x2="{left + c.allowed * w:.1f}" y1="{y}" y2="{y + bar_h - 2}" '
            f'stroke="black" stroke-width="2"/>'
        )
        parts.append(f'<text x="{left + max(c.share * w, 1) + 4:.1f}" y="{y + 12}" font-size="10">{c.share:.1%}</text>')
    parts.append(
        f'<text x="{left}" y="{height - 4}" font-size="10">share of keys whose value would change '
        f"(bar; red: refused, blue: declared) and the share allowed (black tick)</text></svg>"
    )
    return "".join(parts)


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_preview(
    spec: DatasetSpec,
    backfill_id: str,
    verdict: str,
    gates: Mapping[str, GateResult],
    report: ValueReport | None,
    note: str = "",
) -> str:
    lines = refusal_lines(gates, report)
    gate_rows = [[g.gate, "passed" if g.passed else "REFUSED", headline(g.details, 500)] for g in gates.values()]
    out = [
        (
            f"<!doctype html><html><head><meta charset='utf-8'><title>backfill {html.escape(backfill_id)}</title>"
            "<style>body{font-family:sans-serif;font-size:13px;margin:2em}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}"
            ".refused{color:#c0392b}</style></head><body>"
        ),
        f"<h1>Backfill {html.escape(backfill_id)} of {html.escape(str(spec.target.table))}</h1>",
        f"<p><b>{html.escape(verdict)}</b></p>",
    ]
    if note:
        out.append(f"<p>{html.escape(note)}</p>")
    if lines:
        out.append("<ul>" + "".join(f"<li class='refused'>{html.escape(x)}</li>" for x in lines) + "</ul>")
    out.append("<h2>Gates</h2>" + _table(["gate", "result", "details"], gate_rows))
    if report is not None:
        out.append(
            f"<h2>Values: {report.matched:,} keys compared over {len(report.partitions)} partitions "
            f"({report.declared.describe()})</h2>"
        )
        out.append(_bars(report))
        out.append(
            _table(
                ["column", "keys changed", "share", "allowed", "declared", "worst partition"],
                [
                    [
                        c.column,
                        f"{c.changed:,}",
                        f"{c.share:.1%}",
                        f"{c.allowed:.0%}",
                        "yes" if c.declared else "no",
                        f"{c.worst_partition} ({c.worst_share:.0%})" if c.changed else "",
                    ]
                    for c in report.changes
                ],
            )
        )
        changed = report.changed_columns
        out.append("<h3>Keys that would change, per partition and column</h3>")
        out.append(
            _table(
                ["partition", "keys", "dropped", "added"] + changed,
                [
                    [p["partition"], f"{p['matched']:,}", p["missing"], p["added"]] + [p["changed"][c] for c in changed]
                    for p in report.per_partition
                ],
            )
        )
        if report.violations:
            out.append(
                "<h3>Value checks that failed</h3><ul>"
                + "".join(f"<li>{html.escape(v.sentence())}</li>" for v in report.violations)
                + "</ul>"
            )
        for c in report.changes:
            if c.samples:
                out.append(
                    f"<h3>{html.escape(c.column)}: before → after</h3>"
                    + _table(["key", "partition", "published", "backfill"], [list(x) for x in c.samples])
                )
        if report.baseline_notes:
            out.append("<p>" + "<br>".join(html.escape(n) for n in report.baseline_notes) + "</p>")
    out.append("</body></html>")
    return "\n".join(out)


def write_preview(
    spec: DatasetSpec,
    backfill_id: str,
    stage: str,
    verdict: str,
    gates: Mapping[str, GateResult],
    report: ValueReport | None,
    note: str = "",
) -> Path:
    path = preview_path(spec, backfill_id, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_preview(spec, backfill_id, verdict, gates, report, note), encoding="utf-8")
    return path
