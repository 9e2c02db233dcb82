"""The code a guarded backfill runs, and how it is named in a request and a manifest.

A recompute is a function ``fn(ctx: RecomputeContext) -> None`` that writes the
range's rows through ``ctx.writer`` as ``ctx.generation``: the writer puts them in
the backfill's own namespace and refuses them once the generation is fenced. The
built-in ``transform`` computes the spec's transform over the source as of the
manifest's watermark: the correct backfill. Any other is named
``package.module:function``; its code version is the sha256 of its module file.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from recovery.lib.errors import SpecError
from recovery.lib.identifiers import quote
from recovery.lib.snapshot import expected_rows_sql, str_list
from recovery.lib.write.writer import Writer


@dataclass(frozen=True)
class RecomputeContext:
    writer: Writer
    generation: str
    partitions: list[str]  # the range's partitions, as text
    watermark: datetime | None  # the source as of this moment (recorded in the manifest); None: an empty source
    run_id: str | None
    backfill_id: str


Recompute = Callable[[RecomputeContext], None]


def transform_recompute(ctx: RecomputeContext) -> None:
    """The spec's transform over the fixed source snapshot, one replace of the range."""
    spec = ctx.writer.spec
    in_range = (
        f"CAST({quote(spec.target.partition)} AS VARCHAR) IN ({str_list(ctx.partitions)})"
        if ctx.partitions
        else "false"
    )
    ctx.writer.write(
        ctx.generation,
        f"SELECT * FROM ({expected_rows_sql(spec, ctx.watermark)}) WHERE {in_range}",
        mode="replace_partitions",
        partitions=ctx.partitions,
        run_id=ctx.run_id,
        note=f"guarded backfill {ctx.backfill_id}: transform over the source as of {ctx.watermark}",
        source_watermark=ctx.watermark,
        watermark_basis=f"guarded backfill {ctx.backfill_id}: its fixed source snapshot",
    )


def resolve_recompute(name: str) -> Recompute:
    """The function a request names; raises ``SpecError`` naming the field ``recompute``."""
    if name == "transform":
        return transform_recompute
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise SpecError(
            "recompute",
            f"cannot load {name!r} ({err})",
            "name an importable function as package.module:function, or use 'transform'",
        ) from None
    if not callable(fn):
        raise SpecError("recompute", f"{name!r} is not a function", "name a function taking a RecomputeContext")
    return fn


def code_version(name: str, fn: Recompute) -> str:
    """What the manifest records as the code that ran: the module file's sha256 (or the package's for 'transform')."""
    try:
        source = inspect.getsourcefile(inspect.getmodule(fn) or fn)
        digest = hashlib.sha256(open(source, "rb").read()).hexdigest()[:16] if source else "unknown"
    except (TypeError, OSError):
        digest = "unknown"
    return f"{name}@{digest}"
