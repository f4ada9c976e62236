"""The load balancer's filters over the inventory and over HAProxy's `show stat`."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.filter.load_balancer import (
    haproxy_backends,
    haproxy_queues,
    haproxy_servers,
    load_balancer_ha,
    load_balancer_router_changes,
    load_balancer_router_seen,
    load_balancer_routers,
    load_balancer_servers,
)

# The shape of HAProxy 2.6's `show stat -1 6 -1` (backends and servers) on a fleet of two
# models with a per-model rate table (columns cut to those the filters read).
STAT = """\
# pxname,svname,status,weight,uweight
inferfleet_engines,node1,UP,100,100
inferfleet_engines,node2,DRAIN,0,100
inferfleet_engines,BACKEND,UP,100,100
inferfleet_engines_org_beta-1.5,node3,UP,100,100
inferfleet_engines_org_beta-1.5,BACKEND,UP,100,100
inferfleet_rate_by_model,BACKEND,UP,0,0
"""
DEFAULTS = {"port": 8000, "agent_port": 8010, "weight": 100, "maxconn": 64,
            "backend": "inferfleet_engines"}


def test_the_engines_backends_and_their_servers_are_read_from_show_stat():
    assert haproxy_backends(STAT, "inferfleet_engines") == [
        "inferfleet_engines", "inferfleet_engines_org_beta-1.5"]
    assert [(s["backend"], s["name"], s["status"]) for s in
            haproxy_servers(STAT, "inferfleet_engines")] == [
        ("inferfleet_engines", "node1", "UP"),
        ("inferfleet_engines", "node2", "DRAIN"),
        ("inferfleet_engines_org_beta-1.5", "node3", "UP"),
    ]
    # Whatever comes before the header is left out (a blank line parses into rows without one)
    assert haproxy_servers("\n" + STAT, "inferfleet_engines") == haproxy_servers(
        STAT, "inferfleet_engines")
    assert haproxy_servers("Unknown command.\n", "inferfleet_engines") == []
    # Servers only (type mask 4) hold no BACKEND row.
    servers_only = "\n".join(line for line in STAT.splitlines() if ",BACKEND," not in line)
    assert haproxy_backends(servers_only, "inferfleet_engines") == []


def test_each_server_is_in_its_models_backend_the_default_keeping_the_plain_name():
    instances = {"a": ["a"], "b": ["b"], "c": ["c"]}
    hostvars = {"a": {"inferfleet_model_name": "chat"}, "b": {"inferfleet_model_name": "chat"},
                "c": {"inferfleet_model_name": "chat", "inference_engine_served_model_name": "q/x"}}
    servers = load_balancer_servers(instances, hostvars, {**DEFAULTS, "model": "chat"})
    assert [(s["name"], s["model"], s["backend"]) for s in servers] == [
        ("a", "chat", "inferfleet_engines"),
        ("b", "chat", "inferfleet_engines"),
        ("c", "q/x", "inferfleet_engines_q_x"),
    ]


def test_two_models_that_would_share_a_backend_name_are_refused():
    hostvars = {"a": {"inferfleet_model_name": "q/x"}, "b": {"inferfleet_model_name": "q_x"}}
    with pytest.raises(AnsibleFilterError, match="q/x and q_x would share one load balancer"):
        load_balancer_servers({"a": ["a"], "b": ["b"]}, hostvars, {**DEFAULTS, "model": "m"})


# --- The floating address ------------------------------------------------------------------

HA = {"ha": "", "virtual_ip": "10.0.5.200", "interface": "", "router_id": 51,
      "password": "s3cret", "kind": "haproxy"}


def _facts(address: str, interface: str = "eth0") -> dict:
    return {"interfaces": ["lo", interface],
            "default_ipv4": {"interface": interface, "address": address},
            interface: {"ipv4": {"address": address, "netmask": "255.255.255.0"}}}


def _balancers(*hosts: tuple, facts: bool = True) -> tuple[dict, dict]:
    """groups and hostvars of load balancers (name, address, own variables)."""
    hostvars = {}
    for name, address, own in hosts:
        hostvars[name] = {"load_balancer_virtual_ip": "10.0.5.200", **own}
        if facts:
            hostvars[name]["ansible_facts"] = _facts(address)
        else:
            hostvars[name]["ansible_host"] = address
    return {"loadbalancers": [h[0] for h in hosts]}, hostvars


def test_two_load_balancers_share_the_address_with_each_other():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.5.12", {}))
    ha = load_balancer_ha("lb1", groups, hostvars, HA)
    assert ha == {"virtual_ip": "10.0.5.200", "prefix": 24, "interface": "eth0", "router_id": 51,
                  "peers": [{"host": "lb1", "address": "10.0.5.11"},
                            {"host": "lb2", "address": "10.0.5.12"}]}


def test_before_the_facts_the_peers_come_from_the_inventory_and_the_network_waits():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.5.12", {}), facts=False)
    ha = load_balancer_ha("lb1", groups, hostvars, HA)
    assert ha["prefix"] is None
    assert [p["address"] for p in ha["peers"]] == ["10.0.5.11", "10.0.5.12"]
    # an inventory name only: its address is known once its facts are gathered
    del hostvars["lb2"]["ansible_host"]
    ha = load_balancer_ha("lb1", groups, hostvars, HA)
    assert ha["peers"][1] == {"host": "lb2", "address": None}


def test_one_load_balancer_needs_no_address_and_two_must_say_so():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}))
    assert load_balancer_ha("lb1", groups, hostvars, {**HA, "virtual_ip": ""}) == {}
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.5.12", {}))
    with pytest.raises(AnsibleFilterError, match=r"2 load balancers \(lb1, lb2\) and no "
                       r"load_balancer_virtual_ip on lb1: set one .* say load_balancer_ha: none"):
        load_balancer_ha("lb1", groups, hostvars, {**HA, "virtual_ip": ""})
    assert load_balancer_ha("lb1", groups, hostvars, {**HA, "virtual_ip": "", "ha": "none"}) == {}


@pytest.mark.parametrize(("change", "message"), [
    ({"virtual_ip": "10.0.6.200"}, r"10.0.6.200 is outside 10.0.5.0/24, the network of eth0 on "
                                   r"lb1: choose a free address in 10.0.5.0/24"),
    ({"virtual_ip": "10.0.5.12"}, r"10.0.5.12 is the address of lb2: choose a free address"),
    ({"virtual_ip": "10.0.5.200/24"}, r"not an IPv4 address .* without a prefix length"),
    ({"virtual_ip": "fd00::5"}, r"not an IPv4 address"),
    ({"ha": "vrrp"}, r"load_balancer_ha is 'vrrp' on lb1: say keepalived .* or none"),
    ({"ha": "keepalived", "virtual_ip": ""}, r"load_balancer_virtual_ip is not set"),
    ({"router_id": 256}, r"load_balancer_vrrp_router_id 256 on lb1: use 1..255"),
    ({"password": ""}, r"load_balancer_vrrp_password on lb1 is empty"),
    ({"password": "123456789"}, r"longer than 8 characters"),
    ({"interface": "eth1"},
     r"lb1 has no IPv4 address on eth1: set load_balancer_virtual_ip_interface"),
])
def test_a_bad_floating_address_is_refused_naming_what_to_change(change, message):
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.5.12", {}))
    with pytest.raises(AnsibleFilterError, match=message) as refused:
        load_balancer_ha("lb1", groups, hostvars, {**HA, **change})
    assert "123456789" not in str(refused.value) and "s3cret" not in str(refused.value)


def test_peers_running_different_proxies_are_refused():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {"load_balancer_kind": "nginx"}),
                                  ("lb2", "10.0.5.12", {}))
    with pytest.raises(AnsibleFilterError, match=r"the load balancers sharing 10.0.5.200 run "
                                                 r"different proxies \(lb1: nginx, lb2: haproxy\)"):
        load_balancer_ha("lb2", groups, hostvars, HA)


def test_a_peer_on_another_network_is_refused():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.7.12", {}))
    with pytest.raises(AnsibleFilterError, match=r"lb2 shares 10.0.5.200 with lb1 but is not on "
                                                 r"10.0.5.0/24: VRRP peers must be on one"):
        load_balancer_ha("lb1", groups, hostvars, HA)


def test_peers_are_the_load_balancers_of_the_same_address():
    groups, hostvars = _balancers(("lb1", "10.0.5.11", {}), ("lb2", "10.0.5.12", {}),
                                  ("nginx", "10.0.5.13", {"load_balancer_ha": "none",
                                                          "load_balancer_kind": "nginx"}),
                                  ("lb3", "10.0.5.14", {"load_balancer_virtual_ip": "10.0.5.201"}))
    ha = load_balancer_ha("lb2", groups, hostvars, HA)
    assert [p["host"] for p in ha["peers"]] == ["lb1", "lb2"]
    assert load_balancer_ha("nginx", groups, hostvars, {**HA, "ha": "none", "kind": "nginx"}) == {}


def test_the_engines_backends_queues_are_read_from_show_stat():
    stat = ("# pxname,svname,qcur,scur,status\n"
            "inferfleet_engines,node1,0,8,UP\ninferfleet_engines,BACKEND,24,40,UP\n"
            "inferfleet_engines_coder,BACKEND,,0,UP\nstats,BACKEND,3,1,UP\n")
    assert haproxy_queues(stat, "inferfleet_engines") == {
        "inferfleet_engines": {"queued": 24, "sessions": 40},
        "inferfleet_engines_coder": {"queued": 0, "sessions": 0}}


def test_cache_aware_has_one_router_per_backend_over_its_servers_that_take_requests():
    servers = [
        {"backend": "inferfleet_engines", "model": "m", "address": "10.0.0.11", "port": 8000,
         "weight": 100},
        {"backend": "inferfleet_engines_beta", "model": "beta", "address": "10.0.0.13",
         "port": 8001, "weight": 100},
        {"backend": "inferfleet_engines", "model": "m", "address": "10.0.0.12", "port": 8000,
         "weight": 0},
        {"backend": "inferfleet_engines", "model": "m", "address": "10.0.0.14", "port": 8000,
         "weight": 50},
    ]
    settings = {"port": 8600, "metrics_port": 8700,
                "router": {"policy": "cache_aware", "api_key": "k", "port": 1, "host": "0.0.0.0"}}
    assert load_balancer_routers(servers, settings) == [
        {"backend": "inferfleet_engines", "model": "m", "port": 8600, "metrics_port": 8700,
         "settings": {
            "policy": "cache_aware", "api_key": "k", "host": "127.0.0.1", "port": 8600,
            "worker_urls": ["http://10.0.0.11:8000", "http://10.0.0.14:8000"],
            "prometheus_host": "127.0.0.1", "prometheus_port": 8700}},
        {"backend": "inferfleet_engines_beta", "model": "beta", "port": 8601,
         "metrics_port": 8701, "settings": {
            "policy": "cache_aware", "api_key": "k", "host": "127.0.0.1", "port": 8601,
            "worker_urls": ["http://10.0.0.13:8001"],
            "prometheus_host": "127.0.0.1", "prometheus_port": 8701}},
    ]


def test_cache_aware_servers_are_read_from_the_routers_as_haproxy_would_name_their_state():
    servers = [
        {"name": "node1", "backend": "b", "address": "10.0.0.11", "port": 8000},
        {"name": "node2", "backend": "b", "address": "10.0.0.12", "port": 8000},
        {"name": "node3", "backend": "b", "address": "10.0.0.13", "port": 8000},
        {"name": "node4", "backend": "gone", "address": "10.0.0.14", "port": 8000},
    ]
    state = ('{"b": {"workers": ["http://10.0.0.11:8000", "http://10.0.0.12:8000"], '
             '"unhealthy": ["http://10.0.0.12:8000"], "error": "", '
             '"decisions": {"prefix_hit": 7.0, "prefix_miss": 3.0}}, '
             '"gone": {"workers": [], "unhealthy": [], "error": "router on port 8601: refused"}}')
    seen = load_balancer_router_seen({"rc": 0, "stdout": state}, servers)
    assert [(s["name"], s["status"]) for s in seen["servers"]] == [
        ("node1", "UP"), ("node2", "DOWN"), ("node3", "MAINT")]
    assert seen["error"] == "router on port 8601: refused" and seen["kind"] == "haproxy"
    assert seen["routers"] == {"b": {"prefix_hit": 7.0, "prefix_miss": 3.0}}
    failed = load_balancer_router_seen({"rc": 1, "stderr": "no python3"}, servers)
    assert failed == {"kind": "haproxy", "servers": [], "queues": {}, "error": "no python3"}


def test_cache_aware_membership_changes_are_the_routers_add_and_remove_calls():
    import base64
    import json

    def read(urls):
        return {"content": base64.b64encode(json.dumps({"worker_urls": urls}).encode()).decode()}

    routers = [
        {"port": 8600, "settings": {"worker_urls": ["http://a:1", "http://c:1"]}},
        {"port": 8601, "settings": {"worker_urls": ["http://d:1"]}},  # new: started whole
        {"port": 8602, "settings": {"worker_urls": ["http://e:1"]}},
    ]
    before = [read(["http://a:1", "http://b:1"]), {"failed": True}, read(["http://e:1"])]
    assert load_balancer_router_changes(routers, before) == [
        {"port": 8600, "op": "remove_worker", "url": "http://b:1"},
        {"port": 8600, "op": "add_worker", "url": "http://c:1"},
    ]


def test_router_state_reads_workers_health_and_decisions(monkeypatch):
    """files/router_state.py against a router's answers: its workers, the unhealthy ones
    its /health names, and its routing decisions summed over labels."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "roles/load_balancer/files/router_state.py"
    spec = importlib.util.spec_from_file_location("router_state", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answers = {
        (8600, "/list_workers"): (200, '{"urls": ["http://a:8000", "http://b:8000"]}'),
        (8600, "/health"): (503, 'Unhealthy servers: ["http://b:8000"]'),
        (8700, "/metrics"): (200, (
            '# TYPE vllm_router_prefix_routing_decisions_total counter\n'
            'vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",'
            'outcome="prefix_hit"} 136\n'
            'vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="other",'
            'outcome="prefix_hit"} 4\n'
            'vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",'
            'outcome="prefix_miss"} 190\n')),
    }
    monkeypatch.setattr(module, "read", lambda port, path: answers[(port, path)])
    assert module.state(8600, 8700) == {
        "workers": ["http://a:8000", "http://b:8000"], "unhealthy": ["http://b:8000"],
        "decisions": {"prefix_hit": 140.0, "prefix_miss": 190.0}, "error": ""}
