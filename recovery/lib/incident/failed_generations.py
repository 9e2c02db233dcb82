"""What the warehouse knows about an incident's failed generations.

Evidence and the timeline both start here. A failed generation is usually
registered (kind, start, the source watermark it read, code version, the spec
fingerprint it ran with, the backfill that produced it), but it may have been
written by another tool and known only by its rows in the target: then its start
is inferred from its first write, as the damage vocabulary does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.lib.control.plane import SCHEMA, control_plane_exists
from recovery.lib.control.write_registry import generations_sql
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Session
from recovery.lib.identifiers import quote


@dataclass(frozen=True)
class GenerationFacts:
    generation: str
    registered: bool
    kind: str | None = None
    status: str | None = None
    namespace: str | None = None
    started_at: datetime | None = None
    source_watermark: datetime | None = None
    first_write_at: datetime | None = None
    backfill_id: str | None = None
    code_version: str | None = None
    config_hash: str | None = None
    registered_seq: int | None = None
    registered_by: str | None = None
    note: str | None = None

    @property
    def snapshot_watermark(self) -> tuple[datetime | None, str]:
        """The source version the generation read: its registered watermark, else its start, else its first write."""
        for value, basis in (
            (self.source_watermark, "source_watermark"),
            (self.started_at, "started_at"),
            (self.first_write_at, "first write"),
        ):
            if value is not None:
                return value, basis
        return None, "unknown"


def generation_facts(s: Session, spec: DatasetSpec, generations: list[str]) -> list[GenerationFacts]:
    """Facts for each generation, in the order given (a generation with no registry row is ``registered=False``)."""
    gen = quote(spec.target.metadata.generation)
    written = quote(spec.target.metadata.written_at)
    first_in_target = dict(
        s.fetchall(
            f"SELECT {gen}, min({written}) FROM {spec.target.table_name.sql()} "
            f"WHERE {gen} IN (SELECT unnest(CAST(? AS VARCHAR[]))) GROUP BY 1",
            [generations],
        )
    )
    if not control_plane_exists(s):  # a target not contained yet: the team's registry, if any, has the facts
        reg = {
            r[0]: r
            for r in s.fetchall(
                f"SELECT generation, kind, started_at, source_watermark, basis FROM ({generations_sql(s, spec)}) "
                f"WHERE generation IN (SELECT unnest(CAST(? AS VARCHAR[])))",
                [generations],
            )
        }
        return [
            GenerationFacts(
                g,
                False,
                kind=reg[g][1],
                started_at=reg[g][2],
                source_watermark=reg[g][3],
                first_write_at=first_in_target.get(g),
                note=f"from {reg[g][4]}",
            )
            if g in reg
            else GenerationFacts(g, False, first_write_at=first_in_target.get(g))
            for g in generations
        ]
    rows = {
        r[0]: r
        for r in s.fetchall(
            f"SELECT g.generation, g.kind, g.status, g.namespace, g.started_at, g.source_watermark, "
            f"(SELECT min(w.written_at) FROM {SCHEMA}.writes w WHERE w.generation = g.generation), g.backfill_id, "
            f"g.code_version, g.config_hash, g.registered_seq, "
            f"(SELECT arg_min(t.actor, t.event_id) FROM {SCHEMA}.timeline t WHERE t.kind = 'generation_registered' "
            f" AND t.summary LIKE '% generation ' || g.generation || ' registered%'), g.note "
            f"FROM {SCHEMA}.generations g WHERE g.dataset = ? "
            "AND g.generation IN (SELECT unnest(CAST(? AS VARCHAR[])))",
            [spec.dataset, generations],
        )
    }
    out = []
    for g in generations:
        r = rows.get(g)
        if r is None:
            out.append(GenerationFacts(g, False, first_write_at=first_in_target.get(g)))
        else:
            out.append(
                GenerationFacts(
                    g,
                    True,
                    r[1],
                    r[2],
                    r[3],
                    r[4],
                    r[5],
                    r[6] or first_in_target.get(g),
                    r[7],
                    r[8],
                    r[9],
                    r[10],
                    r[11],
                    r[12],
                )
            )
    return out
