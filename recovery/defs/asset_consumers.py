"""Dagster assets downstream of the managed target: found, validated, mapped to partitions, re-materialized.

Two ways an asset is a consumer. In this code location's asset graph (a team that merges
the package's definitions into its own), every asset downstream of the target's asset
(key = the target table's ``schema/name``) that is not the package's own is one, given its
key: listed under the spec's ``downstream_assets`` or in its metadata (``recovery/key``,
with dagster-duckdb's ``partition_expr`` for its partition column). In another code
location, the spec names it (``downstream_assets[].definitions``, the Python file holding
that location's ``Definitions``), loaded here the way ``dagster dev -f`` loads it.

The target's damaged partitions map onto each asset's partitions through the graph's own
partition mappings (an asset two steps down is reached through the one between). The
restatement launches the asset's materialization, one run per partition, through the
repository's implicit asset job: a real run in the instance, so the team's own code and IO
manager compute and store the corrected rows, and the run shows in the UI.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import dagster as dg
from dagster._core.code_pointer import load_python_file
from dagster._core.definitions.backfill_policy import BackfillPolicyType
from dagster._core.definitions.reconstruct import repository_def_from_target_def
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster._core.workspace.autodiscovery import loadable_targets_from_loaded_module
from pydantic import ValidationError

from recovery.defs.location import own_asset_keys, repository
from recovery.lib.consumers.assets import PartitionScope
from recovery.lib.dataset_spec.loader import validation_error
from recovery.lib.dataset_spec.models import AssetConsumerSpec, DatasetSpec
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import naive_utc
from recovery.lib.restatement.checks import MaterializationRun
from recovery.orchestration import failure_reason, forget_dead_defs_state_storage

KEY_METADATA = "recovery/key"
MATERIALITY_METADATA = "recovery/materiality"
KIND_TAG = "recovery/consumer_kind"


@dataclass(frozen=True)
class ResolvedAsset:
    """A downstream asset consumer and the repository that can materialize it."""

    consumer: AssetConsumerSpec
    field: str  # where it is declared, for errors: downstream_assets[0] or the asset's metadata
    repository: dg.RepositoryDefinition

    @property
    def key(self) -> dg.AssetKey:
        return dg.AssetKey(self.consumer.asset_path)


@dataclass(frozen=True)
class Undeclared:
    """An asset downstream of the target whose key is declared nowhere: traced, never restated."""

    asset: str
    problem: str
    fix: str

    def error(self, target: str) -> SpecError:
        return SpecError(f"asset {self.asset}", f"is downstream of {target} but {self.problem}", self.fix)


def target_key(spec: DatasetSpec) -> dg.AssetKey:
    return dg.AssetKey([spec.target.table_name.schema, spec.target.table_name.name])


@cache
def _repository_from_file(path: str, mtime: float) -> dg.RepositoryDefinition:
    module = load_python_file(path, working_directory=str(Path(path).parent))
    targets = loadable_targets_from_loaded_module(module)
    repo = repository_def_from_target_def(targets[0].target_definition) if targets else None
    if repo is None:
        raise SpecError("definitions", f"{path} defines no Definitions", "give the file of the team's code location")
    return repo


def repository_from_file(path: Path, field: str) -> dg.RepositoryDefinition:
    """The team's code location, loaded from its Python file once per process (again if it changed)."""
    try:
        return _repository_from_file(str(path), path.stat().st_mtime)
    except SpecError as err:
        raise SpecError(field, err.problem, err.fix) from None
    except Exception as err:  # noqa: BLE001 - the team's code failed to load: say so in one line
        raise SpecError(
            field,
            f"loading {path} failed ({type(err).__name__}: {' '.join(str(err).split())[:200]})",
            "make the file load with `dagster definitions validate -f` first",
        ) from None


def _value(v):
    return getattr(v, "value", v)


def from_metadata(key: dg.AssetKey, node, field: str) -> AssetConsumerSpec | Undeclared:
    """A consumer declared by the asset itself: ``recovery/key`` (and ``partition_expr``,
    ``recovery/materiality``, owners, the ``recovery/consumer_kind`` tag)."""
    meta = {k: _value(v) for k, v in (node.metadata or {}).items()}
    if KEY_METADATA not in meta:
        return Undeclared(
            key.to_user_string(),
            "declares no key, so its rows cannot be compared before and after",
            f"list it under downstream_assets (asset: {key.to_user_string()}, key: [columns]) "
            f"or give the asset metadata {KEY_METADATA}: [columns]",
        )
    owners = [o.removeprefix("team:") for o in (node.owners or [])]
    raw = {
        "asset": key.to_user_string(),
        "key": meta[KEY_METADATA],
        "partition": meta.get("partition_expr"),
        "owner": owners[0] if owners else "unassigned",
        "kind": (node.tags or {}).get(KIND_TAG, "report"),
        "materiality": meta.get(MATERIALITY_METADATA),
    }
    if meta.get("schema"):
        raw["table"] = f"{meta['schema']}.{key.path[-1]}"
    try:
        return AssetConsumerSpec.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as err:
        raise validation_error(err, field) from None


def resolve(context, spec: DatasetSpec, spec_path: str) -> tuple[list[ResolvedAsset], list[Undeclared]]:
    """Every asset consumer of ``spec``: listed in the spec, or downstream of the target in this code
    location's graph. Raises ``SpecError`` (nothing written) for a listed asset its code location
    does not hold; returns the graph's assets that declare no key apart."""
    here = repository(context, spec_path)
    found: dict[str, ResolvedAsset] = {}
    for i, c in enumerate(spec.downstream_assets):
        field = f"downstream_assets[{i}]"
        repo = repository_from_file(c.definitions, f"{field}.definitions") if c.definitions else here
        if repo is None or not repo.asset_graph.has(dg.AssetKey(c.asset_path)):
            where = f"the code location in {c.definitions}" if c.definitions else "this code location"
            raise SpecError(
                f"{field}.asset",
                f"{c.asset} is not an asset of {where}",
                "give its key as the UI shows it, and name the Python file of its code location in definitions",
            )
        found[c.asset] = ResolvedAsset(c, field, repo)
    undeclared: list[Undeclared] = []
    if here is not None and here.asset_graph.has(target_key(spec)):
        graph, own = here.asset_graph, own_asset_keys(spec_path)
        for key in _descendants(graph, target_key(spec)):
            name = key.to_user_string()
            if key in own or name in found or not graph.get(key).is_materializable:
                continue
            declared = from_metadata(key, graph.get(key), f"asset {name} metadata")
            if isinstance(declared, Undeclared):
                undeclared.append(declared)
            else:
                found[name] = ResolvedAsset(declared, f"asset {name} metadata", here)
    return _upstream_first(list(found.values())), undeclared


def _descendants(graph, key: dg.AssetKey) -> list[dg.AssetKey]:
    seen, todo = set(), [key]
    while todo:
        for child in graph.get(todo.pop()).child_keys:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return [k for k in graph.toposorted_asset_keys if k in seen]


def _upstream_first(assets: list[ResolvedAsset]) -> list[ResolvedAsset]:
    def order(a: ResolvedAsset) -> tuple[int, str]:
        keys = a.repository.asset_graph.toposorted_asset_keys
        return (keys.index(a.key) if a.key in keys else len(keys), a.consumer.asset)

    return sorted(assets, key=order)


def affected_partitions(
    a: ResolvedAsset, spec: DatasetSpec, target_partitions: list[str]
) -> tuple[list[str], PartitionScope]:
    """The asset's partitions that read ``target_partitions`` (through each partition mapping down
    from the target; the same keys when the graph cannot say), and the rows they cover."""
    graph = a.repository.asset_graph
    pdef = graph.get(a.key).partitions_def
    if pdef is None:
        return [], PartitionScope(None)
    if a.consumer.partition is None:
        raise SpecError(
            f"{a.field}.partition",
            f"{a.consumer.asset} is partitioned but no column of {a.consumer.table_name} is named as its partition",
            "add partition: <column> (or the asset's metadata partition_expr)",
        )
    keys = _mapped(graph, target_key(spec), a.key, target_partitions)
    if isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        windows = tuple(
            (naive_utc(w.start), naive_utc(w.end)) for w in (pdef.time_window_for_partition_key(k) for k in keys)
        )
        return keys, PartitionScope(a.consumer.partition, tuple(keys), windows)
    return keys, PartitionScope(a.consumer.partition, tuple(keys))


def _mapped(graph, target: dg.AssetKey, asset: dg.AssetKey, partitions: list[str]) -> list[str]:
    """Partition keys of ``asset`` reached from the target's ``partitions``, parent by parent."""
    own = graph.get(asset).partitions_def
    valid = set(own.get_partition_keys())
    if not graph.has(target) or graph.get(target).partitions_def is None or asset not in _descendants(graph, target):
        return [p for p in partitions if p in valid]
    reached: dict[dg.AssetKey, set[str]] = {
        target: {p for p in partitions if graph.get(target).partitions_def.has_partition_key(p)}
    }
    for key in _descendants(graph, target):
        node, keys = graph.get(key), set()
        for parent in node.parent_keys:
            if parent not in reached or node.partitions_def is None:
                continue
            if graph.get(parent).partitions_def is None:
                keys |= set(node.partitions_def.get_partition_keys())
                continue
            for p in reached[parent]:
                keys |= set(graph.get_child_partition_keys_of_parent(p, parent, key))
        if keys:
            reached[key] = keys
    return sorted(reached.get(asset, set()) & valid)


def materialize(
    a: ResolvedAsset, partitions: list[str], instance: dg.DagsterInstance, tags: dict[str, str]
) -> list[MaterializationRun]:
    """Runs of the asset alone through its repository's implicit asset job, in this process, recorded
    in ``instance``: one per partition, or one per contiguous range when the asset's backfill policy
    is a single run (what its code expects), one when it is unpartitioned."""
    forget_dead_defs_state_storage()
    job = a.repository.get_implicit_job_def_for_assets([a.key])
    if job is None:
        raise SpecError(
            a.field, f"{a.consumer.asset} cannot be materialized by a job", "make it a materializable asset"
        )
    node = a.repository.asset_graph.get(a.key)
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    launches: list[tuple[str | None, dict[str, str]]]
    if not partitions:
        launches = [(None, {})]
    elif (
        node.partitions_def is not None
        and node.backfill_policy is not None
        and node.backfill_policy.policy_type == BackfillPolicyType.SINGLE_RUN
    ):
        launches = [
            (f"{first}...{last}", {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last})
            for first, last in _ranges(list(node.partitions_def.get_partition_keys()), partitions)
        ]
    else:
        launches = [(p, {}) for p in partitions]
    runs = []
    for label, range_tags in launches:
        result = job.execute_in_process(
            instance=instance,
            partition_key=None if range_tags or label is None else label,
            asset_selection=[a.key],
            tags={**tags, **range_tags},
            run_config=quiet,
            raise_on_error=False,
        )
        runs.append(
            MaterializationRun(
                label,
                result.run_id,
                result.success,
                "" if result.success else failure_reason(result).split(": ", 1)[-1],
            )
        )
        if not result.success:
            # an IO manager that closes its connection only on success (dagster-duckdb's own) leaves the
            # warehouse open until its traceback is collected; the recovery's next session needs it
            gc.collect()
    return runs


def _ranges(ordered: list[str], wanted: list[str]) -> list[tuple[str, str]]:
    """``wanted`` as contiguous runs of ``ordered`` (first, last)."""
    chosen = set(wanted)
    out: list[tuple[str, str]] = []
    current: list[str] = []
    for k in ordered:
        if k in chosen:
            current.append(k)
        elif current:
            out.append((current[0], current[-1]))
            current = []
    if current:
        out.append((current[0], current[-1]))
    return out
