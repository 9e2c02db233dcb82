"""Every phase of a recovery, in order, as the Dagster jobs a person launches from the UI.

``recovery recover --incident FILE`` and ``make run`` both go through here:
contain → preserve evidence → assess (reconcile, impact, decide) → repair (plan,
canary, waves) → publish (or roll back) → restate consumers → verify convergence →
timeline and reports. Each phase is timed: wall time, peak memory of this process
(the engine runs in it) and the seconds spent inside the engine, so a benchmark can
say where the time goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from rich.console import Console

from recovery.launch import Launcher
from recovery.launch.repair import decision, publish_or_roll_back, run_repair
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import duckdb_engine
from recovery.lib.errors import RecoveryError
from recovery.lib.incident.model import Incident
from recovery.lib.incident.phases import ASSESS, CONTAIN, EVIDENCE, REPORT, RESTATE, RUNBOOK, TIMELINE, VERIFY
from recovery.lib.repair.plan import wave_name
from recovery.lib.trace import mark, peak_rss_mb


@dataclass
class PhaseFigures:
    phase: str
    seconds: float
    engine_seconds: float
    peak_rss_mb: float
    run_ids: list[str]
    note: str = ""


@dataclass
class RecoveryRun:
    incident: Incident
    spec: DatasetSpec
    phases: list[PhaseFigures] = field(default_factory=list)
    report_summary: str = ""
    decision: str = ""

    @property
    def run_ids(self) -> dict[str, list[str]]:
        return {p.phase: p.run_ids for p in self.phases}


def _reset_peak() -> None:
    """Reset this process's high-water mark of resident memory (Linux), so each phase reports its own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def run_recovery(
    incident: Incident,
    spec: DatasetSpec,
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    console: Console,
    wave_size: int = 30,
    on_phase: Callable[[PhaseFigures], None] | None = None,
    after_canary: Callable[[], str] | None = None,
    full: bool = False,
) -> RecoveryRun:
    """Run every phase; ``after_canary`` (the worked example's ongoing ingestion) runs once the
    canary passed, before the waves, and returns a line to print. ``full``: reconcile the whole target
    rather than the failed generations' footprint."""
    launcher = Launcher(incident, spec, instance=instance, definitions=defs)
    out = RecoveryRun(incident, spec)

    def phase(name: str, fn: Callable[[], tuple[list[str], str]]) -> None:
        mark(f"phase {name} starts")  # a trace's statements fall between these
        _reset_peak()
        engine_before, t0 = duckdb_engine.ENGINE_SECONDS.total, time.perf_counter()
        with console.status(f"{name} …"):
            run_ids, note = fn()
        figures = PhaseFigures(
            name,
            time.perf_counter() - t0,
            duckdb_engine.ENGINE_SECONDS.total - engine_before,
            peak_rss_mb(),
            run_ids,
            note,
        )
        out.phases.append(figures)
        console.print(
            f"[bold]{name:<9}[/] {note}  [dim]({figures.seconds:.1f} s; runs {', '.join(r[:8] for r in run_ids)})[/]",
            highlight=False,
            soft_wrap=True,
        )
        if on_phase:
            on_phase(figures)

    def contain():
        r = launcher.run(CONTAIN)
        lines = [r.output_for_node("adopt_target").line(spec)] + r.output_for_node("stop_dagster_work").lines()
        return [r.run_id], "; ".join(lines[:3])

    def evidence():
        r = launcher.run(EVIDENCE)
        return [r.run_id], f"bundle {incident.evidence_dir(spec)} with sha256 manifest"

    def assess():
        r = launcher.run(ASSESS, full=True) if full else launcher.run(ASSESS)
        recon = r.asset_materializations_for_node("incident__reconciliation")[0].metadata
        out.decision = decision(launcher)[1].choice  # the rule publish follows too
        return [r.run_id], (
            f"{recon['damaged_keys'].value:,} damaged keys in {recon['damaged_partitions'].value} "
            f"partitions; decision: {out.decision}"
        )

    def repair():
        def wave(w, plan) -> None:
            ok = w.gates and all(g.passed for g in w.gates.values())
            console.print(
                f"      {wave_name(w.wave):>8}: {w.partitions:>4} partitions, run {w.run_id[:8]}, "
                + ("gates passed" if ok else "GATES FAILED"),
                highlight=False,
            )
            if w.wave == 0 and ok and after_canary:
                console.print(f"      {after_canary()}", highlight=False)

        rep = run_repair(launcher, wave_size=wave_size, on_wave=wave)
        if rep.stopped:
            raise RecoveryError(f"the repair stopped: {rep.stopped}")
        plan = rep.plan
        return [rep.plan_run_id] + [w.run_id for w in rep.waves], (
            f"generation {plan.generation} in {plan.namespace}: {len(plan.rebuild)} partitions rebuilt from the source "
            f"as of {plan.source_watermark} in {len(plan.waves)} runs, {len(plan.qualified)} qualified"
        )

    def publish():
        done, r, _, finished = publish_or_roll_back(launcher)
        if done == "finished":
            return [], f"published earlier; finished what that publish left undone: {', '.join(finished)}"
        if done == "already_published" or r is None:
            return [], "already published; nothing to do"
        if done == "rolled_back":
            return [r.run_id], "rolled back to the prior generation"
        meta = r.asset_materializations_for_node("repair__publication")[0].metadata
        cand = r.asset_materializations_for_node("repair__candidate")[0].metadata
        return [r.run_id], (
            f"{spec.target.table} -> {meta['published_namespace'].value} "
            f"(was {meta['previous_namespace'].value}, kept); concurrent ingestion replayed: "
            f"{cand['upserts_replayed'].value:,} upserts, {cand['deletes_replayed'].value:,} deletes"
        )

    def restate():
        if not spec.downstream:  # the restatement job exists only for a dataset with consumers
            return [], "no downstream consumer declared in the spec: nothing to restate"
        r = launcher.run(RESTATE)
        return [r.run_id], "every consumer restated against the repaired table; originals kept; owners notified"

    def verify():
        r = launcher.run(VERIFY)
        checks = r.get_asset_check_evaluations()
        passed = sum(1 for c in checks if c.passed)
        return [r.run_id], f"convergence: {passed} of {len(checks)} checks passed"

    def reports():
        t = launcher.run(TIMELINE)
        r = launcher.run(REPORT)
        out.report_summary = str(r.asset_materializations_for_node("incident__reports")[0].metadata["summary"].value)
        return [t.run_id, r.run_id], f"timeline, reconciliation and recovery reports in {incident.reports_dir(spec)}"

    steps: dict[str, Callable[[], tuple[list[str], str]]] = {  # by name; the order is RUNBOOK's
        "assess": assess,
        "contain": contain,
        "evidence": evidence,
        "publish": publish,
        "repair": repair,
        "reports": reports,
        "restate": restate,
        "verify": verify,
    }
    assert set(steps) == {s.name for s in RUNBOOK}, "a step of the runbook without its launcher here"
    for step in RUNBOOK:  # the runbook's order, declared once in recovery.lib.incident.phases
        if step.name == "repair" and decision(launcher)[1].is_rollback:
            continue
        phase(step.name, steps[step.name])
    return out
