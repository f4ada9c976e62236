"""Prometheus scrape targets, derived from the inventory.

One list of file_sd target groups per scrape job, so a node added to the inventory is
scraped after the next run of the role (Prometheus re-reads the files on change, without
a reload). Every target carries `instance` = the host's inventory name, so series of
different jobs on the same host join on `instance`; inference hosts also carry their
model instance, rank, the instance's size (`inferfleet_instances`, the same derivation
the load balancer uses) and the model it serves (`inferfleet_model`, the name clients ask
for), so every alert can speak per model.

Per-host settings are read from the host's own variables, falling back to the defaults
passed in (the owning roles' defaults), as the load balancer role does for its servers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instances,
    served_model,
    whole_number,
)

JOBS = ("engine", "loadbalancer", "router", "node", "dcgm")
WILDCARDS = {"", "0.0.0.0", "::", "*", "[::]"}


def _hv(hostvars: Mapping, host: str) -> Mapping:
    return hostvars.get(host, {}) if hasattr(hostvars, "get") else hostvars[host]


def _int(host: str, name: str, value) -> int:
    try:
        return whole_number(host, name, value)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def _address(host: str, hv: Mapping) -> str:
    """Where the monitoring host reaches `host`: monitoring_scrape_address, else
    ansible_host, else the inventory name."""
    return str(hv.get("monitoring_scrape_address") or hv.get("ansible_host") or host)


def _hostport(address: str, port: int) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass
    return f"{address}:{port}"


def is_loopback(address: str) -> bool:
    if str(address).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(address).strip("[]")).is_loopback
    except ValueError:
        return False


def _unique(hosts: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for host in hosts:
        seen.setdefault(str(host), None)
    return list(seen)


def _members(groups: Mapping, hostvars: Mapping) -> dict[str, dict]:
    """host -> {inferfleet_instance, _rank, _instance_size, inferfleet_model}."""
    engines = list(groups.get("inference", []))
    if not engines:
        return {}
    try:
        by_instance = instances(engines, hostvars)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err
    out = {}
    for name, members in by_instance.items():
        model = served_model(_hv(hostvars, members[0]))
        for rank, host in enumerate(members):
            out[host] = {
                "inferfleet_instance": str(name),
                "inferfleet_rank": str(rank),
                "inferfleet_instance_size": str(len(members)),
                "inferfleet_model": model,
            }
    return out


def monitoring_scrape_targets(groups: Mapping, hostvars: Mapping, options: Mapping) -> dict:
    """{job: [file_sd target group, ...]} for engine, loadbalancer, router, node and dcgm.

    `options`: node_groups (the groups whose hosts run a node exporter), node_exporter_port,
    dcgm_exporter_port, dcgm_default (the role's monitoring_dcgm_exporter_enabled on this
    run), engine_port, lb_admin_address, lb_admin_port, lb_metrics_path (the engine's and
    the load balancer's role defaults).
    """
    members = _members(groups, hostvars)
    jobs: dict[str, list] = {job: [] for job in JOBS}

    # vLLM's /metrics is on the API server, which only rank 0 of an instance runs.
    for host, member in members.items():
        if member["inferfleet_rank"] != "0":
            continue
        hv = _hv(hostvars, host)
        port = _int(host, "inference_engine_port", hv.get("inference_engine_port",
                                                          options["engine_port"]))
        jobs["engine"].append({
            "targets": [_hostport(_address(host, hv), port)],
            "labels": {"instance": host, **member},
        })

    for host in _unique(groups.get("loadbalancers", [])):
        hv = _hv(hostvars, host)
        admin = str(hv.get("load_balancer_admin_address", options["lb_admin_address"]))
        port = _int(host, "load_balancer_admin_port",
                    hv.get("load_balancer_admin_port", options["lb_admin_port"]))
        address = _address(host, hv) if admin in WILDCARDS else admin
        jobs["loadbalancer"].append({
            "targets": [_hostport(address, port)],
            "labels": {
                "instance": host,
                "__metrics_path__": str(hv.get("load_balancer_metrics_path",
                                               options["lb_metrics_path"])),
                "lb_kind": str(hv.get("load_balancer_kind", "haproxy")),
            },
        })

    # cache_aware (never the role's default: a host routes so only when it says so): each
    # model's vllm-router, whose metrics HAProxy's admin bind serves at the metrics path +
    # /router/<model>.
    models = sorted({m["inferfleet_model"] for m in members.values()})
    for lb in jobs["loadbalancer"]:
        hv = _hv(hostvars, lb["labels"]["instance"])
        if str(hv.get("load_balancer_routing")) != "cache_aware":
            continue
        path = lb["labels"]["__metrics_path__"]
        for model in models:
            jobs["router"].append({
                "targets": lb["targets"],
                "labels": {"instance": lb["labels"]["instance"], "inferfleet_model": model,
                           "__metrics_path__": f"{path}/router/{model}"},
            })

    nodes = _unique([h for g in options["node_groups"] for h in groups.get(g, [])])
    for host in nodes:
        hv = _hv(hostvars, host)
        if not _bool(hv.get("monitoring_node_exporter_enabled", True)):
            continue
        port = _int(host, "monitoring_node_exporter_port",
                    hv.get("monitoring_node_exporter_port", options["node_exporter_port"]))
        jobs["node"].append({
            "targets": [_hostport(_address(host, hv), port)],
            "labels": {"instance": host, **members.get(host, {})},
        })

    for host in members:
        hv = _hv(hostvars, host)
        accelerator = str(hv.get("inferfleet_accelerator", "nvidia"))
        enabled = _bool(hv.get("monitoring_dcgm_exporter_enabled", options["dcgm_default"]))
        if accelerator != "nvidia" or not enabled:
            continue
        port = _int(host, "monitoring_dcgm_exporter_port",
                    hv.get("monitoring_dcgm_exporter_port", options["dcgm_exporter_port"]))
        jobs["dcgm"].append({
            "targets": [_hostport(_address(host, hv), port)],
            "labels": {"instance": host, **members[host]},
        })

    for job in jobs.values():
        job.sort(key=lambda group: (group["labels"]["instance"], group["labels"].get(
            "inferfleet_model", "")))
    return jobs


def monitoring_unreachable_lbs(groups: Mapping, hostvars: Mapping, options: Mapping,
                               prometheus_host: str) -> list[str]:
    """Load balancers whose admin endpoint listens on loopback only while Prometheus runs
    on another host: it could not scrape them."""
    bad = []
    for host in _unique(groups.get("loadbalancers", [])):
        if host == prometheus_host:
            continue
        hv = _hv(hostvars, host)
        admin = str(hv.get("load_balancer_admin_address", options["lb_admin_address"]))
        if is_loopback(admin):
            bad.append(f"{host} ({admin})")
    return bad


def monitoring_bad_ratios(ratios: Mapping) -> list[str]:
    """Names of the values that are not a share in (0, 1]."""
    bad = []
    for name, value in ratios.items():
        try:
            ok = 0 < float(value) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            bad.append(str(name))
    return bad


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


class FilterModule:
    def filters(self):
        return {
            "monitoring_scrape_targets": monitoring_scrape_targets,
            "monitoring_unreachable_lbs": monitoring_unreachable_lbs,
            "monitoring_bad_ratios": monitoring_bad_ratios,
        }
