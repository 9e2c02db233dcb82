"""Durations as people write them in a spec ("6h", "90m", "1d 12h", ISO 8601 "PT6H") and as
a sentence reads them back ("3h 12m").

A spec is written by someone on call, so the short forms are accepted next to ISO 8601
and a plain number of seconds; a zero or negative duration is refused, because every
duration in a spec is a tolerance that must let something through.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_SHORT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(w|d|h|m|s)\s*", re.IGNORECASE)
_ISO = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)
EXAMPLES = "'6h', '90m', '1d 12h' or 'PT6H'"
MAX = timedelta(days=3650)


def parse_duration(value: object) -> timedelta:
    """A positive ``timedelta`` from a number of seconds, a ``timedelta``, a short form or ISO 8601;
    ``ValueError`` saying what was wrong otherwise (the caller adds the examples as the fix)."""
    if isinstance(value, timedelta):
        td = value
    elif isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    elif isinstance(value, int | float):
        td = _seconds(float(value), value)
    elif isinstance(value, str):
        td = _from_text(value)
    else:
        raise ValueError(f"{value!r} is not a duration")
    if td <= timedelta(0):
        raise ValueError(f"{value!r} is not a positive duration")
    if td > MAX:
        raise ValueError(f"{value!r} is longer than ten years")
    return td


def _seconds(n: float, value: object) -> timedelta:
    if not math.isfinite(n):
        raise ValueError(f"{value!r} is not a duration")
    if n > MAX.total_seconds():
        raise ValueError(f"{value!r} is longer than ten years")
    return timedelta(seconds=n)


def _from_text(text: str) -> timedelta:
    t = text.strip()
    if t.startswith("-"):
        raise ValueError(f"{text!r} is not a positive duration")
    iso = _ISO.fullmatch(t)
    if iso and any(iso.groupdict().values()) and not t.upper().endswith("T"):
        return _seconds(sum(float(v) * _UNITS[k] for k, v in iso.groupdict().items() if v), text)
    parts = _SHORT.findall(t)
    if parts and "".join(f"{n}{u.lower()}" for n, u in parts) == re.sub(r"\s+", "", t).lower():
        return _seconds(sum(float(n) * _UNITS[u.lower()] for n, u in parts), text)
    try:
        n = float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration") from None
    return _seconds(n, text)


def format_duration(td: timedelta) -> str:
    """As a sentence says an age: '2d 4h', '3h 12m', '10m', '45s' (the largest unit and, from
    hours up, the next one; seconds only under a minute)."""
    seconds = max(int(td.total_seconds()), 0)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m" if minutes else f"{secs}s"
