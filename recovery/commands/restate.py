"""``recovery restate --incident FILE``: launch ``restate_consumers`` for an incident file.

The incident is validated first, and so is the moment: restating while the public
target still exposes a fenced generation's rows would re-publish the damage, so
it is refused (exit 2, nothing written) until the repair is published.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.engine import open_engine
    from recovery.lib.phases import RESTATE
    from recovery.lib.restatement.restate import check_request

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    launcher.require(RESTATE)
    if not spec.downstream:
        console.print(
            f"{spec.dataset} declares no downstream consumer (spec: downstream): nothing to restate",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    check_request(open_engine(spec.warehouse), spec, incident.incident_id, None)
    result = launcher.run(RESTATE)
    from recovery.lib.restatement.summary import restatement_summary

    with open_engine(spec.warehouse).session(read_only=True) as s:
        rows = restatement_summary(s, spec, incident.incident_id)
    console.print(restatement_table(rows, f"{incident.incident_id}: consumers restated (run {result.run_id[:8]})"))
    return 0


def restatement_table(rows: list, title: str) -> Table:
    """Per consumer: totals before and after, keys changed, material changes, when the owner was told."""
    t = Table(title=title)
    for col in (
        "consumer",
        "owner",
        "original total",
        "corrected total",
        "keys changed",
        "material",
        "corrected output",
        "notified",
    ):
        t.add_column(
            col, justify="right" if col in ("original total", "corrected total", "keys changed", "material") else "left"
        )
    fmt = lambda v: "–" if v is None else f"{v:,.2f}"  # noqa: E731
    for r in rows:
        t.add_row(
            r.consumer,
            r.owner,
            fmt(r.original_total),
            fmt(r.corrected_total),
            f"{r.ledger_rows:,}",
            f"{r.material_rows:,}",
            r.corrected_namespace,
            str(r.notified_at or "–")[:19],
        )
    return t


def register(sub: argparse._SubParsersAction) -> None:
    incident_verb(
        sub, "restate", run, "restate every downstream consumer after the repair is published (ledger + owner notices)"
    )
