"""Downstream restatement: each consumer re-published from the repaired target, the original
output kept beside the correction, the differences in a ledger, each owner told once.

Submodules are imported on use (``recovery.lib.consumers.sql`` imports ``outputs``, and
``restate`` imports ``recovery.lib.consumers.sql``): ``restate_consumers`` and
``ConsumerRestatement`` resolve lazily from here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConsumerRestatement", "restate_consumers", "notify_owners"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from recovery.lib.restatement import restate

        return getattr(restate, name)
    raise AttributeError(name)
