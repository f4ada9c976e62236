"""Several models on one fleet: topology and instance count per model, nodes assigned.

Each model gets the layout :func:`plan_model` chooses for one instance (the smallest
topology that fits: replicated on one node, else the smallest pipeline), then as many
instances as its target concurrency needs: ``ceil(target / sequences per instance)``,
counting whole sequences at full context (a sequence cannot span two instances). Nodes
are handed out in the given order, model by model; what is left is spare. The fleet plan
fits when every model fits some topology and the nodes needed add up to at most the fleet.

Pure Python, no Ansible: :meth:`FleetPlan.inventory` is the inventory source (one group
per model under ``inference``, its hosts), :meth:`FleetPlan.group_vars` each group's
variables (for ``group_vars/<group>.yml``, which outrank ``group_vars/all`` and
``group_vars/inference``; group vars inside an inventory file would not), and
:func:`check_inventory` compares an existing assignment with the plan.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import GiB
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.model import ModelSource
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.plan import (
    Hardware,
    Plan,
    Targets,
    plan_model,
)

#: Groups the collection's inventories already use: a model group may not take them.
RESERVED_GROUPS = frozenset({"all", "ungrouped", "inference", "loadbalancers", "monitoring"})


@dataclass(frozen=True)
class ModelRequest:
    """One model the fleet must serve. ``concurrency``: sequences at full context the
    model must hold across all its instances. ``targets.concurrency``, when set, is a
    per-instance minimum as in a single-model plan (normally left unset)."""

    name: str  # the served name: what clients send as `model`
    source: ModelSource
    version: str | None = None
    targets: Targets = field(default_factory=Targets)
    concurrency: int = 1
    group: str | None = None  # the inventory group; default derived from the name


@dataclass
class ModelPlan:
    """One model's share of the fleet."""

    name: str
    group: str
    version: str | None
    plan: Plan
    target: int
    instances: int = 0  # 0 when no topology fits
    nodes: list[list[str]] = field(default_factory=list)  # per instance, rank order

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def per_instance(self) -> int:
        """Whole sequences at full context one instance holds."""
        if not self.fits or self.plan.layout is None:
            return 0
        return math.floor(self.plan.layout.capacity.max_concurrency)

    @property
    def nodes_needed(self) -> int:
        return self.instances * self.plan.nodes_per_instance

    @property
    def holds(self) -> int:
        return self.per_instance * self.instances

    def to_dict(self) -> dict[str, Any]:
        layout = self.plan.layout if self.fits else None
        return {
            "name": self.name,
            "group": self.group,
            "version": self.version,
            "source": self.plan.location,
            "fits": self.fits,
            "decision": self.plan.decision,
            "tensor_parallel_size": layout.tp if layout else None,
            "pipeline_parallel_size": layout.pp if layout else None,
            "nodes_per_instance": self.plan.nodes_per_instance if layout else None,
            "instances": self.instances,
            "nodes_needed": self.nodes_needed,
            "nodes": [list(members) for members in self.nodes],
            "context": self.plan.context,
            "kv_cache_tokens": layout.capacity.tokens if layout else None,
            "max_concurrency": round(layout.capacity.max_concurrency, 2) if layout else None,
            "sequences_per_instance": self.per_instance,
            "target_concurrency": self.target,
            "holds": self.holds,
            "group_vars": self.plan.group_vars() if self.fits else None,
            "plan": self.plan.to_dict(),
        }


@dataclass
class FleetPlan:
    """The answer for the whole fleet; :meth:`to_dict` is the ``--json`` form."""

    hardware: Hardware
    hosts: list[str]
    models: list[ModelPlan]
    spare: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def nodes_needed(self) -> int:
        return sum(model.nodes_needed for model in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "hardware": {
                "gpus_per_node": self.hardware.gpus_per_node,
                "gpu_memory_gib": self.hardware.gpu_memory_gib,
                "nodes": len(self.hosts),
            },
            "hosts": list(self.hosts),
            "nodes_needed": self.nodes_needed,
            "models": [model.to_dict() for model in self.models],
            "spare": list(self.spare),
            "problems": list(self.problems),
        }

    def _check_fits(self) -> None:
        if not self.fits:
            raise PlannerError("the fleet plan does not fit, so there is no inventory to write.")

    def inventory(self) -> dict[str, Any]:
        """The inventory source: under ``inference`` one group per model holding its hosts,
        pipeline members with ``inferfleet_instance`` and ``inferfleet_rank``; no group
        vars (those are :meth:`group_vars`)."""
        self._check_fits()
        children: dict[str, Any] = {}
        for model in self.models:
            hosts: dict[str, dict[str, Any]] = {}
            for number, members in enumerate(model.nodes, start=1):
                for rank, host in enumerate(members):
                    if len(members) > 1:
                        hosts[host] = {"inferfleet_instance": f"{model.group}_{number}",
                                       "inferfleet_rank": rank}
                    else:
                        hosts[host] = {}
            children[model.group] = {"hosts": hosts}
        return {"all": {"children": {"inference": {"children": children}}}}

    def group_vars(self) -> dict[str, dict[str, Any]]:
        """Per model group, its variables: the model's name, version (when given) and
        engine settings."""
        self._check_fits()
        groups: dict[str, dict[str, Any]] = {}
        for model in self.models:
            variables: dict[str, Any] = {"inferfleet_model_name": model.name}
            if model.version:
                variables["inferfleet_model_version"] = model.version
            variables.update(model.plan.group_vars())
            groups[model.group] = variables
        return groups


def group_name(name: str, group: str | None = None) -> str:
    """The Ansible group for a served name: letters, digits and underscores, not starting
    with a digit ("qwen2.5-coder" -> "qwen2_5_coder"); ``group`` when given, checked."""
    if group is not None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", group):
            raise PlannerError(
                f"model {name}: group {group!r} is not a valid Ansible group name: use "
                "letters, digits and underscores, not starting with a digit."
            )
        derived = group
    else:
        derived = re.sub(r"[^A-Za-z0-9_]", "_", name)
        if not derived or derived[0].isdigit():
            derived = f"model_{derived}"
    if derived in RESERVED_GROUPS:
        raise PlannerError(
            f"model {name}: its inventory group would be {derived!r}, a group the inventory "
            "already uses: set another `group` for it."
        )
    return derived


def check_names(entries: Sequence[tuple[str, str | None]]) -> list[str]:
    """Group names for (served name, group or None) pairs; refuse an empty or repeated
    served name and two models landing in one group."""
    seen: dict[str, str] = {}  # group -> served name
    names: set[str] = set()
    groups = []
    for name, group in entries:
        if not name:
            raise PlannerError("a model has an empty name: give every model its served name.")
        if name in names:
            raise PlannerError(
                f"two models are both named {name!r}: served names must differ (clients pick "
                "the model by it); rename one."
            )
        names.add(name)
        derived = group_name(name, group)
        if derived in seen:
            raise PlannerError(
                f"models {seen[derived]!r} and {name!r} would both be the inventory group "
                f"{derived!r}: rename one, or set `group` on one of them."
            )
        seen[derived] = name
        groups.append(derived)
    return groups


def default_hosts(nodes: int) -> list[str]:
    """node1..nodeN, for a fleet without an inventory."""
    return [f"node{number}" for number in range(1, nodes + 1)]


def plan_fleet(hardware: Hardware, requests: Sequence[ModelRequest],
               hosts: Sequence[str] | None = None) -> FleetPlan:
    """Plan every model, count its instances, assign nodes in order (``hosts``, else
    node1..nodeN of ``hardware.nodes``; given hosts set the fleet's size)."""
    if not requests:
        raise PlannerError("no models to plan: list at least one.")
    hosts = [str(h) for h in hosts] if hosts is not None else default_hosts(hardware.nodes)
    if not hosts:
        raise PlannerError("the fleet has no nodes.")
    if len(set(hosts)) != len(hosts):
        raise PlannerError("a node is listed twice: list every node once.")
    hardware = replace(hardware, nodes=len(hosts))
    hardware.check()
    groups = check_names([(request.name, request.group) for request in requests])
    models: list[ModelPlan] = []
    problems: list[str] = []
    for request, group in zip(requests, groups, strict=True):
        if request.concurrency < 1:
            raise PlannerError(f"model {request.name}: concurrency must be at least 1.")
        try:
            plan = plan_model(request.source, hardware, request.targets)
        except PlannerError as err:
            raise PlannerError(f"model {request.name}: {err}") from None
        model = ModelPlan(request.name, group, request.version, plan, request.concurrency)
        if plan.fits:
            model.instances = max(1, math.ceil(request.concurrency / model.per_instance))
            # Plan again on exactly the nodes it gets, so the per-model plan (instances,
            # fleet concurrency, idle nodes) describes its share, not the whole fleet.
            share = plan_model(request.source, replace(hardware, nodes=model.nodes_needed),
                               request.targets)
            if share.fits and share.layout is not None and (
                    share.layout.tp, share.layout.pp) == (plan.layout.tp, plan.layout.pp):
                model.plan = share
        else:
            problems.append(_does_not_fit(request.name, plan, hardware))
        models.append(model)
    needed = sum(model.nodes_needed for model in models)
    if needed > len(hosts):
        shares = ", ".join(
            f"{m.name} {m.nodes_needed} ({m.instances} x {m.plan.nodes_per_instance})"
            for m in models if m.fits
        )
        unfit = [m.name for m in models if not m.fits]
        besides = f"; {', '.join(unfit)} fitting no topology not counted" if unfit else ""
        problems.append(
            f"the models need {needed} node(s) ({shares}{besides}) but the fleet has "
            f"{len(hosts)}: add {needed - len(hosts)} node(s) or lower a target concurrency."
        )
    fleet = FleetPlan(hardware, hosts, models, problems=problems)
    if fleet.fits:
        free = iter(hosts)
        for model in models:
            size = model.plan.nodes_per_instance
            model.nodes = [[next(free) for _ in range(size)] for _ in range(model.instances)]
        fleet.spare = list(free)
    return fleet


def _does_not_fit(name: str, plan: Plan, hardware: Hardware) -> str:
    where = (f"{hardware.nodes} node(s) x {hardware.gpus_per_node} GPU(s) x "
             f"{hardware.gpu_memory_gib:g} GiB")
    layout = plan.layout
    at = f" at TP {layout.tp} x PP {layout.pp}" if layout else ""
    text = (f"{name} does not fit {where}: short by {plan.shortfall_bytes / GiB:.2f} GiB "
            f"per GPU{at}")
    if plan.suggestions:
        text += "; " + "; ".join(s.rstrip(".") for s in plan.suggestions)
    return text + "."


@dataclass
class ModelCheck:
    """One served model: the plan against the instances an inventory gives it."""

    name: str
    instances: list[list[str]]
    planned_instances: int | None  # None: not in the plan, or no topology fits
    nodes_per_instance: int | None
    wrong_size: list[list[str]]
    target: int | None
    holds: int
    message: str

    @property
    def fits(self) -> bool:
        return (self.planned_instances is not None and not self.wrong_size
                and self.target is not None and self.holds >= self.target)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fits": self.fits,
            "instances": [list(members) for members in self.instances],
            "planned_instances": self.planned_instances,
            "nodes_per_instance": self.nodes_per_instance,
            "wrong_size": [list(members) for members in self.wrong_size],
            "target_concurrency": self.target,
            "holds": self.holds,
            "message": self.message,
        }


def check_inventory(fleet: FleetPlan, assignment: Mapping[str, Sequence[Sequence[str]]]
                    ) -> list[ModelCheck]:
    """Compare an inventory's assignment (served name -> instances, each its hosts in rank
    order) with the plan: per model, instances of the wrong node count, and how much of
    the target concurrency the instances of the planned size hold. Planned models first,
    then models the inventory serves that the plan does not know."""
    checks = []
    for model in fleet.models:
        have = [list(members) for members in assignment.get(model.name, [])]
        if not model.fits:
            checks.append(ModelCheck(model.name, have, None, None, [], model.target, 0,
                                     "no topology fits: see the plan"))
            continue
        size = model.plan.nodes_per_instance
        wrong = [members for members in have if len(members) != size]
        right = len(have) - len(wrong)
        holds = right * model.per_instance
        parts = []
        if wrong:
            parts.append(
                f"{len(wrong)} instance(s) not of {size} node(s): "
                + "; ".join(f"{' + '.join(members)} ({len(members)})" for members in wrong)
            )
        parts.append(f"holds {holds} of {model.target} sequences")
        if holds < model.target:
            missing = math.ceil((model.target - holds) / model.per_instance)
            parts[-1] += f": add {missing} instance(s) of {size} node(s)"
        elif right > model.instances:
            parts[-1] += f": {right - model.instances} instance(s) more than needed"
        checks.append(ModelCheck(model.name, have, model.instances, size, wrong,
                                 model.target, holds, "; ".join(parts)))
    planned = {model.name for model in fleet.models}
    for name, members in assignment.items():
        if name not in planned:
            checks.append(ModelCheck(
                name or "(none)", [list(m) for m in members], None, None, [], None, 0,
                "the inventory serves it but the models file does not list it"
                if name else "these instances serve no model: set inferfleet_model_name",
            ))
    return checks
