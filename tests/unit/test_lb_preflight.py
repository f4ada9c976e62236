"""Bad inventories fail in the load balancer's preflight, with a message naming what to change.

Each case runs the role's `preflight` task file through `ansible-playbook` against a
small inventory (no host is contacted: every check is an assertion on the controller).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
SECRET = "sk-never-print-me-0123456789"
GOOD_KEYS = [{"id": "alice", "key": SECRET}]

PLAYBOOK = """\
- name: Load balancer preflight
  hosts: loadbalancers
  gather_facts: false
  tasks:
    - name: Run the role's preflight
      ansible.builtin.include_role:
        name: inferfleet.fleet.load_balancer
        tasks_from: preflight
"""


def _inventory(lb: dict | None = None, backends: dict | None = None, lb_name: str = "lb1",
               also_engine: bool = False, peer: dict | None = None) -> dict:
    lb_vars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "load_balancer_api_keys": GOOD_KEYS, **(lb or {})}
    backends = {"node1": {"ansible_host": "10.0.0.11"}, "node2": {"ansible_host": "10.0.0.12"}} \
        if backends is None else backends
    inference = dict(backends)
    if also_engine:
        inference[lb_name] = {}
    balancers = {lb_name: lb_vars}
    if peer is not None:  # a second load balancer
        balancers["lb2"] = {**lb_vars, **peer}
    return {"all": {"children": {
        "loadbalancers": {"hosts": balancers},
        "inference": {"hosts": inference},
    }}}


def _preflight(tmp_path: Path, inventory: dict,
               playbook: str = PLAYBOOK) -> subprocess.CompletedProcess:
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "preflight.yml").write_text(playbook)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "inventory.yml"),
         str(tmp_path / "preflight.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def _one_line(text: str) -> str:
    """The output with YAML line folding undone, so phrases can be searched."""
    return " ".join(text.split())


CASES = {
    "no backends": (
        _inventory(backends={}),
        ["no backends", "`inference` group", "Add the engine nodes to [inference]"],
    ),
    "lb on an engine host, same port": (
        _inventory(lb={"load_balancer_port": 8000}, also_engine=True),
        ["lb1 runs both the load balancer and an engine", "port 8000",
         "set load_balancer_port (now 8000)", "inference_engine_port on lb1"],
    ),
    "lb at an engine's address, admin port clash": (
        _inventory(lb={"ansible_host": "10.0.0.12", "load_balancer_admin_port": 8000}),
        ["lb1 runs both the load balancer and an engine", "port 8000",
         "load_balancer_admin_port (now 8000)"],
    ),
    "public and admin port equal": (
        _inventory(lb={"load_balancer_port": 8404}),
        ["load_balancer_port and load_balancer_admin_port are both 8404"],
    ),
    "every weight zero": (
        _inventory(lb={"load_balancer_backend_weight": 0}),
        ["every backend (node1, node2) has weight 0",
         "set load_balancer_backend_weight above 0"],
    ),
    "weight out of range": (
        _inventory(backends={"node1": {"load_balancer_backend_weight": 300}, "node2": {}}),
        ["load_balancer_backend_weight must be 0..256 on node1"],
    ),
    "two rank 0 in one instance": (
        _inventory(backends={
            "node1": {"inferfleet_instance": "big", "inferfleet_rank": 0},
            "node2": {"inferfleet_instance": "big", "inferfleet_rank": 0},
        }),
        ["instance big", "inferfleet_rank"],
    ),
    "instance name unfit for a server": (
        _inventory(backends={"node1": {"inferfleet_instance": "big one"}, "node2": {}}),
        ["instance names big one", "change inferfleet_instance"],
    ),
    "a key limited to a model no instance serves": (
        _inventory(lb={"load_balancer_api_keys": [{**GOOD_KEYS[0], "models": ["coder"]}],
                       "load_balancer_model_rate_limits": {"chat": 10}},
                   backends={"node1": {"inferfleet_model_name": "chat"}}),
        ["coder is named in load_balancer_api_keys (models) or load_balancer_model_rate_limits",
         "no instance serves it (served: chat)"],
    ),
    "a per-model limit that is not a number above 0": (
        _inventory(lb={"load_balancer_model_rate_limits": {"chat": 0}},
                   backends={"node1": {"inferfleet_model_name": "chat"}}),
        ["load_balancer_model_rate_limits of chat must be a whole number above 0"],
    ),
    "a per-model limit on Nginx": (
        _inventory(lb={"load_balancer_kind": "nginx",
                       "load_balancer_model_rate_limits": {"chat": 5}},
                   backends={"node1": {"inferfleet_model_name": "chat"}}),
        ["lb1 runs Nginx, which counts requests before it reads their body",
         "remove load_balancer_model_rate_limits there"],
    ),
    "a served name a proxy cannot route by": (
        _inventory(backends={"node1": {"inferfleet_model_name": "my model"},
                             "node2": {"inferfleet_model_name": "chat"}}),
        ['the served model names ["my model"]', "set inference_engine_served_model_name"],
    ),
    "two models behind one backend name": (
        _inventory(lb={"inferfleet_model_name": "chat"},
                   backends={"node1": {"inferfleet_model_name": "org/m"},
                             "node2": {"inferfleet_model_name": "org_m"}}),
        ["the served models org/m and org_m would share one load balancer backend", "rename one"],
    ),
    "no API keys": (
        _inventory(lb={"load_balancer_api_keys": []}),
        ["no API keys", "set load_balancer_api_keys", "load_balancer_api_keys_required: false"],
    ),
    "malformed and shared keys": (
        _inventory(lb={"load_balancer_api_keys": [
            {"id": "short", "key": "abc"},
            {"id": "twin1", "key": SECRET},
            {"id": "twin2", "key": SECRET},
        ]}),
        ["the keys of short, twin1, twin2 in load_balancer_api_keys", "replace them"],
    ),
    "repeated key ids": (
        _inventory(lb={"load_balancer_api_keys": [
            {"id": "alice", "key": SECRET}, {"id": "alice", "key": SECRET + "x"},
        ]}),
        ["API key ids must be distinct", "rename the repeated ones"],
    ),
    "duration without a unit": (
        _inventory(lb={"load_balancer_timeout_server": "600"}),
        ["load_balancer_timeout_server: write a number with a unit"],
    ),
    "certificate without key": (
        _inventory(lb={"load_balancer_tls_certificate": "-----BEGIN CERTIFICATE-----\nx\n"}),
        ["load_balancer_tls_certificate", "load_balancer_tls_key", "or neither"],
    ),
    "HSTS without TLS": (
        _inventory(lb={"load_balancer_hsts_max_age": 31536000}),
        [
            "load_balancer_hsts_max_age is whole seconds (0 = off) and needs TLS",
            "31536000, TLS off",
        ],
    ),
    "retry that replays a request an engine may have died on": (
        _inventory(lb={"load_balancer_retry_on": ["conn-failure", "empty-response", 503]}),
        ["load_balancer_retry_on may hold conn-failure and HTTP statuses", "remove empty-response"],
    ),
    "two load balancers, no floating address, no ha none": (
        _inventory(peer={}),
        ["2 load balancers (lb1, lb2) and no load_balancer_virtual_ip on lb1",
         "or say load_balancer_ha: none"],
    ),
    "floating address without its password": (
        _inventory(lb={"load_balancer_virtual_ip": "10.9.9.100", "inferfleet_address": "10.9.9.1"},
                   peer={"inferfleet_address": "10.9.9.2"}),
        ["load_balancer_vrrp_password on lb1 is empty", "1 to 8 characters", "vaulted file"],
    ),
    "floating address in CIDR form": (
        _inventory(lb={"load_balancer_virtual_ip": "10.9.9.100/24",
                       "inferfleet_address": "10.9.9.1", "load_balancer_vrrp_password": "pw"}),
        ["load_balancer_virtual_ip '10.9.9.100/24' on lb1 is not an IPv4 address",
         "without a prefix length"],
    ),
    "the old name of the routing": (
        _inventory(lb={"load_balancer_balance": "roundrobin"}),
        ["load_balancer_balance is now load_balancer_routing", "rename it in the inventory"],
    ),
    "prefix routing on Nginx": (
        _inventory(lb={"load_balancer_kind": "nginx", "load_balancer_routing": "prefix"}),
        ["lb1 runs Nginx, which has no load-bounded hash", "load_balancer_kind: haproxy"],
    ),
    "prefix routing settings out of range": (
        _inventory(lb={"load_balancer_routing": "prefix", "load_balancer_prefix_bytes": 4,
                       "load_balancer_prefix_balance_factor": 90}),
        ["load_balancer_prefix_bytes must be a whole number from 16", "not 4",
         "load_balancer_prefix_balance_factor must be 0 (no bound) or a percentage above 100",
         "not 90"],
    ),
    "Nginx keeps idle engine connections longer than an engine": (
        _inventory(lb={"load_balancer_kind": "nginx"},
                   backends={"node1": {"ansible_host": "10.0.0.11"},
                             "node2": {"ansible_host": "10.0.0.12", "inference_engine_extra_env":
                                       {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3"}}}),
        ["load_balancer_nginx_keepalive_timeout (4) must be whole seconds",
         "every engine behind lb1: node2 closes idle connections after 3 s (VLLM_HTTP_TIMEOUT"],
    ),
    "Nginx's idle limit not whole seconds": (
        _inventory(lb={"load_balancer_kind": "nginx",
                       "load_balancer_nginx_keepalive_timeout": "4s"}),
        ['load_balancer_nginx_keepalive_timeout ("4s") must be whole seconds'],
    ),
    "allowed path not a path": (
        _inventory(lb={"load_balancer_allowed_paths": ["v1/completions"]}),
        ["load_balancer_allowed_paths must list exact paths"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inventory_fails_naming_what_to_change(tmp_path, case):
    inventory, words = CASES[case]
    run = _preflight(tmp_path, inventory)
    out = _one_line(run.stdout + run.stderr)
    assert run.returncode != 0, out[-3000:]
    for word in words:
        assert word in out, f"{word!r} missing from: {out[-3000:]}"
    assert SECRET not in out, "the preflight printed an API key"


def test_good_inventory_passes(tmp_path):
    inventory = _inventory(lb={"load_balancer_routing": "prefix",
                               "load_balancer_prefix_bytes": "512"}, backends={
        "node1": {"load_balancer_backend_weight": 0},
        "node2": {"inferfleet_instance": "big"},
        "node3": {"inferfleet_instance": "big"},
    })
    run = _preflight(tmp_path, inventory)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert SECRET not in run.stdout + run.stderr


# The preflight, then the role's check of the floating address with the hosts' facts.
HA_PLAYBOOK = PLAYBOOK + """\
    - name: Run the role's check of the floating address
      ansible.builtin.include_role:
        name: inferfleet.fleet.load_balancer
        tasks_from: ha_preflight
"""


def test_a_floating_address_outside_the_hosts_network_is_refused(tmp_path):
    """Both load balancers run here (a local connection): their network is this machine's
    default route's, which 203.0.113.0/24 (TEST-NET-3) is not."""
    lb = {"load_balancer_virtual_ip": "203.0.113.200", "inferfleet_address": "10.9.9.1",
          "load_balancer_vrrp_password": "pw"}
    run = _preflight(tmp_path, _inventory(lb=lb, peer={"inferfleet_address": "10.9.9.2"}),
                     HA_PLAYBOOK)
    out = _one_line(run.stdout + run.stderr)
    assert run.returncode != 0, out[-3000:]
    assert "load_balancer_virtual_ip 203.0.113.200 is outside" in out, out[-3000:]
    assert "choose a free address in" in out and "Passed" in out  # the preflight itself passed
