"""The incident file: what failed, who asked, who approved, and which spec it concerns.

Like the spec, it is validated in two stages before anything writes: its shape
(pydantic) and its meaning against the control plane and the target (through a
read-only session): every failed generation must be known (registered, or present
in the target's generation column, as when another tool wrote it) and be a
backfill, and the partition range must overlap the data.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recovery.lib.control_plane import SCHEMA, control_plane_exists
from recovery.lib.engine import open_engine
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import check_identifier, quote
from recovery.lib.spec import DatasetSpec, _shape_error, load_spec, load_yaml_model, resolve_path


class PartitionRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    start: date = Field(description="First partition of the range (YYYY-MM-DD).")
    end: date = Field(description="Last partition of the range, inclusive.")

    @model_validator(mode="after")
    def _ordered(self):
        if self.end < self.start:
            raise ValueError("end is before start")
        return self


class Incident(BaseModel):
    """An incident file, with ``spec`` resolved relative to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    incident_id: str = Field(min_length=1, max_length=100, description="Incident id, e.g. INC-2024-031.")
    spec: Path = Field(description="Dataset spec, relative to the incident file.")
    failed_generations: list[str] = Field(min_length=1, description="Generations to fence and repair.")
    partitions: PartitionRange | None = Field(None, description="Nominal range; inferred from the writes if absent.")
    requested_by: str = Field(min_length=1, description="Who asked for the recovery.")
    approved_by: list[str] = Field(default_factory=list, description="Who approved it.")
    notes: str = ""
    evidence_root: Path | None = Field(None, description="Where evidence bundles go (default: evidence/ beside the warehouse).")
    incident_path: Path | None = Field(None, exclude=True)

    @field_validator("incident_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not all(ch.isalnum() or ch in "-_." for ch in v) or v.startswith("."):
            raise ValueError("use letters, digits, '-', '_' and '.' only (it names folders)")
        return v

    @field_validator("failed_generations")
    @classmethod
    def _gens(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists a generation twice")
        for g in v:
            if not g or len(g) > 200:
                raise ValueError(f"{g!r} is not a generation id")
        return v

    def load_spec(self, *, check_warehouse: bool = True) -> DatasetSpec:
        return load_spec(self.spec, check_warehouse=check_warehouse)

    def evidence_dir(self, spec: DatasetSpec) -> Path:
        root = self.evidence_root or spec.warehouse.path.parent / "evidence"
        return Path(root) / self.incident_id

    def reports_dir(self, spec: DatasetSpec) -> Path:
        return spec.warehouse.path.parent / "reports" / self.incident_id


def parse_incident(path: str | Path) -> Incident:
    path = Path(path)
    inc = load_yaml_model(path, Incident, what="incident", example="sample_data/transactions/incident.yaml")
    base = resolve_path(Path.cwd(), path, "incident", source=str(path)).parent
    spec = resolve_path(base, inc.spec, "spec", source=str(path))
    evidence = resolve_path(base, inc.evidence_root, "evidence_root", source=str(path)) if inc.evidence_root else None
    from recovery.lib.evidence.root import check_evidence_root  # here: the evidence package imports this module

    check_evidence_root(evidence, source=str(path))
    return inc.model_copy(update={"spec": spec, "evidence_root": evidence, "incident_path": path.resolve()})


def incident_from_mapping(raw: dict, *, base_dir: Path) -> Incident:
    """The same validation for an incident given as run config (paths relative to ``base_dir``)."""
    try:
        inc = Incident.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as e:
        raise _shape_error(e, "run config") from None
    spec = resolve_path(base_dir, inc.spec, "spec", source="run config")
    evidence = resolve_path(base_dir, inc.evidence_root, "evidence_root", source="run config") if inc.evidence_root else None
    from recovery.lib.evidence.root import check_evidence_root

    check_evidence_root(evidence, source="run config")
    return inc.model_copy(update={"spec": spec, "evidence_root": evidence})


def check_incident(inc: Incident) -> DatasetSpec:
    """Meaning checks against the warehouse (read-only). Returns the validated spec."""
    src = str(inc.incident_path) if inc.incident_path else None
    spec = inc.load_spec()

    def fail(field: str, problem: str, fix: str):
        raise SpecError(field, problem, fix, source=src)

    engine = open_engine(spec.warehouse)
    gen_col = quote(check_identifier(spec.target.metadata.generation, "column"))
    part = quote(spec.target.partition)
    with engine.session(read_only=True) as s:
        target_cols = dict(s.columns(spec.target.table_name.sql()))
        if not target_cols:
            fail("spec", f"target {spec.target.table} does not exist yet", "point the incident at a dataset whose target has data")
        registered = {}
        if control_plane_exists(s):
            registered = {r[0]: r[1] for r in s.fetchall(
                f"SELECT generation, kind FROM {SCHEMA}.generations WHERE dataset = ?", [spec.dataset])}
        in_target = set()
        if spec.target.metadata.generation in target_cols:
            in_target = {r[0] for r in s.fetchall(f"SELECT DISTINCT {gen_col} FROM {spec.target.table_name.sql()} WHERE {gen_col} IS NOT NULL")}
        for i, g in enumerate(inc.failed_generations):
            if g not in registered and g not in in_target:
                known = sorted(set(registered) | in_target)
                fail(f"failed_generations[{i}]", f"generation {g!r} is unknown to dataset {spec.dataset!r} (known: {', '.join(known[:8]) or 'none'})",
                     "name a generation that wrote the target")
            if registered.get(g) not in (None, "backfill", "unknown"):
                fail(f"failed_generations[{i}]", f"generation {g!r} is an {registered[g]} generation, not a backfill",
                     "fence only the failed backfill's generation; normal ingestion must keep running")
        if inc.partitions:
            lo, hi = s.fetchone(f"SELECT min({part}), max({part}) FROM {spec.target.table_name.sql()}")
            if lo is None or inc.partitions.end < _as_date(lo) or inc.partitions.start > _as_date(hi):
                fail("partitions", f"range {inc.partitions.start}..{inc.partitions.end} is outside the data ({lo}..{hi})",
                     "give a range that overlaps the target's partitions, or omit it to infer it from the writes")
    return spec


def _as_date(v) -> date:
    try:
        return v if isinstance(v, date) else date.fromisoformat(str(v)[:10])
    except ValueError:
        raise SpecError("partitions", f"the partition column holds {v!r}, not dates", "omit partitions to infer the range "
                        "from the writes") from None
