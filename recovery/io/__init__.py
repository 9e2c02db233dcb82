"""The IO manager a platform team's own assets write managed datasets through."""

from recovery.io.handlers import ArrowTypeHandler, PandasTypeHandler, RelationTypeHandler
from recovery.io.manager import ManagedDuckDBIOManager

__all__ = ["ManagedDuckDBIOManager", "PandasTypeHandler", "ArrowTypeHandler", "RelationTypeHandler"]
