"""Sensitive columns followed by lineage, not by name.

A consumer that writes ``any_value(customer_id) AS top_customer`` holds a customer id
under another name; hashing evidence columns by name alone would copy it in clear.
So the transform and every consumer SQL are read with sqlglot's column lineage: a
target column is sensitive when declared (``target.sensitive``) or derived from a
declared source column (``source.sensitive``), and a consumer's output column is
sensitive when derived from a sensitive target column. The evidence bundle hashes
all of them.

Some SQL exposes a sensitive value where no column hash can hide it: a PIVOT on a
sensitive column turns its values into column *names*. Such a consumer (or a SQL
whose lineage sqlglot cannot follow while it mentions a sensitive column) is refused
at spec time, naming the column and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
import sqlglot.expressions as exp

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Exposure:
    """A place where a sensitive value would leave in a form no column hash can cover."""

    field: str  # the spec field, e.g. downstream[2].sql
    column: str  # the sensitive column involved
    why: str
    fix: str = "hash or drop the value in the SQL (e.g. sha256(col)), or do not pivot on it"


@dataclass(frozen=True)
class SensitiveLineage:
    target: frozenset[str]  # target columns holding or derived from a sensitive value
    consumers: dict[str, frozenset[str]] = field(default_factory=dict)  # consumer name -> derived output columns
    exposures: tuple[Exposure, ...] = ()
    # consumer name -> (positions of its derived outputs, how many outputs the lineage resolved)
    consumer_positions: dict[str, tuple[frozenset[int], int]] = field(default_factory=dict)

    def all_columns(self) -> set[str]:
        return set(self.target).union(*self.consumers.values()) if self.consumers else set(self.target)


@dataclass(frozen=True)
class OutputLineage:
    """What one SQL's outputs take from sensitive columns."""

    names: dict[str, set[str]]  # output name (as sqlglot names it) -> sensitive input columns
    positions: dict[int, set[str]]  # output position -> sensitive input columns (names can repeat or differ)
    width: int  # how many outputs sqlglot resolved (the relation has as many when it resolved them all)
    opaque: list[tuple[str, str]]  # (output, why): a use of the input no column lineage can follow


def derived_outputs(sql: str, placeholder: str, columns: dict[str, str], sensitive: set[str]) -> dict[str, set[str]]:
    """For each output column of ``sql`` (which reads ``{{ placeholder }}`` shaped like
    ``columns``), the sensitive input columns it derives from (empty sets left out).
    Raises ``ValueError`` when the lineage cannot be followed."""
    return output_lineage(sql, placeholder, columns, sensitive).names


def output_lineage(
    sql: str,
    placeholder: str,
    columns: dict[str, str],
    sensitive: set[str],
    *,
    by_name: frozenset[str] = frozenset(),
) -> OutputLineage:
    """:func:`derived_outputs` by name and by position, plus the uses of the input that no lineage
    can follow while the input holds a sensitive column: a whole row (``t``, ``to_json(t)``,
    ``CAST(t AS VARCHAR)``, ``struct_extract(t, 'a' || 'b')``), a star inside an expression, a
    ``COLUMNS(...)`` the check cannot resolve to the columns it selects, a relation named at run time
    (``query_table``) and ``by_name`` relations (the dataset's own tables read by name, not through
    the placeholder). ``COLUMNS('regex')`` and ``COLUMNS(['a', 'b'])`` over the placeholder are
    expanded first, so a sensitive column selected by pattern is followed like one selected by name.
    Raises ``ValueError`` when the lineage cannot be followed."""
    name = f"__{placeholder}__"
    text = _PLACEHOLDER.sub(name, sql.strip().rstrip(";"))
    schema: dict[str, object] = {name: dict(columns)}
    # sqlglot's lineage and optimizer load here, not with every command (a tenth of a second)
    from sqlglot.lineage import lineage
    from sqlglot.optimizer.qualify import qualify

    try:
        parsed = sqlglot.parse_one(text, read="duckdb")
        opaque = _expand_columns(parsed, name, list(columns))
        opaque += _by_name_reads(parsed, by_name)
        tree = qualify(parsed, schema=schema, dialect="duckdb")
        if not isinstance(tree, exp.Query):  # only a query has output columns to follow
            raise ValueError(f"not a query: {text[:200]}")
        names = list(tree.named_selects)
        opaque += _unfollowable(tree, name, {c.lower() for c in columns})
        # one lineage per position: two outputs may share a name (DuckDB keeps both)
        outer = tree
        while isinstance(outer, exp.SetOperation):
            outer = outer.this
        renamed = tree.copy()
        first = renamed
        while isinstance(first, exp.SetOperation):
            first = first.this
        for i, proj in enumerate(first.expressions):
            if isinstance(proj, exp.Alias):
                proj.set("alias", exp.to_identifier(f"__out{i}"))
            else:
                proj.replace(exp.alias_(proj.copy(), f"__out{i}"))
        by_name_out: dict[str, set[str]] = {}
        by_pos: dict[int, set[str]] = {}
        # every output's lineage from one qualification of the query (sqlglot shares the work across them)
        nodes = lineage(None, renamed, schema=schema, dialect="duckdb")
        for i, col in enumerate(names):
            node = nodes[f"__out{i}"]
            leaves = {n.name.split(".")[-1].strip('"') for n in node.walk() if not n.downstream}
            hits = {c for c in leaves if c.lower() in sensitive}
            if hits:
                by_pos[i] = hits
                by_name_out.setdefault(col, set()).update(hits)
        return OutputLineage(by_name_out, by_pos, len(names), opaque)
    except (sqlglot.errors.SqlglotError, RecursionError, KeyError, AttributeError, IndexError) as e:
        raise ValueError(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}") from None


def _output_of(node: exp.Expr, root: exp.Expr) -> str:
    """The output column of ``root`` a node sits in (its alias), or where it sits."""
    outer = root
    while isinstance(outer, exp.SetOperation):
        outer = outer.this
    cur: exp.Expr | None = node
    while cur is not None and cur.parent is not None:
        if cur.parent is outer and cur in outer.expressions:
            return cur.alias_or_name or cur.sql("duckdb")[:60]
        cur = cur.parent
    return "a subquery's column"


def _expand_columns(tree: exp.Expr, table: str, columns: list[str]) -> list[tuple[str, str]]:
    """Replace each ``COLUMNS('regex')`` / ``COLUMNS(['a', ...])`` over the placeholder by the columns it
    selects (DuckDB's partial regex match); any other ``COLUMNS`` is a use no lineage follows."""
    opaque = []
    for node in list(tree.find_all(exp.Columns)):
        where = _output_of(node, tree)
        select = node.find_ancestor(exp.Select)
        sources = (
            [select.args.get("from_") or select.args.get("from")] + list(select.args.get("joins") or [])
            if select
            else []
        )
        direct = (
            select is not None
            and len(sources) == 1
            and sources[0] is not None
            and isinstance(sources[0].this, exp.Table)
            and sources[0].this.name == table
            and not sources[0].this.args.get("db")
        )
        arg = node.this
        matched: list[str] | None = None
        if direct and isinstance(arg, exp.Literal) and arg.is_string:
            try:
                pattern = re.compile(arg.this)
                matched = [c for c in columns if pattern.search(c)]
            except re.error:
                matched = None
        elif (
            direct
            and isinstance(arg, exp.Array)
            and all(isinstance(e, exp.Literal) and e.is_string for e in arg.expressions)
        ):
            wanted = {e.this.lower() for e in arg.expressions}
            matched = [c for c in columns if c.lower() in wanted]
        if not matched:
            opaque.append((where, f"COLUMNS({arg.sql('duckdb')[:60]}) selects columns the check cannot resolve"))
            continue
        cols = [exp.column(c, quoted=True) for c in matched]
        if select is None:  # not reached: ``direct`` needs the select
            continue
        bare = node.parent is select and node in select.expressions
        if len(cols) == 1:
            node.replace(cols[0])
        elif bare:
            at = select.expressions.index(node)
            select.set("expressions", select.expressions[:at] + cols + select.expressions[at + 1 :])
        else:
            opaque.append((where, f"COLUMNS({arg.sql('duckdb')[:60]}) inside an expression selects several columns"))
    return opaque


def _by_name_reads(tree: exp.Expr, by_name: frozenset[str]) -> list[tuple[str, str]]:
    opaque = []
    for t in tree.find_all(exp.Table):
        fn = t.this
        if isinstance(fn, exp.Func | exp.Anonymous):
            fname = (fn.name if isinstance(fn, exp.Anonymous) else fn.sql_name()).lower()
            if fname in ("query", "query_table"):
                opaque.append(("its FROM", f"{fname}(...) reads a relation named at run time"))
            continue
        full = f"{t.db}.{t.name}".lower() if t.db else t.name.lower()
        if full in by_name or any(full.startswith(n + "__") for n in by_name if "." in n):
            opaque.append(("its FROM", f"it reads {full} by name, which the check cannot follow"))
    return opaque


def _unfollowable(tree: exp.Expr, table: str, columns: set[str]) -> list[tuple[str, str]]:
    """Uses of an input no column lineage follows: a whole row, a star inside an expression, a name
    the input does not have (a struct field read from a row)."""
    from sqlglot.optimizer.scope import Scope, traverse_scope

    opaque = []
    for star in tree.find_all(exp.Star):
        parent = star.parent
        holder = parent.parent if isinstance(parent, exp.Column) else parent
        if isinstance(holder, exp.Count) or (isinstance(holder, exp.Select) and star in holder.expressions):
            continue
        opaque.append((_output_of(star, tree), "a star inside an expression takes the whole row"))
    for select in tree.find_all(exp.Select):  # DuckDB renames a repeated name (sku_1): no lineage knows which is which
        names = [n.lower() for n in select.named_selects]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            opaque.append((dup, f"{names.count(dup)} outputs of one SELECT are named {dup}"))
    for row in tree.find_all(exp.TableColumn):  # DuckDB reads a relation's name as its whole row
        opaque.append((_output_of(row, tree), f"{row.sql('duckdb')} is a whole row"))
    for scope in traverse_scope(tree):
        for col in scope.columns:
            if isinstance(col.this, exp.Star):
                continue  # counted above
            source = None
            cur: Scope | None = scope
            while cur is not None and source is None:
                source = cur.sources.get(col.table) if col.table else None
                cur = cur.parent
            if not col.table or source is None:
                opaque.append(
                    (_output_of(col, tree), f"{col.sql('duckdb')} is a whole row or a name the input does not have")
                )
                continue
            if isinstance(source, Scope):
                known = {n.lower() for n in getattr(source.expression, "named_selects", ["*"])}
                if "*" in known:
                    continue
            elif isinstance(source, exp.Table) and source.name == table:
                known = columns
            else:
                continue  # another table: its columns are not the dataset's
            if col.name.lower() not in known:
                opaque.append(
                    (_output_of(col, tree), f"{col.sql('duckdb')} is a whole row or a name the input does not have")
                )
    return opaque


def _pivot_exposures(sql: str, placeholder: str, sensitive: set[str], fld: str) -> list[Exposure]:
    name = f"__{placeholder}__"
    try:
        tree = sqlglot.parse_one(_PLACEHOLDER.sub(name, sql), read="duckdb")
    except (sqlglot.errors.SqlglotError, RecursionError):
        return []
    found = []
    for pivot in tree.find_all(exp.Pivot):
        if pivot.args.get("unpivot"):
            continue  # column names become values: no value becomes a name
        # DuckDB's PIVOT t ON col USING agg keeps the ON columns in expressions; standard PIVOT in fields
        on = (pivot.args.get("expressions") or []) if pivot.args.get("using") else (pivot.args.get("fields") or [])
        for f in on:
            for c in f.find_all(exp.Column):
                if c.name.lower() in sensitive:
                    found.append(
                        Exposure(
                            fld,
                            c.name,
                            "a PIVOT on it turns its values into column names, which no column hash can hide",
                        )
                    )
    return found


_OPAQUE_FIX = (
    "select the sensitive column by its name or through a value expression (its output is then hashed in "
    "evidence) under a name no other output of its SELECT has, or hash or drop it in the SQL (e.g. sha256(col)); "
    "not as a whole row, to_json/CAST/struct of a row, a star inside a function, a COLUMNS(...) the check cannot "
    "resolve, or a relation named at run time"
)


def follow_sensitive(spec, source_columns: dict[str, str], target_columns: dict[str, str]) -> SensitiveLineage:
    """The sensitive columns of the target and of every consumer, by lineage through the
    transform (over the source) and each consumer's SQL (over the target); and what no lineage can
    follow, as exposures the spec check refuses."""
    src_sensitive = {c.lower() for c in spec.source.sensitive}
    target = {c.lower() for c in spec.target.sensitive}
    exposures: list[Exposure] = []
    own = _own_relations(spec)
    # key columns keep their names through the transform: a sensitive key stays sensitive
    target |= {c.lower() for c in spec.source.key if c.lower() in src_sensitive}
    if src_sensitive and spec.transform_sql:
        pivots = _pivot_exposures(spec.transform_sql, "source", src_sensitive, "target.transform")
        exposures += pivots
        try:
            followed = output_lineage(spec.transform_sql, "source", source_columns, src_sensitive, by_name=own)
            target |= {c.lower() for c in followed.names}
            exposures += _opaque_exposures("target.transform", "the transform", followed, src_sensitive)
        except ValueError as e:
            if _mentions(spec.transform_sql, src_sensitive) and not pivots:
                exposures.append(
                    Exposure(
                        "target.transform",
                        ", ".join(sorted(src_sensitive & _words(spec.transform_sql))),
                        f"its lineage cannot be followed ({e}), so derived columns cannot be hashed",
                    )
                )
    consumers: dict[str, frozenset[str]] = {}
    positions: dict[str, tuple[frozenset[int], int]] = {}
    for i, d in enumerate(spec.downstream):
        sql = spec.downstream_sql.get(d.name, "")
        fld = f"downstream[{i}].sql"
        if not target or not sql:
            consumers[d.name] = frozenset()
            continue
        pivots = _pivot_exposures(sql, "target", target, fld)  # the precise reason first
        exposures += pivots
        try:
            lin = output_lineage(sql, "target", target_columns, target, by_name=own)
        except ValueError as e:
            lin = OutputLineage({}, {}, 0, [])
            if not pivots:  # a dynamic name need not mention the column: any unfollowable consumer is refused
                exposures.append(
                    Exposure(
                        fld,
                        ", ".join(sorted(target & _words(sql)) or sorted(target)),
                        f"consumer {d.name}: its lineage cannot be followed ({e}), so its outputs derived from a "
                        f"sensitive column cannot be hashed",
                        _OPAQUE_FIX,
                    )
                )
        if not pivots:
            exposures += _opaque_exposures(fld, f"consumer {d.name}", lin, target)
        consumers[d.name] = frozenset(c.lower() for c in lin.names)
        positions[d.name] = (frozenset(lin.positions), lin.width)
    return SensitiveLineage(frozenset(target), consumers, tuple(exposures), positions)


def _opaque_exposures(fld: str, who: str, lin: OutputLineage, sensitive: set[str]) -> list[Exposure]:
    seen: set[tuple[str, str]] = set()
    found = []
    for output, why in lin.opaque:
        if (output, why) in seen:
            continue
        seen.add((output, why))
        found.append(
            Exposure(
                fld,
                ", ".join(sorted(sensitive)),
                f"{who}'s output {output} may carry it in clear: {why}, which no column lineage follows",
                _OPAQUE_FIX,
            )
        )
    return found


def _own_relations(spec) -> frozenset[str]:
    """The dataset's tables a SQL must read through its placeholder, never by name."""
    names = set()
    for t in (spec.target.table_name, spec.source.table_name):
        try:
            names.add(f"{t.schema}.{t.name}".lower())
        except AttributeError:
            continue
    return frozenset(names)


def _words(sql: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}


def _mentions(sql: str, names: set[str]) -> bool:
    return bool(_words(sql) & names)
