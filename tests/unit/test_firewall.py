"""The firewall role: the rules each host gets, the file nft loads, and what is refused.

The rules come from plugins/filter/firewall.py, called directly on a mixed
inventory (two replicas, one two-node instance, two load balancers, a monitoring host).
The nft file is rendered by Ansible itself, through the role's `configure-rules` task file
on local connections into temporary folders, and checked with `nft -c -f` (which needs
nft and the right to ask the kernel: root). The preflight runs through Ansible too, so its
refusals are checked as an operator sees them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.inferfleet.fleet.plugins.filter import firewall as fw

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "firewall"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
DOCS = REPO / "docs" / "security.md"


ENGINES = {
    "rep1": {"ansible_host": "10.0.0.11"},
    "rep2": {"ansible_host": "10.0.0.12", "inference_engine_port": 8001},
    "big0": {"ansible_host": "10.0.0.21", "inferfleet_instance": "big"},
    "big1": {
        "inferfleet_address": "10.0.1.22",
        "ansible_host": "big1.example.com",
        "inferfleet_instance": "big",
        "inferfleet_accelerator": "cpu",
    },
}
LBS = {
    "lb1": {"ansible_host": "10.0.0.1"},
    "lb2": {"ansible_host": "2001:db8::2", "load_balancer_port": 443},
}
MONITORING = {"mon": {"ansible_host": "10.0.0.5"}}
GROUPS = {"inference": list(ENGINES), "loadbalancers": list(LBS), "monitoring": list(MONITORING)}
HOSTVARS = {**ENGINES, **LBS, **MONITORING}
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
# The firewall's port fallbacks name the variables roles/fleet_defaults defines.
SHARED = yaml.safe_load((REPO / "roles" / "fleet_defaults" / "defaults" / "main.yml").read_text())
PORT_VARIABLES = {
    "engine_port": "inference_engine_port",
    "agent_port": "inference_engine_agent_port",
    "master_port": "inference_engine_master_port",
    "lb_port": "load_balancer_port",
    "lb_admin_port": "load_balancer_admin_port",
    "lb_peers_port": "load_balancer_haproxy_peers_port",
    "prometheus_port": "monitoring_prometheus_port",
    "node_exporter_port": "monitoring_node_exporter_port",
    "dcgm_exporter_port": "monitoring_dcgm_exporter_port",
    "model_peer_port": "model_sync_peer_port",
}
PORTS = {
    "model_peers": SHARED["model_sync_peers"],
    **{key: SHARED[variable] for key, variable in PORT_VARIABLES.items()},
    "ray_port_defaults": {k: v for k, v in SHARED.items()
                          if k.startswith("inference_engine_ray_") and k.endswith("_port")},
}
ADMINS = ["192.0.2.0/24"]


def options(**changes) -> dict:
    base = {
        **PORTS,
        "client_networks": DEFAULTS["firewall_client_networks"],
        "admin_networks": ADMINS,
        "ssh_port": DEFAULTS["firewall_ssh_port"],
        "group_port_ranges": DEFAULTS["firewall_group_port_ranges"],
        "ray_ports": DEFAULTS["firewall_ray_ports"],
        "extra_rules": DEFAULTS["firewall_extra_rules"],
        "monitoring_group": "monitoring",
    }
    return {**base, **changes}


def allowed(host: str, hostvars=HOSTVARS, groups=GROUPS, **changes) -> dict[str, list[str]]:
    """{"tcp/port": sources} for one host."""
    out: dict[str, list[str]] = {}
    for rule in fw.firewall_rules(host, groups, hostvars, options(**changes)):
        out.setdefault(f"{rule['proto']}/{rule['ports']}", []).extend(rule["sources"])
    return {key: sorted(set(value)) for key, value in out.items()}


LB_ADDRS = ["10.0.0.1", "2001:db8::2"]


# --- Which host gets which openings -------------------------------------------------------
def test_a_replica_takes_its_engine_port_from_lbs_monitoring_and_admins_only():
    assert allowed("rep2") == {
        "tcp/22": ADMINS,
        "tcp/8001": sorted(["10.0.0.1", "2001:db8::2", "10.0.0.5", *ADMINS]),
        "tcp/8010": LB_ADDRS,  # the engine's agent: the load balancers alone
        "tcp/9400": ["10.0.0.5"],
        "tcp/9100": ["10.0.0.5"],
    }


def test_a_replica_has_no_group_ports():
    # single-node instances talk to nobody: no master port, no NCCL range
    assert "tcp/29500" not in allowed("rep1")
    assert "tcp/32768-60999" not in allowed("rep1")


def test_members_of_one_instance_take_group_ports_from_each_other_only():
    big0, big1 = allowed("big0"), allowed("big1")
    assert big0["tcp/29500"] == ["10.0.1.22"]
    assert big0["tcp/32768-60999"] == ["10.0.1.22"]
    assert big1["tcp/29500"] == ["10.0.0.21"]
    assert "10.0.0.11" not in big0["tcp/29500"] and "10.0.0.1" not in big0["tcp/29500"]
    # the engine port also from the peer (fabric_preflight checks it between members)
    assert "10.0.1.22" in big0["tcp/8000"]
    assert big0["tcp/8000"] == sorted([*LB_ADDRS, "10.0.0.5", *ADMINS, "10.0.1.22"])


def test_engine_nodes_that_share_model_pieces_open_the_peer_port_to_each_other_only():
    assert "tcp/8950" not in allowed("rep1")  # model_sync_peers is off by default
    hostvars = {**HOSTVARS, "rep2": {**HOSTVARS["rep2"], "model_sync_peers": False}}
    on = allowed("rep1", hostvars=hostvars, model_peers=True)
    # From the other engine nodes that take part: not rep2 (off), no load balancer.
    assert on["tcp/8950"] == ["10.0.0.21", "10.0.1.22"]
    assert "tcp/8950" not in allowed("rep2", hostvars=hostvars, model_peers=True)
    assert "tcp/8950" not in allowed("lb1", hostvars=hostvars, model_peers=True)
    moved = {**hostvars, "big0": {**HOSTVARS["big0"], "model_sync_peer_port": 9950}}
    assert allowed("big0", hostvars=moved, model_peers=True)["tcp/9950"] == ["10.0.0.11",
                                                                             "10.0.1.22"]


def test_ray_ports_follow_the_setting():
    assert "tcp/6379" not in allowed("big0")
    ray = allowed("big0", ray_ports=[6379, "10001-19999"])
    assert ray["tcp/6379"] == ["10.0.1.22"] and ray["tcp/10001-19999"] == ["10.0.1.22"]


def test_a_ray_backed_group_opens_the_engine_roles_ray_ports_between_members():
    hostvars = {**HOSTVARS,
                "big0": {**ENGINES["big0"], "inference_engine_group_backend": "ray",
                         "inference_engine_ray_port": 7000}}
    big0 = allowed("big0", hostvars=hostvars)
    engine = SHARED
    expected = ["tcp/7000"] + [f"tcp/{engine[f'inference_engine_ray_{k}']}" for k in (
        "dashboard_port", "client_port", "node_manager_port", "object_manager_port",
        "agent_port", "agent_listen_port", "metrics_port", "runtime_env_agent_port")]
    expected.append(f"tcp/{engine['inference_engine_ray_min_worker_port']}-"
                    f"{engine['inference_engine_ray_max_worker_port']}")
    for port in expected:
        assert big0[port] == ["10.0.1.22"], port
    assert "tcp/6379" not in big0
    # an explicit firewall_ray_ports replaces the derived list
    assert "tcp/7000" not in allowed("big0", hostvars=hostvars, ray_ports=[6379])


def test_dcgm_only_on_gpu_nodes():
    assert "tcp/9400" in allowed("big0")
    assert "tcp/9400" not in allowed("big1")  # inferfleet_accelerator: cpu


def test_a_load_balancer_takes_the_public_port_from_clients_and_admin_port_from_admins():
    assert allowed("lb1") == {
        "tcp/22": ADMINS,
        "tcp/80": ["0.0.0.0/0", "::/0"],
        "tcp/8404": sorted(["10.0.0.5", *ADMINS]),
        "tcp/9100": ["10.0.0.5"],
    }
    assert "tcp/443" in allowed("lb2") and "tcp/8000" not in allowed("lb2")


def test_client_networks_restrict_the_public_port():
    assert allowed("lb1", client_networks=["198.51.100.0/24"])["tcp/80"] == ["198.51.100.0/24"]


def test_the_monitoring_host_opens_prometheus_to_admins_only():
    assert allowed("mon") == {"tcp/22": ADMINS, "tcp/9090": ADMINS, "tcp/9100": ["10.0.0.5"]}


def test_without_admin_networks_ssh_and_prometheus_are_closed():
    assert "tcp/22" not in allowed("mon", admin_networks=[])
    assert "tcp/9090" not in allowed("mon", admin_networks=[])
    assert allowed("lb1", admin_networks=[])["tcp/8404"] == ["10.0.0.5"]


def test_without_a_monitoring_host_no_exporter_port_opens():
    groups = {**GROUPS, "monitoring": []}
    assert set(allowed("rep1", groups=groups)) == {"tcp/22", "tcp/8000", "tcp/8010"}


def test_extra_rules_are_added():
    extra = [{"port": "5000-5010", "proto": "udp", "sources": ["10.9.0.0/16"], "comment": "x"}]
    assert allowed("rep1", extra_rules=extra)["udp/5000-5010"] == ["10.9.0.0/16"]


# --- Addresses ---------------------------------------------------------------------------
def test_address_comes_from_inferfleet_address_then_ansible_host_then_facts():
    facts = {
        "ansible_facts": {
            "default_ipv4": {"address": "10.5.0.1"},
            "default_ipv6": {"address": "2001:db8::5"},
        }
    }
    assert fw.host_addresses(
        "a", {"inferfleet_address": "10.1.0.1", "ansible_host": "10.2.0.1", **facts}
    ) == ["10.1.0.1"]
    assert fw.host_addresses("a", {"inferfleet_address": "2001:db8::1"}) == ["2001:db8::1"]
    assert fw.host_addresses("a", {"ansible_host": "10.2.0.1", **facts}) == ["10.2.0.1"]
    assert fw.host_addresses("a", {"ansible_host": "a.example.com", **facts}) == [
        "10.5.0.1",
        "2001:db8::5",
    ]


def test_a_host_name_is_never_used_as_an_address():
    with pytest.raises(fw.FirewallError, match="Set inferfleet_address for gpu7"):
        fw.host_addresses("gpu7", {"ansible_host": "gpu7.example.com"})
    with pytest.raises(fw.FirewallError, match="inferfleet_address 'gpu7' is not an IP"):
        fw.host_addresses("gpu7", {"inferfleet_address": "gpu7"})


def test_only_hosts_without_an_ip_and_facts_need_facts():
    hostvars = {
        **HOSTVARS,
        "named": {"ansible_host": "n.example.com"},
        "gathered": {"ansible_facts": {"default_ipv4": {"address": "10.3.0.1"}}},
    }
    hosts = [*HOSTVARS, "named", "gathered"]
    assert fw.firewall_hosts_needing_facts(hosts, hostvars) == ["named"]


def test_a_peer_without_an_address_is_refused_with_its_name():
    hostvars = {**HOSTVARS, "big1": {"inferfleet_instance": "big", "ansible_host": "x.example"}}
    with pytest.raises(fw.FirewallError, match="Set inferfleet_address for big1"):
        fw.firewall_rules("big0", GROUPS, hostvars, options())


# --- Bad settings -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"client_networks": ["10.0.0.0/33"]},
            "firewall_client_networks: '10.0.0.0/33' is not a network",
        ),
        ({"admin_networks": ["10.0.0.1/8"]}, "did you mean 10.0.0.0/8"),
        ({"admin_networks": ["office"]}, "firewall_admin_networks: 'office' is not a network"),
        (
            {"group_port_ranges": ["40000-30000"]},
            "firewall_group_port_ranges: '40000-30000' is out of range",
        ),
        ({"ray_ports": [70000]}, "firewall_ray_ports: 70000 is out of range"),
        ({"ray_ports": ["ray"]}, "firewall_ray_ports: 'ray' is not a port"),
        ({"ssh_port": 0, "admin_networks": []}, "firewall_ssh_port: 0 is out of range"),
        ({"extra_rules": [{"port": 5000}]}, r"firewall_extra_rules\[0\]: write each extra rule"),
        (
            {"extra_rules": [{"port": 5000, "sources": ["10.0.0.0/8"], "proto": "sctp"}]},
            "proto 'sctp' must be one of tcp, udp",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_variable_to_change(changes, message):
    with pytest.raises(fw.FirewallError, match=message):
        fw.firewall_rules("big0", GROUPS, HOSTVARS, options(**changes))


def test_a_bad_port_in_the_inventory_names_the_variable():
    hostvars = {**HOSTVARS, "rep1": {"ansible_host": "10.0.0.11", "inference_engine_port": 99999}}
    with pytest.raises(fw.FirewallError, match="inference_engine_port: 99999 is out of range"):
        fw.firewall_rules("rep1", GROUPS, hostvars, options())


def test_in_networks():
    assert fw.firewall_in_networks("192.0.2.7", ["10.0.0.0/8", "192.0.2.0/24"])
    assert not fw.firewall_in_networks("192.0.3.7", ["192.0.2.0/24"])
    assert not fw.firewall_in_networks("192.0.2.7", [])


# Two HAProxy load balancers sharing a floating address, and an Nginx one without.
HA_LBS = {
    "lb1": {"ansible_host": "10.0.0.1", "load_balancer_virtual_ip": "10.0.0.100"},
    "lb3": {"ansible_host": "10.0.0.3", "load_balancer_virtual_ip": "10.0.0.100"},
    "lb4": {"ansible_host": "10.0.0.4", "load_balancer_kind": "nginx", "load_balancer_ha": "none"},
}
HA_HOSTVARS = {**ENGINES, **HA_LBS, **MONITORING}
HA_GROUPS = {**GROUPS, "loadbalancers": list(HA_LBS)}


def test_load_balancers_sharing_an_address_take_vrrp_and_haproxy_peers_from_each_other_only():
    lb1 = allowed("lb1", HA_HOSTVARS, HA_GROUPS)
    assert lb1["vrrp/"] == ["10.0.0.3"] and lb1["tcp/10000"] == ["10.0.0.3"]
    assert allowed("lb3", HA_HOSTVARS, HA_GROUPS)["vrrp/"] == ["10.0.0.1"]
    lb4 = allowed("lb4", HA_HOSTVARS, HA_GROUPS)
    assert "vrrp/" not in lb4 and "tcp/10000" not in lb4
    assert "vrrp/" not in allowed("rep1", HA_HOSTVARS, HA_GROUPS)
    # Nginx peers: VRRP only (no HAProxy peers)
    nginx = {h: {**hv, "load_balancer_kind": "nginx"} for h, hv in HA_LBS.items() if h != "lb4"}
    groups = {**GROUPS, "loadbalancers": list(nginx)}
    lb1 = allowed("lb1", {**ENGINES, **nginx, **MONITORING}, groups)
    assert lb1["vrrp/"] == ["10.0.0.3"] and "tcp/10000" not in lb1


# --- Through Ansible: the rendered file and the preflight -------------------------------
RENDER = """\
- name: Render the firewall's rules file of every fleet host
  hosts: all
  gather_facts: false
  tasks:
    - name: Write firewall.nft (the role's template task, checked by nft -c)
      ansible.builtin.include_role:
        name: inferfleet.fleet.firewall
        tasks_from: configure-rules
"""
PREFLIGHT = """\
- name: Run the firewall's preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: The role's preflight
      ansible.builtin.include_role:
        name: inferfleet.fleet.firewall
        tasks_from: preflight
"""


def _nft() -> str:
    found = shutil.which("nft") or ("/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else "")
    if not found:
        pytest.fail("nft is missing: run `make setup` (it installs Debian's nftables package)")
    probe = subprocess.run(
        [found, "-c", "-f", "-"], input="table inet probe {}\n", capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.fail(
            f"nft -c cannot ask the kernel here (run the tests as root or with CAP_NET_ADMIN): "
            f"{probe.stderr.strip()}"
        )
    return found


def _playbook(
    tmp: Path, text: str, hostvars: dict, group_vars: dict | None = None, env: dict | None = None,
    groups: dict | None = None,
) -> subprocess.CompletedProcess:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        name: {**local, **hv, "firewall_config_dir": str(tmp / name)}
        for name, hv in hostvars.items()
    }
    inventory = {
        "all": {
            "vars": {"firewall_admin_networks": ADMINS, **(group_vars or {})},
            "children": {
                group: {"hosts": {h: hosts[h] for h in members}}
                for group, members in (groups or GROUPS).items()
            },
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(text)
    run_env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    nft = _nft()
    tmp = tmp_path_factory.mktemp("firewall")
    run = _playbook(tmp, RENDER, HOSTVARS)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    for host in HOSTVARS:
        check = subprocess.run(
            [nft, "-c", "-f", str(tmp / host / "firewall.nft")], capture_output=True, text=True
        )
        assert check.returncode == 0, f"{host}: {check.stderr}"
    return tmp


def _text(rendered: Path, host: str) -> str:
    return (rendered / host / "firewall.nft").read_text()


def test_the_file_replaces_only_our_table(rendered):
    text = _text(rendered, "lb1")
    assert "flush ruleset" not in text
    statements = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert statements[:3] == [
        "table inet inferfleet {}",
        "delete table inet inferfleet",
        "table inet inferfleet {",
    ]
    assert "policy drop;" in text
    for base in (
        'iif "lo" accept',
        "ct state established,related accept",
        "meta l4proto { icmp, ipv6-icmp } accept",
    ):
        assert base in text


def test_the_rendered_rules_split_addresses_by_family(rendered):
    big0 = _text(rendered, "big0")
    assert "ip saddr { 10.0.1.22 } tcp dport 29500 accept" in big0
    assert "ip6 saddr { 2001:db8::2 } tcp dport 8000 accept" in big0
    lb1 = _text(rendered, "lb1")
    assert "ip saddr { 0.0.0.0/0 } tcp dport 80 accept" in lb1
    assert "ip6 saddr { ::/0 } tcp dport 80 accept" in lb1
    assert "dport 8000" not in lb1


def test_a_published_container_port_is_guarded_where_docker_forwards_it(rendered):
    # the DCGM exporter runs in Docker with --publish: its traffic is forwarded
    big0 = _text(rendered, "big0")
    forward = big0.split("chain forward {", 1)[1]
    assert (
        "ct status dnat meta l4proto tcp ct original proto-dst 9400 ip saddr { 10.0.0.5 } accept"
    ) in forward
    assert "ct original proto-dst 9400 counter drop" in forward
    assert "chain forward" not in _text(rendered, "big1")  # CPU node: no DCGM exporter


def test_the_vrrp_rule_loads(tmp_path):
    nft = _nft()
    run = _playbook(tmp_path, RENDER, HA_HOSTVARS, groups=HA_GROUPS)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    text = (tmp_path / "lb1" / "firewall.nft").read_text()
    assert "ip saddr { 10.0.0.3 } meta l4proto vrrp accept" in text
    assert "ip saddr { 10.0.0.3 } tcp dport 10000 accept" in text
    check = subprocess.run([nft, "-c", "-f", str(tmp_path / "lb1" / "firewall.nft")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_rendered_file_is_root_only(rendered):
    assert (rendered / "mon" / "firewall.nft").stat().st_mode & 0o777 == 0o600


def _preflight(tmp: Path, group_vars: dict, env: dict | None = None):
    _nft()
    return _playbook(tmp, PREFLIGHT, HOSTVARS, group_vars, {"SSH_CONNECTION": "", **(env or {})})


def test_preflight_refuses_a_bad_network_naming_the_variable(tmp_path):
    run = _preflight(tmp_path, {"firewall_client_networks": ["10.0.0.300/8"]})
    assert run.returncode != 0
    assert "firewall_client_networks: '10.0.0.300/8' is not a network" in run.stdout


def test_preflight_refuses_to_shut_the_ssh_controller_out(tmp_path):
    env = {"SSH_CONNECTION": "198.51.100.7 50000 10.0.0.11 22"}
    run = _preflight(tmp_path, {}, env)
    assert run.returncode != 0
    assert "Add the controller's network (or 198.51.100.7) to firewall_admin_networks" in run.stdout
    ok = _preflight(tmp_path, {"firewall_admin_networks": ["198.51.100.0/24"]}, env)
    assert ok.returncode == 0, ok.stdout[-4000:]


def test_preflight_accepts_no_admin_network_without_ssh(tmp_path):
    # local or docker connections: nothing to lock out
    run = _preflight(tmp_path, {"firewall_admin_networks": []})
    assert run.returncode == 0, run.stdout[-4000:]


def test_preflight_refuses_a_short_revert(tmp_path):
    run = _preflight(tmp_path, {"firewall_revert_seconds": 5})
    assert run.returncode != 0 and "set it to 30 or more" in run.stdout


# --- No drift between the role, the other roles and the docs ----------------------------
def test_port_fallbacks_are_the_shared_variables():
    vars_main = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_firewall_port_defaults"]
    for key, variable in PORT_VARIABLES.items():
        assert vars_main[key] == f"{{{{ {variable} }}}}", key
    assert "inferfleet.fleet.fleet_defaults" in (ROLE / "meta" / "main.yml").read_text()


def _docs_ports() -> dict[str, str]:
    """{variable: port} from the Ports table of docs/security.md."""
    text = DOCS.read_text()
    section = text.split("### Ports", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out[cells[-1].strip("`")] = cells[0].strip("`")
    return out


def test_the_docs_ports_table_matches_the_defaults():
    documented = _docs_ports()
    expected = {variable: str(PORTS[key]) for key, variable in PORT_VARIABLES.items()}
    expected["firewall_ssh_port"] = str(DEFAULTS["firewall_ssh_port"])
    expected["firewall_group_port_ranges"] = ", ".join(DEFAULTS["firewall_group_port_ranges"])
    expected["firewall_ray_ports"] = "none"
    expected["load_balancer_virtual_ip"] = "none"
    assert documented == expected


def test_the_docs_keep_their_headings():
    text = DOCS.read_text()
    assert text.startswith("# Security\n")
    assert re.findall(r"^## .*", text, re.M)[0] == "## Firewall"


def test_overlapping_sources_still_load(tmp_path):
    # an admin network that holds the load balancers' and the monitoring host's addresses
    nft = _nft()
    run = _playbook(tmp_path, RENDER, HOSTVARS, {"firewall_admin_networks": ["10.0.0.0/8"]})
    assert run.returncode == 0, run.stdout[-6000:]
    check = subprocess.run(
        [nft, "-c", "-f", str(tmp_path / "rep1" / "firewall.nft")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
