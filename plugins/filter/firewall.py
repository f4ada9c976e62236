"""What the firewall of one host lets in, derived from the inventory.

`firewall_rules` returns, for one host, the list of rules its `inet inferfleet` table
accepts besides loopback, established/related traffic and ICMP: each rule is a protocol,
a port or port range, and the source addresses or networks allowed to reach it. The
template (templates/firewall.nft.j2) only writes them out.

A host's address, as its peers' packets carry it: `inferfleet_address` (the address the
CLI also uses), else `ansible_host` when it is an IP address, else the default IPv4 and IPv6
addresses from the host's gathered facts. A name is never used: nft would resolve it once,
at load time, and a later DNS change would silently change who gets in. The preflight
gathers the network facts of hosts that need them (`firewall_hosts_needing_facts`).

Instances come from module_utils.instances, the same derivation the load balancer and the
monitoring use.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.engine_args import ray_ports
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instances,
)

PROTOCOLS = ("tcp", "udp")


class FirewallError(ValueError):
    """Settings or an inventory the firewall cannot be built from; says what to change."""


def _hv(hostvars: Mapping, host: str) -> Mapping:
    return hostvars[host] if host in hostvars else {}


def _ip(value) -> str | None:
    try:
        return str(ipaddress.ip_address(str(value).strip("[]")))
    except ValueError:
        return None


def explicit_address(host: str, hv: Mapping) -> list[str]:
    """The addresses the inventory gives `host` (inferfleet_address, else an IP
    ansible_host); [] when only facts can tell."""
    given = hv.get("inferfleet_address")
    if given:
        if _ip(given) is None:
            raise FirewallError(
                f"{host}: inferfleet_address {given!r} is not an IP address: set it to the "
                "address the host's peers (and the CLI) reach it at"
            )
        return [_ip(given)]
    address = _ip(hv.get("ansible_host", ""))
    return [address] if address else []


def host_addresses(host: str, hv: Mapping) -> list[str]:
    """inferfleet_address, else an IP ansible_host, else the facts' default addresses."""
    found = explicit_address(host, hv)
    if found:
        return found
    facts = hv.get("ansible_facts") or {}
    for key in ("default_ipv4", "default_ipv6"):
        address = _ip((facts.get(key) or {}).get("address", ""))
        if address:
            found.append(address)
    if not found:
        raise FirewallError(
            f"cannot tell the address of {host}: its ansible_host "
            f"({hv.get('ansible_host', 'unset')}) is not an IP address and its facts have no "
            f"default IPv4 or IPv6 address. Set inferfleet_address for {host} in the inventory"
        )
    return found


def network(value, variable: str) -> str:
    """A CIDR network (or a single address), normalised; refuses host bits."""
    try:
        return str(ipaddress.ip_network(str(value), strict=True))
    except ValueError as err:
        try:
            fixed = ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            raise FirewallError(
                f"{variable}: {value!r} is not a network: write it as 10.0.0.0/8, "
                "2001:db8::/32 or a single address"
            ) from err
        raise FirewallError(
            f"{variable}: {value!r} has bits set after the prefix: did you mean {fixed}?"
        ) from err


def ports(value, variable: str) -> str:
    """A port (8000) or range ("30000-30100") as nft writes it."""
    text = str(value).strip()
    low, _, high = text.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError as err:
        raise FirewallError(
            f'{variable}: {value!r} is not a port or a range: write 8000 or "30000-30100"'
        ) from err
    if not 1 <= first <= last <= 65535:
        raise FirewallError(
            f"{variable}: {value!r} is out of range: ports are 1..65535, a range low-high"
        )
    return str(first) if first == last else f"{first}-{last}"


def _rule(
    comment: str,
    port,
    sources: Sequence[str],
    variable: str,
    proto: str = "tcp",
    published: bool = False,
) -> dict:
    """`published`: the port is a container's, published by Docker (-p), so its traffic is
    forwarded rather than delivered to the host; the template guards it in `forward`."""
    return {
        "comment": comment,
        "proto": proto,
        "ports": ports(port, variable),
        "sources": sorted(set(sources), key=lambda s: (":" in s, s)),
        "published": published,
    }


def _addresses(hosts: Sequence[str], hostvars: Mapping) -> list[str]:
    return [a for h in hosts for a in host_addresses(h, _hv(hostvars, h))]


def _on(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def _engine_ray_ports(hv: Mapping, defaults: Mapping) -> list[str]:
    """The ports the inference_engine role starts Ray with, on a Ray-backed group's member
    (its inventory values, else `defaults`: {inference_engine_ray_*_port: value}); [] under
    the native backend."""
    if str(hv.get("inference_engine_group_backend", "native")) != "ray":
        return []
    prefix = "inference_engine_ray_"
    return ray_ports({k[len(prefix):]: hv.get(k, v) for k, v in defaults.items()})


def firewall_rules(host: str, groups: Mapping, hostvars: Mapping, options: Mapping) -> list[dict]:
    """The rules of `host`'s input chain, in order; raises FirewallError.

    `options`: client_networks, admin_networks, ssh_port, group_port_ranges, ray_ports,
    extra_rules (this host's firewall_* settings), monitoring_group, and the other roles'
    port defaults for hosts that do not set them: engine_port, agent_port, master_port, lb_port,
    lb_admin_port, lb_peers_port, prometheus_port, node_exporter_port, dcgm_exporter_port,
    model_peers and model_peer_port (model_sync_peers, model_sync_peer_port), and
    ray_port_defaults ({inference_engine_ray_*_port: value}).
    """
    hv = _hv(hostvars, host)
    clients = [network(n, "firewall_client_networks") for n in options["client_networks"]]
    admins = [network(n, "firewall_admin_networks") for n in options["admin_networks"]]
    balancers = _addresses(list(groups.get("loadbalancers", [])), hostvars)
    watchers = _addresses(list(groups.get(options["monitoring_group"], [])), hostvars)
    ssh = ports(options["ssh_port"], "firewall_ssh_port")  # checked even when unused
    rules = []
    if admins:
        rules.append(_rule("SSH from the admin networks", ssh, admins, "firewall_ssh_port"))

    if host in groups.get("inference", []):
        try:
            by_instance = instances(list(groups["inference"]), hostvars)
        except InventoryError as err:
            raise FirewallError(str(err)) from err
        peers = next(m for m in by_instance.values() if host in m)
        peers = [p for p in peers if p != host]
        engine = hv.get("inference_engine_port", options["engine_port"])
        rules.append(
            _rule(
                "engine API from load balancers, monitoring and admins",
                engine,
                balancers + watchers + admins,
                "inference_engine_port",
            )
        )
        rules.append(
            _rule(
                "engine agent from load balancers",
                hv.get("inference_engine_agent_port", options["agent_port"]),
                balancers,
                "inference_engine_agent_port",
            )
        )
        group = [
            (
                "engine API between instance members (fabric_preflight)",
                engine,
                "inference_engine_port",
            ),
            (
                "distributed master port between instance members",
                hv.get("inference_engine_master_port", options["master_port"]),
                "inference_engine_master_port",
            ),
        ]
        ray = options["ray_ports"] or _engine_ray_ports(hv, options["ray_port_defaults"])
        group += [("Ray between instance members", p, "firewall_ray_ports") for p in ray]
        group += [
            ("NCCL/Gloo between instance members", p, "firewall_group_port_ranges")
            for p in options["group_port_ranges"]
        ]
        sources = _addresses(peers, hostvars)
        if sources:
            rules += [_rule(comment, port, sources, variable) for comment, port, variable in group]
        if _on(hv.get("model_sync_peers", options["model_peers"])):
            takers = [
                h for h in groups["inference"] if h != host
                and _on(_hv(hostvars, h).get("model_sync_peers", options["model_peers"]))
            ]
            rules.append(
                _rule(
                    "model pieces between engine nodes (model_sync_peers)",
                    hv.get("model_sync_peer_port", options["model_peer_port"]),
                    _addresses(takers, hostvars),
                    "model_sync_peer_port",
                )
            )
        gpu = str(hv.get("inferfleet_accelerator", "nvidia")) == "nvidia"
        if gpu and _on(hv.get("monitoring_dcgm_exporter_enabled", True)):
            rules.append(
                _rule(
                    "DCGM exporter from monitoring",
                    hv.get("monitoring_dcgm_exporter_port", options["dcgm_exporter_port"]),
                    watchers,
                    "monitoring_dcgm_exporter_port",
                    published=True,
                )
            )

    if host in groups.get("loadbalancers", []):
        rules.append(
            _rule(
                "public API from the client networks",
                hv.get("load_balancer_port", options["lb_port"]),
                clients,
                "load_balancer_port",
            )
        )
        rules.append(
            _rule(
                "load balancer stats and metrics from monitoring and admins",
                hv.get("load_balancer_admin_port", options["lb_admin_port"]),
                watchers + admins,
                "load_balancer_admin_port",
            )
        )

        vip = str(hv.get("load_balancer_virtual_ip", "") or "")
        if vip and hv.get("load_balancer_ha", "") != "none":
            peers = [
                h for h in groups.get("loadbalancers", [])
                if h != host and str(_hv(hostvars, h).get("load_balancer_virtual_ip", "")) == vip
                and _hv(hostvars, h).get("load_balancer_ha", "") != "none"
            ]
            sources = _addresses(peers, hostvars)
            rules.append(
                {"comment": "VRRP between the load balancers sharing the floating address",
                 "proto": "vrrp", "ports": "", "sources": sorted(set(sources)), "published": False}
            )
            if str(hv.get("load_balancer_kind", "haproxy")) == "haproxy":
                rules.append(
                    _rule(
                        "HAProxy peers (rate counters) between the load balancers",
                        hv.get("load_balancer_haproxy_peers_port", options["lb_peers_port"]),
                        sources,
                        "load_balancer_haproxy_peers_port",
                    )
                )

    if host in groups.get(options["monitoring_group"], []):
        rules.append(
            _rule(
                "Prometheus from the admin networks",
                hv.get("monitoring_prometheus_port", options["prometheus_port"]),
                admins,
                "monitoring_prometheus_port",
            )
        )

    if _on(hv.get("monitoring_node_exporter_enabled", True)):
        rules.append(
            _rule(
                "node exporter from monitoring",
                hv.get("monitoring_node_exporter_port", options["node_exporter_port"]),
                watchers,
                "monitoring_node_exporter_port",
            )
        )

    for index, extra in enumerate(options["extra_rules"]):
        rules.append(_extra(extra, f"firewall_extra_rules[{index}]"))
    return [r for r in rules if r["sources"]]


def _extra(extra, where: str) -> dict:
    if not isinstance(extra, Mapping) or "port" not in extra or not extra.get("sources"):
        raise FirewallError(
            f"{where}: write each extra rule as {{port: 5000, sources: [10.0.0.0/8], "
            "proto: tcp, comment: why}} (port and sources required)"
        )
    proto = str(extra.get("proto", "tcp"))
    if proto not in PROTOCOLS:
        raise FirewallError(f"{where}: proto {proto!r} must be one of {', '.join(PROTOCOLS)}")
    sources = [network(s, f"{where}.sources") for s in extra["sources"]]
    comment = str(extra.get("comment") or f"extra rule {where}")
    if '"' in comment or "\n" in comment:
        raise FirewallError(f"{where}: the comment may not hold a double quote or a newline")
    return _rule(comment, extra["port"], sources, f"{where}.port", proto)


def firewall_refusal(host: str, groups: Mapping, hostvars: Mapping, options: Mapping) -> str:
    """'' when firewall_rules can be built for `host`, else the reason (for an assert)."""
    try:
        firewall_rules(host, groups, hostvars, options)
    except FirewallError as err:
        return str(err)
    return ""


def firewall_hosts_needing_facts(hosts: Sequence[str], hostvars: Mapping) -> list[str]:
    """Hosts whose address only their facts can tell, and whose facts are not gathered."""
    out = []
    for host in dict.fromkeys(hosts):
        hv = _hv(hostvars, host)
        try:
            if explicit_address(host, hv):
                continue
        except FirewallError:
            continue  # firewall_refusal reports it
        if not (hv.get("ansible_facts") or {}).get("default_ipv4"):
            out.append(host)
    return out


def firewall_in_networks(address: str, networks: Sequence[str]) -> bool:
    """Whether `address` lies in one of `networks` (bad networks count as no match)."""
    ip = ipaddress.ip_address(address)
    for value in networks:
        try:
            if ip in ipaddress.ip_network(str(value), strict=False):
                return True
        except ValueError:
            continue
    return False


def firewall_families(sources: Sequence[str]) -> dict[str, list[str]]:
    """{'ip': [...], 'ip6': [...]}: the sources split by family, for nft's saddr sets."""
    out: dict[str, list[str]] = {"ip": [], "ip6": []}
    for source in sources:
        family = "ip6" if ipaddress.ip_network(source, strict=False).version == 6 else "ip"
        out[family].append(source)
    return out


def _wrap(func):
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except FirewallError as err:
            raise AnsibleFilterError(str(err)) from err

    call.__name__ = func.__name__
    call.__doc__ = func.__doc__
    return call


class FilterModule:
    def filters(self):
        return {
            "firewall_rules": _wrap(firewall_rules),
            "firewall_refusal": firewall_refusal,
            "firewall_hosts_needing_facts": firewall_hosts_needing_facts,
            "firewall_in_networks": firewall_in_networks,
            "firewall_families": firewall_families,
        }
