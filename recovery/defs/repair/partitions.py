"""The repair's partitions, registered in wave order so that each wave is one partition range.

A ``DynamicPartitionsDefinition`` keeps keys in the order they were added; the plan
registers the partitions it rebuilds canary first, then wave by wave, so a wave is
launched as one run over a contiguous range (``BackfillPolicy.single_run``), from
the UI's partition picker or from the CLI.
"""

import dagster as dg

from recovery.defs.target_partitions import RANGE_END, RANGE_START
from recovery.lib.repair.plan import RepairPlan

REPAIR_PARTITIONS_NAME = "repair_partitions"
REPAIR_PARTITIONS = dg.DynamicPartitionsDefinition(name=REPAIR_PARTITIONS_NAME)


def register_repair_partitions(instance: dg.DagsterInstance, plan: RepairPlan) -> list[str]:
    """Make the registered keys exactly the plan's rebuild list, in wave order."""
    wanted = plan.rebuild
    known = list(instance.get_dynamic_partitions(REPAIR_PARTITIONS_NAME))
    if known != wanted:
        for key in known:
            instance.delete_dynamic_partition(REPAIR_PARTITIONS_NAME, key)
        instance.add_dynamic_partitions(REPAIR_PARTITIONS_NAME, wanted)
    return wanted


def wave_tags(plan: RepairPlan, wave: int) -> dict[str, str]:
    parts = plan.waves[wave]
    return {RANGE_START: parts[0], RANGE_END: parts[-1]}


def wave_ranges_md(plan: RepairPlan) -> str:
    from recovery.lib.repair.plan import wave_name

    rows = ["| wave | partitions | range (select it in the partition picker) |", "| --- | ---: | --- |"]
    rows += [f"| {wave_name(n)} | {len(ps)} | {ps[0]} … {ps[-1]} |" for n, ps in sorted(plan.waves.items())]
    return "\n".join(rows)
