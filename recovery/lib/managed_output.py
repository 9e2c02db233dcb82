"""A user's asset output written into a managed dataset. Dagster-free.

A platform team's own assets return frames; the IO manager (``recovery/defs/io/``)
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
from typing import Literal

from recovery.lib.errors import RecoveryError
from recovery.lib.fencing import GENERATION_TAG
from recovery.lib.identifiers import quote
from recovery.lib.writer import GenerationKind, Writer, WriteResult, retrying

BACKFILL_TAG = "dagster/backfill"
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
) -> WriteResult:
    """Write the rows staged in ``stage`` into the writer's dataset as ``run.generation``.

    A partitioned output replaces exactly its partitions (rows outside them are refused, not
    moved); an unpartitioned one upserts by key unless ``mode`` says otherwise. A source
    version column is taken from the rows when they have one, else left NULL. Raises
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
    writer.register_generation(
        run.generation, run.kind, run_id=run_id, backfill_id=run.backfill_id, code_version=code_version
    )
    return writer.write(
        run.generation,
        f"SELECT * FROM {stage}",
        mode=mode,
        partitions=list(partitions) if mode == "replace_partitions" and partitions else None,
        run_id=run_id,
        note="io manager output",
    )


def drop_stage(writer: Writer, stage: str) -> None:
    def txn() -> None:
        with writer.engine.transaction() as s:
            s.execute(f"DROP TABLE IF EXISTS {stage}")

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


__all__ = ["RunGeneration", "generation_for_run", "stage_table", "write_output", "drop_stage", "STAGE_SCHEMA"]
