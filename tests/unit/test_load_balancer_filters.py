"""The load balancer's filters over the inventory and over HAProxy's `show stat`."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.inferfleet.fleet.plugins.filter.load_balancer import (
    haproxy_backends,
    haproxy_servers,
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
DEFAULTS = {"port": 8000, "weight": 100, "maxconn": 64, "backend": "inferfleet_engines"}


def test_the_engines_backends_and_their_servers_are_read_from_show_stat():
    assert haproxy_backends(STAT, "inferfleet_engines") == [
        "inferfleet_engines", "inferfleet_engines_org_beta-1.5"]
    assert [(s["backend"], s["name"], s["status"]) for s in
            haproxy_servers(STAT, "inferfleet_engines")] == [
        ("inferfleet_engines", "node1", "UP"),
        ("inferfleet_engines", "node2", "DRAIN"),
        ("inferfleet_engines_org_beta-1.5", "node3", "UP"),
    ]
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
