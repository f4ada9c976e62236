"""Instances from the inventory: which nodes together hold one copy of the model.

A node's instance is its `inferfleet_instance` host variable (default: its own name);
nodes sharing a name form one pipeline group, ranked by `inferfleet_rank` where given,
else in inventory order. Rank 0 serves the API and is the load balancer's backend.
Each instance serves one model: the fleet-wide `inferfleet_model_name` /
`inferfleet_model_version` unless a group or host sets its own (`instance_models`).
Pure functions over plain data, so the filter plugin, the CLI and the tests share them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class InventoryError(ValueError):
    """The inventory cannot work; the message says what to change."""


def whole_number(host: str, name: str, value) -> int:
    """`value`, a host's setting `name`, as an int; InventoryError naming both if not."""
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise InventoryError(
            f"{host}: {name} must be a whole number, not {value!r}: fix it in the inventory"
        ) from err


def instances(hosts: Sequence[str], hostvars: Mapping[str, Mapping]) -> dict[str, list[str]]:
    """Map each instance name to its member hosts in rank order; raise on a bad inventory."""
    if not hosts:
        raise InventoryError("the `inference` group is empty: add at least one engine node")
    # One look at each host's variables: in Ansible each is a whole variable merge.
    wanted = {}
    for host in hosts:
        hv = hostvars.get(host, {})
        wanted[host] = (hv.get("inferfleet_instance"), hv.get("inferfleet_rank"))
    groups: dict[str, list[str]] = {}
    for host in hosts:
        name = str(wanted[host][0] or host)
        groups.setdefault(name, []).append(host)
    ordered = {}
    for name, members in groups.items():
        explicit = {h: wanted[h][1] for h in members}
        given = {h: r for h, r in explicit.items() if r is not None}
        if given and len(given) != len(members):
            missing = sorted(set(members) - set(given))
            raise InventoryError(
                f"instance {name}: set inferfleet_rank on every member or on none "
                f"(missing on {', '.join(missing)})"
            )
        if given:
            ranks = sorted(int(r) for r in given.values())
            if ranks != list(range(len(members))):
                raise InventoryError(
                    f"instance {name}: inferfleet_rank values {ranks} must be 0..{len(members) - 1}"
                    " with no gaps or repeats"
                )
            members = sorted(members, key=lambda h: int(given[h]))
        ordered[name] = members
    return ordered


def rank_of(host: str, groups: Mapping[str, list[str]]) -> tuple[str, int, int]:
    """(instance name, rank, group size) of a host."""
    for name, members in groups.items():
        if host in members:
            return name, members.index(host), len(members)
    raise InventoryError(f"{host} is not in the `inference` group")


def serving_nodes(groups: Mapping[str, list[str]]) -> list[str]:
    """Every instance's rank 0: the load balancer's backends."""
    return [members[0] for members in groups.values()]


# Where each part of a host's model comes from: its own variable, else the fleet-wide one.
MODEL_VARIABLES = {
    "served": ("inference_engine_served_model_name", "inferfleet_model_name"),
    "name": ("model_sync_name", "inferfleet_model_name"),
    "version": ("model_sync_version", "inferfleet_model_version"),
}
MODEL_PARTS = {"served": "served name", "name": "weights name", "version": "version"}


def _first_set(hv: Mapping, names: Sequence[str]) -> str:
    """The first of the variables `names` that `hv` sets non-empty, as a string ('' if none)."""
    values = (hv.get(name) for name in names)
    return next((str(v) for v in values if v is not None and str(v) != ""), "")


def served_model(hv: Mapping) -> str:
    """The name clients send as `model` to the host whose variables are `hv` ('' if unset)."""
    return _first_set(hv, MODEL_VARIABLES["served"])


def model_of(host: str, hostvars: Mapping[str, Mapping]) -> dict[str, str]:
    """The model a host serves, {"served", "name", "version"} as strings ('' where unset)."""
    hv = hostvars.get(host, {})
    return {part: _first_set(hv, names) for part, names in MODEL_VARIABLES.items()}


def instance_models(
    groups: Mapping[str, list[str]], hostvars: Mapping[str, Mapping]
) -> dict[str, dict[str, str]]:
    """Map each instance (from `instances`) to the model its members serve; raise when a host
    has no model, when an instance's members disagree, or when one served name would stand
    for two different models. Versions may differ between instances (a rollout)."""
    models: dict[str, dict[str, str]] = {}
    for instance, members in groups.items():
        of = {host: model_of(host, hostvars) for host in members}
        for host, model in of.items():
            missing = [MODEL_PARTS[part] for part, value in model.items() if not value]
            if missing:
                raise InventoryError(
                    f"{host}: no model {' or '.join(missing)} to serve: set inferfleet_model_name"
                    " and inferfleet_model_version (group_vars/all for the fleet-wide default,"
                    " or per group or host)"
                )
        disagree = [
            f"{MODEL_PARTS[part]} ({' else '.join(names)}): "
            + ", ".join(f"{host}={model[part]}" for host, model in of.items())
            for part, names in MODEL_VARIABLES.items()
            if len({model[part] for model in of.values()}) > 1
        ]
        if disagree:
            raise InventoryError(
                f"instance {instance} ({', '.join(members)}) holds one copy of one model, but its"
                f" members disagree on the {'; and the '.join(disagree)}: set these alike on"
                f" every member of {instance} (in a group of its hosts, or in group_vars/all)"
            )
        models[instance] = of[members[0]]
    first: dict[str, str] = {}  # served name -> the first instance serving it
    for instance, model in models.items():
        other = first.setdefault(model["served"], instance)
        if models[other]["name"] != model["name"]:
            raise InventoryError(
                f"instances {other} ({', '.join(groups[other])}) and {instance}"
                f" ({', '.join(groups[instance])}) both serve {model['served']} but from different"
                f" weights ({models[other]['name']} and {model['name']}): the load balancer could"
                " not tell them apart; give one of them another inference_engine_served_model_name"
                " or the same model_sync_name / inferfleet_model_name"
            )
    return models
