"""Where a lakehouse table lives: the spec's ``lakehouse:`` section of a source or target.

A leaf module (pydantic only), so ``recovery.lib.dataset_spec.models`` can hold it without importing the
formats' libraries: a spec that names no lakehouse table never loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SQLITE = "sqlite:///"


class IcebergCatalogSpec(BaseModel):
    """A pyiceberg catalog. ``uri`` ``sqlite:///<file>`` and ``warehouse`` are resolved against the spec's
    folder when relative (a SQL catalog on SQLite); any other catalog type takes its own properties."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("default", min_length=1, description="The catalog's name.")
    type: str = Field("sql", description="pyiceberg catalog type: sql, rest, glue, hive, ...")
    uri: str = Field(description="Catalog URI, e.g. sqlite:///lake/catalog.db (relative to the spec) or a REST URL.")
    warehouse: str | None = Field(None, description="Where new tables' files go: a folder (relative to the spec).")
    properties: dict[str, str] = Field({}, description="Further catalog properties, passed as given.")


class LakehouseTable(BaseModel):
    """A Delta Lake table (a folder) or an Apache Iceberg table (catalog + identifier)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["delta", "iceberg"] = Field(description="delta or iceberg.")
    path: Path | None = Field(None, description="delta: the table's folder, relative to the spec file.")
    catalog: IcebergCatalogSpec | None = Field(None, description="iceberg: the catalog holding the table.")
    identifier: str | None = Field(
        None, description="iceberg: the table's identifier in the catalog, e.g. mart.orders."
    )
    generation_property: str = Field(
        "recovery.generation",
        min_length=1,
        description="The commit property (Delta commit info, Iceberg snapshot summary) naming the generation "
        "that wrote the commit; commits without it take their rows' generation column.",
    )
    written_at_property: str | None = Field(
        None,
        description="A commit property holding when the write happened (ISO timestamp, UTC); default: the "
        "commit's own timestamp.",
    )
    kind_property: str | None = Field(
        None, description="A commit property telling a backfill from ingestion (its value 'backfill' or not)."
    )

    @field_validator("identifier")
    @classmethod
    def _identifier(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(not p for p in v.split("."))):
            raise ValueError(f"{v!r} is not a table identifier such as mart.orders")
        return v

    @model_validator(mode="after")
    def _located(self) -> LakehouseTable:
        if self.format == "delta" and (self.path is None or self.catalog or self.identifier):
            raise ValueError("a delta table is given by path alone (the table's folder); remove catalog/identifier")
        if self.format == "iceberg" and (self.catalog is None or self.identifier is None or self.path is not None):
            raise ValueError("an iceberg table is given by catalog and identifier; remove path")
        return self

    def resolved(self, base: Path) -> LakehouseTable:
        """The same table with its relative paths made absolute against ``base`` (the spec's folder)."""
        if self.path is not None:
            return self.model_copy(update={"path": (base / self.path).resolve()})
        assert self.catalog is not None  # validated: an iceberg table names its catalog
        cat = self.catalog
        uri = cat.uri
        if uri.startswith(SQLITE) and not uri[len(SQLITE) :].startswith("/"):
            uri = SQLITE + str((base / uri[len(SQLITE) :]).resolve())
        warehouse = cat.warehouse
        if warehouse and "://" not in warehouse:
            warehouse = (base / warehouse).resolve().as_uri()
        return self.model_copy(update={"catalog": cat.model_copy(update={"uri": uri, "warehouse": warehouse})})

    @property
    def location(self) -> str:
        """How the table is named in messages: its folder, or catalog and identifier."""
        if self.path is not None:
            return str(self.path)
        assert self.catalog is not None
        return f"{self.catalog.name}:{self.identifier}"
