"""Reading a YAML file a person wrote (a spec, an incident) into a validated model: the hardened
reader (size, encoding, depth, NUL bytes, paths the OS cannot resolve) and the one-line errors that
name the field and the fix. Shared by the spec and the incident, so both refuse bad files alike."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from recovery.lib.dataset_spec.durations import EXAMPLES as DURATION_EXAMPLES
from recovery.lib.errors import SpecError

_FIXES = {
    "missing": "add the field",
    "extra_forbidden": "remove it, or check its spelling against the spec reference in README.md",
    "literal_error": "use one of the allowed values",
    "string_type": "give a string",
    "list_type": "give a list, e.g. [a, b]",
    "int_parsing": "give a whole number",
    "float_parsing": "give a number",
    "date_from_datetime_parsing": "give a date as YYYY-MM-DD",
    "date_parsing": "give a date as YYYY-MM-DD",
    "model_type": "give a mapping of fields",
    "greater_than_equal": "give a non-negative value",
    "greater_than": "give a larger value",
    "less_than_equal": "give a smaller value",
    "less_than": "give a smaller value",
    "too_short": "give at least one value",
    "too_long": "give fewer values",
    "finite_number": "give a finite number",
    "bool_type": "give true or false",
    "int_not_bool": "give a whole number, e.g. 4 (not true or false)",
    "float_not_bool": "give a number, e.g. 0.5 (not true or false)",
    "date_in_future": "give a date that has passed (today or earlier), or remove the field",
    "dict_type": "give a mapping of fields",
    "path_type": "give a path as a string",
    "duration": f"give a positive duration such as {DURATION_EXAMPLES}",
}


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"


def validation_error(err: ValidationError, source: str) -> SpecError:
    """One line naming the first invalid field of a YAML model (spec, incident, run config,
    backfill request) and the fix, instead of pydantic's multi-line report."""
    first = err.errors()[0]
    field = _loc(tuple(p for p in first["loc"] if not str(p).startswith("function-")))
    msg = first["msg"].removeprefix("Value error, ")
    named = re.match(r"^([a-z_][a-z0-9_.\[\]]*): (.+)$", msg)
    if named and (field == "spec" or named.group(1).startswith(field)):
        # a whole-model check names the field it is about: "downstream: two consumers ..."
        field, msg = named.group(1), named.group(2)
    fix = _FIXES.get(first["type"], "correct the value as the message says")
    if "plain identifier" in msg:
        fix = "use a plain name (letters, digits, underscores); the package quotes it"
    return SpecError(field, msg, fix, source=source)


MAX_FILE_BYTES = 1 << 20
"""Largest spec, incident or SQL file read (1 MiB; real ones are a few KB): ``/dev/zero`` or a
multi-GB file named by mistake is refused instead of read into memory."""
MAX_DEPTH = 20
"""Deepest nesting of mappings and lists in a spec or incident (the spec itself needs 7)."""
MAX_NODES = 20_000
"""Most values in a document, anchors expanded: a 'billion laughs' of aliases is refused."""
MAX_PATH_CHARS = 4096


def read_text_file(
    path: str | Path, field: str, *, what: str, fix: str, source: str | None = None, limit: int = MAX_FILE_BYTES
) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, or one ``SpecError`` naming
    ``field``: a NUL byte in the path, a directory, device or FIFO, an over-long path, a file too
    large, or bytes that are not UTF-8. Reads at most ``limit + 1`` bytes whatever the file claims."""
    name = str(path)
    if "\x00" in name:
        raise SpecError(field, f"the {what} path contains a NUL byte", fix, source=source)
    if len(name) > MAX_PATH_CHARS:
        raise SpecError(field, f"the {what} path is {len(name):,} characters long", fix, source=source)
    try:
        # O_NONBLOCK: opening a FIFO must not hang; the fstat below refuses it
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise SpecError(field, f"cannot read {name} ({e.strerror or e})", fix, source=source) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
            raise SpecError(field, f"{name} is {kind}", fix, source=source)
        if st.st_size > limit:
            raise SpecError(field, f"{name} is {st.st_size:,} bytes, over the {limit:,}-byte limit", fix, source=source)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise SpecError(field, f"cannot read {name} ({e.strerror or e})", fix, source=source) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SpecError(field, f"{name} is over the {limit:,}-byte limit", fix, source=source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(
            field,
            f"{name} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})",
            "save the file as UTF-8",
            source=source,
        ) from None
    if "\x00" in text:
        raise SpecError(
            field,
            f"{name} holds a NUL character (offset {text.index(chr(0))})",
            "save it as plain UTF-8 text",
            source=source,
        )
    return text


# libyaml's parser where PyYAML was built with it (the wheels are): the same safe constructor,
# much faster than the pure-Python one, and specs are read by every command and run
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_document(text: str, what: str, source: str) -> Any:
    """Parse YAML without recursion surprises: the event stream (a state machine, no recursion)
    is checked for depth first, so the recursive composer only sees shallow documents."""

    def bad(problem: str, fix: str = "fix the YAML syntax") -> SpecError:
        return SpecError(what, problem, fix, source=source)

    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise bad(
                        f"nested more than {MAX_DEPTH} levels deep (line {line})",
                        f"flatten it; start from a sample {what}",
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        raise bad(f"not valid YAML ({' '.join(str(e).split())[:300]})") from None
    except (ValueError, OverflowError, TypeError, RecursionError) as e:  # a date like 2024-02-30, a huge timestamp
        raise bad(
            f"not valid YAML ({type(e).__name__}: {' '.join(str(e).split())[:200]})", "fix the value it names"
        ) from None


def _check_values(raw: Any, what: str, source: str) -> None:
    """Walk the document (aliases expanded) within a budget; refuse NUL characters in any string,
    naming the field, and documents that expand past ``MAX_NODES`` values."""
    stack: list[tuple[Any, tuple]] = [(raw, ())]
    seen = 0
    while stack:
        node, loc = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise SpecError(
                what,
                f"holds more than {MAX_NODES:,} values (anchors and aliases expanded)",
                "write the values out; a spec or incident is small",
                source=source,
            )
        if isinstance(node, str):
            if "\x00" in node:
                raise SpecError(_loc(loc) if loc else what, "contains a NUL character", "remove it", source=source)
        elif isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and "\x00" in k:
                    raise SpecError(
                        _loc(loc) if loc else what, "a field name contains a NUL character", "remove it", source=source
                    )
                stack.append((v, loc + (k,)))
        elif isinstance(node, list):
            stack.extend((v, loc + (i,)) for i, v in enumerate(node))


_Model = TypeVar("_Model", bound=BaseModel)


def load_yaml_model(path: str | Path, model: type[_Model], *, what: str, example: str) -> _Model:
    """Read a YAML file and validate it as ``model``; every failure is one ``SpecError`` naming
    the field (``what`` when the whole file is at fault) and the fix.

    The file must be a regular UTF-8 file of at most ``MAX_FILE_BYTES``, nested at most
    ``MAX_DEPTH`` deep, with no NUL character anywhere: the audit's crashes (encodings,
    recursion, /dev/zero, NUL bytes) all end here as one line."""
    source = str(path)
    text = read_text_file(path, what, what=what, fix=f"pass the path of an existing {what} YAML file", source=source)
    raw = _yaml_document(text, what, source)
    if not isinstance(raw, dict):
        raise SpecError(what, "the file is not a mapping of fields", f"start from {example}", source=source)
    _check_values(raw, what, source)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e, source) from None
    except RecursionError:  # belt and braces: MAX_DEPTH keeps validation shallow
        raise SpecError(what, "nested too deeply to validate", f"start from {example}", source=source) from None


def resolve_path(base: Path, value: str | Path, field: str, *, source: str | None = None) -> Path:
    """``value`` relative to ``base``, resolved; a path the OS cannot resolve (too long, a
    symlink loop) is a ``SpecError`` naming ``field``."""
    try:
        p = (base / value).resolve()
        if len(str(p)) > MAX_PATH_CHARS:
            raise OSError(f"the path is {len(str(p)):,} characters long")
        if any(len(part.encode()) > 255 for part in p.parts):
            raise OSError("a path component is longer than 255 bytes")
        return p
    except (OSError, RuntimeError, ValueError) as e:
        raise SpecError(
            field, f"cannot resolve {str(value)[:200]!r} ({e})", "give a plain path relative to the file", source=source
        ) from None
