"""Filters over the inventory's instances (see module_utils.instances)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.group import group_problems
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instances,
    rank_of,
    serving_nodes,
)


def _instances(hosts, hostvars):
    try:
        return instances(list(hosts), hostvars)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def _rank(host, hosts, hostvars):
    name, rank, size = rank_of(host, _instances(hosts, hostvars))
    return {
        "instance": name,
        "rank": rank,
        "size": size,
        "members": _instances(hosts, hostvars)[name],
    }


def _serving(hosts, hostvars):
    return serving_nodes(_instances(hosts, hostvars))


def _serving_of(named, hosts, hostvars):
    """The serving nodes (rank 0) of the instances that `named` hosts belong to."""
    return [h for h in _serving(hosts, hostvars) if h in _members_of(named, hosts, hostvars)]


def _members_of(named, hosts, hostvars):
    """Every member of the instances that `named` hosts belong to."""
    groups = _instances(hosts, hostvars)
    return [h for members in groups.values() if set(members) & set(named) for h in members]


def _first_not_serving(hosts, hostvars):
    """The members of the first instance none of whose nodes serves yet (by the fact
    rollout_serving, from roles/rollout/tasks/release.yml); [] when every instance does."""
    for members in _instances(hosts, hostvars).values():
        if not any(hostvars[h].get("rollout_serving") for h in members):
            return members
    return []


def _group_problems(members, instance):
    """What stops a multi-node instance from starting (module_utils.group)."""
    return group_problems(instance, members)


class FilterModule:
    def filters(self):
        return {
            "instances": _instances,
            "rank": _rank,
            "serving_nodes": _serving,
            "serving_nodes_of": _serving_of,
            "members_of": _members_of,
            "first_not_serving": _first_not_serving,
            "group_problems": _group_problems,
        }
