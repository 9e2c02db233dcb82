"""The kill -9 matrix, a few points per phase (``python -m bench kill`` runs 20+ per phase):
adoption, fence, evidence build, a repair wave, publish with replay and restatement are
each SIGKILLed at random moments of their work; after every kill the public view serves
the old or the new result whole, the control plane agrees with the catalog, and rerunning
the step converges to what an uninterrupted run produced."""

from __future__ import annotations

from recovery_tests.kill_matrix import PHASES, run_matrix


def test_every_phase_survives_kill_9_at_random_points_and_a_rerun_converges(tmp_path):
    results = run_matrix(tmp_path, points=2, seed=20)
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
