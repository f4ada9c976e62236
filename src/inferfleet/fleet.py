"""The fleet as the CLI sees it: the inventory's hosts, instances and endpoints, with
variables templated by Ansible itself (so group_vars, host_vars and references between
variables resolve exactly as in a playbook run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    instances,
    model_of,
    served_model,
)

from inferfleet.paths import COLLECTION


def role_defaults(*roles: str) -> dict:
    """The plain values of these roles' defaults/main.yml (the collection's own), later
    roles first: what a host gets when the inventory does not set the variable."""
    out: dict = {}
    for role in roles:
        path = COLLECTION / "roles" / role / "defaults" / "main.yml"
        out.update(yaml.safe_load(path.read_text()))
    return out


@dataclass
class Node:
    host: str
    address: str
    port: int
    instance: str
    rank: int
    model: str = ""  # the name clients ask for (served_model: the host's variables)
    version: str = ""  # the model version the inventory gives it

    @property
    def base(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class Fleet:
    model: str  # the first instance's model
    engine_key: str
    api_key: str  # the first API key
    nodes: list[Node]
    balancers: list[str]  # base URLs of the public listeners
    admin: list[str]  # base URLs of the load balancers' admin listeners
    routing: str = "leastconn"  # the first load balancer's load_balancer_routing
    weight: int = 100  # each backend's configured weight (load_balancer_backend_weight)
    slowstart: float = 60.0  # seconds a returning backend ramps up (load_balancer_slowstart)
    max_num_seqs: int = 256  # requests an engine runs at once (vLLM's default when unset)
    ca: str = ""  # the CA clients trust for the TLS listeners (load_balancer_tls_ca_certificate)
    keys: list[dict] | None = None  # load_balancer_api_keys: {id, key, models (optional)}

    @property
    def serving(self) -> list[Node]:
        return [n for n in self.nodes if n.rank == 0]

    @property
    def models(self) -> list[str]:
        """Every served model, the first instance's first."""
        return list(dict.fromkeys(n.model for n in self.serving))

    def serving_of(self, model: str) -> list[Node]:
        return [n for n in self.serving if n.model == model]

    def key_for(self, model: str) -> str:
        """An API key that may use `model` (a key without `models` may use every one)."""
        for entry in self.keys or []:
            if "models" not in entry or model in entry["models"]:
                return str(entry["key"])
        return self.api_key

    def members(self, instance: str) -> list[str]:
        """The hosts of an instance, rank 0 first."""
        return [n.host for n in self.nodes if n.instance == instance]


def duration(value) -> float:
    """Seconds from an HAProxy time ("10s", "500ms", "2m", or a bare number of ms)."""
    text = str(value).strip()
    for unit, scale in (("ms", 0.001), ("us", 1e-6), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text) / 1000


def load(inventory: Path) -> Fleet:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(inventory)])
    varman = VariableManager(loader=loader, inventory=inv)

    def hostvars(host: str) -> dict:
        raw = varman.get_vars(host=inv.get_host(host))
        return Templar(loader=loader, variables=raw).template(raw)

    engine_hosts = inv.get_groups_dict().get("inference", [])
    hv = {h: hostvars(h) for h in engine_hosts}
    groups = instances(engine_hosts, hv)
    defaults = role_defaults("load_balancer", "fleet_defaults")
    nodes = []
    for name, members in groups.items():
        for rank, host in enumerate(members):
            v = hv[host]
            nodes.append(
                Node(
                    host,
                    str(v.get("inferfleet_address") or v.get("ansible_host") or host),
                    int({**defaults, **v}["inference_engine_port"]),
                    name,
                    rank,
                    served_model(hv[members[0]]),
                    model_of(members[0], hv)["version"],
                )
            )
    balancers, admin = [], []
    lb_vars: dict = defaults
    routing = str(defaults["load_balancer_routing"])
    for index, host in enumerate(inv.get_groups_dict().get("loadbalancers", [])):
        lb_vars = {**defaults, **hostvars(host)}
        if index == 0:  # the one verify's load goes through
            routing = str(lb_vars["load_balancer_routing"])
        address = lb_vars.get("inferfleet_address") or lb_vars.get("ansible_host") or host
        # With TLS the certificate must carry this address (or the name it holds).
        tls = lb_vars.get("load_balancer_tls_certificate") and lb_vars.get("load_balancer_tls_key")
        scheme = "https" if tls else "http"
        balancers.append(f"{scheme}://{address}:{lb_vars['load_balancer_port']}")
        admin.append(f"http://{address}:{lb_vars['load_balancer_admin_port']}")
    first = hv[engine_hosts[0]] if engine_hosts else {}
    keys = lb_vars.get("load_balancer_api_keys") or []
    return Fleet(
        model=served_model(first),
        engine_key=str(first.get("inference_engine_api_key") or ""),
        api_key=str(keys[0]["key"]) if keys else "",
        nodes=nodes,
        balancers=balancers,
        admin=admin,
        routing=routing,
        weight=int(lb_vars["load_balancer_backend_weight"]),
        slowstart=duration(lb_vars["load_balancer_slowstart"]),
        max_num_seqs=int(first.get("inference_engine_max_num_seqs") or 256),
        ca=str(lb_vars.get("load_balancer_tls_ca_certificate") or ""),
        keys=list(keys),
    )
