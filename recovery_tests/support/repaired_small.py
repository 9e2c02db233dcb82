"""The small dataset taken through an incident up to a published repair, for restatement and
convergence tests.

Ingestion writes the target; two consumers are published from it (a report keyed by
shard, an experiment keyed by region); a backfill ``bf-7`` damages the target
(tripled quantities, duplicated and deleted orders) and the consumers are
refreshed from the damage; the backfill is fenced; a repair generation rebuilds
the target from the source into its own namespace, and the pointer moves to it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import yaml

from recovery.lib.catalog_checks import load_spec
from recovery.lib.consumers.sql import materialize_consumer
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.pointers.namespaces import move_pointer
from recovery.lib.snapshot import expected_rows_sql
from recovery.lib.write.ingest import apply_changes
from recovery.lib.write.writer import Writer
from recovery_tests.support.rows import present
from recovery_tests.support.small_dataset import build_small_dataset, spec_dict, write_spec

INCIDENT = "INC-small"
FAILED = "bf-7"
REPAIR = "repair-1"
REGION_UNITS_SQL = """\
SELECT region, sum(qty) AS units, count(*) AS orders
FROM {{ target }}
GROUP BY region
"""


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class Repaired:
    spec_path: Path
    incident_path: Path
    spec: DatasetSpec
    writer: Writer
    published_before: dict[str, list[tuple]]  # consumer -> rows of its output before the repair

    @property
    def engine(self):
        return self.writer.engine

    def fetch(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.engine.session(read_only=True) as s:
            return s.fetchall(sql, params or [])


def build_damaged(root: Path, *, misfiled: bool = False) -> Repaired:
    """Ingested, consumers published, damaged by ``bf-7`` and consumers refreshed from the damage; fenced.
    ``misfiled``: the backfill also wrote copies of some west orders into the next month's shard."""
    spec_path = build_small_dataset(root, n_orders=160)
    (root / "region_units.sql").write_text(REGION_UNITS_SQL)
    data = spec_dict()
    data["downstream"][0]["decisions"] = [
        {"name": "shard order report sent to ops", "remediation": "re-issue the report"}
    ]
    data["downstream"].append(
        {
            "name": "region_units",
            "kind": "experiment",
            "owner": "growth",
            "sql": "region_units.sql",
            "key": ["region"],
            "materiality": {"column": "units", "rel": 0.01},
            "decisions": [
                {"name": "regional stock rebalanced", "remediation": "re-plan the rebalance"},
                {"name": "growth readout shared", "remediation": "correct the readout"},
            ],
        }
    )
    write_spec(root, data)
    incident = root / "incident.yaml"
    incident.write_text(
        yaml.safe_dump(
            {
                "incident_id": INCIDENT,
                "spec": "spec.yaml",
                "failed_generations": [FAILED],
                "requested_by": "data-platform-oncall",
                "approved_by": ["head-of-data"],
            }
        )
    )
    spec = load_spec(spec_path)
    writer = Writer(open_engine(spec.warehouse), spec, actor="test")
    writer.ensure()
    writer.register_generation("ingest-1", "ingest")
    apply_changes(writer, "ingest-1", until=now())
    for c in spec.downstream:
        materialize_consumer(writer.engine, spec, c)
    writer.register_generation(FAILED, "backfill")
    e = expected_rows_sql(spec, None)
    writer.write(FAILED, f"SELECT * REPLACE (qty * 3 AS qty) FROM ({e}) WHERE region = 'north'", mode="upsert_keys")
    writer.write(
        FAILED,
        f"SELECT * FROM ({e}) WHERE region = 'south' AND order_no % 4 = 0",
        mode="append",
        allow_duplicate_keys=True,
    )  # the faulty backfill appended rows the table held
    writer.write(
        FAILED,
        f"SELECT region, order_no, src_rev FROM ({e}) WHERE region = 'east' AND order_no % 3 = 0",
        mode="delete_keys",
    )
    if misfiled:
        writer.write(
            FAILED,
            f"SELECT * REPLACE (region || '-' || strftime(placed_at + INTERVAL 31 DAY, '%Y%m') AS shard) FROM ({e}) "
            f"WHERE region = 'west' AND order_no % 5 = 0 AND placed_at < TIMESTAMP '2026-03-01'",
            mode="append",
            allow_duplicate_keys=True,
        )
    for c in spec.downstream:
        materialize_consumer(writer.engine, spec, c)
    with writer.engine.session(read_only=True) as s:
        before = {c.name: sorted(s.fetchall(f"SELECT * FROM consumers.{c.name}"), key=repr) for c in spec.downstream}
    writer.fence(FAILED, incident_id=INCIDENT, fenced_by="test")
    return Repaired(spec_path, incident, spec, writer, before)


def publish_repair(r: Repaired) -> str:
    """Rebuild the target from the source into the repair's own namespace and move the pointer to it."""
    ns = present(r.writer.register_generation(REPAIR, "repair", own_namespace=True, source_watermark=now()))
    r.writer.write(REPAIR, expected_rows_sql(r.spec, None), mode="replace_partitions")
    with r.engine.transaction() as s:
        move_pointer(s, r.spec, ns, actor="test", reason=f"publish repair of {INCIDENT}")
    return ns


def build_repaired(root: Path) -> Repaired:
    r = build_damaged(root)
    publish_repair(r)
    return r


class Receiver:
    """A local HTTP endpoint that records every JSON POST (the webhook channel's far end)."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
