"""``recovery adopt --spec FILE`` and ``recovery release --spec FILE``: manage a target, or hand it back.

``contain`` adopts a target on its own; ``adopt`` is for a healthy target that should
go through the package's gates (``recovery backfill``) before anything went wrong.
``release`` makes the public name a plain table again, holding the published rows,
for the team's own pipelines to write once the incident is closed.
"""

from __future__ import annotations

import argparse
import getpass

from rich.console import Console


def _spec(path: str, verb: str):
    from recovery.lib.catalog_checks import load_spec
    from recovery.lib.lakehouse.history import refuse_lakehouse

    spec = load_spec(path)
    refuse_lakehouse(spec, verb)  # containment adopts a lakehouse target's copy; the table itself stays the team's
    return spec


def adopt(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.engine import open_engine
    from recovery.lib.pointers.adoption import adopt as adopt_target

    spec = _spec(args.spec, "adopt")
    adoption = adopt_target(open_engine(spec.warehouse), spec, actor=args.actor or getpass.getuser())
    console.print(adoption.line(spec), highlight=False, soft_wrap=True)
    if adoption.adopted_now:
        console.print(
            f"from now on write {spec.target.table} through the package (Writer or the IO manager); "
            f"`recovery release --spec {args.spec}` hands it back",
            highlight=False,
            soft_wrap=True,
        )
    return 0


def release(args: argparse.Namespace, console: Console) -> int:
    from recovery.lib.engine import open_engine
    from recovery.lib.pointers.adoption import release as release_target

    spec = _spec(args.spec, "release")
    ns, rows = release_target(open_engine(spec.warehouse), spec, actor=args.actor or getpass.getuser())
    console.print(
        f"{spec.target.table} is a plain table again: {rows:,} rows of {ns}; the package's namespaces "
        f"are kept as history",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    for name, fn, text in [
        ("adopt", adopt, "take a target another tool wrote under management (its public name becomes a managed view)"),
        ("release", release, "hand a managed target back as a plain table holding the published rows"),
    ]:
        p = sub.add_parser(name, help=text)
        p.add_argument("--spec", required=True, help="dataset spec YAML")
        p.add_argument("--actor", help="who does it (default: the current user)")
        p.set_defaults(fn=fn)
