"""The load balancer's servers, derived from the inventory's instances.

`inferfleet_instances` (plugins/filter/inventory.py) says which hosts form which
instance, in rank order; this filter turns every instance's rank 0 into one server
entry for the HAProxy/Nginx templates and for the role's preflight checks. Per-server
settings are read from the serving host's variables, falling back to the role's
defaults, so mixed hardware is described where the hardware is: on the host.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    whole_number,
)


def _int(host: str, name: str, value) -> int:
    try:
        return whole_number(host, name, value)
    except InventoryError as err:
        raise AnsibleFilterError(str(err)) from err


def load_balancer_servers(instances: Mapping, hostvars: Mapping, defaults: Mapping) -> list:
    """One server per instance, named after the instance, pointing at its rank 0.

    `defaults` holds `port`, `weight` and `maxconn`; a serving host overrides them
    with `inference_engine_port`, `load_balancer_backend_weight` and
    `load_balancer_backend_maxconn`, and its address with `load_balancer_backend_address`
    (else `ansible_host`, else its inventory name).
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
                "members": list(members),
                "address": str(address),
                "port": _int(
                    host, "inference_engine_port",
                    hv.get("inference_engine_port", defaults["port"]),
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
    return sorted(servers, key=lambda s: s["name"])


def haproxy_servers(stat: str, backend: str) -> list:
    """The servers of `backend` in HAProxy's `show stat` CSV: name, status, weight
    (effective, ramped by slow start) and uweight (the user weight)."""
    rows = csv.DictReader(str(stat).lstrip("# ").splitlines())
    return [
        {"name": r["svname"], "status": r["status"], "weight": r["weight"],
         "uweight": r.get("uweight", "")}
        for r in rows
        if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND")
    ]


def load_balancer_seen(result: Mapping, backend: str) -> dict:
    """One load balancer's entry of tasks/servers.yml's fact, from its looped `show stat`
    result: a skipped one runs Nginx, which keeps no state to read."""
    if result.get("skipped"):
        return {"kind": "nginx", "servers": [], "error": ""}
    if result.get("rc") != 0:
        error = (result.get("stderr") or result.get("msg") or "no answer").strip()
        return {"kind": "haproxy", "servers": [], "error": error}
    servers = haproxy_servers(result.get("stdout", ""), backend)
    return {"kind": "haproxy", "servers": servers, "error": ""}


class FilterModule:
    def filters(self):
        return {
            "load_balancer_servers": load_balancer_servers,
            "haproxy_servers": haproxy_servers,
            "load_balancer_seen": load_balancer_seen,
        }
