"""``recovery restate --incident FILE``: launch ``restate_consumers`` for an incident file.

The incident is validated first, and so is the moment: restating while the public
target still exposes a fenced generation's rows would re-publish the damage, so
it is refused (exit 2, nothing written) until the repair is published; so is a
Dagster asset downstream of the target whose key is declared nowhere. When the
restatement's own check fails (a corrected output that differs from the source, an
empty ledger where the impact found material rows, a downstream asset's run that
failed), the run stops with one sentence and the command exits 1, after printing what
was recorded.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from recovery.commands import incident_verb
from recovery.lib.errors import GateRefusedError


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.defs.asset_consumers import resolve
    from recovery.launch import Launcher
    from recovery.lib.engine import open_engine
    from recovery.lib.incident.phases import RESTATE
    from recovery.lib.restatement.restate import check_request
    from recovery.lib.restatement.summary import restatement_summary

    launcher = Launcher.for_file(args.incident)
    incident, spec = launcher.incident, launcher.spec
    launcher.require(RESTATE)
    launcher.definitions  # noqa: B018 - built first: the asset graph the consumers are found in
    assets, undeclared = resolve(None, spec, str(incident.spec))
    if undeclared:
        raise undeclared[0].error(spec.target.table)
    if not spec.downstream and not assets:
        console.print(
            f"{spec.dataset} has no downstream consumer (spec: downstream, downstream_assets; no asset downstream of "
            f"{spec.target.table} in the code location): nothing to restate",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    check_request(open_engine(spec.warehouse), spec, incident.incident_id, None)
    refused: GateRefusedError | None = None
    try:
        result = launcher.run(RESTATE)
        title = f"{incident.incident_id}: consumers restated (run {result.run_id[:8]})"
    except GateRefusedError as err:
        refused, title = err, f"{incident.incident_id}: recorded, but the restatement's check failed"
    with open_engine(spec.warehouse).session(read_only=True) as s:
        rows = restatement_summary(s, spec, incident.incident_id)
    console.print(restatement_table(rows, title))
    if refused is not None:
        raise refused
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
