"""``recovery backfill plan|run``: a backfill of the served dataset through the guarded launcher.

``plan`` is the dry run (job ``preview_backfill``): the whole backfill rehearsed on a
scratch copy of the warehouse, so it exits 1 exactly when ``run`` would refuse, and
names the columns that would change (table, metadata, HTML preview); the warehouse
is left byte-identical. ``run`` launches ``guarded_backfill``: refused without
approvals, past capacity or over current partitions; otherwise built in its own
generation, gated, and published only if every gate passed. A refusal is one line per
failed gate (gate, partition, column, observed vs allowed, where the preview is), no
stack trace. Exit 0: would publish / published; 1: a gate refuses; 2: bad input.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _request(args: argparse.Namespace):
    from recovery.lib.recurrence.request import request_from_mapping

    return request_from_mapping(
        {
            "start": args.start,
            "end": args.end,
            "recompute": args.recompute,
            "requested_by": args.requested_by,
            "approved_by": [a for a in (args.approved_by or "").split(",") if a.strip()],
            "allow_current_partitions": args.allow_current_partitions,
            "backfill_id": args.backfill_id,
            "notes": args.notes,
            "expect_change": [c for c in (args.expect_change or "").split(",") if c.strip()],
            "expected_share": args.expected_share,
        },
        source="command line",
    )


def _gates_table(title: str, gates: list[tuple[str, bool, str]]) -> Table:
    t = Table(title=title)
    t.add_column("gate")
    t.add_column("passed")
    t.add_column("details", overflow="fold")
    for gate, passed, details in gates:
        t.add_row(gate, "[green]yes[/]" if passed else "[red]NO[/]", details[:400])
    return t


def _changes_table(changes: list[dict]) -> Table:
    t = Table(title="columns: share of the range's keys whose value would change")
    for title in ("column", "keys changed", "share", "allowed", "declared", "e.g. key: published -> backfill"):
        t.add_column(title, overflow="fold")
    for c in changes:
        share = f"{c['share']:.1%}"
        t.add_row(
            c["column"],
            f"{c['changed']:,} of {c['keys']:,}",
            f"[red]{share}[/]" if c["refused"] else share,
            f"{c['allowed']:.0%}",
            "yes" if c["declared"] else "no",
            "; ".join(f"{k}: {b} -> {a}" for k, _, b, a in c["samples"][:2]),
        )
    return t


def _print_refusals(console: Console, lines: list[str]) -> None:
    for line in lines:  # as Text: a sample value in brackets is not rich markup
        console.print(Text(line, style="red"), soft_wrap=True)


QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}  # a refusal is a decision, not a stack trace


def run(args: argparse.Namespace, console: Console) -> int:
    from recovery.config import spec_path
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.lakehouse.history import refuse_lakehouse

    path = Path(args.spec).resolve() if args.spec else spec_path()
    spec = load_spec(path)  # validate before launching anything
    refuse_lakehouse(spec, "a guarded backfill")
    request = _request(args)
    from recovery.definitions import definitions_for
    from recovery.lib.engine import open_engine
    from recovery.lib.errors import RecoveryError
    from recovery.lib.recurrence.launch import preflight
    from recovery.lib.write.writer import Writer
    from recovery.orchestration import project_instance, run_job

    preflight(Writer(open_engine(spec.warehouse), spec, actor="cli"), request)  # bad input: exit 2 before any run
    config = {k: v for k, v in request.model_dump().items()}
    instance = project_instance()
    code_location = definitions_for(path)  # built for this dataset's spec
    if args.action == "plan":
        try:
            result = run_job(
                code_location,
                "preview_backfill",
                instance,
                run_config={**QUIET, "ops": {"preview_backfill_scope": {"config": config}}},
            )
        except RecoveryError as err:
            console.print(f"[red]plan failed[/]: {err}", highlight=False, soft_wrap=True)
            return 2
        out = result.output_for_node("preview_backfill_scope")
        p = out["preview"]
        t = Table(
            title=f"dry run of backfill {request.id} (run {result.run_id[:8]}): rehearsed on a copy, "
            "nothing was written"
        )
        t.add_column("scope")
        t.add_column("value", overflow="fold")
        for label, value in [
            ("partitions", f"{len(p['partitions'])} ({p['range_start']} .. {p['range_end']})"),
            ("rows published / from source", f"{p['published_rows']:,} / {p['expected_rows']:,}"),
            ("keys", f"{p['keys']:,}"),
            ("bytes (new generation)", f"{p['estimated_bytes']:,}"),
            ("estimated run time", f"{p['estimated_seconds']:,.1f} s ({p['throughput_from']})"),
            ("current partitions touched", ", ".join(p["current_touched"]) or "none"),
            ("consumers that would change", ", ".join(c["name"] for c in p["consumers"]) or "none"),
            ("columns that would change", ", ".join(c["column"] for c in out["changes"] if c["changed"]) or "none"),
        ]:
            t.add_row(label, value)
        console.print(t)
        console.print(
            _gates_table(
                "gates (as `run` would evaluate them)", [(g["gate"], g["passed"], g["details"]) for g in out["gates"]]
            )
        )
        if out["changes"]:
            console.print(_changes_table(out["changes"]))
        if out["note"]:
            console.print(out["note"], highlight=False)
        console.print(f"preview: {out['preview_path']}", highlight=False, soft_wrap=True)
        if out["passed"]:
            console.print("[green]would publish[/]: every gate passes")
            return 0
        _print_refusals(console, out["refusals"])
        return 1

    failure = None
    try:
        run_job(
            code_location,
            "guarded_backfill",
            instance,
            run_config={**QUIET, "ops": {"recurrence__backfill": {"config": config}}},
        )
    except RecoveryError as err:
        failure = str(err)
    from recovery.lib.recurrence.gates.value_preview import preview_path, refusal_line
    from recovery.lib.recurrence.record import latest_gates, load_backfill

    with open_engine(spec.warehouse).session(read_only=True) as s:
        rec = load_backfill(s, request.id)
        gates = latest_gates(s, request.id)
    console.print(
        _gates_table(
            f"backfill {request.id}: {rec.status if rec else 'not started'}",
            [(g.gate, g.passed, g.details) for g in gates.values()],
        )
    )
    if rec is not None and rec.status == "published":
        console.print(
            f"published: {spec.target.table} now points at {rec.namespace} (prior {rec.from_namespace} retained)"
        )
        return 0
    preview = preview_path(spec, request.id, "run")
    report = None
    if rec is not None and rec.namespace and preview.exists():
        from recovery.lib.recurrence.rehearsal import value_report_of

        report = value_report_of(Writer(open_engine(spec.warehouse), spec, actor="cli"), request.id)
    lines = [refusal_line(g, report, preview if preview.exists() else None) for g in gates.values() if not g.passed]
    if not lines:
        lines = [
            f"backfill {request.id} not published: "
            f"{(rec.reason if rec and rec.reason else failure) or 'see the run in the UI'}"
        ]
    _print_refusals(console, lines)
    if rec is not None and rec.namespace:
        console.print(
            f"{spec.target.table} unchanged; the candidate is kept in {rec.namespace} for inspection", highlight=False
        )
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
    p.add_argument(
        "--allow-current-partitions",
        action="store_true",
        help="acknowledge that the range reaches the partitions ingestion writes",
    )
    p.add_argument("--backfill-id", help="backfill id (default: derived from the range and the code)")
    p.add_argument(
        "--expect-change",
        help="comma-separated columns the backfill is meant to change (declared intent, "
        "stored in the approval record); any other column changing is refused",
    )
    p.add_argument(
        "--expected-share", type=float, help="share of the range's keys the backfill is meant to change (0-1]"
    )
    p.add_argument("--notes", default="", help="free text kept in the manifest")
    p.set_defaults(fn=run)
