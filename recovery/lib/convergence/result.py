"""What one convergence check found, and the sentences a run page, a terminal and an alert read.

Three figures are kept apart per partition, because they call for different people:
drift (the target differs from the source where ingestion has applied it: the data is
wrong), pending (source changes after the watermark that the target does not show yet:
ingestion has not reached them) and the watermark with where it comes from. Pending
changes younger than ``convergence.max_lag`` are reported and pass; older ones fail,
because ingestion is then behind, not merely in progress.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from recovery.lib.dataset_spec.durations import format_duration

SCOPES = ("recent", "repaired", "late")
"""Why a partition is checked: ingestion wrote it last, a repair rebuilt it, or a pending change
waits in it (a partition may be in several)."""


def plural(n: int, word: str) -> str:
    """'1 partition', '4 partitions'."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


class PartitionDrift(BaseModel):
    model_config = ConfigDict(frozen=True)
    partition: str
    recent: bool
    repaired: bool
    expected_rows: int
    actual_rows: int
    missing: int
    extra: int
    changed: int
    duplicate: int
    drift_keys: int
    sample_keys: list[str]
    drifting_since: datetime | None = None  # first check of the current run of drifting checks
    watermark: datetime | None = None  # the source is applied up to here in this partition
    watermark_basis: str = ""
    pending_changes: int = 0  # source changes after the watermark the target does not show yet
    pending_oldest: datetime | None = None  # arrival of the oldest of them
    pending_overdue: int = 0  # of them, older than the allowed lag

    @property
    def late(self) -> bool:
        return self.pending_changes > 0

    @property
    def drifts(self) -> bool:
        """The target differs from the source where ingestion has applied it (a row count that
        differs is drift unless pending changes explain it)."""
        return self.drift_keys > 0 or (self.expected_rows != self.actual_rows and not self.pending_changes)

    @property
    def behind(self) -> bool:
        return self.pending_overdue > 0

    @property
    def converged(self) -> bool:
        """No drift and nothing pending past the allowed lag (younger pending changes are allowed)."""
        return not self.drifts and not self.behind

    def in_scope(self, scope: str | None) -> bool:
        return scope is None or getattr(self, scope)


class ConvergenceResult(BaseModel):
    """What one check found; ``converged`` is what ``recovery verify`` exits on."""

    model_config = ConfigDict(frozen=True)
    check_id: int
    dataset: str
    checked_at: datetime
    watermark: datetime | None
    watermark_basis: str
    max_lag: timedelta
    pending_changes: int
    pending_oldest: datetime | None
    pending_overdue: int
    recent_partitions: list[str]
    repaired_partitions: list[str]
    partitions: list[PartitionDrift]

    def scoped(self, scope: str | None = None) -> list[PartitionDrift]:
        return [p for p in self.partitions if p.in_scope(scope)]

    def drifted(self, scope: str | None = None) -> list[PartitionDrift]:
        """Partitions that drift (``scope``: 'recent', 'repaired', 'late' or None for all)."""
        return [p for p in self.scoped(scope) if p.drifts]

    def behind(self, scope: str | None = None) -> list[PartitionDrift]:
        """Partitions holding a pending change older than the allowed lag."""
        return [p for p in self.scoped(scope) if p.behind]

    @property
    def converged(self) -> bool:
        return not self.drifted() and not self.pending_overdue

    @property
    def verified(self) -> bool:
        """Converged, over at least one partition: only this may be called verified."""
        return self.converged and bool(self.partitions)

    @property
    def recent_converged(self) -> bool:
        return not self.drifted("recent")

    @property
    def repaired_converged(self) -> bool:
        return not self.drifted("repaired")

    def lag(self) -> timedelta | None:
        """How far ingestion is behind: the age of the oldest pending change."""
        return max(self.checked_at - self.pending_oldest, timedelta(0)) if self.pending_oldest else None

    def as_of(self) -> str:
        """The watermark as a reader needs it: the timestamp and where it came from."""
        if self.watermark is None:
            return f"its latest change ({self.watermark_basis})"
        return f"{self.watermark:%Y-%m-%d %H:%M:%S} ({self.watermark_basis})"

    def figures(self, scope: str | None = None) -> str:
        """The three figures, over ``scope``: drift, pending, watermark."""
        parts = self.scoped(scope)
        bad = [p for p in parts if p.drifts]
        late = [p for p in parts if p.pending_changes]
        changes = sum(p.pending_changes for p in late) if scope else self.pending_changes
        oldest = min((p.pending_oldest for p in late if p.pending_oldest), default=None)
        text = (
            f"drift: {sum(p.drift_keys for p in bad):,} keys in {len(bad)} of "
            f"{plural(len(parts), 'partition')}; pending: "
        )
        if changes:
            age = format_duration(self.checked_at - oldest) if oldest else "?"
            text += (
                f"{plural(changes, 'change')} in {plural(len(late), 'partition')}, the oldest {age} old "
                f"(convergence.max_lag {format_duration(self.max_lag)})"
            )
        else:
            text += "none"
        rebuilt = {p.watermark for p in parts if p.watermark and p.watermark != self.watermark}
        text += f"; watermark {self.as_of()}"
        if rebuilt:
            text += f", later in {plural(sum(1 for p in parts if p.watermark in rebuilt), 'partition')} rebuilt since"
        return text

    def behind_sentence(self) -> str:
        """Says ingestion is behind and by how much (empty when it is not)."""
        if not self.pending_overdue:
            return ""
        bad = self.behind()
        names = ", ".join(p.partition for p in bad[:10]) + (" ..." if len(bad) > 10 else "")
        lag = self.lag() or timedelta(0)
        return (
            f"ingestion is behind by {format_duration(lag)}: {plural(self.pending_overdue, 'source change')} "
            "that arrived "
            f"after the watermark {self.as_of()} are still not applied after convergence.max_lag "
            f"({format_duration(self.max_lag)}), in {plural(len(bad), 'partition')} ({names}). Fix: run "
            "ingestion for them, "
            f"or find why it stopped"
        )

    def summary(self) -> str:
        if not self.partitions:
            return f"not verified: no partition to check (none recent, repaired or late); watermark {self.as_of()}"
        bad = self.drifted()
        lines = []
        if bad:
            lines.append(
                f"drift in {len(bad)} partition(s): "
                + ", ".join(f"{p.partition} ({p.drift_keys} keys)" for p in bad[:10])
                + (" ..." if len(bad) > 10 else "")
            )
        if self.pending_overdue:
            lines.append(self.behind_sentence())
        if not lines:
            lines.append(
                f"converged: {len(self.recent_partitions)} recent and {len(self.repaired_partitions)} repaired "
                f"partitions equal the source up to the watermark"
            )
        return "; ".join(lines) + f" ({self.figures()})"
