"""``python -m bench <name> ...``: run one benchmark: ``reconcile`` (the default, ``make bench``), ``recover``,
``fuzz`` (spec and incident files, ``make fuzz``), ``share`` (one DuckDB file, many users),
``kill`` (the kill -9 matrix), ``fixed`` (a command's fixed cost), ``whole`` (the whole command vs the floor),
``fence`` (a fence against a busy writer), ``gates`` (a gate's GE validations), ``lakehouse`` (reconcile on Delta
vs DuckDB) or ``convergence`` (verify with late changes pending)."""

import sys

from bench import (
    convergence_bench,
    fence_bench,
    fixed_cost_bench,
    fuzz_bench,
    gate_suites_bench,
    kill_bench,
    lakehouse_bench,
    reconcile_bench,
    recover_bench,
    share_bench,
    whole_command_bench,
)

BENCHES = {
    "reconcile": reconcile_bench.main,
    "recover": recover_bench.main,
    "fuzz": fuzz_bench.main,
    "share": share_bench.main,
    "kill": kill_bench.main,
    "fixed": fixed_cost_bench.main,
    "fence": fence_bench.main,
    "lakehouse": lakehouse_bench.main,
    "convergence": convergence_bench.main,
    "whole": whole_command_bench.main,
    "gates": gate_suites_bench.main,
}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "reconcile"
    args = sys.argv[2:] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else sys.argv[1:]
    sys.exit(BENCHES[name](args))
