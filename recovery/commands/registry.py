"""``recovery registry dagster --spec FILE --backfill ID``: the run registry from the Dagster instance.

For a target the team's own Dagster assets wrote, stamping each row with the run id:
resolves the failed Dagster backfill to its runs, writes every run of the asset as a
registry table in the warehouse, and prints the spec's ``registry`` section and the
failed generations (or writes a draft incident naming them with ``--incident-out``).
"""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path

import yaml
from rich.console import Console


def dagster(args: argparse.Namespace, console: Console) -> int:
    import dagster as dg

    from recovery.launch.dagster_registry import draft_incident, registry_from_dagster
    from recovery.lib.catalog_checks import check_against_warehouse
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery.lib.errors import RecoveryError
    from recovery.lib.incident.draft import draft_incident_id

    spec = parse_spec(args.spec)
    # the registry table this command writes may not exist yet even when the spec already names it
    # (a re-run, a rebuilt warehouse): it is checked once written, like the rest of the spec now
    writes_own = spec.registry is not None and str(spec.registry.table_name) == args.table
    check_against_warehouse(spec.model_copy(update={"registry": None}) if writes_own else spec)
    if args.incident_out and Path(args.incident_out).exists():
        raise RecoveryError(
            f"--incident-out {args.incident_out} exists; nothing was written. Fix: name a new file "
            f"(an incident file a person may have edited is never overwritten)"
        )
    with dg.DagsterInstance.get() as instance:
        reg = registry_from_dagster(spec, args.backfill, table=args.table, asset=args.asset, instance=instance)
        doc = draft_incident(
            instance,
            reg,
            Path(args.spec),
            args.incident_id or draft_incident_id(args.backfill),
            args.actor or getpass.getuser(),
        )
    backfill_runs = sum(r.backfill_id == args.backfill for r in reg.runs)
    console.print(
        f"Dagster backfill {args.backfill}: {backfill_runs} runs, {len(reg.failed_generations)} of which wrote "
        f"{reg.rows_of_backfill:,} rows of {spec.target.table}; {len(reg.runs)} runs of the asset written to "
        f"{reg.table}",
        highlight=False,
        soft_wrap=True,
    )
    if spec.registry is None or str(spec.registry.table_name) != reg.table:
        console.print(
            "add to the spec:\n" + yaml.safe_dump({"registry": reg.spec_section()}, sort_keys=False).rstrip(),
            highlight=False,
            soft_wrap=True,
        )
    if args.incident_out:
        out = Path(args.incident_out)
        incident_id = doc["incident_id"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        console.print(
            f"draft incident {incident_id} written to {out} (fill in approved_by, then "
            f"`recovery contain --incident {out}`)",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"dagster_backfill: {args.backfill}\nfailed_generations:\n"
            + "\n".join(f"  - {g}" for g in doc["failed_generations"]),
            highlight=False,
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("registry", help="build a run registry for a target another tool wrote")
    verbs = p.add_subparsers(dest="registry_verb", required=True, metavar="SOURCE")
    d = verbs.add_parser("dagster", help="from the Dagster instance: resolve a failed backfill id to its runs")
    d.add_argument("--spec", required=True, help="dataset spec YAML")
    d.add_argument("--backfill", required=True, help="the failed Dagster backfill's id (as the UI shows it)")
    d.add_argument("--asset", help="the target's asset key, a/b (default: the target table's schema/name)")
    d.add_argument("--table", default="ops.dagster_runs", help="registry table to write (default: ops.dagster_runs)")
    d.add_argument("--incident-out", help="write a draft incident naming the backfill's runs as failed generations")
    d.add_argument(
        "--incident-id", help="the draft incident's id (default: INC-DRAFT-<backfill id>, the draft-incident sensor's)"
    )
    d.add_argument("--actor", help="who asks (default: the current user)")
    d.set_defaults(fn=dagster)
