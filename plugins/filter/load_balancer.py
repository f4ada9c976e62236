"""The load balancer's servers, derived from the inventory's instances.

`inferfleet_instances` (plugins/filter/inventory.py) says which hosts form which
instance, in rank order; this filter turns every instance's rank 0 into one server
entry for the HAProxy/Nginx templates and for the role's preflight checks. Per-server
settings are read from the serving host's variables, falling back to the role's
defaults, so mixed hardware is described where the hardware is: on the host.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    served_model,
    whole_number,
)


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

    `defaults` holds `port`, `weight`, `maxconn`, `backend` (the base backend name) and
    `model` (the fleet's default model, whose backend is `backend` itself); a
    serving host overrides the first three with `inference_engine_port`,
    `load_balancer_backend_weight` and `load_balancer_backend_maxconn`, and its address
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


def haproxy_servers(stat: str, backend: str) -> list:
    """The servers of the engines' backends in HAProxy's `show stat` CSV: `backend` and,
    on a fleet of several models, each model's `backend_<model>`. Name, backend, status,
    weight (effective, ramped by slow start) and uweight (the user weight)."""
    rows = csv.DictReader(str(stat).lstrip("# ").splitlines())
    return [
        {"name": r["svname"], "backend": r["pxname"], "status": r["status"],
         "weight": r["weight"], "uweight": r.get("uweight", "")}
        for r in rows
        if (r.get("pxname") == backend or str(r.get("pxname", "")).startswith(f"{backend}_"))
        and r.get("svname") not in ("FRONTEND", "BACKEND")
    ]


def haproxy_backends(stat: str, backend: str) -> list:
    """The engines' backends HAProxy runs, from `show stat` CSV with its BACKEND rows
    (type mask 2 or more): `backend` and each model's `backend_<model>`."""
    rows = csv.DictReader(str(stat).lstrip("# ").splitlines())
    return [
        r["pxname"]
        for r in rows
        if r.get("svname") == "BACKEND"
        and (r.get("pxname") == backend or str(r.get("pxname", "")).startswith(f"{backend}_"))
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
            "haproxy_backends": haproxy_backends,
            "load_balancer_seen": load_balancer_seen,
        }
