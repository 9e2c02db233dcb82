"""What one containment run did, for the CLI, the UI's metadata and the tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from recovery.defs.containment.dagster_runs import StoppedRun
from recovery.lib.write.fencing import FenceOutcome


@dataclass(frozen=True)
class GenerationContainment:
    fence: FenceOutcome
    backfills: tuple[str, ...] = ()  # backfills that produced the generation
    cancelled_backfills: tuple[str, ...] = ()  # moved to CANCELING by this run
    stopped_runs: tuple[StoppedRun, ...] = ()
    retries_stripped: tuple[str, ...] = ()  # runs newly tagged never to be retried
    runs_seen: int = 0  # every run of the generation, finished or not
    covered_by: str | None = None  # another generation of the same backfill, whose containment stopped its runs

    @property
    def changed_anything(self) -> bool:
        return self.fence.newly_fenced or bool(self.cancelled_backfills or self.stopped_runs or self.retries_stripped)


@dataclass(frozen=True)
class ContainmentReport:
    incident_id: str
    containment_run_id: str
    generations: tuple[GenerationContainment, ...] = field(default_factory=tuple)
    refused_writers: tuple[str, ...] = ()  # writers of the target the fence now refuses, and how to switch them

    @property
    def changed_anything(self) -> bool:
        return any(g.changed_anything for g in self.generations)

    def lines(self) -> list[str]:
        out = []
        for g in self.generations:
            f = g.fence.record
            state = "fenced" if g.fence.newly_fenced else "already fenced"
            out.append(
                f"{f.generation}: {state} at {f.fenced_at:%Y-%m-%d %H:%M:%S} UTC by {f.fenced_by} "
                f"(incident {f.incident_id}, token {f.token}, commit seq {f.seq})"
            )
            if g.covered_by is not None and not g.runs_seen and not g.backfills:
                out.append(f"  its Dagster backfill and runs: contained with {g.covered_by} above")
                continue
            if not g.runs_seen and not g.backfills:
                out.append(f"  no runs to cancel: no Dagster backfill or run of {f.generation} in this instance")
                continue
            for b in g.backfills:
                out.append(
                    f"  backfill {b}: "
                    + (
                        "cancelled (CANCELING; the daemon finishes it)"
                        if b in g.cancelled_backfills
                        else "already cancelled or finished"
                    )
                )
            for r in g.stopped_runs:
                out.append(f"  run {r.run_id} ({r.status_before}): {r.action}")
            if not g.stopped_runs:
                out.append(f"  no queued or in-flight run among its {g.runs_seen} runs")
            if g.retries_stripped:
                out.append(f"  retries disabled on {len(g.retries_stripped)} run(s)")
        out += [f"refused from now on: {w}" for w in self.refused_writers]
        if not self.changed_anything:
            out.append(f"incident {self.incident_id} was already contained: nothing changed")
        return out

    def markdown(self) -> str:
        return "\n".join(f"- {line.strip()}" for line in self.lines())
