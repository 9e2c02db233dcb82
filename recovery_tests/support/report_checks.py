"""Read the three rendered reports of a recovered incident back and check their Done checklists.

Shared by the worked example's end-to-end recovery and the orders dataset's: every
Done item of the runbook is present in its report with a status, the evidence a
verified item cites is the control plane's (or the bundle's) own, a qualified item
says why, and no section reads "not run yet" for a phase the recovery ran.
"""

from __future__ import annotations

from collections.abc import Set
from html.parser import HTMLParser
from pathlib import Path

from recovery.lib.evidence.manifest import sha256_file
from recovery.lib.reports.done import RECONCILIATION_ITEMS, RECOVERY_ITEMS, TIMELINE_ITEMS
from recovery.lib.reports.recovery import SECTIONS


def checklist(page: ReportPage) -> dict[str, dict[str, str]]:
    """The Done checklist table of a report: item -> {status, evidence, why}."""
    rows = page.tables["done-checklist"]
    assert rows[0] == ["Done item", "status", "evidence", "why not verified, and what would verify it"]
    out = {r[0]: {"status": r[1], "evidence": r[2], "why": r[3]} for r in rows[1:]}
    assert len(out) == len(rows) - 1, "an item is listed twice"
    return out


def check_done_reports(
    reports_dir: Path,
    *,
    evidence_dir: Path,
    run_ids: set[str],
    consumers: list[str],
    computed_originals: Set[str] = frozenset(),
    qualified: dict[str, str] | None = None,
    concurrent_writes: bool = True,
) -> dict[str, dict]:
    """``run_ids``: the failed generations' Dagster runs the timeline must cite; ``qualified``: timeline
    items expected to be qualified, with a phrase their reason must hold; ``concurrent_writes``: whether
    ingestion wrote during the repair (if not, preservation has nothing to check and must not read verified)."""
    """Assert what every recovered incident's reports must say; return the checklists for more."""
    pages = {
        name: ReportPage((reports_dir / f"{name}.html").read_text())
        for name in ("timeline", "reconciliation", "recovery")
    }
    lists = {name: checklist(page) for name, page in pages.items()}
    assert list(lists["timeline"]) == list(TIMELINE_ITEMS)
    assert list(lists["reconciliation"]) == list(RECONCILIATION_ITEMS)
    assert list(lists["recovery"]) == list(RECOVERY_ITEMS)
    for items in lists.values():
        for item, r in items.items():
            assert r["status"] in ("verified", "not verified", "qualified", "not verifiable"), (item, r)
            assert r["evidence"], item
            assert r["status"] == "verified" or r["why"], f"{item} is {r['status']} without saying why"
            assert r["status"] != "not verifiable", f"{item}: every phase ran, yet {r}"

    # timeline: authority, runs, containment and the evidence bundle re-checked against its manifest now
    tl = lists["timeline"]
    for item in TIMELINE_ITEMS:
        if qualified and item in qualified:
            assert tl[item]["status"] == "qualified" and qualified[item] in tl[item]["why"], (item, tl[item])
        elif item != "retries":
            assert tl[item]["status"] == "verified", (item, tl[item])
    manifest = sha256_file(evidence_dir / "manifest.json")
    assert manifest[:16] in tl["evidence"]["evidence"] and "re-checked now" in tl["evidence"]["evidence"]
    if tl["runs"]["status"] == "verified":
        shown = tl["runs"]["evidence"]
        assert any(r[:8] in shown for r in run_ids), shown

    # reconciliation: every key-level item from the recorded classification, downstream and decisions
    rc = lists["reconciliation"]
    for item in RECONCILIATION_ITEMS:
        assert rc[item]["status"] == "verified", (item, rc[item])
    assert "_recovery.impact__" in rc["downstream"]["evidence"]

    # recovery: every phase that ran is reported from its record, never as "not run yet"
    rv = lists["recovery"]
    cw = rv["concurrent-write preservation"]
    if concurrent_writes:
        assert cw["status"] == "verified" and "repair_concurrent_writes" in cw["evidence"], cw
    else:
        assert cw["status"] == "not verified" and "no write landed during the repair" in cw["why"], cw
    for item in (
        "isolated repair",
        "canaries",
        "downstream correction",
        "current-ingestion validation",
    ):
        assert rv[item]["status"] == "verified", (item, rv[item])
    assert rv["tested backfill gates"]["status"] in ("verified", "not verified")
    # no guarded backfill and no idempotency gate ran in these recoveries: neither may read as verified
    assert rv["idempotency"]["status"] == "not verified" and "0 idempotency gates ran" in rv["idempotency"]["why"]
    html = (reports_dir / "recovery.html").read_text()
    for sid, title, _ in SECTIONS:
        section = html[html.index(f'<section id="{sid}">') :]
        section = section[: section.index("</section>")]
        assert "not run yet" not in section.lower() and "Not run yet" not in section, sid
    corrections = {r[0]: r for r in pages["recovery"].tables["corrections"][1:]}
    assert sorted(corrections) == sorted(consumers)
    header = pages["recovery"].tables["corrections"][0]
    for consumer, cells in corrections.items():
        original, corrected = cells[header.index("original total")], cells[header.index("corrected total")]
        assert {original, corrected}.isdisjoint({"", "—", "–", "-"}), (consumer, original, corrected)
        basis = cells[header.index("original from")]
        assert basis.startswith("original computed") == (consumer in computed_originals), (consumer, basis)
    return {"lists": lists, "pages": pages}


class ReportPage(HTMLParser):
    """Tables by id (rows of cell texts), element texts by id, and every src/href/url attribute."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.texts: dict[str, str] = {}
        self.links: list[str] = []
        self.tags: set[str] = set()
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._ids: list[tuple[str, str, list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.links += [v for k, v in attrs if k in ("src", "href", "srcset", "action", "data", "poster") and v]
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        if a.get("id") and tag != "table":
            self._ids.append((tag, a["id"], []))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        if self._ids and self._ids[-1][0] == tag:
            _, id_, parts = self._ids.pop()
            self.texts[id_] = "".join(parts).strip()

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        for _, _, parts in self._ids:
            parts.append(data)

    def rows(self, table_id: str) -> dict[str, list[str]]:
        """Body rows of a table keyed by their first cell (the header row is left out)."""
        return {r[0]: r[1:] for r in self.tables[table_id][1:]}
