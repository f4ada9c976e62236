"""Filters over the inventory's instances (see inferfleet.instances)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from inferfleet.instances import InventoryError, instances, rank_of, serving_nodes


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


def _balancers(hosts, hostvars, kind):
    """The load balancer hosts running `kind` (load_balancer_kind, default haproxy)."""
    return [h for h in hosts if hostvars[h].get("load_balancer_kind", "haproxy") == kind]


class FilterModule:
    def filters(self):
        return {
            "inferfleet_instances": _instances,
            "inferfleet_rank": _rank,
            "inferfleet_serving_nodes": _serving,
            "inferfleet_balancers": _balancers,
        }
