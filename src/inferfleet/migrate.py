"""A topology migration, planned: from the layout one inventory describes to the layout
another describes, on the same machines (a two-node pipeline to two replicas, or back).

Each engine host's variables are read raw (as `ansible-inventory --list` gives them,
group variables merged in, templates not yet rendered) from both inventories. A host whose
variables differ moves, with every host of its old instance and of its new one: those
hosts are one step, taken out as the old instances and brought back as the new ones while
the rest of the fleet serves. Between steps the fleet runs a mixed inventory: the moved
hosts as the new inventory says, the others as the old one. Pure functions but `read`;
`inferfleet migrate` runs the steps (commands/migrate.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from inferfleet import fleet as fleet_mod

ENGINES = "inference"  # the group of engine hosts


@dataclass
class Inventory:
    """An inventory as data: each host's variables (raw) and the groups it is in."""

    path: Path
    hostvars: dict[str, dict]
    groups: dict[str, list[str]]  # host -> its groups, children's included, `all` left out

    @property
    def engines(self) -> list[str]:
        return [h for h in self.hostvars if ENGINES in self.groups.get(h, [])]


@dataclass
class Step:
    hosts: list[str]
    old: list[str]  # the instances the hosts form now
    new: list[str]  # the instances they form after the step
    models: list[str] = field(default_factory=list)  # what each new instance serves


def _vaulted(value) -> bool:
    if isinstance(value, dict):
        return "__ansible_vault" in value or any(_vaulted(v) for v in value.values())
    if isinstance(value, list):
        return any(_vaulted(v) for v in value)
    return False


def parse(path: Path, listing: dict) -> Inventory:
    """An Inventory from `ansible-inventory --list`'s JSON."""
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    groups: dict[str, list[str]] = {h: [] for h in hostvars}

    def walk(group: str, seen: tuple[str, ...]) -> set[str]:
        entry = listing.get(group, {})
        hosts = set(entry.get("hosts", []))
        for child in entry.get("children", []):
            if child not in seen:
                hosts |= walk(child, (*seen, child))
        return hosts

    for group in listing:
        if group in ("_meta", "all"):
            continue
        for host in sorted(walk(group, (group,))):
            groups.setdefault(host, []).append(group)
            hostvars.setdefault(host, {})
    secret = sorted(h for h, v in hostvars.items() if _vaulted(v))
    if secret:
        raise ValueError(
            f"{path}: {', '.join(secret)} have vault-encrypted variables, which a migration "
            "cannot carry into the inventories it runs between steps; give them as plain "
            "variables in a file only you can read (or as extra vars) for the migration"
        )
    return Inventory(path, hostvars, groups)


def read(path: Path) -> Inventory:
    """The inventory at `path`, through Ansible's own reading of it."""
    tool = Path(sys.executable).with_name("ansible-inventory")
    command = str(tool) if tool.exists() else shutil.which("ansible-inventory")
    if command is None:
        raise ValueError("ansible-inventory is not installed beside this Python")
    done = subprocess.run(
        [command, "-i", str(path), "--list"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ValueError(f"cannot read the inventory {path}: {done.stderr.strip()[-500:]}")
    return parse(path, json.loads(done.stdout))


def plan(
    old: Inventory, new: Inventory, before: fleet_mod.Fleet, after: fleet_mod.Fleet
) -> list[Step]:
    """The steps from `old` to `new`, in the order of the old inventory's hosts. `before`
    and `after` are the two inventories' fleets (instances and models, templated)."""
    if sorted(old.engines) != sorted(new.engines):
        only_old = sorted(set(old.engines) - set(new.engines))
        only_new = sorted(set(new.engines) - set(old.engines))
        raise ValueError(
            "a migration keeps the same engine hosts (the `inference` group); "
            + "; ".join(
                part
                for part in (
                    f"only the fleet now has {', '.join(only_old)}" if only_old else "",
                    f"only the new layout has {', '.join(only_new)}" if only_new else "",
                )
                if part
            )
            + ": add or take out machines with `inferfleet scale` before or after the migration"
        )
    instance_now = {n.host: n.instance for n in before.nodes}
    instance_then = {n.host: n.instance for n in after.nodes}
    moving = [h for h in old.engines if old.hostvars[h] != new.hostvars[h]]
    # Union-find over the hosts: members of one instance, old or new, move together.
    parent = {h: h for h in old.engines}

    def root(h: str) -> str:
        while parent[h] != h:
            parent[h] = parent[parent[h]]
            h = parent[h]
        return h

    for fleet in (before, after):
        for node in fleet.nodes:
            first = fleet.members(node.instance)[0]
            parent[root(node.host)] = root(first)
    steps: dict[str, list[str]] = {}
    for host in old.engines:
        steps.setdefault(root(host), []).append(host)
    moved = {root(h) for h in moving}
    models = {n.instance: n.model for n in after.nodes}
    out = []
    for key, hosts in steps.items():
        if key not in moved:
            continue
        new_instances = list(dict.fromkeys(instance_then[h] for h in hosts))
        out.append(
            Step(
                hosts,
                list(dict.fromkeys(instance_now[h] for h in hosts)),
                new_instances,
                [models[i] for i in new_instances],
            )
        )
    return out


def capacity(before: fleet_mod.Fleet, steps: list[Step], index: int) -> dict[str, tuple[int, int]]:
    """While step `index` runs: per model its old instances take out, the instances that
    serve it and how many served it before the step (earlier steps done)."""
    out = {}
    step = steps[index]
    out_hosts = set(step.hosts)
    for model in dict.fromkeys(n.model for n in before.serving if n.host in out_hosts):
        # Serving now: the old layout's instances outside this step and the later ones,
        # plus what earlier steps brought in (counted by their new instances of the model).
        done = steps[:index]
        moved = {h for s in done for h in s.hosts}
        old_left = [
            n for n in before.serving_of(model) if n.host not in moved and n.host not in out_hosts
        ]
        new_in = sum(1 for s in done for m in s.models if m == model)
        old_now = [n for n in before.serving_of(model) if n.host not in moved]
        out[model] = (len(old_left) + new_in, len(old_now) + new_in)
    return out


def mixed(old: Inventory, new: Inventory, moved: set[str]) -> dict:
    """The inventory the fleet runs between steps: the moved hosts as `new` gives them,
    every other host as `old` does. Group variables are already in each host's; the
    groups are written flat."""
    hosts = {h: (new if h in moved else old).hostvars[h] for h in old.hostvars}
    groups: dict[str, list[str]] = {}
    for host in hosts:
        for group in (new if host in moved else old).groups.get(host, []):
            groups.setdefault(group, []).append(host)
    return {
        "all": {
            "hosts": hosts,
            "children": {g: {"hosts": {h: None for h in members}} for g, members in groups.items()},
        }
    }


def write(document: dict, path: Path) -> Path:
    """The inventory written where only its owner reads it (it holds the fleet's keys)."""
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(
        "# Written by `inferfleet migrate` for one step of a migration: do not edit.\n"
        + yaml.safe_dump(document, sort_keys=False)
    )
    return path
