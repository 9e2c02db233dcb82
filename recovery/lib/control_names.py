"""The control plane's names, apart from its tables' SQL: a leaf module, so an engine can route
control-plane relations (small and transactional) apart from the per-dataset logs that grow
with the data without importing the control plane itself."""

from __future__ import annotations

SCHEMA = "_recovery"

PER_DATASET_TABLES = (
    "delta",
    "recon",
    "recon_partitions",
    "impact",
    "repair_snapshot",
    "restatement_ledger",
    "asset_impact",
    "convergence",
    "expected",
)
"""The control plane's per-dataset tables, each named ``_recovery."<kind>__<dataset>"``: every module
asks here for the name rather than building it."""


def dataset_table_name(kind: str, dataset: str) -> str:
    """The bare name of a per-dataset control-plane table (the dataset is a plain identifier)."""
    if kind not in PER_DATASET_TABLES:
        raise ValueError(f"{kind!r} is not a per-dataset control-plane table ({', '.join(PER_DATASET_TABLES)})")
    return f"{kind}__{dataset}"


def is_dataset_table_name(name: str) -> bool:
    """Whether a bare control-plane table name is a per-dataset table (``<kind>__<dataset>``):
    those grow with the data, so an engine that keeps data apart from the control plane routes them."""
    kind, sep, dataset = name.partition("__")
    return bool(sep and dataset) and kind in PER_DATASET_TABLES


def dataset_table(kind: str, dataset: str) -> str:
    """The qualified name of a per-dataset control-plane table."""
    return f'{SCHEMA}."{dataset_table_name(kind, dataset)}"'
