"""The kill -9 matrix. At random moments (a few points per phase; ``python -m bench kill`` runs
20+ per phase): adoption, fence, evidence build, a repair wave, publish with replay and
restatement are each SIGKILLed during their work. At the commit: every named fault point in
and right after the commits of every phase (containment's adoption and fence, the evidence
bundle's record, the reconciliation, the repair's plan, canary and wave with their gate, a failed
gate's stop, the expansion stopped and resumed, the replay to now, publish and a refused publish,
restatement and its owners' notices, rollback, the release of the public name, convergence
verification, the generation registry with its fence attempts, ingestion during the repair, and a
guarded backfill's gates, publish, read copy, convergence and release of the prior, a Delta
target's fence, a repair's publish onto a Delta target, a draft incident opened, a team's asset
output written through the IO manager (and re-executed as a new run after a kill), a SQL consumer
refreshed, a Dagster asset consumer restated, a guarded backfill's launch, the impact and decision
records, a Delta target's adoption, a run registry from Dagster and the fencing sensor's pass) is killed
once,
injected there (``RECOVERY_FAULT_AT``), not by timing. After every kill the public view serves
the old or the new result whole, the control plane agrees with the catalog and with itself (no
torn state), and rerunning the step converges to what an uninterrupted run produced; after a
publish's rerun (a repair's or a guarded backfill's) the BI read copy holds the published view."""

from __future__ import annotations

import pytest

from recovery_tests.support.kill_matrix import COMMIT_POINTS, PHASES, build_templates, run_commit_kills, run_matrix


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    return build_templates(tmp_path_factory.mktemp("kill-templates"))


def test_every_phase_survives_kill_9_at_random_points_and_a_rerun_converges(tmp_path, templates):
    results = run_matrix(tmp_path, points=2, seed=20, templates=templates)
    assert sorted(results) == sorted(PHASES)
    problems = [
        f"{t.phase} (kill after {t.delay_s:.3f}s): {p}"
        for trials in results.values()
        for t in trials
        for p in t.problems
    ]
    assert problems == []
    assert all(any(t.killed for t in trials) for trials in results.values()), {
        ph: [(t.delay_s, t.killed) for t in trials] for ph, trials in results.items()
    }


def test_every_commit_point_of_every_phase_killed_leaves_no_torn_state_and_the_rerun_converges(tmp_path, templates):
    results = run_commit_kills(tmp_path, templates)
    assert {ph: [k.point for k in kills] for ph, kills in results.items()} == {
        ph: list(points) for ph, points in COMMIT_POINTS.items()
    }
    problems = [f"{k.point}: {p}" for kills in results.values() for k in kills for p in k.problems]
    assert problems == []
    # each window killed on both sides of its commit: rolled back whole, and committed with the rest left to the rerun
    assert {ph: sorted({k.left for k in kills}) for ph, kills in results.items()} == {
        "contain": ["between", "new", "old"],
        "evidence": ["between", "new"],  # the bundle is on disk before its event commits
        "assess": ["new", "old"],
        "registry": ["new", "old"],
        "patrol": ["between", "old"],  # (events:recorded: the backfill's cancel rolled back)
        "decide": ["between", "new", "old"],
        "plan": ["new", "old"],
        "canary": ["between", "new", "old"],
        "wave": ["new", "old"],
        "candidate": ["new", "old"],
        "verify": ["new", "old"],
        "publish": ["between", "new", "old"],
        "rollback": ["between", "new", "old"],
        "restate": ["between", "new", "old"],
        "release": ["new", "old"],
        "notify": ["between"],  # every point follows the notice's delivery: the rerun finishes (at least once)
        "stop": ["between", "new", "old"],
        "refuse": ["new", "old"],
        "replay": ["new", "old"],
        "register": ["between", "new", "old"],
        "ingest": ["between", "new", "old"],
        "launch": ["between", "new", "old"],
        "recur_gate": ["new", "old"],
        "recur_publish": ["between", "new", "old"],
        "lake_fence": ["between", "old"],  # the sync of the fence commit follows every point
        "lake_adopt": ["new", "old"],  # the write log follows the adoption in its commit
        "lake_publish": ["between", "new"],  # the table's commit precedes every point but the last
        "draft": ["between", "new"],  # the draft's file is in place before its event commits
        "output": ["between"],  # the stage table is dropped after every point: the step's retry drops it
        "reexecute": ["between", "old"],  # the re-execution's output lands after every point but the first
        "consumer": ["new", "old"],
        "asset_restate": ["between", "new", "old"],  # the original and the re-materialization commit first
    }
