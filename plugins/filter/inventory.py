"""Filters over the inventory's instances (see module_utils.instances)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.group import group_problems
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instance_models,
    instances,
    rank_of,
    served_model,
    serving_nodes,
)


def _instances(hosts, hostvars):
    try:
        return instances(list(hosts), hostvars)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def _instance_models(hosts, hostvars):
    """{instance: {"served", "name", "version"}}: the model each instance serves."""
    try:
        return instance_models(_instances(hosts, hostvars), hostvars)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def _rank(host, hosts, hostvars):
    groups = _instances(hosts, hostvars)
    name, rank, size = rank_of(host, groups)
    return {"instance": name, "rank": rank, "size": size, "members": groups[name]}


def _ranks(hosts, hostvars):
    """{host: its rank as `rank` gives it} for every host, from one look at the inventory."""
    return {
        host: {"instance": name, "rank": i, "size": len(members), "members": members}
        for name, members in _instances(hosts, hostvars).items()
        for i, host in enumerate(members)
    }


def _serving(hosts, hostvars):
    return serving_nodes(_instances(hosts, hostvars))


def _serving_of(named, hosts, hostvars):
    """The serving nodes (rank 0) of the instances that `named` hosts belong to."""
    groups = _instances(hosts, hostvars)
    return [members[0] for members in groups.values() if set(members) & set(named)]


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


def _rollout_batches(hosts, hostvars, per_batch, play_hosts):
    """The batches a rolling play takes the play's hosts in, `per_batch` instances each (a
    number, or a percentage of the instances such as "25%"): whole instances, each one's
    members together in rank order, as [{"host": ..., "batch": 1}, ...]. An instance the
    play holds only part of (a --limit) is refused: its members restart as one."""
    groups = {n: m for n, m in _instances(hosts, hostvars).items() if set(m) & set(play_hosts)}
    for name, members in groups.items():
        left_out = [h for h in members if h not in play_hosts]
        if left_out:
            raise AnsibleFilterError(
                f"instance {name} is {', '.join(members)}, and this run leaves out"
                f" {', '.join(left_out)}: a multi-node instance rolls as one; limit the run to"
                " all of its members or none"
            )
    text = str(per_batch).strip()
    try:
        count = int(text[:-1]) * len(groups) // 100 if text.endswith("%") else int(text)
        count = max(1, count) if text.endswith("%") else count
    except ValueError:
        count = 0
    if count < 1:
        raise AnsibleFilterError(
            f"rollout_serial={per_batch!r}: give a number of instances per batch (1 or more)"
            " or a percentage of them such as 25%"
        )
    members = list(groups.values())
    return [
        {"host": host, "batch": i // count + 1}
        for i, instance in enumerate(members)
        for host in instance
    ]


def _batch_sizes(groups):
    """A play's `serial` from the groups tasks/batches.yml of the rollout role made:
    inferfleet_rollout_batch_1, _2, ... (play keywords see `groups`, not hostvars)."""
    prefix = "inferfleet_rollout_batch_"
    batches = sorted(int(g[len(prefix) :]) for g in groups if g.startswith(prefix))
    return [len(groups[f"{prefix}{i}"]) for i in batches] or [1]


def _group_problems(members, instance):
    """What stops a multi-node instance from starting (module_utils.group)."""
    return group_problems(instance, members)


class FilterModule:
    def filters(self):
        return {
            "instances": _instances,
            "instance_models": _instance_models,
            "served_model": served_model,
            "rank": _rank,
            "ranks": _ranks,
            "serving_nodes": _serving,
            "serving_nodes_of": _serving_of,
            "members_of": _members_of,
            "first_not_serving": _first_not_serving,
            "rollout_batches": _rollout_batches,
            "batch_sizes": _batch_sizes,
            "group_problems": _group_problems,
        }
