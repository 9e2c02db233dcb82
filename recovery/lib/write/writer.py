"""The generation-aware writer: the only path by which managed datasets change.

Each write is one transaction that (1) takes the next commit sequence number,
(2) checks the writer's generation against the fence registry by a
compare-and-set on the generation's row, so a fence committed concurrently makes
this transaction conflict and land nothing, (3) changes the physical namespace,
(4) appends every inserted and deleted row to the dataset's delta log and (5)
records the write. A refused write is then counted as a fence attempt.

Contention between processes (DuckDB admits one writer process per file) and
write-write conflicts are retried with bounded, jittered backoff; a fence is never
retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

from recovery.lib import faults
from recovery.lib.control.plane import (
    SCHEMA,
    SOURCE_WATERMARKS,
    SOURCE_WATERMARKS_DDL,
    delta_table,
    ensure_control_plane,
    next_seq,
    utcnow,
)
from recovery.lib.engine.base import RetryableConflict, Session
from recovery.lib.errors import DuplicateKeyError, FencedGenerationError, RecoveryError, SchemaMismatchError
from recovery.lib.identifiers import TableName, naive_utc, quote, quote_all
from recovery.lib.pointers.namespaces import create_or_adopt, current_namespace, namespace_sql
from recovery.lib.retry import retrying
from recovery.lib.write.generations import GenerationRegistry

WriteMode = Literal["replace_partitions", "upsert_keys", "append", "delete_keys"]
T = TypeVar("T")


@dataclass(frozen=True)
class WriteResult:
    seq: int
    generation: str
    namespace: str
    mode: str
    rows_inserted: int
    rows_deleted: int
    partitions: tuple[str, ...]


class Writer(GenerationRegistry):
    """Writes one dataset's generations (registered and fenced through :class:`GenerationRegistry`). Build one per
    dataset spec."""

    # ---- set-up -------------------------------------------------------------------------
    def ensure(self) -> str:
        """Control plane plus the dataset's public view; adopts a plain table. Returns the
        namespace the public name points at."""

        def txn() -> str:
            with self.engine.transaction() as s:
                ensure_control_plane(s)
                return create_or_adopt(s, self.spec, actor=self.actor)

        return retrying(txn)

    # ---- writes -------------------------------------------------------------------------
    def write(
        self,
        generation: str,
        rows_sql: str,
        *,
        mode: WriteMode,
        partitions: list[Any] | None = None,
        token: int | None = None,
        at: datetime | None = None,
        run_id: str | None = None,
        note: str | None = None,
        params: list[Any] | None = None,
        keep_stamps: bool = False,
        allow_duplicate_keys: bool = False,
        source_watermark: datetime | None = None,
        watermark_basis: str | None = None,
    ) -> WriteResult:
        """Apply ``rows_sql`` (payload columns plus the source-version column) as ``generation``.

        ``replace_partitions`` deletes the listed partitions (default: those in the rows)
        then inserts; ``upsert_keys`` replaces rows with the same key wherever they sit;
        ``append`` only inserts; ``delete_keys`` removes the keys (rows hold key and source
        version: the tombstone's version is what the delta log records).

        In every mode a batch with two rows (or tombstones) for one key raises
        :class:`~recovery.lib.errors.DuplicateKeyError` inside the transaction and nothing
        lands: which row should win is the caller's decision, not the writer's. So does a
        ``replace_partitions`` or ``append`` batch whose key the namespace still holds outside
        the replaced partitions (a key moving partition, a retried append), unless that row
        belongs to a fenced generation: known damage, which the repair removes, and normal
        ingestion must keep running during an incident.

        Keys are compared as the namespace stores them: the rows are first cast to its column
        types (a DOUBLE ``100000.4`` offered for a BIGINT key is the key ``100000``, in the batch
        and against the table), and a batch with a NULL key part is refused in every mode (a key
        is a row's identity; NULL is none, so two NULL-keyed rows could never be told apart).

        ``allow_duplicate_keys`` lifts the second check only, to reproduce the faulty
        pipelines whose damage this package repairs (the worked example's backfill, the
        tests' damage); no path of the package passes it, and the write log notes it.

        ``source_watermark`` is what the rows applied: every change that arrived in the source at
        or before it is in them (for ``replace_partitions``, in the replaced partitions; otherwise
        in the whole dataset). It is recorded with the write, in its transaction, with
        ``watermark_basis`` saying who knows it; convergence verification reads it, so changes
        after it are pending (ingestion has not reached them), not drift.
        """
        if mode not in ("replace_partitions", "upsert_keys", "append", "delete_keys"):
            raise RecoveryError(f"mode {mode!r} is not one of replace_partitions, upsert_keys, append, delete_keys")
        written_at = at or utcnow()
        lifted = allow_duplicate_keys and mode in ("replace_partitions", "append")

        def txn() -> WriteResult:
            with self.engine.transaction() as s:
                result = self.write_in(
                    s,
                    generation,
                    rows_sql,
                    mode=mode,
                    partitions=partitions,
                    token=token,
                    at=written_at,
                    run_id=run_id,
                    params=params,
                    keep_stamps=keep_stamps,
                    note=f"{note + '; ' if note else ''}duplicate keys allowed" if lifted else note,
                    existing_keys=not allow_duplicate_keys,
                    source_watermark=source_watermark,
                    watermark_basis=watermark_basis,
                )
                faults.checkpoint("write:recorded")  # the rows and their write record, not committed
                return result

        try:
            return retrying(txn)
        except FencedGenerationError as err:
            self.record_fence_attempt(generation, f"write:{mode}", run_id=run_id, detail=str(err))
            raise

    def write_in(
        self,
        s: Session,
        generation: str,
        rows_sql: str,
        *,
        mode: WriteMode,
        partitions: list[Any] | None = None,
        token: int | None = None,
        at: datetime | None = None,
        run_id: str | None = None,
        note: str | None = None,
        params: list[Any] | None = None,
        keep_stamps: bool = False,
        log_delta: bool = True,
        existing_keys: bool = True,
        source_watermark: datetime | None = None,
        watermark_basis: str | None = None,
    ) -> WriteResult:
        """:meth:`write` inside the caller's transaction ``s`` (no retry: the caller owns it), for a
        step whose write must commit with its own bookkeeping (a repair plan's carry-over, the delta
        replay, a guarded backfill's seed). ``log_delta=False`` keeps the write out of the delta log
        (a copy into a namespace of its own that ingestion must not replay); ``existing_keys=False``
        is what ``allow_duplicate_keys`` sets."""
        written_at = at or utcnow()
        seq = next_seq(s)
        token_clause = "AND token = ?" if token is not None else ""
        row = s.fetchone(
            f"UPDATE {SCHEMA}.generations SET writes = writes + 1, last_write_seq = ? "
            f"WHERE generation = ? AND dataset = ? AND fenced_at IS NULL {token_clause} RETURNING namespace",
            [seq, generation, self.spec.dataset] + ([token] if token is not None else []),
        )
        if row is None:
            known = s.fetchone(f"SELECT fenced_at, token FROM {SCHEMA}.generations WHERE generation = ?", [generation])
            if known is None:
                raise RecoveryError(
                    f"generation {generation!r} is not registered for dataset {self.spec.dataset!r}; "
                    f"register it (Writer.register_generation) before writing"
                )
            raise FencedGenerationError(generation, f"fenced at {known[0]}" if known[0] else f"stale token {token}")
        ns = row[0] or current_namespace(s, self.spec)
        if ns is None:
            raise RecoveryError(f"dataset {self.spec.dataset!r} has no published namespace; run Writer.ensure() first")
        ns_sql = namespace_sql(ns)
        cols = [c for c, _ in s.columns(ns_sql)]
        types = dict(s.columns(ns_sql))
        payload = [c for c in cols if c not in (self.meta.generation, self.meta.written_at)]
        s.temp_table("__incoming", f"SELECT * FROM ({rows_sql}) AS r", params or [])
        incoming = [c for c, _ in s.columns("__incoming")]
        needed = self.spec.key + [self.meta.source_version] if mode == "delete_keys" else payload
        if keep_stamps and mode != "delete_keys":
            needed = cols
        missing = [c for c in needed if c not in incoming]
        if missing:
            raise SchemaMismatchError(
                f"rows written as {generation!r} lack columns {missing} of {self.public} (they have {incoming})"
            )
        self._cast_incoming(s, types, generation)
        self._refuse_null_keys(s, generation, mode)
        key = quote_all(self.spec.key)
        # every mode, in this transaction: a batch holding one key twice would leave both rows
        # (upsert deletes the key once, then inserts each row); nothing is guessed, the write fails.
        # Compared as the namespace stores them (after the cast): 100000.0 and 100000.4 into a BIGINT are one key
        dup = s.fetchone(f"SELECT {key}, count(*) FROM __incoming GROUP BY ALL HAVING count(*) > 1 LIMIT 1")
        if dup:
            n_keys = s.scalar(f"SELECT count(*) FROM (SELECT {key} FROM __incoming GROUP BY ALL HAVING count(*) > 1)")
            raise DuplicateKeyError(
                f"write {mode} as {generation!r} to {self.public} refused: key {self.spec.key} = {tuple(dup[:-1])} "
                f"occurs {dup[-1]} times in one batch ({n_keys} such keys); nothing was written. Fix: make the rows "
                f"one per key (e.g. the transform must not fan out rows, or keep each key's latest version)"
            )
        part = quote(self.spec.target.partition)
        delta = delta_table(self.spec.dataset)
        all_cols = quote_all(cols)
        stamped = ", ".join(
            "?"
            if c == self.meta.generation
            else "CAST(? AS TIMESTAMP)"
            if c == self.meta.written_at
            else f"i.{quote(c)}"
            for c in cols
        )
        stamp_params = [
            generation if c == self.meta.generation else written_at
            for c in cols
            if c in (self.meta.generation, self.meta.written_at)
        ]
        removal_params = stamp_params
        if keep_stamps:
            stamped, stamp_params = ", ".join(f"i.{quote(c)}" for c in cols), []

        if mode == "replace_partitions":
            if partitions is None:
                s.temp_table("__scope", f"SELECT DISTINCT {part} AS p FROM __incoming")
            else:
                s.temp_table(
                    "__scope",
                    "SELECT DISTINCT CAST(u AS "
                    f"{types[self.spec.target.partition]}) AS p "
                    f"FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS u)",
                    [[str(p) for p in partitions]],
                )
            in_scope = f"{part} IN (SELECT p FROM __scope)"
        elif mode in ("upsert_keys", "delete_keys"):
            in_scope = f"({key}) IN (SELECT {key} FROM __incoming)"
        else:
            in_scope = "false"
        if existing_keys and mode in ("replace_partitions", "append"):
            # before anything is written: a key the namespace keeps outside the removed rows
            self._refuse_held_keys(
                s,
                ns_sql,
                generation,
                mode,
                replaced=f"t.{part} IN (SELECT p FROM __scope)" if mode == "replace_partitions" else None,
            )

        # delta log: rows removed and not re-inserted by this write (stamped with this write's
        # generation and time; a tombstone carries its own version), then rows inserted
        def removed(version_from: str, key_from: str = "t") -> str:
            return ", ".join(
                "?"
                if c == self.meta.generation
                else "CAST(? AS TIMESTAMP)"
                if c == self.meta.written_at
                else f"{version_from}.{quote(c)}"
                if c == self.meta.source_version
                else f"{key_from}.{quote(c)}"
                if c in self.spec.key
                else f"t.{quote(c)}"
                for c in cols
            )

        # the changes themselves are engine primitives (Session.replace_rows), not DML text
        log_cols = cols + ["_delta_seq", "_delta_op", "_delta_namespace"]
        if not log_delta:
            pass
        elif mode == "delete_keys":
            # every tombstone is logged, held here or not: a repair generation may hold the key
            # even where this namespace lost it, and the replay must still delete it there
            join = " AND ".join(f"t.{quote(k)} = i.{quote(k)}" for k in self.spec.key)
            s.replace_rows(
                delta,
                log_cols,
                params=removal_params + [seq, ns],
                insert=(
                    f"SELECT {removed('i', key_from='i')}, ?, 'delete', ? FROM __incoming AS i LEFT JOIN {ns_sql} AS t "
                    f"ON {join}"
                ),
            )
        elif mode != "append":
            s.replace_rows(
                delta,
                log_cols,
                params=removal_params + [seq, ns],
                insert=(
                    f"SELECT {removed('t')}, ?, 'delete', ? FROM {ns_sql} AS t WHERE {in_scope} "
                    f"AND ({key}) NOT IN (SELECT {key} FROM __incoming)"
                ),
            )
        deleted = int(s.scalar(f"SELECT count(*) FROM {ns_sql} WHERE {in_scope}") or 0) if mode != "append" else 0
        s.replace_rows(
            ns_sql,
            cols,
            params=stamp_params,
            remove=in_scope if mode != "append" else None,
            insert=f"SELECT {stamped} FROM __incoming AS i" if mode != "delete_keys" else None,
        )
        inserted = int(s.scalar("SELECT count(*) FROM __incoming") or 0) if mode != "delete_keys" else 0
        if mode != "delete_keys" and log_delta:
            s.replace_rows(
                delta,
                log_cols,
                params=stamp_params + [seq, ns],
                insert=f"SELECT {stamped}, ?, 'upsert', ? FROM __incoming AS i",
            )
        touched = (
            [
                r[0]
                for r in s.fetchall(
                    f"SELECT DISTINCT CAST(p AS VARCHAR) FROM (SELECT {part} AS p FROM __incoming "
                    + ("UNION SELECT p FROM __scope" if mode == "replace_partitions" else "")
                    + ") WHERE p IS NOT NULL ORDER BY 1"
                )
            ]
            if mode != "delete_keys"
            else []
        )
        s.execute(
            f"INSERT INTO {SCHEMA}.writes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                seq,
                self.spec.dataset,
                generation,
                ns,
                mode,
                touched,
                inserted,
                deleted,
                written_at,
                utcnow(),
                run_id,
                note,
            ],
        )
        if source_watermark is not None:
            s.execute(SOURCE_WATERMARKS_DDL)
            s.execute(
                f"INSERT INTO {SOURCE_WATERMARKS} VALUES (?, ?, ?, ?, ?, ?)",
                [
                    seq,
                    self.spec.dataset,
                    generation,
                    naive_utc(source_watermark),
                    touched if mode == "replace_partitions" else None,
                    watermark_basis or "given by the writer's caller",
                ],
            )
        s.drop_relation("__incoming")
        s.drop_relation("__scope")
        return WriteResult(seq, generation, ns, mode, inserted, deleted, tuple(touched))

    def _cast_incoming(self, s: Session, types: dict[str, str], generation: str) -> None:
        """Make ``__incoming`` hold each of the namespace's columns as the namespace's type, so every
        comparison (one key twice in the batch, a key the namespace holds, the rows an upsert
        replaces) sees the values the insert would store: a DOUBLE 100000.4 offered for a BIGINT key
        is the key 100000, not a value no stored key equals."""
        have = s.columns("__incoming")
        recast = {c for c, t in have if c in types and t != types[c]}
        if not recast:
            return
        select = ", ".join(
            f"CAST({quote(c)} AS {types[c]}) AS {quote(c)}" if c in recast else quote(c) for c, _ in have
        )
        try:
            s.temp_table("__incoming_cast", f"SELECT {select} FROM __incoming")
        except RetryableConflict:
            raise
        except Exception as err:  # a value the column's type cannot hold: the insert would fail on it too
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            wanted = ", ".join(f"{c} {types[c]}" for c in sorted(recast))
            raise SchemaMismatchError(
                f"rows written as {generation!r} to {self.public} do not fit its column types ({wanted}): {first}; "
                f"nothing was written. Fix: give those columns values of the table's types"
            ) from err
        s.temp_table("__incoming", "SELECT * FROM __incoming_cast")
        s.drop_relation("__incoming_cast")

    def _refuse_null_keys(self, s: Session, generation: str, mode: str) -> None:
        """Refuse a batch in which a key column is NULL: a key is a row's identity, and NULL is no value,
        so two batches offering ``(NULL, 555555)`` could never be told to be one key or two (SQL's ``=``
        says neither). The repair's gates refuse NULL keys too (``repair_keys``)."""
        counts = ", ".join(f"sum(CASE WHEN {quote(k)} IS NULL THEN 1 ELSE 0 END)" for k in self.spec.key)
        row = s.fetchone(f"SELECT {counts} FROM __incoming")
        nulls = [(k, int(n)) for k, n in zip(self.spec.key, row or (), strict=False) if n]
        if not nulls:
            return
        named = ", ".join(f"{k} in {n} rows" for k, n in nulls)
        raise DuplicateKeyError(
            f"write {mode} as {generation!r} to {self.public} refused: key {self.spec.key} has NULL parts ({named}); "
            f"a key identifies one row and NULL identifies none; nothing was written. Fix: give every row a value "
            f"for {', '.join(k for k, _ in nulls)} (fill it, or drop the rows, before writing)"
        )

    def _refuse_held_keys(self, s: Session, ns_sql: str, generation: str, mode: str, *, replaced: str | None) -> None:
        """Refuse (inside the write's transaction, before it changes anything) incoming keys the
        namespace keeps once the replaced partitions (``replaced``: the predicate on its rows ``t`` that
        the write removes; None for an append) are gone: inserting them would leave two rows for one key."""
        key = quote_all(self.spec.key)
        # an inner join, so the engine builds its hash table on the smaller side (the batch, not the table);
        # rows of a fenced generation are known damage the repair removes: normal ingestion keeps running
        gen = quote(self.meta.generation)
        outside = f"NOT coalesce({replaced}, false) AND " if replaced else ""
        held = (
            f"SELECT DISTINCT {key} FROM __incoming JOIN {ns_sql} AS t USING ({key}) WHERE {outside}(t.{gen} IS NULL "
            f"OR t.{gen} "
            f"NOT IN (SELECT generation FROM {SCHEMA}.generations WHERE fenced_at IS NOT NULL))"
        )
        clash = s.fetchone(f"{held} LIMIT 1")
        if clash is None:
            return
        n_keys = s.scalar(f"SELECT count(*) FROM ({held})")
        where = "outside the replaced partitions" if mode == "replace_partitions" else "already"
        raise DuplicateKeyError(
            f"write {mode} as {generation!r} to {self.public} refused: key {self.spec.key} = {tuple(clash)} is {where} "
            f"in the table ({n_keys} such keys); nothing was written. Fix: write those keys with mode "
            "upsert_keys (a key "
            f"that moved partition), or replace the partitions that hold them"
        )


__all__ = ["Writer", "WriteResult", "TableName"]
