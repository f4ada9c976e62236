"""Instances from the inventory: which nodes together hold one copy of the model.

A node's instance is its `inferfleet_instance` host variable (default: its own name);
nodes sharing a name form one pipeline group, ranked by `inferfleet_rank` where given,
else in inventory order. Rank 0 serves the API and is the load balancer's backend.
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
    groups: dict[str, list[str]] = {}
    for host in hosts:
        name = str(hostvars.get(host, {}).get("inferfleet_instance") or host)
        groups.setdefault(name, []).append(host)
    ordered = {}
    for name, members in groups.items():
        explicit = {h: hostvars.get(h, {}).get("inferfleet_rank") for h in members}
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
