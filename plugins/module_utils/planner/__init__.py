"""Capacity planner: does a model fit a fleet, in which topology, with which settings.

Pure Python, no Ansible: :func:`load_model` reads config.json and safetensors
headers (folder or S3), :func:`plan_model` answers, ``Plan.to_dict()`` is the
machine form and ``Plan.group_vars()`` the variables the roles consume.
See docs/planner.md for how it computes and where each constant comes from.
"""

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.architecture import (
    Architecture,
    parse_architecture,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.fleet import (
    FleetPlan,
    ModelCheck,
    ModelPlan,
    ModelRequest,
    check_inventory,
    check_names,
    group_name,
    plan_fleet,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import (
    KVCapacity,
    cpu_kv_capacity,
    kv_bytes_per_token,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.model import (
    ModelSource,
    load_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.plan import (
    Hardware,
    Plan,
    Targets,
    plan_config,
    plan_model,
)

__all__ = [
    "Architecture",
    "FleetPlan",
    "Hardware",
    "KVCapacity",
    "ModelCheck",
    "ModelPlan",
    "ModelRequest",
    "ModelSource",
    "Plan",
    "PlannerError",
    "Targets",
    "check_inventory",
    "check_names",
    "cpu_kv_capacity",
    "group_name",
    "kv_bytes_per_token",
    "load_model",
    "parse_architecture",
    "plan_config",
    "plan_fleet",
    "plan_model",
]
