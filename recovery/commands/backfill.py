"""``recovery backfill plan|run``: a backfill of the served dataset through the guarded launcher.

``plan`` is the dry run (job ``preview_backfill``): the scope preview and the
pre-write gates; the warehouse is left byte-identical. ``run`` launches
``guarded_backfill``: refused without approvals, past capacity or over current
partitions; otherwise built in its own generation, gated, and published only if
every gate passed. Exit 0: would launch / published; 1: refused or stopped; 2: bad input.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _request(args: argparse.Namespace):
    from recovery.lib.recurrence.request import request_from_mapping

    return request_from_mapping({
        "start": args.start, "end": args.end, "recompute": args.recompute, "requested_by": args.requested_by,
        "approved_by": [a for a in (args.approved_by or "").split(",") if a.strip()],
        "allow_current_partitions": args.allow_current_partitions, "backfill_id": args.backfill_id, "notes": args.notes,
    }, source="command line")


def _gates_table(title: str, gates: list[tuple[str, bool, str]]) -> Table:
    t = Table(title=title)
    t.add_column("gate")
    t.add_column("passed")
    t.add_column("details", overflow="fold")
    for gate, passed, details in gates:
        t.add_row(gate, "[green]yes[/]" if passed else "[red]NO[/]", details[:400])
    return t


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.config import spec_path
    from recovery.lib.catalog_checks import load_spec

    path = Path(args.spec).resolve() if args.spec else spec_path()
    spec = load_spec(path)                    # validate before launching anything
    request = _request(args)
    os.environ["RECOVERY_SPEC"] = str(path)   # the code location serves this dataset
    from recovery.definitions import defs
    from recovery.lib.errors import RecoveryError
    from recovery.orchestration import project_instance, run_job

    config = {k: v for k, v in request.model_dump().items()}
    instance = project_instance()
    if args.action == "plan":
        result = run_job(defs(), "preview_backfill", instance,
                         run_config={"ops": {"preview_backfill_scope": {"config": config}}})
        out = result.output_for_node("preview_backfill_scope")
        p = out["preview"]
        t = Table(title=f"dry run of backfill {request.id} (run {result.run_id[:8]}): nothing was written")
        t.add_column("scope")
        t.add_column("value", overflow="fold")
        for label, value in [
            ("partitions", f"{len(p['partitions'])} ({p['range_start']} .. {p['range_end']})"),
            ("rows published / from source", f"{p['published_rows']:,} / {p['expected_rows']:,}"),
            ("keys", f"{p['keys']:,}"), ("bytes (new generation)", f"{p['estimated_bytes']:,}"),
            ("estimated run time", f"{p['estimated_seconds']:,.1f} s ({p['throughput_from']})"),
            ("current partitions touched", ", ".join(p["current_touched"]) or "none"),
            ("consumers that would change", ", ".join(c["name"] for c in p["consumers"]) or "none"),
        ]:
            t.add_row(label, value)
        console.print(t)
        console.print(_gates_table("pre-write gates", [(g["gate"], g["passed"], g["details"]) for g in out["gates"]]))
        return 0 if out["passed"] else 1

    failure = None
    try:
        run_job(defs(), "guarded_backfill", instance, run_config={"ops": {"recurrence__backfill": {"config": config}}})
    except RecoveryError as err:
        failure = str(err)
    from recovery.lib.engine import open_engine
    from recovery.lib.recurrence.record import latest_gates, load_backfill

    with open_engine(spec.warehouse).session(read_only=True) as s:
        rec = load_backfill(s, request.id)
        gates = latest_gates(s, request.id)
    console.print(_gates_table(f"backfill {request.id}: {rec.status if rec else 'not started'}",
                               [(g.gate, g.passed, g.details) for g in gates.values()]))
    if rec is not None and rec.status == "published":
        console.print(f"published: {spec.target.table} now points at {rec.namespace} (prior {rec.from_namespace} retained)")
        return 0
    console.print(f"[red]not published[/]: {(rec.reason if rec and rec.reason else failure) or 'see the run in the UI'}",
                  highlight=False, soft_wrap=True)
    return 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backfill", help="preview (plan) or run a backfill through the recurrence gates")
    p.add_argument("action", choices=["plan", "run"], help="plan: dry run, writes nothing; run: the guarded backfill")
    p.add_argument("--start", required=True, help="first partition of the range")
    p.add_argument("--end", required=True, help="last partition of the range, inclusive")
    p.add_argument("--spec", help="dataset spec (default: RECOVERY_SPEC, else the worked example)")
    p.add_argument("--recompute", default="transform", help="'transform' or package.module:function")
    p.add_argument("--requested-by", default=os.environ.get("USER") or "cli", help="who launches it")
    p.add_argument("--approved-by", help="comma-separated approvers")
    p.add_argument("--allow-current-partitions", action="store_true",
                   help="acknowledge that the range reaches the partitions ingestion writes")
    p.add_argument("--backfill-id", help="backfill id (default: derived from the range and the code)")
    p.add_argument("--notes", default="", help="free text kept in the manifest")
    p.set_defaults(fn=run)
