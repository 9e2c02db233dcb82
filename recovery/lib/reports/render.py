"""Templates and files: Jinja2 from the package's ``templates/``, written atomically."""

from __future__ import annotations

from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2


def num(value, digits: int = 0) -> str:
    """Thousands separators; ``—`` for nothing."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def when(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def md_cell(value) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import jinja2  # loads when a report is rendered, not with the code location

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("recovery.lib.reports", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=False),
        undefined=jinja2.StrictUndefined,  # a missing field is a bug in a section, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(num=num, when=when, md=md_cell)
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


def write_text(path: Path, text: str) -> Path:
    """Replace ``path`` in one rename, so a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
