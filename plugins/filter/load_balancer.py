"""The load balancer's servers, derived from the inventory's instances.

`inferfleet_instances` (plugins/filter/inventory.py) says which hosts form which
instance, in rank order; this filter turns every instance's rank 0 into one server
entry for the HAProxy/Nginx templates and for the role's preflight checks. Per-server
settings are read from the serving host's variables, falling back to the role's
defaults, so mixed hardware is described where the hardware is: on the host.
"""

from __future__ import annotations

import base64
import csv
import ipaddress
import json
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.filter.firewall import (
    FirewallError,
    host_addresses,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    served_model,
    whole_number,
)

HA_MODES = ("", "keepalived", "none")


def _int(host: str, name: str, value) -> int:
    try:
        return whole_number(host, name, value)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def backend_name(base: str, model: str, default_model: str) -> str:
    """The backend of a model's instances: `base` for the fleet's default model (so a
    single-model fleet's backend keeps its name, and adding or removing another model
    never renames it), `base_<model>` for every other, with each character a proxy name
    cannot hold as `_`."""
    if model == default_model:
        return base
    return f"{base}_{re.sub(r'[^A-Za-z0-9_.-]', '_', model)}"


def load_balancer_servers(instances: Mapping, hostvars: Mapping, defaults: Mapping) -> list:
    """One server per instance, named after the instance, pointing at its rank 0, in the
    backend of the model the instance serves (its `model` and `backend`).

    `defaults` holds `port`, `agent_port`, `weight`, `maxconn`, `backend` (the base backend
    name) and `model` (the fleet's default model, whose backend is `backend` itself); a
    serving host overrides the first four with `inference_engine_port`,
    `inference_engine_agent_port`, `load_balancer_backend_weight` and
    `load_balancer_backend_maxconn`, and its address
    with `load_balancer_backend_address` (else `ansible_host`, else its inventory name).
    """
    servers = []
    for name, members in instances.items():
        if not members:
            continue
        host = members[0]
        hv = hostvars.get(host, {}) if hasattr(hostvars, "get") else hostvars[host]
        address = hv.get("load_balancer_backend_address") or hv.get("ansible_host") or host
        servers.append(
            {
                "name": str(name),
                "host": host,
                "model": served_model(hv),
                "members": list(members),
                "address": str(address),
                "port": _int(
                    host, "inference_engine_port",
                    hv.get("inference_engine_port", defaults["port"]),
                ),
                "agent_port": _int(
                    host, "inference_engine_agent_port",
                    hv.get("inference_engine_agent_port", defaults["agent_port"]),
                ),
                "weight": _int(
                    host, "load_balancer_backend_weight",
                    hv.get("load_balancer_backend_weight", defaults["weight"]),
                ),
                "maxconn": _int(
                    host, "load_balancer_backend_maxconn",
                    hv.get("load_balancer_backend_maxconn", defaults["maxconn"]),
                ),
            }
        )
    base, default_model = str(defaults["backend"]), str(defaults.get("model") or "")
    seen: dict = {}
    for server in servers:
        server["backend"] = backend_name(base, server["model"], default_model)
        seen.setdefault(server["backend"], set()).add(server["model"])
    clash = next((sorted(models) for models in seen.values() if len(models) > 1), None)
    if clash:
        raise AnsibleFilterError(
            f"the served models {' and '.join(clash)} would share one load balancer backend:"
            " rename one (inference_engine_served_model_name, or inferfleet_model_name)"
        )
    return sorted(servers, key=lambda s: s["name"])


def _stat_rows(stat: str) -> csv.DictReader:
    """The rows of `show stat`'s CSV, from its header line on: once, right after a reload,
    an answer parsed into rows without a header, as one that begins with a blank line does
    (a CI run on 2026-12-06; the answer itself was not kept)."""
    text = str(stat)
    start = text.find("# pxname,")
    return csv.DictReader((text[start + 2:] if start >= 0 else "").splitlines())


def haproxy_servers(stat: str, backend: str) -> list:
    """The servers of the engines' backends in HAProxy's `show stat` CSV: `backend` and,
    on a fleet of several models, each model's `backend_<model>`. Name, backend, status,
    weight (effective, ramped by slow start), uweight (the user weight), and for
    `inferfleet doctor` the address HAProxy checks (addr), its last check's status and
    reason (check_status, e.g. L4TOUT; last_chk). With agent checks HAProxy writes
    "DOWN (agent)" for a server its agent took down and "DRAIN (agent)" for any drained
    one: status is the state alone (DOWN, DRAIN) and agent_down says the agent's part."""
    rows = _stat_rows(stat)
    return [
        {"name": r["svname"], "backend": r["pxname"],
         "status": r["status"].removesuffix(" (agent)"),
         "agent_down": r["status"] == "DOWN (agent)",
         "weight": r["weight"], "uweight": r.get("uweight", ""),
         **{key: r.get(key) or "" for key in ("addr", "check_status", "last_chk")}}
        for r in rows
        if (r.get("pxname") == backend or str(r.get("pxname", "")).startswith(f"{backend}_"))
        and r.get("svname") not in ("FRONTEND", "BACKEND")
    ]


def haproxy_backends(stat: str, backend: str) -> list:
    """The engines' backends HAProxy runs, from `show stat` CSV with its BACKEND rows
    (type mask 2 or more): `backend` and each model's `backend_<model>`."""
    rows = _stat_rows(stat)
    return [
        r["pxname"]
        for r in rows
        if r.get("svname") == "BACKEND"
        and (r.get("pxname") == backend or str(r.get("pxname", "")).startswith(f"{backend}_"))
    ]


def haproxy_queues(stat: str, backend: str) -> dict:
    """The engines' backends' queues from `show stat` CSV with BACKEND rows: {backend:
    {queued: requests waiting for a server (qcur), sessions: those and the ones the servers
    serve (scur)}}."""
    rows = _stat_rows(stat)
    return {
        r["pxname"]: {"queued": int(r.get("qcur") or 0), "sessions": int(r.get("scur") or 0)}
        for r in rows
        if r.get("svname") == "BACKEND"
        and (r.get("pxname") == backend or str(r.get("pxname", "")).startswith(f"{backend}_"))
    }


def load_balancer_seen(result: Mapping, backend: str) -> dict:
    """One load balancer's entry of tasks/servers.yml's fact, from its looped `show stat`
    result: a skipped one runs Nginx, which keeps no state to read."""
    if result.get("skipped"):
        return {"kind": "nginx", "servers": [], "queues": {}, "error": ""}
    if result.get("rc") != 0:
        error = (result.get("stderr") or result.get("msg") or "no answer").strip()
        return {"kind": "haproxy", "servers": [], "queues": {}, "error": error}
    stat = result.get("stdout", "")
    return {"kind": "haproxy", "servers": haproxy_servers(stat, backend),
            "queues": haproxy_queues(stat, backend), "error": ""}


def _worker_url(server: Mapping) -> str:
    """A server as a router's worker."""
    return f"http://{server['address']}:{server['port']}"


def load_balancer_router_changes(routers: list, before: list) -> list:
    """cache_aware, a membership change at runtime: for each router of `routers`
    (load_balancer_routers), what its admin API must do to go from the workers its
    settings file listed (`before`: the looped slurp results, in the same order; a router
    without one is new and starts with its whole list) to those it lists now: [{port,
    op: add_worker | remove_worker, url}], removals first."""
    changes = []
    for router, read in zip(routers, before, strict=True):
        if not read.get("content"):
            continue
        old = json.loads(base64.b64decode(read["content"]))["worker_urls"]
        new = router["settings"]["worker_urls"]
        changes += [{"port": router["port"], "op": "remove_worker", "url": u}
                    for u in old if u not in new]
        changes += [{"port": router["port"], "op": "add_worker", "url": u}
                    for u in new if u not in old]
    return sorted(changes, key=lambda c: c["op"] != "remove_worker")


def load_balancer_router_seen(result: Mapping, servers: list) -> dict:
    """One cache_aware load balancer's entry of tasks/servers.yml's fact, from its looped
    files/router_state.py result: each server of `servers` (the inventory's) is UP in its
    backend's router, DOWN (listed, its health check failing) or MAINT (not listed: taken
    out), as HAProxy would say; `routers` holds each backend's routing decisions; an
    unreadable router is the entry's error."""
    if result.get("rc") != 0:
        error = (result.get("stderr") or result.get("msg") or "no answer").strip()
        return {"kind": "haproxy", "servers": [], "queues": {}, "error": error}
    routers = json.loads(result.get("stdout") or "{}")
    seen, errors = [], [r["error"] for r in routers.values() if r.get("error")]
    decisions = {backend: r.get("decisions") or {} for backend, r in routers.items()
                 if not r.get("error")}
    for server in servers:
        router = routers.get(server["backend"])
        if router is None or router.get("error"):
            continue
        url = _worker_url(server)
        status = ("MAINT" if url not in router["workers"]
                  else "DOWN" if url in router["unhealthy"] else "UP")
        seen.append({"name": server["name"], "backend": server["backend"], "status": status,
                     "agent_down": False, "weight": "", "uweight": "",
                     "addr": f"{server['address']}:{server['port']}", "check_status": "",
                     "last_chk": ""})
    return {"kind": "haproxy", "servers": seen, "queues": {}, "routers": decisions,
            "error": "; ".join(errors)}


def _ipv4(host: str, hv: Mapping) -> str | None:
    """The host's IPv4 address as its peers reach it; None while only facts could tell and
    none are gathered."""
    try:
        found = host_addresses(host, hv)
    except FirewallError:
        return None
    return next((a for a in found if ipaddress.ip_address(a).version == 4), None)


def load_balancer_ha(host: str, groups: Mapping, hostvars: Mapping, settings: Mapping) -> dict:
    """This load balancer's share of the floating address, or {} when it has none.

    `settings` are this host's own values: ha, virtual_ip, interface, router_id, password,
    kind (the role's load_balancer_* variables). Its peers are the hosts of `loadbalancers`
    that set the same load_balancer_virtual_ip (and not load_balancer_ha: none). Returns
    {virtual_ip, prefix, interface, router_id, peers: [{host, address}]}, with `prefix`
    and `interface` from this host's gathered network facts and the peers' addresses from
    the inventory or their facts; where facts are not gathered yet (the preflight, on the
    controller), the checks that need them wait for the role's HA tasks, which gather them.
    Raises AnsibleFilterError naming what to change."""
    balancers = list(groups.get("loadbalancers", []))

    def hv_of(name: str) -> Mapping:
        return hostvars[name] if name in hostvars else {}

    hv = hv_of(host)
    mode = str(settings.get("ha") or "")
    vip = str(settings.get("virtual_ip") or "").strip()
    if mode not in HA_MODES:
        raise AnsibleFilterError(
            f"load_balancer_ha is {mode!r} on {host}: say keepalived (a floating address over "
            "the load balancers) or none (no shared address: clients choose a load balancer)"
        )
    if mode == "none":
        return {}
    if not vip:
        if mode == "keepalived":
            raise AnsibleFilterError(
                f"load_balancer_ha is keepalived on {host} but load_balancer_virtual_ip is not set:"
                " set the floating address clients will use (a free address on the load"
                " balancers' network)"
            )
        if len(balancers) > 1:
            raise AnsibleFilterError(
                f"{len(balancers)} load balancers ({', '.join(balancers)}) and no"
                f" load_balancer_virtual_ip on {host}: set one (a free address on their"
                " network, which keepalived moves to a healthy load balancer), or say"
                " load_balancer_ha: none if clients choose a load balancer themselves"
            )
        return {}
    try:
        address = ipaddress.ip_address(vip)
    except ValueError:
        address = None
    if address is None or address.version != 4:
        raise AnsibleFilterError(
            f"load_balancer_virtual_ip {vip!r} on {host} is not an IPv4 address (VRRP version 2,"
            " for its authentication): write it as 10.0.0.100, without a prefix length"
        )
    router_id = settings.get("router_id")
    if not str(router_id).isdigit() or not 1 <= int(router_id) <= 255:
        raise AnsibleFilterError(
            f"load_balancer_vrrp_router_id {router_id!r} on {host}: use 1..255, one no other"
            " VRRP group on the network uses"
        )
    password = str(settings.get("password") or "")
    if not 1 <= len(password) <= 8:
        what = "empty" if not password else "longer than 8 characters"
        raise AnsibleFilterError(
            f"load_balancer_vrrp_password on {host} is {what}:"
            " VRRP's authentication takes 1 to 8 characters (keepalived would silently cut a"
            " longer one); set it in a vaulted file, the same on every peer"
        )
    peers = [
        h for h in balancers
        if h == host or (
            str(hv_of(h).get("load_balancer_virtual_ip", "")).strip() == vip
            and hv_of(h).get("load_balancer_ha", "") != "none"
        )
    ]
    # A peer's kind as its inventory says (role defaults are not in hostvars): every peer
    # runs this check, so a difference is caught on one of them at least.
    kinds = {h: str(hv_of(h).get("load_balancer_kind", settings["kind"])) for h in peers}
    kinds[host] = str(settings["kind"])
    if len(set(kinds.values())) > 1:
        raise AnsibleFilterError(
            f"the load balancers sharing {vip} run different proxies ("
            + ", ".join(f"{h}: {k}" for h, k in sorted(kinds.items()))
            + "): a failover must not change what clients get; give them one load_balancer_kind"
        )
    addresses = {h: _ipv4(h, hv_of(h)) for h in balancers}
    taken = sorted(h for h, a in addresses.items() if a == vip)
    if taken:
        raise AnsibleFilterError(
            f"load_balancer_virtual_ip {vip} is the address of {', '.join(taken)}: choose a"
            " free address on the load balancers' network"
        )
    facts = hv.get("ansible_facts") or {}
    interface = str(
        settings.get("interface") or (facts.get("default_ipv4") or {}).get("interface", "")
    )
    own = (facts.get(interface.replace("-", "_")) or {}).get("ipv4") or {}
    prefix = None
    if own.get("address") and own.get("netmask"):
        net = ipaddress.ip_interface(f"{own['address']}/{own['netmask']}").network
        prefix = net.prefixlen
        if address not in net:
            raise AnsibleFilterError(
                f"load_balancer_virtual_ip {vip} is outside {net}, the network of {interface} on"
                f" {host}: choose a free address in {net} (the peers must share one network"
                " segment), or set load_balancer_virtual_ip_interface"
            )
        strays = sorted(h for h in peers
                        if addresses[h] and ipaddress.ip_address(addresses[h]) not in net)
        if strays:
            raise AnsibleFilterError(
                f"{', '.join(strays)} share{'s' if len(strays) == 1 else ''} {vip} with {host}"
                f" but {'is' if len(strays) == 1 else 'are'} not on {net}: VRRP peers must be"
                " on one network segment (where a host has an address there too, set its"
                " inferfleet_address to it)"
            )
    elif facts.get("interfaces"):
        raise AnsibleFilterError(
            f"{host} has no IPv4 address on {interface or 'its default route'}: set"
            " load_balancer_virtual_ip_interface to the interface on the load balancers'"
            " network"
        )
    return {
        "virtual_ip": vip,
        "prefix": prefix,
        "interface": interface,
        "router_id": int(router_id),
        "peers": [{"host": h, "address": addresses[h]} for h in peers],
    }


def load_balancer_routers(servers: list, settings: Mapping) -> list:
    """cache_aware: one vllm-router per model backend, in the order the backends first
    appear: its `backend`, `model`, loopback `port` and `metrics_port` (`settings`' base ports plus
    the backend's index) and `settings` for vllm-router itself (vllm_router's RouterArgs
    names: the workers are the backend's servers that may receive requests, as
    http://address:port; `settings["router"]` holds the rest, the engines' key among them).
    """
    backends: dict[str, list] = {}
    models: dict[str, str] = {}
    for server in servers:
        backends.setdefault(server["backend"], [])
        models.setdefault(server["backend"], server["model"])
        if int(server["weight"]) > 0:
            backends[server["backend"]].append(_worker_url(server))
    routers = []
    for index, (backend, workers) in enumerate(backends.items()):
        port = int(settings["port"]) + index
        metrics_port = int(settings["metrics_port"]) + index
        routers.append({
            "backend": backend,
            "model": models[backend],
            "port": port,
            "metrics_port": metrics_port,
            "settings": {
                **settings["router"],
                "worker_urls": workers,
                "host": "127.0.0.1",
                "port": port,
                "prometheus_host": "127.0.0.1",
                "prometheus_port": metrics_port,
            },
        })
    return routers


class FilterModule:
    def filters(self):
        return {
            "load_balancer_servers": load_balancer_servers,
            "haproxy_servers": haproxy_servers,
            "haproxy_backends": haproxy_backends,
            "load_balancer_seen": load_balancer_seen,
            "load_balancer_ha": load_balancer_ha,
            "load_balancer_routers": load_balancer_routers,
            "load_balancer_router_seen": load_balancer_router_seen,
            "load_balancer_router_changes": load_balancer_router_changes,
        }
