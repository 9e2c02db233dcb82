"""A draft incident opened from a failed backfill. Dagster-free.

When a backfill that writes a managed dataset fails, is canceled or has failed runs,
the on-call person's first step is containment. This module writes the incident file
that step needs (the backfill as ``dagster_backfill``, every generation its rows may carry,
its partition range, ``approved_by`` left empty for a person to fill in), starts the incident's timeline, and builds the
``contain_backfill`` run config and launchpad link, so the alert leads to containment
in one click. Opening is idempotent per backfill: the timeline event is the record,
and an existing file is never overwritten (a person may have edited it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from urllib.parse import quote as url_quote

import yaml

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, ensure_control_plane
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.base import Engine
from recovery.lib.incident.phases import CONTAIN, incident_tags
from recovery.lib.retry import retrying

DRAFT_KIND = "incident_drafted"
DRAFTS_DIR = "incidents"


@dataclass(frozen=True)
class FailedBackfill:
    """A backfill of a managed dataset that needs containment, as the sensor saw it."""

    backfill_id: str
    status: str  # the backfill's status (COMPLETED_FAILED, CANCELED, ...)
    generations: tuple[str, ...]  # what its rows may carry: its runs' ids, a load id, backfill-<id>
    partition_keys: tuple[str, ...]
    failed_runs: tuple[str, ...]

    @property
    def generation(self) -> str:
        """How the backfill is named in a sentence: its one generation, else its id."""
        return self.generations[0] if len(self.generations) == 1 else f"backfill {self.backfill_id}"

    @property
    def reason(self) -> str:
        runs = f"{len(self.failed_runs)} failed run(s)" if self.failed_runs else "no failed run"
        return f"Dagster backfill {self.backfill_id} is {self.status} with {runs}"


@dataclass(frozen=True)
class Draft:
    incident_id: str
    path: Path
    newly_opened: bool
    partitions: tuple[date, date] | None


def draft_incident_id(backfill_id: str) -> str:
    return "INC-DRAFT-" + "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in backfill_id)


def draft_path(spec: DatasetSpec, incident_id: str) -> Path:
    """Beside the warehouse, with the evidence and reports: ``incidents/<id>.yaml``."""
    return Path(spec.warehouse.path).parent / DRAFTS_DIR / f"{incident_id}.yaml"


def partition_range(keys: tuple[str, ...] | list[str]) -> tuple[date, date] | None:
    """First and last partition when every key is a date (the incident's range is in days)."""
    try:
        days = sorted(date.fromisoformat(k) for k in keys)
    except (TypeError, ValueError):
        return None
    return (days[0], days[-1]) if days else None


def launchpad_url(
    ui: str, location: str, incident_file: str | Path, job: str = CONTAIN.job, tags: dict[str, str] | None = None
) -> str:
    """A job's launchpad with the incident chosen: the run tag ``recovery/incident`` (``INCIDENT_TAG``)
    set to the incident file (Dagster's ``?tags[0][key]=...&tags[0][value]=...`` parameters), no config
    to type. ``job`` is ``contain_backfill`` (the draft incident's link), ``contain_backfill__<dataset>``
    for a further dataset, or any later phase's job (the links a phase's run logs); ``tags`` are further
    run tags the launch needs (a partition range: the whole target, or a repair wave's)."""
    query = "&".join(
        f"tags[{i}][key]={url_quote(k, safe='')}&tags[{i}][value]={url_quote(v, safe='')}"
        for i, (k, v) in enumerate({**incident_tags(str(incident_file)), **(tags or {})}.items())
    )
    return f"{ui.rstrip('/')}/locations/__repository__@{location}/jobs/{job}/playground/setup?{query}"


def incident_document(spec_path: Path, path: Path, failed: FailedBackfill, *, requested_by: str) -> dict:
    span = partition_range(failed.partition_keys)
    doc = {
        "incident_id": draft_incident_id(failed.backfill_id),
        "spec": os.path.relpath(Path(spec_path).resolve(), path.parent.resolve()),
        "dagster_backfill": failed.backfill_id,
        "failed_generations": list(failed.generations),
        "partitions": {"start": span[0], "end": span[1]} if span else None,
        "requested_by": requested_by,
        "approved_by": [],
        "notes": f"Draft opened automatically: {failed.reason}. Review the range, add approved_by, then contain.",
    }
    return {k: v for k, v in doc.items() if v is not None}


def open_draft(
    engine: Engine,
    spec_path: Path,
    spec: DatasetSpec,
    failed: FailedBackfill,
    *,
    requested_by: str,
    actor: str = "backfill_incident_sensor",
) -> Draft:
    """Write the draft incident file (unless it exists) and start its timeline, once per backfill."""
    incident_id = draft_incident_id(failed.backfill_id)
    path = draft_path(spec, incident_id)
    span = partition_range(failed.partition_keys)

    def txn() -> bool:
        with engine.transaction() as s:
            ensure_control_plane(s)
            if s.scalar(
                f"SELECT count(*) FROM {SCHEMA}.timeline WHERE kind = ? AND incident_id = ?", [DRAFT_KIND, incident_id]
            ):
                return False
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                text = (
                    f"# Draft incident opened when {failed.reason}.\n"
                    f"# Review it, add approved_by, then: recovery contain --incident {path}\n"
                    + yaml.safe_dump(
                        incident_document(spec_path, path, failed, requested_by=requested_by), sort_keys=False
                    )
                )
                tmp = path.with_suffix(".yaml.tmp")
                tmp.write_text(text)
                tmp.replace(path)
                faults.checkpoint("draft:written")  # the file in place, its timeline event not committed
            EventSource(dataset=spec.dataset, incident_id=incident_id, actor=actor).record(
                s,
                DRAFT_KIND,
                f"draft incident {incident_id} opened: {failed.reason}; generation {failed.generation}"
                + (f", partitions {span[0]}..{span[1]}" if span else ""),
                json.dumps(
                    {
                        "backfill_id": failed.backfill_id,
                        "generation": failed.generation,
                        "generations": list(failed.generations),
                        "status": failed.status,
                        "failed_runs": list(failed.failed_runs),
                        "incident_file": str(path),
                    },
                    default=str,
                ),
            )
            faults.checkpoint("draft:recorded")  # the event written, not committed
            return True

    newly = retrying(txn)
    faults.checkpoint("draft:committed")
    return Draft(incident_id, path, newly, span)


__all__ = [
    "FailedBackfill",
    "Draft",
    "draft_incident_id",
    "draft_path",
    "partition_range",
    "launchpad_url",
    "incident_document",
    "open_draft",
    "DRAFT_KIND",
]
