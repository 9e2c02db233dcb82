"""Ground truth for the worked example, written to schema ``truth``.

Only tests and benchmarks read it; the recovery code never does. It is computed
here in pandas, independently of the package's SQL classifier, from the damaged
target, the full change log, the delta log and the generation registry, applying
the damage vocabulary of ARCHITECTURE.md (one label per key, first match wins).
Agreement between the two implementations is what the reconciliation tests check.
"""

from __future__ import annotations

from datetime import datetime

import duckdb
import pandas as pd

from recovery.lib.control.plane import delta_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine.duckdb_engine import fetch_row
from recovery.lib.snapshot import expected_rows_sql


def _same(a: pd.Series, b: pd.Series) -> pd.Series:
    return (a == b) | (a.isna() & b.isna())


def build_truth(
    con: duckdb.DuckDBPyConnection, spec: DatasetSpec, *, failed_generation: str, watermark: datetime
) -> dict:
    """Compute and store ``truth.expected``, ``truth.damage`` and ``truth.partition_findings``."""
    meta = spec.target.metadata
    key, part = spec.key[0], spec.target.partition
    con.execute("CREATE SCHEMA IF NOT EXISTS truth")
    con.execute(f"CREATE OR REPLACE TABLE truth.expected AS {expected_rows_sql(spec, watermark)}")
    E = con.execute("SELECT * FROM truth.expected").df().set_index(key)
    T = con.execute(f"SELECT * FROM {spec.target.table_name.sql()}").df()
    src = con.execute(
        f"SELECT {key}, version, op, ingested_at FROM {spec.source.table_name.sql()} WHERE ingested_at <= ?",
        [watermark],
    ).df()
    latest = src.sort_values([key, "version"]).groupby(key).tail(1).set_index(key)
    arrived = src.set_index([key, "version"])["ingested_at"]
    delta = con.execute(
        f'SELECT {key}, "{meta.generation}" AS gen, "{meta.source_version}" AS sv, "{meta.written_at}" AS wat, '
        f"_delta_seq AS seq, _delta_op AS op FROM {delta_table(spec.dataset)}"
    ).df()
    start = fetch_row(con, "SELECT started_at FROM _recovery.generations WHERE generation = ?", [failed_generation])[0]

    payload = [c for c in E.columns if c not in (meta.source_version,)]
    no_part = [c for c in payload if c != part]
    counts = T.groupby(key).size()
    labels: dict = {}
    for k in counts[counts > 1].index:
        labels[k] = "duplicate"
    single = T[T[key].map(counts) == 1].set_index(key)
    # out_of_order: the failed generation wrote the key's row after it had already written a
    # newer version of the key, or applied its tombstone (a delete_keys write), per its write log
    tomb_seqs = set(
        con.execute(
            "SELECT seq FROM _recovery.writes WHERE generation = ? AND mode = 'delete_keys'", [failed_generation]
        ).df()["seq"]
    )
    f_log = delta[(delta["gen"] == failed_generation) & ((delta["op"] == "upsert") | delta["seq"].isin(tomb_seqs))]
    mine = single[single[meta.generation] == failed_generation][meta.source_version].rename("t_sv").reset_index()
    j = f_log.merge(mine, on=key)
    held_seq = j[(j["op"] == "upsert") & (j["sv"] == j["t_sv"])].groupby(key)["seq"].max()
    j["held_seq"] = j[key].map(held_seq)
    for k in set(j.loc[(j["sv"] > j["t_sv"]) & (j["seq"] < j["held_seq"]), key]):
        if k in E.index and all(
            _same(pd.Series([single.at[k, c]]), pd.Series([E.at[k, c]])).iloc[0] for c in E.columns
        ):
            continue  # the row equals the expected one: no damage
        labels.setdefault(k, "out_of_order")
    tomb = latest.index[latest["op"] == "delete"]
    for k in single.index.intersection(tomb):
        labels.setdefault(k, "resurrected")
    for k in single.index.difference(latest.index):
        labels.setdefault(k, "unexpected")

    # missing vs deleted: did the target hold the key when the failed generation started?
    before = delta[delta["wat"] <= start].sort_values("seq").groupby(key).tail(1)
    held = set(before.loc[before["op"] == "upsert", key])
    for k in E.index.difference(T[key].unique()):
        labels.setdefault(k, "deleted" if k in held else "missing")

    both = single.index.intersection(E.index)
    t, e = single.loc[both], E.loc[both]
    same_no_part = pd.concat([_same(t[c], e[c]) for c in no_part], axis=1).all(axis=1)
    same_part = _same(t[part], e[part])
    by_failed = t[meta.generation] == failed_generation
    older = t[meta.source_version] < e[meta.source_version]
    for k in both[(same_no_part & ~same_part).to_numpy()]:
        labels.setdefault(k, "mispartitioned")
    # overwritten: the newer version arrived after the failed generation started and another
    # generation had written it before the failed write clobbered it
    f_writes = delta[(delta["gen"] == failed_generation) & (delta["op"] == "upsert")].groupby(key)["seq"].max()
    cand = both[(older & by_failed).to_numpy()]
    cand = cand[~cand.isin(list(labels))]
    c = pd.DataFrame(
        {
            key: cand,
            "t_sv": t.loc[cand, meta.source_version].to_numpy(),
            "e_sv": e.loc[cand, meta.source_version].to_numpy(),
        }
    )
    c["clobber_seq"] = c[key].map(f_writes)
    c["newer_at"] = [arrived.get((k, int(v))) for k, v in zip(c[key], c["e_sv"])]
    others = delta[(delta["gen"] != failed_generation) & (delta["op"] == "upsert")][[key, "sv", "seq"]]
    m = c.merge(others, on=key, how="left")
    m = m[(m["sv"] > m["t_sv"]) & (m["seq"] < m["clobber_seq"])]
    concurrent = set(m[key])
    for k, newer_at in zip(c[key], c["newer_at"]):
        over = newer_at is not None and newer_at > start and k in concurrent
        labels[k] = "overwritten" if over else "stale"
    equal_version = t[meta.source_version] == e[meta.source_version]
    for k in both[(equal_version & ~(same_no_part & same_part)).to_numpy()]:
        labels.setdefault(k, "incorrectly_transformed")

    damage = pd.DataFrame({key: list(labels.keys()), "label": list(labels.values())})
    con.execute("CREATE OR REPLACE TABLE truth.damage AS SELECT * FROM damage")

    # partition-level findings
    findings = []
    f_rows = T[T[meta.generation] == failed_generation]
    old_rows = T[(T[meta.generation] != failed_generation) & (T[meta.written_at] < start)]
    for p in sorted(set(f_rows[part]) & set(old_rows[part])):
        findings.append((p, "partially_updated"))
    te = T.groupby(part).size().rename("t").to_frame().join(E.groupby(part).size().rename("e"), how="outer").fillna(0)
    findings += [(p, "count_mismatch") for p in te.index[te["t"] != te["e"]]]
    if spec.target.amount:
        a = spec.target.amount
        # the amount is a DECIMAL that pandas reads as float: summing floats in two row orders can
        # differ in the last bit where the exact totals are equal, so sum whole units of its scale instead
        amount_type, scale = fetch_row(
            con,
            "SELECT data_type, numeric_scale FROM information_schema.columns WHERE table_schema = 'truth' "
            "AND table_name = 'expected' AND column_name = ?",
            [a],
        )

        def units(frame: pd.DataFrame) -> pd.Series:
            if not amount_type.startswith("DECIMAL"):  # compare the sums as they are
                return frame.groupby(part)[a].sum()
            return (frame[a] * 10 ** int(scale)).round().astype("Int64").groupby(frame[part]).sum()

        ta = units(T).rename("t").to_frame().join(units(E.reset_index()).rename("e"), how="outer").fillna(0)
        findings += [(p, "total_mismatch") for p in ta.index[ta["t"] != ta["e"]]]
    pf = pd.DataFrame(findings, columns=[part, "finding"])
    # pandas turns DATE partitions into timestamps: store them with the target's partition type
    ptype = fetch_row(
        con,
        "SELECT data_type FROM information_schema.columns WHERE table_schema = 'truth' AND table_name = 'expected' "
        "AND column_name = ?",
        [part],
    )[0]
    con.execute(
        f'CREATE OR REPLACE TABLE truth.partition_findings AS SELECT CAST("{part}" AS {ptype}) AS "{part}", finding '
        "FROM pf"
    )
    return damage["label"].value_counts().to_dict()
