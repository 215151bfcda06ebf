"""Scenario files: the validated, unit-carrying description of a cluster, its jobs and the fabric.

>>> scenario = default_scenario()
>>> scenario.topology.n_gpus, [job.name for job in scenario.jobs]
(128, ['vision-dp', 'llm-dp', 'moe-ep'])
"""

from fabricpilot.scenario.loader import (
    check_gpu_count,
    default_scenario,
    default_scenario_path,
    format_loc,
    load_scenario,
    scenario_from_dict,
)
from fabricpilot.scenario.models import (
    CollectiveSpec,
    EcmpSpec,
    FabricSpec,
    FieldProblem,
    JobSpec,
    MiceSpec,
    Scenario,
    TopologySpec,
    check_fits,
)

__all__ = [
    "CollectiveSpec",
    "EcmpSpec",
    "FabricSpec",
    "FieldProblem",
    "JobSpec",
    "MiceSpec",
    "Scenario",
    "TopologySpec",
    "check_fits",
    "check_gpu_count",
    "default_scenario",
    "default_scenario_path",
    "format_loc",
    "load_scenario",
    "scenario_from_dict",
]
