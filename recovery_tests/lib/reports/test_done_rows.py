"""Every Done row says "verified" only when its check ran over a non-empty set and passed.

One case per row and way of falling short: the row's underlying set made empty, or its check
made to fail, starting from a context in which every row is verified (checked first, so no
case passes by a row that could never be verified). The contexts are the shapes the report
builders hand ``done.py``; the end-to-end recoveries check the same rows from real records
(``report_checks.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from recovery.lib.reports import done
from recovery.lib.reports.tables import NOT_RUN

# ---- contexts in which every row is verified -------------------------------------------------------


def timeline_inputs() -> dict:
    events = [
        {"kind": "approval", "summary": "approved by head-of-data", "source": "incident", "actor": "head-of-data"},
        {"kind": "input_snapshot", "summary": "read the source as of 2024-07-01", "source": "generations"},
        {"kind": "code", "summary": "code version 2.3.0", "source": "generations"},
        {"kind": "ranges", "summary": "requested 2024-02-01..2024-02-28", "source": "dagster"},
        {"kind": "runs", "summary": "run started", "source": "dagster", "run_id": "abcdef0123"},
        {"kind": "writes", "summary": "wrote 3 partitions", "source": "_recovery.writes", "seq": 4},
        {"kind": "containment", "summary": "bf-1 fenced", "source": "_recovery.fences", "seq": 9},
        {"kind": "decisions", "summary": "repair: no complete prior generation", "source": "timeline"},
    ]
    return {
        "tl": {"events": events},
        "propagation": {"status": "ok", "builds": [], "total": 4, "assets": [], "asset_table": "t"},
        "evidence": {
            "status": "ok",
            "bundle": "/e",
            "files": 12,
            "manifest_sha256": "f" * 64,
            "recorded": "f" * 64,
            "problems": [],
        },
    }


def timeline_rows(x: dict) -> list[dict]:
    return done.timeline_checklist(x["tl"], propagation=x["propagation"], evidence=x["evidence"])


def reconciliation_inputs() -> dict:
    return {
        "ctx": {
            "dataset": "orders",
            "scope": {
                "status": "ok",
                "source_keys": 100,
                "actual_rows": 98,
                "partitions": 6,
                "source_events": 140,
                "max_version": 9,
                "watermark": "2024-07-01",
            },
            "labels": {
                "status": "ok",
                "total": 7,
                "unexplained": 0,
                "rows": [
                    {"label": "overwritten", "keys": 2},
                    {"label": "deleted", "keys": 3},
                    {"label": "missing", "keys": 1},
                    {"label": "duplicate", "keys": 1},
                ],
            },
            "basis": {"overwritten": "write_log", "deleted": "write_log", "missing": "write_log"},
            "summary": None,
            "partitions": {"status": "ok", "damaged": [{"partition": "p1"}], "findings": {"written_after_fence": 0}},
            "impact": {"status": "ok", "rows": [{"consumer": "c"}], "affected": 1, "material_rows": 4},
            "assets": [],
            "decisions": {"per_consumer": [{"consumer": "c", "decision": "d", "material": True}]},
        },
        "write_log": True,
    }


def reconciliation_rows(x: dict) -> list[dict]:
    return done.reconciliation_checklist(x["ctx"], write_log=x["write_log"], out_of_order_basis="write_log")


def recovery_inputs() -> dict:
    sections = {
        "isolated_repair": {
            "status": "published",
            "facts": [("generation", "repair-1"), ("namespace", "t__g0002"), ("from_namespace", "t__g0001")],
            "actions": {"rebuild": 3, "keep (qualified)": 1},
            "published": {"seq": 40},
        },
        "idempotency": {
            "status": "passed",
            "gates": [{"gate": "idempotent_rerun", "passed": True}],
            "noop_replays": [],
        },
        "concurrent_writes": {
            "status": "recorded",
            "totals": {"upserted": 3, "deleted": 1, "skipped_older": 0},
            "replays": [{}],
            "gate": {"gate": "repair_concurrent_writes", "passed": True, "observed": 0, "details": "4 keys ..."},
        },
        "waves": {
            "status": "recorded",
            "waves": [{"wave": 0, "partitions": 1}],
            "gates": [{"stage": "canary", "passed": True, "blocking": True, "run_id": "r1"}],
        },
        "totals": {"status": "recorded"},
        "downstream_corrections": {
            "status": "recorded",
            "consumers": [{"consumer": "c", "rows_restated": 5}, {"consumer": "marts/daily", "rows_restated": 2}],
            "rows_restated": 7,
            "material": 3,
            "checks": [
                {"consumer": "c", "passed": True, "details": "ok"},
                {"consumer": "marts/daily", "passed": True, "details": "ok"},
            ],
            "impact_material": {"c": 4},
            "assets_reached": ["marts/daily"],
            "computed_originals": [],
        },
        "convergence": {
            "status": "converged",
            "latest": {
                "check_id": 1,
                "run_id": "r",
                "partitions": 5,
                "recent": 2,
                "repaired": 3,
                "drift_keys": 0,
                "drifting_partitions": 0,
            },
        },
        "recurrence_gates": {"status": "in force", "total": 10, "tested": 4},
    }
    return {"sections": sections}


def recovery_rows(x: dict) -> list[dict]:
    return done.recovery_checklist({"sections": [{"id": k, **v} for k, v in x["sections"].items()]})


BUILDERS: dict[str, tuple[Callable[[], dict], Callable[[dict], list[dict]]]] = {
    "timeline": (timeline_inputs, timeline_rows),
    "reconciliation": (reconciliation_inputs, reconciliation_rows),
    "recovery": (recovery_inputs, recovery_rows),
}


def statuses(report: str, change: Callable[[dict], None] | None = None) -> dict[str, dict]:
    make, rows = BUILDERS[report]
    x = copy.deepcopy(make())
    if change:
        change(x)
    return {r["item"]: r for r in rows(x)}


@pytest.mark.parametrize("report", list(BUILDERS))
def test_the_starting_contexts_verify_every_row(report):
    got = statuses(report)
    assert {k: r["status"] for k, r in got.items()} == {k: "verified" for k in got}, got


# ---- each row, its set made empty or its check failing ---------------------------------------------


def _set(path: str, value):
    def change(x: dict) -> None:
        *parents, last = path.split(".")
        node = x
        for p in parents:
            node = node[p]
        node[last] = value

    return change


def _events_without(kind: str):
    return lambda x: x["tl"].update(events=[e for e in x["tl"]["events"] if e["kind"] != kind])


def _unknown(kind: str):
    def change(x: dict) -> None:
        for e in x["tl"]["events"]:
            if e["kind"] == kind:
                e["summary"] = "watermark unknown"

    return change


def _no_history(x: dict) -> None:
    """A foreign target with neither a write log nor a run registry: older versions can only be stale,
    absent keys only missing."""
    x["write_log"] = False
    x["ctx"]["basis"] = {"stale": "none", "missing": "none"}
    x["ctx"]["labels"]["rows"] = [{"label": "stale", "keys": 2}, {"label": "missing", "keys": 3}]


CASES = [
    # timeline
    ("timeline", "authority", lambda x: x["tl"]["events"][0].update(actor=None), "no approver is named"),
    ("timeline", "inputs", _unknown("input_snapshot"), "recorded without its value"),
    ("timeline", "inputs", _events_without("input_snapshot"), "register the generation"),
    ("timeline", "code", _events_without("code"), "code version"),
    ("timeline", "ranges", _events_without("ranges"), "intended range"),
    ("timeline", "runs", _events_without("runs"), "not run by the orchestrator"),
    ("timeline", "retries", _events_without("runs"), "retries show in an orchestrator's run log"),
    ("timeline", "writes", _events_without("writes"), "outside the generation-aware writer"),
    ("timeline", "propagation", _set("propagation.total", 0), "0 consumer builds recorded"),
    ("timeline", "containment", _events_without("containment"), "recovery contain"),
    ("timeline", "decisions", _events_without("decisions"), "assess_incident"),
    ("timeline", "evidence", _set("evidence.files", 0), "0 files"),
    ("timeline", "evidence", _set("evidence.status", "failed"), "the bundle changed"),
    ("timeline", "evidence", _set("evidence.recorded", None), "holds no checksum"),
    # reconciliation
    ("reconciliation", "keys", _set("ctx.scope.source_keys", 0), "0 source keys compared"),
    ("reconciliation", "keys", _set("ctx.labels.unexplained", 5), "5 keys match no rule"),
    ("reconciliation", "partitions", _set("ctx.scope.partitions", 0), "0 partitions compared"),
    ("reconciliation", "versions", _set("ctx.scope.source_events", 0), "0 source changes"),
    (
        "reconciliation",
        "missing",
        lambda x: x["ctx"]["scope"].update(source_keys=0, actual_rows=0),
        "nothing was compared",
    ),
    ("reconciliation", "duplicate", lambda x: x["ctx"]["scope"].update(source_keys=0, actual_rows=0), "nothing was"),
    ("reconciliation", "overwritten", _no_history, "an older version is labelled stale (2 keys)"),
    ("reconciliation", "deleted", _no_history, "an absent key is labelled missing (3 keys)"),
    ("reconciliation", "concurrent", _no_history, "no run registry"),
    ("reconciliation", "downstream", lambda x: x["ctx"]["impact"].update(rows=[], affected=0), "0 consumers assessed"),
    ("reconciliation", "decision impact", _set("ctx.decisions.per_consumer", []), "declares no decisions"),
    # recovery
    ("recovery", "isolated repair", _set("sections.isolated_repair.actions", {"keep (qualified)": 4}), "0 partitions"),
    ("recovery", "isolated repair", _set("sections.isolated_repair.published", None), "not published yet"),
    (
        "recovery",
        "idempotency",
        _set("sections.idempotency", {"status": "recorded", "gates": [], "noop_replays": [{}]}),
        "0 idempotency gates ran",
    ),
    (
        "recovery",
        "idempotency",
        _set("sections.idempotency.gates", [{"gate": "idempotent_rerun", "passed": False}]),
        "1 of 1 idempotency gates failed",
    ),
    (
        "recovery",
        "concurrent-write preservation",
        _set("sections.concurrent_writes.gate", None),
        "the key-by-key publish gate (repair_concurrent_writes) did not run",
    ),
    (
        "recovery",
        "concurrent-write preservation",
        _set(
            "sections.concurrent_writes.gate",
            {"gate": "repair_concurrent_writes", "passed": False, "observed": 3, "details": "3 lost"},
        ),
        "failed on 3 keys",
    ),
    (
        "recovery",
        "concurrent-write preservation",
        _set("sections.concurrent_writes.totals", {"upserted": 0, "deleted": 0, "skipped_older": 0}),
        "no write landed during the repair",
    ),
    ("recovery", "canaries", _set("sections.waves.gates", []), "0 gates recorded at stage canary"),
    (
        "recovery",
        "canaries",
        _set("sections.waves.gates", [{"stage": "canary", "passed": False, "blocking": True}]),
        "1 of 1 blocking gates",
    ),
    (
        "recovery",
        "downstream correction",
        lambda x: x["sections"]["downstream_corrections"]["consumers"][0].update(rows_restated=0),
        "c: 0 ledger rows while the impact found 4 material rows",
    ),
    (
        "recovery",
        "downstream correction",
        lambda x: x["sections"]["downstream_corrections"]["checks"][1].update(passed=False, details="run failed"),
        "check failed: run failed",
    ),
    (
        "recovery",
        "downstream correction",
        lambda x: x["sections"]["downstream_corrections"]["checks"].pop(),
        "no restatement check recorded for marts/daily",
    ),
    (
        "recovery",
        "downstream correction",
        lambda x: x["sections"]["downstream_corrections"]["consumers"].pop(),
        "marts/daily, which were not restated",
    ),
    (
        "recovery",
        "downstream correction",
        lambda x: x["sections"]["downstream_corrections"].update(consumers=[], checks=[]),
        "0 consumers restated",
    ),
    ("recovery", "current-ingestion validation", _set("sections.convergence.latest.partitions", 0), "0 partitions"),
    (
        "recovery",
        "current-ingestion validation",
        lambda x: (
            x["sections"]["convergence"].update(status="drift")
            or x["sections"]["convergence"]["latest"].update(drift_keys=3, drifting_partitions=1)
        ),
        "3 keys in 1 partitions differ",
    ),
    ("recovery", "tested backfill gates", _set("sections.recurrence_gates.tested", 0), "0 gate evaluations"),
]


@pytest.mark.parametrize("report, item, change, reason", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_a_row_whose_set_is_empty_or_whose_check_fails_is_not_verified_and_says_why(report, item, change, reason):
    got = statuses(report, change)[item]
    assert got["status"] != "verified", got
    assert reason in got["why"] + " " + got["evidence"], got


def test_a_phase_that_did_not_run_names_the_command_that_would_verify_its_rows():
    sections = [
        {"id": k, "status": NOT_RUN, **({"total": 10, "tested": 0} if k == "recurrence_gates" else {})}
        for k in recovery_inputs()["sections"]
    ]
    rows = done.recovery_checklist({"sections": sections})
    assert all(r["status"] != "verified" and "recovery " in r["why"] for r in rows), rows


def test_labels_inferred_from_a_run_registry_are_reported_as_labelled_not_as_stale_or_missing():
    """The reconciliation report said the overwritten and deleted keys "are reported as stale/missing"
    when a registry had labelled them overwritten and deleted."""

    def registry(x: dict) -> None:
        x["write_log"] = False
        x["ctx"]["basis"] = {k: "registry ops.load_runs" for k in ("overwritten", "deleted", "missing")}

    got = statuses("reconciliation", registry)
    for item, label in (("overwritten", "overwritten"), ("deleted", "deleted")):
        assert got[item]["status"] == "verified", got[item]
        assert (
            f"keys labelled {label}" in got[item]["evidence"]
            and "inferred from registry ops.load_runs" in (got[item]["evidence"])
        )
        assert "reported as" not in got[item]["evidence"]
