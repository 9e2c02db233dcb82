"""A kill -9 matrix: each phase runs in a child process that is SIGKILLed at a random moment
of its work, then the state is checked and the same step is rerun in process.

Phases (the small orders dataset, composite key, string partitions): ``adopt`` (a plain
target table adopted behind a managed view), ``fence`` (a running backfill fenced),
``evidence`` (the evidence bundle), ``wave`` (one repair wave), ``publish`` (gate-checked
publish that replays ingestion's late writes) and ``restate`` (consumers restated).

After each kill: the public view serves the old or the new result whole (its rows equal
the state before or after an uninterrupted run), the control plane is consistent (the
view reads the namespace the pointer names; no write past the commit clock), and a rerun
converges to the uninterrupted run's result. The suite runs a few points per phase;
``python -m bench kill`` runs 20+.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
PHASES = ["adopt", "fence", "evidence", "wave", "publish", "restate"]


# ---- the state each phase starts from ------------------------------------------------------


def build_templates(base: Path) -> dict[str, Path]:
    """One folder per phase, in the state just before the phase runs."""
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.incident import parse_incident
    from recovery.lib.ingest import apply_changes
    from recovery.lib.repair.publish import gate_candidate
    from recovery.lib.snapshot import expected_rows_sql
    from recovery.lib.writer import Writer
    from recovery_tests.input_fuzz import build_fuzz_dataset
    from recovery_tests.repair_support import current_plan, repair_through_library
    from recovery_tests.repaired_small import INCIDENT, build_damaged, now

    out = {}
    out["adopt"] = build_fuzz_dataset(base / "adopt")  # mart.orders is a plain table
    damaged = build_damaged(base / "damaged")  # ingested, damaged by bf-7, fenced
    w = damaged.writer
    w.register_generation("bf-8", "backfill")  # a second backfill, still running
    w.write(
        "bf-8",
        f"SELECT * REPLACE (qty + 1 AS qty) FROM ({expected_rows_sql(damaged.spec, None)}) "
        f"WHERE region = 'west' AND order_no % 5 = 0",
        mode="upsert_keys",
    )
    shutil.copytree(base / "damaged", base / "fence")
    out["fence"] = base / "fence"
    shutil.copytree(base / "damaged", base / "evidence")
    out["evidence"] = base / "evidence"
    plan = repair_through_library(damaged.spec, parse_incident(damaged.incident_path), wave_size=4, waves=1)
    shutil.copytree(base / "damaged", base / "wave")  # canary built, wave 1 next
    out["wave"] = base / "wave"
    spec = load_spec(damaged.spec_path)
    writer = Writer(open_engine(spec.warehouse), spec)
    from recovery.lib.repair.build import build_wave
    from recovery.lib.repair.waves import gate_wave

    for n in sorted(plan.waves)[1:]:
        build_wave(writer, current_plan(spec, INCIDENT), n)
        gate_wave(writer, INCIDENT, n)
    gate_candidate(writer, current_plan(spec, INCIDENT))
    # ingestion keeps writing after the candidate was gated: publish must replay these
    with writer.engine.transaction() as s:
        s.execute(
            "INSERT INTO src.order_events SELECT * REPLACE (rev + 100 AS rev, qty + 7 AS qty, now()::TIMESTAMP AS "
            "loaded_at) FROM src.order_events WHERE change = 'put' QUALIFY row_number() OVER (PARTITION BY region, "
            "order_no ORDER BY rev DESC) = 1 AND order_no % 9 = 0"
        )
    writer.register_generation("ingest-2", "ingest")
    apply_changes(writer, "ingest-2", until=now())
    shutil.copytree(base / "damaged", base / "publish")
    out["publish"] = base / "publish"
    from recovery.lib.repair.publish import publish

    publish(writer, INCIDENT)
    out["restate"] = base / "damaged"  # published: consumers next
    return out


# ---- the phases, as a child process runs them --------------------------------------------


def run_phase(phase: str, d: Path) -> None:
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.engine import open_engine
    from recovery.lib.writer import Writer

    spec = load_spec(d / "spec.yaml")
    writer = Writer(open_engine(spec.warehouse), spec, actor="kill-matrix")
    if phase == "adopt":
        writer.ensure()
    elif phase == "fence":
        writer.fence("bf-8", incident_id="INC-small", fenced_by="kill-matrix")
    elif phase == "evidence":
        from recovery.lib.evidence import build_evidence
        from recovery.lib.incident import check_incident, parse_incident
        from recovery.lib.run_history import RunHistory

        incident = parse_incident(d / "incident.yaml")
        build_evidence(incident, check_incident(incident), writer.engine, RunHistory("none"), actor="kill-matrix")
    elif phase == "wave":
        from recovery.lib.repair.build import build_wave
        from recovery_tests.repair_support import current_plan

        build_wave(writer, current_plan(spec, "INC-small"), 1)  # the template has the canary (wave 0) built
    elif phase == "publish":
        from recovery.lib.repair.publish import publish

        publish(writer, "INC-small")
    elif phase == "restate":
        from recovery.lib.restatement.restate import restate_consumers

        restate_consumers(writer.engine, spec, "INC-small", failed_generations=["bf-7"])
    else:
        raise ValueError(phase)


# ---- what is checked -----------------------------------------------------------------------


def _con(d: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(d / "wh.duckdb"), read_only=True)


def observe(phase: str, d: Path) -> dict:
    """The phase's outcome, independent of wall-clock stamps: what must equal the uninterrupted run."""
    con = _con(d)
    try:

        def digest(sql: str) -> str:
            rows = sorted(con.execute(sql).fetchall(), key=repr)
            return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]

        public = digest("SELECT * EXCLUDE (landed_at) FROM mart.orders")
        state = {"public": public}
        cp = con.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = '_recovery'").fetchone()[
            0
        ]
        if cp:
            state["pointer"] = con.execute("SELECT namespace FROM _recovery.pointers").fetchall()
            state["fenced"] = con.execute(
                "SELECT generation, token FROM _recovery.generations WHERE fenced_at IS NOT NULL ORDER BY 1"
            ).fetchall()
            state["fences"] = con.execute("SELECT generation, token FROM _recovery.fences ORDER BY 1, 2").fetchall()
        if phase == "wave" or phase == "publish":
            state["plan"] = con.execute("SELECT status FROM _recovery.repair_plans").fetchall()
            ns = con.execute("SELECT namespace FROM _recovery.repair_plans").fetchone()[0]
            state["repair_rows"] = digest(f"SELECT * EXCLUDE (landed_at) FROM {ns}")
        if phase == "evidence":
            state["evidence_events"] = con.execute(
                "SELECT count(*) FROM _recovery.timeline WHERE kind = 'evidence_preserved'"
            ).fetchone()[0]
        if phase == "restate":
            state["consumers"] = {
                name: digest(f"SELECT * FROM consumers.{name}")
                for (name,) in con.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'consumers' "
                    "AND table_type = 'VIEW' "
                    "ORDER BY 1"
                ).fetchall()
            }
    finally:
        con.close()
    if phase == "evidence":
        bundle = d / "evidence" / "INC-small"
        state["bundle"] = (
            sorted(
                (f["path"], f["rows"])
                for f in json.loads((bundle / "manifest.json").read_text())["files"]
                if f["path"].endswith(".parquet")
            )
            if (bundle / "manifest.json").exists()
            else None
        )
    return state


def consistency_problems(phase: str, d: Path) -> list[str]:
    """The control plane agrees with the catalog, and no half-built thing is visible."""
    problems = []
    con = _con(d)
    try:
        if con.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = '_recovery'").fetchone()[
            0
        ]:
            view = con.execute(
                "SELECT sql FROM duckdb_views() WHERE schema_name = 'mart' AND view_name = 'orders'"
            ).fetchall()
            pointer = con.execute("SELECT namespace FROM _recovery.pointers").fetchall()
            if view and pointer and pointer[0][0].split(".")[-1] not in view[0][0]:
                problems.append(f"view reads other than pointer {pointer[0][0]}")
            if not view and pointer:
                problems.append("pointer without a managed view")
            clock = con.execute("SELECT seq FROM _recovery.clock").fetchone()[0]
            late = con.execute("SELECT count(*) FROM _recovery.writes WHERE seq > ?", [clock]).fetchone()[0]
            if late:
                problems.append(f"{late} writes past the commit clock")
            fenced_without = con.execute(
                "SELECT count(*) FROM _recovery.generations g WHERE fenced_at IS NOT NULL AND NOT "
                "EXISTS (SELECT 1 FROM _recovery.fences f WHERE f.generation = g.generation)"
            ).fetchone()[0]
            if fenced_without:
                problems.append("a generation fenced without its fence record")
    finally:
        con.close()
    if phase == "evidence":
        bundle = d / "evidence" / "INC-small"
        if bundle.exists():
            from recovery.lib.evidence import verify_bundle

            v = verify_bundle(bundle)
            if not v.ok:
                problems.append(f"bundle does not verify: {v.problems[:2]}")
    return problems


# ---- one trial -----------------------------------------------------------------------------


@dataclass
class Trial:
    phase: str
    delay_s: float
    killed: bool
    left: str = (
        ""  # what the kill left: "old" (as before), "new" (as after) or "between" (e.g. half a bundle cleaned up later)
    )
    problems: list[str] = field(default_factory=list)


def child(phase: str, d: Path, ready: Path) -> None:
    # import everything first: the kill must land in the phase's work, not in Python's start-up
    import recovery.lib.evidence  # noqa: F401
    import recovery.lib.repair.build  # noqa: F401
    import recovery.lib.repair.publish  # noqa: F401
    import recovery.lib.restatement.restate  # noqa: F401
    import recovery_tests.repair_support  # noqa: F401

    ready.write_text("ready")
    run_phase(phase, d)
    ready.write_text("done")


def uninterrupted(phase: str, template: Path, work: Path) -> tuple[dict, dict, float]:
    """(state before, state after, seconds) of the phase run to completion on a copy."""
    d = work / f"{phase}-reference"
    shutil.copytree(template, d)
    before = observe(phase, d)
    t0 = time.monotonic()
    run_phase(phase, d)
    took = time.monotonic() - t0
    return before, observe(phase, d), took


def trial(phase: str, template: Path, work: Path, n: int, delay_s: float, before: dict, after: dict) -> Trial:
    d = work / f"{phase}-{n}"
    shutil.copytree(template, d)
    ready = work / f"{phase}-{n}.ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "recovery_tests.kill_matrix", phase, str(d), str(ready)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    while not ready.exists() and proc.poll() is None:
        time.sleep(0.005)
    time.sleep(delay_s)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t = Trial(phase, delay_s, killed)
    if not killed and proc.returncode != 0:
        t.problems.append(f"child failed: {proc.stderr.read().decode()[-300:]}")
    t.problems += consistency_problems(phase, d)
    mid = observe(phase, d)
    t.left = "old" if mid == before else "new" if mid == after else "between"
    if mid["public"] not in (before["public"], after["public"]):
        t.problems.append("the public view serves neither the old nor the new result")
    run_phase(phase, d)  # the rerun of the same step
    t.problems += consistency_problems(phase, d)
    again = observe(phase, d)
    if again != after:
        t.problems.append(f"rerun did not converge: {_diff(again, after)}")
    shutil.rmtree(d, ignore_errors=True)
    return t


def _diff(a: dict, b: dict) -> str:
    return "; ".join(
        f"{k}: {a.get(k)!r:.120} != {b.get(k)!r:.120}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    )


def run_matrix(base: Path, points: int, *, phases: list[str] | None = None, seed: int = 20) -> dict[str, list[Trial]]:
    rng = random.Random(seed)
    templates = build_templates(base / "templates")
    out = {}
    for phase in phases or PHASES:
        before, after, took = uninterrupted(phase, templates[phase], base)
        # kill points spread over the phase's run (its duration measured uninterrupted, plus
        # the child's own start-up margin), a few beyond it: those must simply complete. The first
        # lies in the run's first 60%, so a phase the child runs faster than the measurement
        # (a loaded machine during it) is still killed at least once.
        out[phase] = [
            trial(
                phase, templates[phase], base, n, rng.uniform(0, took * (0.6 if n == 0 else 1.2) + 0.05), before, after
            )
            for n in range(points)
        ]
    return out


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
