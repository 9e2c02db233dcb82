"""A user's asset output written into a managed dataset. Dagster-free.

A platform team's own assets return frames; the IO manager (``recovery/io/``)
stages each frame as a table in the warehouse and hands it here. This module decides
which generation the rows belong to and writes them through :class:`Writer`, so the
fence is checked in the same transaction as the write (a fenced generation's rows never
land) and every row is stamped and logged in the delta log like any other write.

Why a staged table and not the frame: DuckDB's replacement scans (a query reading a
Python variable by name) are disabled on every engine connection, and the writer takes
SQL, so the frame is first copied into the warehouse by the IO manager's type handler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, utcnow
from recovery.lib.errors import RecoveryError
from recovery.lib.identifiers import quote
from recovery.lib.retry import retrying
from recovery.lib.write.fencing import GENERATION_TAG
from recovery.lib.write.generations import GenerationKind
from recovery.lib.write.writer import Writer, WriteResult

BACKFILL_TAG = "dagster/backfill"
SOURCE_WATERMARK_KEY = "recovery/source_watermark"
"""Output metadata an asset may set to say how far it read the source (see :func:`output_watermark`)."""
STAGE_SCHEMA = "recovery_io"
OutputMode = Literal["replace_partitions", "upsert_keys", "append"]


@dataclass(frozen=True)
class RunGeneration:
    """The generation a run's writes are stamped with."""

    generation: str
    kind: GenerationKind
    backfill_id: str | None


def generation_for_run(tags: Mapping[str, str], run_id: str) -> RunGeneration:
    """``recovery/generation`` when the launcher named one; else ``backfill-<id>`` for every run of
    a Dagster backfill (so the whole backfill is fenced as one); else ``run-<run id>``."""
    backfill = tags.get(BACKFILL_TAG)
    kind: GenerationKind = "backfill" if backfill else "ingest"
    if tags.get(GENERATION_TAG):
        return RunGeneration(tags[GENERATION_TAG], kind, backfill)
    if backfill:
        return RunGeneration(f"backfill-{backfill}", kind, backfill)
    return RunGeneration(f"run-{run_id}", kind, None)


def stage_table(run_id: str, step: str) -> str:
    """Where one step's output waits for the writer (dropped after the write, landed or not)."""
    safe = "".join(ch if ch.isalnum() else "_" for ch in f"{run_id}_{step}")
    return f'{STAGE_SCHEMA}."stage_{safe}"'


def write_output(
    writer: Writer,
    stage: str,
    *,
    run: RunGeneration,
    run_id: str,
    partitions: Sequence[str] | None,
    mode: OutputMode | None = None,
    code_version: str | None = None,
    source_watermark: datetime | None = None,
    watermark_basis: str | None = None,
) -> WriteResult:
    """Write the rows staged in ``stage`` into the writer's dataset as ``run.generation``.

    A partitioned output replaces exactly its partitions (rows outside them are refused, not
    moved); an unpartitioned one upserts by key unless ``mode`` says otherwise. A source
    version column is taken from the rows when they have one, else left NULL.
    ``source_watermark`` (see :func:`output_watermark`) is recorded with the write. Raises
    :class:`FencedGenerationError` (nothing written) when the generation is fenced.
    """
    spec = writer.spec
    mode = mode or ("replace_partitions" if partitions else "upsert_keys")
    if mode not in ("replace_partitions", "upsert_keys", "append"):
        raise RecoveryError(
            f"write mode {mode!r} is not one of replace_partitions, upsert_keys, append; "
            f"set the asset's recovery/write_mode metadata to one of them"
        )
    if mode == "replace_partitions" and not partitions:
        raise RecoveryError(
            f"write mode replace_partitions needs a partitioned asset; {spec.target.table} "
            f"output has no partition: use upsert_keys or append"
        )
    writer.ensure()
    _prepare_stage(writer, stage, partitions)
    faults.checkpoint("output:staged")  # the stage prepared, the generation not yet registered
    writer.register_generation(
        run.generation, run.kind, run_id=run_id, backfill_id=run.backfill_id, code_version=code_version
    )
    result = writer.write(
        run.generation,
        f"SELECT * FROM {stage}",
        mode=mode,
        partitions=list(partitions) if mode == "replace_partitions" and partitions else None,
        run_id=run_id,
        note="io manager output",
        source_watermark=source_watermark,
        watermark_basis=watermark_basis,
    )
    faults.checkpoint("output:written")  # the rows landed, the stage not yet dropped
    return result


def output_watermark(reported: object, run_started: datetime | None, written: datetime) -> tuple[datetime, str]:
    """The source watermark an output applied, and how it is known.

    An asset that reads the source itself cannot say which changes it saw unless it reports
    it, so: the value the asset reported in its output metadata (``recovery/source_watermark``:
    an ISO timestamp, UTC unless it names a zone, or a POSIX timestamp) when there is one;
    else the moment its run started, because every change that had arrived by then was there
    for the asset to read. That is a lower bound: changes that arrived while the run read the
    source may be in the rows or not, and convergence verification counts them as pending
    until the target shows them, never as drift. An asset that reads something other than the
    live source (a snapshot, a lagging copy) must report what it read up to, or the changes its
    copy lacked read as drift. Without a run start (an output written outside a run) the
    moment of the write is used."""
    if reported is not None:
        return _reported(reported), f"reported by the asset ({SOURCE_WATERMARK_KEY})"
    if run_started is not None:
        return run_started, "the source when the run started"
    return written, "the source when the output was written"


def _reported(value: object) -> datetime:
    problem = None
    at: datetime | None = None
    if isinstance(value, datetime):
        at = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            at = datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            problem = "is not a POSIX timestamp in range"
    elif isinstance(value, str):
        try:
            at = datetime.fromisoformat(value.strip())
        except ValueError:
            problem = "is not an ISO timestamp"
    else:
        problem = "is neither an ISO timestamp nor a POSIX timestamp"
    if at is None:
        raise RecoveryError(
            f"output metadata {SOURCE_WATERMARK_KEY} = {str(value)[:80]!r} {problem or 'is not a timestamp'}. "
            f"Fix: report the source's ingested_at the asset read up to, e.g. "
            f"'2024-03-10T02:00:00' (UTC) or dg.MetadataValue.timestamp(...)"
        )
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo else at


def clear_superseded(writer: Writer, run: RunGeneration, run_id: str, step: str, earlier: Sequence[str | None]) -> None:
    """What the earlier attempts of a re-executed run (Dagster's parent and root runs: killed, or failed before
    their IO manager cleaned up) left of this step: each one's stage table is dropped and, when the run writes
    its own ``run-<run id>`` generation, each one's generation registered without a write is ended ``failed``
    (a generation that wrote keeps its rows and write records, as any earlier run's). One transaction."""
    prior = [r for r in dict.fromkeys(earlier) if r and r != run_id]
    if not prior:
        return
    own = run.generation == f"run-{run_id}"

    def txn() -> None:
        with writer.engine.transaction() as s:
            if s.scalar("SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", [STAGE_SCHEMA]):
                for r in prior:
                    s.drop_relation(stage_table(r, step))
            if own:
                s.execute(
                    f"UPDATE {SCHEMA}.generations SET status = 'failed', ended_at = ?, note = ? WHERE list_contains("
                    "CAST(? AS VARCHAR[]), generation) AND list_contains(CAST(? AS VARCHAR[]), run_id) AND writes = 0 "
                    "AND status = 'running' AND fenced_at IS NULL",
                    [utcnow(), f"superseded by its re-execution, run {run_id}", [f"run-{r}" for r in prior], prior],
                )
            faults.checkpoint("superseded:cleared")  # the earlier attempts' stages dropped, their generations ended

    retrying(txn)
    faults.checkpoint("superseded:committed")


def drop_stage(writer: Writer, stage: str) -> None:
    def txn() -> None:
        with writer.engine.transaction() as s:
            s.drop_relation(stage)

    retrying(txn)


def _prepare_stage(writer: Writer, stage: str, partitions: Sequence[str] | None) -> None:
    """Add a NULL source version when the rows carry none; refuse rows outside the run's partitions."""
    spec = writer.spec
    meta = spec.target.metadata
    public = str(spec.target.table_name)

    def txn() -> None:
        with writer.engine.transaction() as s:
            s.execute(f"CREATE SCHEMA IF NOT EXISTS {STAGE_SCHEMA}")
            target = dict(s.columns(spec.target.table_name.sql()))
            have = dict(s.columns(stage))
            if meta.source_version not in have:
                s.execute(f"ALTER TABLE {stage} ADD COLUMN {quote(meta.source_version)} {target[meta.source_version]}")
            part = spec.target.partition
            if partitions and part in have:
                typ = target[part]
                outside = s.fetchall(
                    f"SELECT DISTINCT CAST(CAST({quote(part)} AS {typ}) AS VARCHAR) FROM {stage} "
                    f"WHERE CAST({quote(part)} AS {typ}) IS NULL OR CAST({quote(part)} AS {typ}) NOT IN "
                    f"(SELECT CAST(u AS {typ}) FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS u)) ORDER BY 1 LIMIT 5",
                    [list(partitions)],
                )
                if outside:
                    raise RecoveryError(
                        f"output rows for {public} fall outside the run's partitions {list(partitions)[:5]} "
                        f"({part} = {[r[0] for r in outside]}); a partitioned asset may only write its own "
                        f"partitions: filter the frame on {part}"
                    )

    retrying(txn)


__all__ = [
    "RunGeneration",
    "generation_for_run",
    "stage_table",
    "write_output",
    "output_watermark",
    "drop_stage",
    "clear_superseded",
    "STAGE_SCHEMA",
    "SOURCE_WATERMARK_KEY",
]
