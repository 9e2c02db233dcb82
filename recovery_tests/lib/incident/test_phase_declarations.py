"""Each runbook phase is declared once (``recovery.lib.incident.phases``): no job name and no phase order is
written a second time in the package, and the order the runbook declares is one a phase's needs allow.

The source is read with ``ast``: every string a module holds (f-strings' literal parts included,
docstrings left out: prose may name a job) is searched for every declared job name.
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from recovery.config import PROJECT_ROOT
from recovery.lib.incident.phases import BY_JOB, NEEDS, PHASES, PUBLISH, RUNBOOK
from recovery.lib.incident_state import IncidentState

PACKAGE = PROJECT_ROOT / "recovery"
DECLARATIONS = PACKAGE / "lib" / "incident" / "phases.py"
JOBS = sorted(p.job for p in PHASES.values())
STEP_NAMES = {s.name for s in RUNBOOK} | set(PHASES)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _exports(tree: ast.AST) -> set[int]:
    """The strings of ``__all__``: names of Python objects (``restate_consumers`` is a function too)."""
    return {
        id(e)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for e in ast.walk(node.value)
    }


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings and ``__all__``, with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree) | _exports(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != DECLARATIONS)


def test_the_declarations_are_found_by_the_search():
    """The search itself finds a job name where it is declared (so an empty result below means something)."""
    found = {job for _, text in _strings(DECLARATIONS) for job in JOBS if text == job}
    assert found == set(JOBS)


def test_no_job_name_is_written_outside_the_phase_declarations():
    pattern = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, JOBS)) + r")(?![A-Za-z0-9])")
    written = [
        f"{path.relative_to(PROJECT_ROOT)}:{line}: {text!r}"
        for path in _sources()
        for line, text in _strings(path)
        if pattern.search(text)
    ]
    assert written == [], "name the job from recovery.lib.incident.phases instead:\n" + "\n".join(written)


def test_no_phase_order_is_written_outside_the_phase_declarations():
    """A list or tuple of three or more phase or step names (``["contain", "assess", ...]``) is an order
    written again: the order is ``RUNBOOK``'s."""
    written = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.List | ast.Tuple) and len(node.elts) >= 3:
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(names) == len(node.elts) and set(names) <= STEP_NAMES:
                    written.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}: {names}")
    assert written == [], "\n".join(written)


def test_the_recover_loop_walks_the_runbook():
    """``run_recovery`` launches its steps by iterating ``RUNBOOK`` (and only there)."""
    tree = ast.parse((PACKAGE / "launch" / "recover.py").read_text())
    (run_recovery,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_recovery"]
    loops = [n for n in ast.walk(run_recovery) if isinstance(n, ast.For)]
    assert [ast.unparse(loop.iter) for loop in loops] == ["RUNBOOK"]


def test_every_need_is_a_fact_of_the_incident_state_made_by_an_earlier_step_of_the_runbook():
    assert set(NEEDS) == {f.name for f in fields(IncidentState)}
    position = {p.name: i for i, step in enumerate(RUNBOOK) for p in step.phases}
    for step in RUNBOOK:
        for phase in step.phases:
            for need in phase.needs:
                maker = NEEDS[need][0]
                assert position[maker.name] < position[phase.name] or maker in step.phases, (phase.name, need)
    # every phase of a recovery is in the runbook once, and ``reconcile`` (assess's first asset alone) is its own verb
    runbook_phases = [p.name for step in RUNBOOK for p in step.phases]
    assert len(runbook_phases) == len(set(runbook_phases)) and set(PHASES) - set(runbook_phases) == {"reconcile"}
    assert len(BY_JOB) == len(PHASES)


def test_a_refusal_is_one_sentence_naming_the_verb_and_the_job_to_run_first():
    refused = PUBLISH.refusal(("built",), "/data/incident.yaml")
    assert refused.sentence == (
        "publish: the repair's waves are not all built and gated; "
        "run `recovery repair --incident /data/incident.yaml` (Dagster job repair_waves) first"
    )
    assert refused.metadata() == {
        "phase": "publish",
        "requires": "contain, assess, wave",
        "missing": "built",
        "run_first": "repair_waves",
    }
    typed = PUBLISH.refusal(("assessed", "built"), None)  # an incident typed into the launchpad has no file
    assert typed.sentence == (
        "publish: the incident has no recorded reconciliation; launch the Dagster job assess_incident for this "
        "incident first"
    )
