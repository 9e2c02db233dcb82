"""One module per ``recovery`` verb, each with ``register(subparsers)``."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def incident_verb(
    sub, name: str, fn: Callable, text: str, *, incident_help: str = "incident YAML file"
) -> argparse.ArgumentParser:
    """A verb that acts on one incident (``--incident FILE``), run by ``fn(args, console)``."""
    p = sub.add_parser(name, help=text)
    p.add_argument("--incident", required=True, help=incident_help)
    p.set_defaults(fn=fn)
    return p
