"""Retrying a transaction function that lost a race to another writer, with bounded backoff."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from recovery.lib.engine.base import RetryableConflict

T = TypeVar("T")


def retrying(fn: Callable[[], T], *, attempts: int = 60, base_delay: float = 0.01) -> T:
    """Run a transaction function, retrying lost races with bounded backoff."""
    delay = base_delay
    for i in range(attempts):
        try:
            return fn()
        except RetryableConflict:
            if i == attempts - 1:
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 1.5, 0.5)
    raise AssertionError("unreachable")
