"""Property-based fuzzing of spec and incident files (Hypothesis), shared by the test suite
(a bounded budget) and ``python -m bench fuzz`` (10,000+ cases per file kind).

A case starts from the small dataset's valid spec or incident, applies a few structural
mutations (delete a field, replace a value by anything Hypothesis draws or by a known
nasty value, append an injection), dumps it as YAML and may then damage the bytes (a
non-UTF-8 byte, a truncation, deep nesting, a BOM, UTF-16). The property: validating it in
process either succeeds or raises one ``SpecError`` whose message is one line naming a
field and a fix, and nothing is written (the warehouse file's hash, no WAL, the folder's
listing and the evidence root unchanged).
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import yaml
from hypothesis import strategies as st

from recovery.lib.catalog_checks import load_spec
from recovery.lib.errors import SpecError
from recovery.lib.incident.model import check_incident, parse_incident
from recovery_tests.support.small_dataset import build_small_dataset, spec_dict

FAILED = "bf-7"

NASTY: list[object] = [
    None,
    "",
    " ",
    "\x00",
    "a\x00b",
    "wh.duckdb\x00",
    -1,
    0,
    100000,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    float("inf"),
    float("nan"),
    True,
    [],
    {},
    [[]],
    "/",
    "/dev/zero",
    "/proc/self",
    "/proc/self/mem",
    "../../../../etc",
    "/etc/passwd",
    ".",
    "..",
    "-1GB",
    "0KB",
    "1e308",
    "x" * 5000,
    "é" * 50,
    "\u202e",
    "\ufeff",
    "; DROP TABLE src.order_events; --",
    '" OR 1=1 --',
    "{{ source }}",
    "{{ target }}",
    "2024-02-30",
    "9999-12-31",
    "0001-01-01",
    {"start": "2026-01-01", "end": "2026-02-01"},
    {"start": 1, "end": 2},
    ["put", "drop"],
    ["put", "put"],
    ["drop"],
    "orders.sql",
    "orders_by_shard.sql",
    "spec.yaml",
    "wh.duckdb",
]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(NASTY).map(copy.deepcopy),  # a copy: mutations must not touch NASTY
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def valid_incident() -> dict:
    return {
        "incident_id": "INC-FUZZ-1",
        "spec": "spec.yaml",
        "failed_generations": [FAILED],
        "requested_by": "ops-oncall",
        "approved_by": ["lead"],
        "notes": "fuzz",
        "evidence_root": "ev",
    }


def _paths(node, prefix=()) -> list[tuple]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    out = []
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(_paths(v, prefix + (k,)))
    return out


@st.composite
def mutated_document(draw, base: dict) -> bytes:
    """The bytes of a mutated spec or incident file."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(d)
        if not paths:
            break
        *parents, last = draw(st.sampled_from(paths))
        node = d
        for p in parents:
            node = node[p]
        op = draw(st.sampled_from(["delete", "value", "nasty", "inject"]))
        if op == "delete":
            del node[last]
        elif op == "value":
            node[last] = draw(_values)
        elif op == "nasty":
            node[last] = draw(st.sampled_from(NASTY).map(copy.deepcopy))
        else:
            node[last] = f"{node[last]}{draw(st.sampled_from(['; --', chr(0), chr(0xFF), '..', '/', '{{ x }}']))}"
    text = yaml.safe_dump(d, sort_keys=False, allow_unicode=draw(st.booleans()))
    data = text.encode("utf-8")
    damage = draw(
        st.sampled_from(
            ["none"] * 6 + ["byte", "insert", "truncate", "nest_flow", "nest_block", "bom", "utf16", "aliases", "tab"]
        )
    )
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if damage == "byte" and data:
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif damage == "insert":
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    elif damage == "truncate":
        data = data[:at]
    elif damage == "nest_flow":
        n = draw(st.sampled_from([30, 1000, 100_000]))
        data += b"\nnested: " + b"[" * n + b"]" * n + b"\n"
    elif damage == "nest_block":
        n = draw(st.sampled_from([25, 300]))
        data += b"\n" + b"".join(b"  " * i + b"k:\n" for i in range(n)) + b"  " * n + b"v\n"
    elif damage == "bom":
        data = b"\xef\xbb\xbf" + data
    elif damage == "utf16":
        data = text.encode("utf-16")
    elif damage == "aliases":
        data += b"\nlol0: &a0 [x, x, x, x, x, x, x, x, x]\n" + b"".join(
            b"lol%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n" % ((i, i) + (i - 1,) * 9)
            for i in range(1, 9)
        )
    elif damage == "tab":
        data = data.replace(b"  ", b"\t", 1)
    return data


def build_fuzz_dataset(directory: Path) -> Path:
    """The small dataset plus a target written by ``bf-7`` (incidents need one); returns the folder."""
    build_small_dataset(directory)
    con = duckdb.connect(str(directory / "wh.duckdb"))
    try:
        con.execute("CREATE SCHEMA mart")
        con.execute("""CREATE TABLE mart.orders AS
            SELECT region, order_no, region || '-' || strftime(placed_at, '%Y%m') AS shard, placed_at, qty, sku,
                   'bf-7' AS gen_id, rev AS src_rev, TIMESTAMP '2026-03-02 00:00:00' AS landed_at
            FROM src.order_events WHERE change = 'put'""")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return directory


@dataclass
class Tally:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    uncaught: list[str] = field(default_factory=list)
    multi_line: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "cases": self.cases,
            "outcomes": dict(self.outcomes),
            "uncaught": len(self.uncaught),
            "multi_line_errors": len(self.multi_line),
            "writes": len(self.writes),
        }


def _state(directory: Path) -> tuple:
    db = directory / "wh.duckdb"
    return hashlib.sha256(db.read_bytes()).hexdigest(), sorted(os.listdir(directory))


class FuzzTarget:
    """Validates one file kind in a dataset folder and tallies what happened."""

    def __init__(self, directory: Path, kind: str):
        self.directory = directory
        self.kind = kind
        self.tally = Tally()
        self.before = _state(directory)
        self.file = directory / f"fuzz_{kind}.yaml"

    def base(self) -> dict:
        return spec_dict() if self.kind == "spec" else valid_incident()

    def validate(self, data: bytes) -> None:
        self.file.write_bytes(data)
        try:
            try:
                if self.kind == "spec":
                    load_spec(self.file)
                else:
                    check_incident(parse_incident(self.file))
                self.tally.outcomes["valid"] += 1
            except SpecError as err:
                self.tally.outcomes[f"SpecError {err.field.split('[')[0].split('.')[0]}"] += 1
                text = str(err)
                if "\n" in text or "Fix:" not in text or not err.field:
                    self.tally.multi_line.append(text)
            except Exception as err:  # noqa: BLE001 - counting anything else is the point
                self.tally.outcomes[f"uncaught {type(err).__name__}"] += 1
                self.tally.uncaught.append(f"{type(err).__name__}: {str(err)[:300]}\n{data[:600]!r}")
        finally:
            self.file.unlink()
            self.tally.cases += 1
        after = _state(self.directory)
        if after != self.before:
            self.tally.writes.append(f"{after[1]} vs {self.before[1]}")
            self.before = after
