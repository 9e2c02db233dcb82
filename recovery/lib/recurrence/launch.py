"""The guarded launcher, start to build: preflight, manifest, own generation, seed, recompute.

- ``preflight``: the scope preview and the pre-write gates (approval, scope, capacity),
  in one read-only session. A dry run stops here: the warehouse file is unchanged.
- ``start_backfill``: a refused preflight is recorded (who tried what, and why) and
  nothing else is written. Otherwise the manifest (inputs with their watermark and
  pointer sequence, code version, config hash, approvals, preview) is committed
  *before* the first write; then the backfill's generation is registered with its own
  namespace and fencing token, and seeded, in one transaction that confirms the
  pointer has not moved, with the published rows outside the range (stamps kept).
- ``build_backfill``: runs the recompute; every write goes through the writer as the
  backfill's generation, so it can only land in its own namespace, and is refused
  once the generation is fenced. A recompute that raises leaves the backfill failed
  and the published table untouched.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import metadata

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, utcnow
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.errors import DuplicateKeyError, RecoveryError, SpecError
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote
from recovery.lib.pointers.managed_views import pointer_seq
from recovery.lib.pointers.namespaces import current_namespace, namespace_sql
from recovery.lib.recurrence.gates.values import compared_columns
from recovery.lib.recurrence.policy import pre_write_gates
from recovery.lib.recurrence.preview import ScopePreview, preview_scope
from recovery.lib.recurrence.recompute import Recompute, RecomputeContext, code_version, resolve_recompute
from recovery.lib.recurrence.record import BackfillRecord, load_backfill, record_gates, require_backfill, set_status
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.recurrence.tables import BACKFILLS, ensure_backfill_tables
from recovery.lib.retry import retrying
from recovery.lib.write.writer import Writer


@dataclass(frozen=True)
class Preflight:
    request: BackfillRequest
    preview: ScopePreview
    gates: list[GateResult]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def refusals(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]


def preflight(writer: Writer, request: BackfillRequest) -> Preflight:
    """Scope preview and pre-write gates; reads only."""
    resolve_recompute(request.recompute)  # a bad name is a SpecError before anything else
    preview = preview_scope(writer.engine, writer.spec, request)
    _check_declared(writer, request, preview.published_namespace)
    return Preflight(request, preview, pre_write_gates(writer.spec, request, preview))


def _check_declared(writer: Writer, request: BackfillRequest, namespace: str) -> None:
    """The value gate's per-column overrides and the declared columns name compared columns; raises ``SpecError``
    naming ``recurrence.anomaly.columns.<name>`` or ``expect_change`` before anything is written."""
    with writer.engine.session(read_only=True) as s:
        names = [c for c, _ in compared_columns(s, writer.spec, namespace)] + [writer.spec.target.partition]
    unknown = [c for c in request.expect_change if c not in names]
    if unknown:
        raise SpecError(
            "expect_change",
            f"{', '.join(unknown)} is not a payload column of {writer.spec.target.table}",
            f"declare some of {names}",
        )


def _package_version() -> str:
    try:
        return metadata.version("backfill-recovery")
    except metadata.PackageNotFoundError:
        return "unknown"


def manifest(writer: Writer, pf: Preflight, code: str, published_seq: int | None) -> dict:
    spec, req, pv = writer.spec, pf.request, pf.preview
    return {
        "backfill_id": req.id,
        "dataset": spec.dataset,
        "generation": req.generation,
        "request": req.model_dump(mode="json"),
        "config_hash": req.config_hash,
        "spec": {"path": str(spec.spec_path or ""), "fingerprint": spec.fingerprint},
        "policy": spec.recurrence_policy.model_dump(mode="json"),
        "code": {"recompute": req.recompute, "version": code, "package": _package_version()},
        "inputs": {
            "source": {"table": spec.source.table, "watermark": str(pv.source_watermark)},
            "published": {
                "namespace": pv.published_namespace,
                "pointer_seq": published_seq,
                "rows_in_range": pv.published_rows,
                "rows_outside_range": pv.seed_rows,
            },
        },
        "scope": pv.model_dump(mode="json"),
        "approvals": req.approved_by,
        "requested_by": req.requested_by,
        "declared_intent": req.declared,  # what the approvers approved it to change (the value gate holds it to that)
        "recorded_at": utcnow().isoformat(),
    }


def start_backfill(
    writer: Writer, pf: Preflight, *, recompute: Recompute | None = None, run_id: str | None = None
) -> BackfillRecord:
    """Record the refusal, or the manifest then the generation and its seed. Idempotent per backfill id: a
    launch stopped after its manifest's commit (or its generation's) resumes from the recorded manifest."""
    spec, req, pv = writer.spec, pf.request, pf.preview
    events = EventSource(dataset=spec.dataset, actor=req.requested_by, run_id=run_id)
    fn = recompute or resolve_recompute(req.recompute)
    code = code_version(req.recompute, fn)
    with writer.engine.session(read_only=True) as s:
        existing = load_backfill(s, req.id)
    if existing is not None and existing.status not in ("refused", "manifest"):
        if existing.status in ("failed", "stopped"):
            raise RecoveryError(
                f"backfill {req.id} already ran and ended {existing.status} ({existing.reason}); "
                f"launch a new one with another backfill_id"
            )
        return existing
    if existing is not None and existing.status == "manifest":
        # the manifest committed, its generation or seed not: go on from what the manifest recorded
        return _seed(writer, req, existing, code, run_id)

    def txn() -> None:
        with writer.engine.transaction() as s:
            ensure_backfill_tables(s)
            s.execute(f"DELETE FROM {BACKFILLS} WHERE backfill_id = ? AND status = 'refused'", [req.id])
            status = "manifest" if pf.passed else "refused"
            reason = None if pf.passed else "; ".join(f"{g.gate}: {g.details}" for g in pf.refusals)
            body = manifest(writer, pf, code, pointer_seq(s, str(spec.target.table_name)))
            seq = record_gates(s, req.id, req.generation, spec.dataset, "preflight", pf.gates, run_id=run_id)
            s.execute(
                f"INSERT INTO {BACKFILLS} VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, ?, ?, "
                "?, ?)",
                [
                    req.id,
                    spec.dataset,
                    req.generation,
                    pv.published_namespace,
                    req.start,
                    req.end,
                    pv.partitions,
                    status,
                    json.dumps(body),
                    req.config_hash,
                    code,
                    pv.source_watermark,
                    seq,
                    req.requested_by,
                    req.approved_by,
                    utcnow(),
                    reason,
                ],
            )
            if not pf.passed:
                events.record(
                    s,
                    "backfill_refused",
                    f"backfill {req.id} of {spec.target.table} refused before any write: {reason}",
                )
                return
            record_gates(
                s,
                req.id,
                req.generation,
                spec.dataset,
                "preflight",
                [
                    GateResult(
                        "manifest",
                        True,
                        0,
                        f"recorded at seq {seq} before the first write: source {spec.source.table} as of "
                        f"{pv.source_watermark}, published {pv.published_namespace}, code {code}, "
                        f"config {req.config_hash}",
                    )
                ],
                run_id=run_id,
            )
            events.record(
                s,
                "backfill_manifest",
                f"backfill {req.id} manifest recorded: {pv.summary()}; approved by "
                f"{', '.join(req.approved_by) or 'nobody'}",
                body,
            )
            faults.checkpoint("backfill_manifest:recorded")  # the manifest, its gate and its event, not committed

    retrying(txn)
    with writer.engine.session(read_only=True) as s:
        rec = require_backfill(s, req.id)
    if not pf.passed:
        return rec
    faults.checkpoint("backfill_manifest:committed")  # the manifest recorded, no generation yet
    return _seed(writer, req, rec, code, run_id)


def _seed(writer: Writer, req: BackfillRequest, rec: BackfillRecord, code: str, run_id: str | None) -> BackfillRecord:
    """Register the backfill's generation with its own namespace, then seed it with the published rows outside
    the range and set the backfill building (one transaction), as its manifest recorded them."""
    spec = writer.spec
    events = EventSource(dataset=spec.dataset, actor=req.requested_by, run_id=run_id)
    published = rec.from_namespace
    namespace = writer.register_generation(
        req.generation,
        "backfill",
        own_namespace=True,
        source_watermark=rec.source_watermark,
        code_version=code,
        run_id=run_id,
        backfill_id=req.id,
        parent=published,
        note=f"guarded backfill {req.id}",
    )
    if namespace == published or namespace is None:
        raise RecoveryError(f"generation {req.generation} has no namespace of its own; refusing to write")

    def seed() -> None:
        with writer.engine.transaction() as s:
            if s.scalar(f"SELECT status FROM {BACKFILLS} WHERE backfill_id = ?", [req.id]) != "manifest":
                return  # seeded by another attempt
            part_filter = in_partitions(s, spec, rec.partitions)
            if current_namespace(s, spec) != published:
                raise RecoveryError(f"{spec.target.table} was republished while the backfill started; launch it again")
            res = writer.write_in(
                s,
                req.generation,
                f"SELECT * FROM {namespace_sql(published)} WHERE NOT ({part_filter})",
                mode="append",
                run_id=run_id,
                note=f"seed of guarded backfill {req.id}: published rows outside the range",
                keep_stamps=True,
                log_delta=False,
            )
            s.execute(
                f"UPDATE {BACKFILLS} SET namespace = ?, seed_seq = ?, status = 'building' WHERE backfill_id = ?",
                [namespace, res.seq, req.id],
            )
            events.record(
                s,
                "backfill_started",
                f"backfill {req.id} writes generation {req.generation} into its own namespace {namespace}, "
                f"seeded with {res.rows_inserted:,} published rows outside the range (seq {res.seq})",
            )
            faults.checkpoint("backfill_seed:recorded")  # the seed, the backfill building and its event, not committed

    retrying(seed)
    faults.checkpoint("backfill_seed:committed")
    with writer.engine.session(read_only=True) as s:
        return require_backfill(s, req.id)


def build_backfill(
    writer: Writer, rec: BackfillRecord, recompute: Recompute, *, run_id: str | None = None
) -> BackfillRecord:
    """Run the recompute into the backfill's generation; a failure is recorded, never published."""
    if rec.status != "building":
        raise RecoveryError(f"backfill {rec.backfill_id} is {rec.status}, not building")
    ctx = RecomputeContext(
        writer=writer,
        generation=rec.generation,
        partitions=rec.partitions,
        watermark=rec.source_watermark,
        run_id=run_id,
        backfill_id=rec.backfill_id,
    )
    began = time.monotonic()
    try:
        recompute(ctx)
    except DuplicateKeyError as err:  # the writer's own one-row-per-key invariant: a gate refusal, not a crash
        gate = GateResult("invariants", False, 1, f"unique key {writer.spec.key} refused by the writer: {err}")
        _end_build(writer, rec, "stopped", f"gate invariants failed: {gate.details}", run_id, gate)
        with writer.engine.session(read_only=True) as s:
            return require_backfill(s, rec.backfill_id)
    except Exception as err:  # the recompute is user code: any failure ends the backfill, unpublished
        reason = f"{type(err).__name__}: {err}"
        _end_build(writer, rec, "failed", reason, run_id)
        raise RecoveryError(
            f"backfill {rec.backfill_id} failed while recomputing: {reason}; nothing was published"
        ) from err
    seconds = max(time.monotonic() - began, 1e-3)
    part = quote(writer.spec.target.partition)

    def built() -> None:
        with writer.engine.transaction() as s:
            rows = s.scalar(
                f"SELECT count(*) FROM {namespace_sql(rec.built_namespace)} "
                f"WHERE {in_partitions(s, writer.spec, rec.partitions)}"
            )
            s.execute(
                f"UPDATE {BACKFILLS} SET status = 'built', manifest = json_merge_patch(manifest, ?) "
                "WHERE backfill_id = ?",
                [
                    json.dumps(
                        {
                            "build": {
                                "rows_written": rows,
                                "seconds": round(seconds, 3),
                                "rows_per_second": round(rows / seconds, 1),
                            }
                        }
                    ),
                    rec.backfill_id,
                ],
            )
            EventSource(dataset=writer.spec.dataset, actor="guarded_backfill", run_id=run_id).record(
                s,
                "backfill_built",
                f"backfill {rec.backfill_id} built {rows:,} rows over {len(rec.partitions)} partitions "
                f"({part} {rec.partitions[0]}..{rec.partitions[-1]}) in {seconds:,.1f} s",
            )
            # its generation complete in the same commit: a rerun finds the backfill built and builds nothing
            s.execute(
                f"UPDATE {SCHEMA}.generations SET status = 'complete', ended_at = ? WHERE generation = ? "
                "AND fenced_at IS NULL",
                [utcnow(), rec.generation],
            )
            faults.checkpoint("backfill_built:recorded")  # the backfill built, its generation complete, its event

    retrying(built)
    faults.checkpoint("backfill_built:committed")
    with writer.engine.session(read_only=True) as s:
        return require_backfill(s, rec.backfill_id)


def _end_build(
    writer: Writer, rec: BackfillRecord, status: str, reason: str, run_id: str | None, gate: GateResult | None = None
) -> None:
    """End a build that did not finish: ``failed`` (the recompute raised) or ``stopped`` (the
    writer refused a key written twice, recorded as the ``invariants`` gate). Whatever the
    candidate holds is kept for inspection; the published table is untouched."""

    def txn() -> None:
        with writer.engine.transaction() as s:
            if gate is not None:
                record_gates(s, rec.backfill_id, rec.generation, writer.spec.dataset, "build", [gate], run_id=run_id)
            set_status(s, rec.backfill_id, status, reason[:2000])
            s.execute(  # its generation failed in the same commit, as a build's completes
                f"UPDATE {SCHEMA}.generations SET status = 'failed', ended_at = ? WHERE generation = ? "
                "AND fenced_at IS NULL",
                [utcnow(), rec.generation],
            )
            EventSource(dataset=writer.spec.dataset, actor="guarded_backfill", run_id=run_id).record(
                s,
                f"backfill_{status}",
                f"backfill {rec.backfill_id} {status} while recomputing ({reason[:300]}); "
                f"{writer.spec.target.table} still points at {rec.from_namespace}",
            )

    retrying(txn)
