"""No measured figures in the package's docstrings and comments (issue #38).

A docstring or comment says why the code is the way it is; the figures that justified a choice
("at 10M events the phase took 10.6 s instead of 12.7 s") go to ``bench/RESULTS.md``,
"Measurements behind the code's choices", where they can be re-measured and dated. Every module
of ``recovery/`` is read with ``ast`` (docstrings) and ``tokenize`` (comments, consecutive lines
as one text, since a figure often spans two).

Units on their own are not figures: a default (``(default 0.5 s)``), a clock's resolution
(``10 ms ticks``) or a quoted example (``'45s'``, ``'4GB'``) pass. A figure is a time or size
with a measuring context around it (took, instead of, seen, saved, "of a 3.7 s fixed cost", "at
10M events", "about 25 ms"), a share of a time ("a fifth of its wall time"), a speed-up ("ten
times faster") or a rate of failures ("1 race in 5").
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from recovery.config import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "recovery"

_NUM = r"\d+(?:[.,]\d+)?"
_SIZE = rf"{_NUM}[kM]"
# a time or size: 1.3 s, 25 ms, 2.25-3.0 s, 1.97 GB; not inside a quote or a name ('45s', x_2s)
_AMOUNT = (
    rf"(?<![\w'\"`.:-])(?P<approx>(?:about|roughly|nearly|~) ?)?{_NUM}(?:-{_NUM})? ?(?:s|ms|GB|MB|KB)\b(?![\w'\"`])"
)
# words that make a nearby amount a measurement rather than a setting
_MEASURING = re.compile(
    rf"\b(?:took|takes|instead of|measured|seen|saved|spent)\b"
    rf"|\b(?:at|of|on) (?:the )?{_SIZE}\b"
    rf"|\b{_SIZE}[- ](?:\w+ )?(?:events?|rows|keys|changes)\b"
)
_NEAR = 100
_ALONE = [
    # the size of the data a claim was measured at: "at 10M events", "of the 200k worked example"
    re.compile(rf"\b(?:at|of|on) (?:the )?{_SIZE}[- ]?(?:\w+ )?(?:events?|rows|keys|changes|example)\b"),
    # an amount followed by what it is a part of: "1.3 s of a 3.7 s fixed cost", "1.5 s of imports"
    re.compile(rf"(?<![\w'\"`.:-]){_NUM} ?(?:s|ms|GB|MB) of\b"),
    # a share of a time: "about a fifth of its wall time", "two thirds of a copy's time"
    re.compile(
        r"\b(?:a fifth|a third|a quarter|two thirds|three quarters|half) of (?:its|the|a|their) "
        r"(?:[\w']+ ){0,2}time\b"
    ),
    # a speed-up: "about ten times faster", "1.4x slower", "twice as fast"
    re.compile(
        r"\b(?:\d+(?:\.\d+)?x?|two|three|four|five|six|seven|eight|nine|ten|twenty|a hundred) times "
        r"(?:faster|slower)\b|\b\d+(?:\.\d+)?x (?:faster|slower)\b|\btwice as (?:fast|slow)\b"
    ),
    # a rate of failures: "1 race in 5", "4 of 29 runs"
    re.compile(r"\b\d+ (?:race|run|try|attempt|round)s? in \d+\b|\b\d+ of \d+ (?:runs|races|tries|attempts|rounds)\b"),
]


def figures(text: str) -> list[str]:
    """The measured figures in one docstring or comment (whitespace-normalized), as quoted."""
    text = " ".join(text.split())
    found = []
    for m in re.finditer(_AMOUNT, text):
        around = text[max(m.start() - _NEAR, 0) : m.end() + _NEAR]
        if m.group("approx") or _MEASURING.search(around):
            found.append(m.group(0).strip())
    for pattern in _ALONE:
        found += [m.group(0) for m in pattern.finditer(text)]
    return found


def texts(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and every block of consecutive comment lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    block: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and block[-1][0] != line - 1:
            out.append((block[0][0], " ".join(t for _, t in block)))
            block = []
        block.append((line, tok.string.lstrip("#")))
    if block:
        out.append((block[0][0], " ".join(t for _, t in block)))
    return out


def figures_in(source: str, name: str) -> list[str]:
    return [f"{name}:{line}: {', '.join(map(repr, found))}" for line, text in texts(source) if (found := figures(text))]


def test_no_measured_figures_in_docstrings_or_comments():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += figures_in(path.read_text(), str(path.relative_to(PROJECT_ROOT)))
    assert not found, "measured figures belong in bench/RESULTS.md, not the code:\n" + "\n".join(found)


def test_figures_are_told_from_units():
    measured = [
        "at 10M events the phase took 10.6 s instead of 12.7 s",
        "change log before it starts (at 6M lineitem rows that took 1.3 s of a 3.7 s fixed cost)",
        "its own transaction (about 25 ms each with SQLite)",
        "(seen: a cancelled backfill run's step retry, and the containment, both for 300 s)",
        "connection churn was about a fifth of its wall time",
        "about ten times faster than the pure-Python one",
        "lost an acknowledged append in about 1 race in 5",
        "whose hash table alone outgrows a few GB at 100M keys",
        "the example's generator and truth (1.5 s of imports)",
    ]
    units = [
        "every traced step slower than RECOVERY_TRACE_MIN_S (default 0.5 s) is appended there",
        "From the kernel's record of the process's start (Linux, 10 ms ticks)",
        "As a sentence says an age: '2d 4h', '3h 12m', '10m', '45s'",
        "checked here, not left to DuckDB: '-1GB' or '0KB' would otherwise reach every connection",
        "10M events are produced by set-based SQL without a Python loop",
        "EXCEPT ALL both ways computes each side twice",
    ]
    assert [t for t in measured if not figures(t)] == []
    assert [t for t in units if figures(t)] == []
