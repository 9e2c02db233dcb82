"""``recovery evidence build|verify|snapshot --incident FILE``: freeze an incident's evidence, re-check
it, or write one of its source snapshots out of the bundle.

``build`` launches the ``preserve_evidence`` job in the project's Dagster instance
(the instance the backfill ran in, so its runs and event logs are found), exactly
as the UI would. ``verify`` needs no Dagster: it recomputes every checksum and
exits 1 naming each file that changed, went missing or appeared unlisted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from recovery.commands import incident_verb
from recovery.lib.errors import RecoveryError


def build(args: argparse.Namespace, console: Console) -> int:
    from recovery.launch import Launcher
    from recovery.lib.evidence import read_manifest
    from recovery.lib.incident.phases import EVIDENCE

    launcher = Launcher.for_file(args.incident)  # validates before launching anything
    incident, spec = launcher.incident, launcher.spec
    result = launcher.run(EVIDENCE)
    bundle = incident.evidence_dir(spec)
    manifest = read_manifest(bundle)
    (event,) = result.get_asset_materialization_events()
    created = event.materialization.metadata["created"].value
    size = sum(f["bytes"] for f in manifest["files"])
    state = "built" if created else "already existed: left untouched"
    console.print(
        f"evidence bundle {bundle} {state} ({len(manifest['files'])} files, {size / 1e6:.1f} MB; "
        f"run {result.run_id[:8]})",
        highlight=False,
        soft_wrap=True,
    )
    for note in manifest["notes"] + manifest["orchestrator"]["notes"]:
        console.print(f"  note: {note}")
    return 0


def verify(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.engine import open_engine
    from recovery.lib.evidence import recorded_manifest_sha256, verify_bundle
    from recovery.lib.incident.model import parse_incident

    incident = parse_incident(args.incident)
    spec = incident.load_spec(check_warehouse=False)  # verifying must not depend on the warehouse's state
    bundle = incident.evidence_dir(spec)
    if not bundle.exists():
        raise RecoveryError(
            f"no evidence bundle at {bundle}; build it with: recovery evidence build --incident {args.incident}"
        )
    recorded = None
    try:
        recorded = recorded_manifest_sha256(
            open_engine(spec.warehouse.model_copy(update={"busy_timeout_s": 5.0})), incident.incident_id, bundle
        )
    except Exception as err:  # the warehouse is optional evidence of the manifest, not a precondition
        console.print(
            f"note: could not read the manifest's recorded checksum from the warehouse ({err})", highlight=False
        )
    result = verify_bundle(bundle, recorded_manifest_sha256=recorded)
    for problem in result.problems:
        console.print(f"[red]FAIL[/] {problem}", highlight=False, soft_wrap=True)
    if result.ok:
        checked = "; manifest matches the checksum recorded in the control plane" if recorded else ""
        console.print(
            f"[green]OK[/] {bundle}: {result.files_checked} files match the manifest{checked}",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    console.print(f"{len(result.problems)} problem(s) in {bundle}", highlight=False, soft_wrap=True)
    return 1


def snapshot(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.evidence import choose_snapshot, read_manifest, write_snapshot
    from recovery.lib.incident.model import parse_incident

    incident = parse_incident(args.incident)
    bundle = incident.evidence_dir(incident.load_spec(check_warehouse=False))
    if not (bundle / "manifest.json").is_file():
        raise RecoveryError(
            f"no evidence bundle at {bundle}; build it with: recovery evidence build --incident {args.incident}"
        )
    out = args.out.resolve()
    if out.exists():
        raise RecoveryError(f"--out {out} exists; name a new file (nothing is overwritten)")
    if bundle.resolve() in out.parents:
        raise RecoveryError(f"--out {out} is inside the bundle, which is immutable; name a file outside it")
    entry = choose_snapshot(read_manifest(bundle), args.as_of)
    rows = write_snapshot(bundle, entry, out)
    console.print(
        f"source snapshot as of {entry['snapshot']['as_of']}: {rows:,} rows written to {out} "
        f"(from {entry['snapshot']['rows_of']} through {entry['path']})",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evidence", help="preserve an incident's evidence bundle, or verify its checksums")
    verbs = p.add_subparsers(dest="evidence_verb", required=True, metavar="ACTION")
    incident_verb(verbs, "build", build, "freeze the incident's evidence (never overwrites an existing bundle)")
    incident_verb(
        verbs, "verify", verify, "re-check every checksum; exits 1 naming each changed, missing or extra file"
    )
    p = incident_verb(
        verbs, "snapshot", snapshot, "write a source snapshot's rows (from the bundle's change log) to a Parquet file"
    )
    p.add_argument("--out", type=Path, required=True, help="a new Parquet file, outside the bundle")
    p.add_argument(
        "--as-of",
        help="the snapshot's watermark as the manifest lists it, or 'now' (default: the failed generation's read)",
    )
