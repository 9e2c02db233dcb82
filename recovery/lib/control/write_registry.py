"""Which runs wrote the target, when, and reading what: one relation from every source we have.

A target the package manages carries that history in the control plane
(``_recovery.generations``, every write in the write log). A target that another
tool wrote has only what that tool recorded: the team's own run registry named by
the spec's ``registry`` section, and the generation / written-at columns on its
rows. ``generations_sql`` gives one relation over both, so the reconciliation and
the timeline read the same facts whichever way the target was written.
"""

from __future__ import annotations

from recovery.lib.control.plane import SCHEMA, control_plane_exists
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote, str_list, string_literal

COLUMNS = "generation, kind, started_at, ended_at, source_watermark, basis"
"""The relation's columns; ``kind`` is 'backfill', 'ingest', 'repair', 'adopted' or 'unknown', and
``basis`` says where the row comes from ('control_plane' or 'registry <table>')."""


def registry_sql(spec: DatasetSpec) -> str | None:
    """The spec's registry as the common relation, or None when the spec names none."""
    reg = spec.registry
    if reg is None:
        return None
    col = lambda name, cast: f"CAST({quote(name)} AS {cast})" if name else f"CAST(NULL AS {cast})"  # noqa: E731
    kind = (
        f"CASE WHEN CAST({quote(reg.kind)} AS VARCHAR) IN ({str_list(reg.backfill_kinds)}) THEN 'backfill' "
        "ELSE 'ingest' END"
        if reg.kind
        else "'unknown'"
    )
    basis = string_literal(f"registry {reg.table}")
    return (
        f"SELECT CAST({quote(reg.generation)} AS VARCHAR) AS generation, {kind} AS kind, "
        f"{col(reg.started_at, 'TIMESTAMP')} AS started_at, {col(reg.ended_at, 'TIMESTAMP')} AS ended_at, "
        f"{col(reg.source_watermark, 'TIMESTAMP')} AS source_watermark, {basis} AS basis "
        f"FROM {reg.table_name.sql()} WHERE {quote(reg.generation)} IS NOT NULL"
    )


def generations_sql(s: Session, spec: DatasetSpec) -> str:
    """Every generation known for the dataset: the control plane's rows first, then the registry's
    rows for generations the control plane does not know (or knows only as inferred)."""
    parts = []
    if control_plane_exists(s):
        # rows copied from the team's registry at adoption keep saying so
        parts.append(
            f"SELECT generation, kind, started_at, ended_at, source_watermark, CASE WHEN note LIKE 'from registry %' "
            f"THEN substr(note, 6) || ' (copied at adoption)' ELSE 'control_plane' END AS basis, "
            f"inferred FROM {SCHEMA}.generations WHERE dataset = '{spec.dataset}'"
        )
    reg = registry_sql(spec)
    if reg:
        parts.append(f"SELECT *, false AS inferred FROM ({reg})")
    if not parts:
        return (
            "SELECT CAST(NULL AS VARCHAR) AS generation, CAST(NULL AS VARCHAR) AS kind, "
            "CAST(NULL AS TIMESTAMP) AS started_at, "
            "CAST(NULL AS TIMESTAMP) AS ended_at, CAST(NULL AS TIMESTAMP) AS source_watermark, "
            "CAST(NULL AS VARCHAR) AS basis WHERE false"
        )
    # a registry row beats a control-plane row the fence or the adoption only inferred (and the live
    # registry row its copy, so the basis a reader sees does not vary from run to run)
    return (
        f"SELECT {COLUMNS} FROM ({' UNION ALL '.join(parts)}) "
        "QUALIFY row_number() OVER (PARTITION BY generation ORDER BY inferred, basis LIKE 'registry %' DESC, "
        "basis) = 1"
    )


def registered_generations(s: Session, spec: DatasetSpec) -> dict[str, str]:
    """Generation id -> kind, from every source."""
    return dict(s.fetchall(f"SELECT generation, kind FROM ({generations_sql(s, spec)})"))


def backfill_generations(s: Session, spec: DatasetSpec, backfill_id: str) -> list[str]:
    """Generations the warehouse records as written by Dagster backfill ``backfill_id``: the control
    plane's (``generations.backfill_id``) and the team's registry's, when it maps a backfill column."""
    parts = []
    if control_plane_exists(s):
        parts.append(f"SELECT generation FROM {SCHEMA}.generations WHERE dataset = ? AND backfill_id = ?")
    params: list = [spec.dataset, backfill_id] if parts else []
    reg = spec.registry
    if reg is not None and reg.backfill_id and s.columns(reg.table_name.sql()):
        parts.append(
            f"SELECT CAST({quote(reg.generation)} AS VARCHAR) FROM {reg.table_name.sql()} "
            f"WHERE CAST({quote(reg.backfill_id)} AS VARCHAR) = ? AND {quote(reg.generation)} IS NOT NULL"
        )
        params.append(backfill_id)
    if not parts:
        return []
    return [r[0] for r in s.fetchall(f"SELECT DISTINCT * FROM ({' UNION '.join(parts)}) ORDER BY 1", params)]
