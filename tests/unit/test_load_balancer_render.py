"""The load balancer role's configurations, rendered by Ansible itself and checked by the proxies.

One `ansible-playbook` run per sample inventory (2 backends: every variant; 3 backends
of which one is a pipeline instance: plain HAProxy and Nginx) renders into a temporary
folder through the role's own `preflight` and `configure` task files, with one load
balancer host on a local connection per variant. Then the real `haproxy -c` and
`nginx -t` read the output, and the tests assert the contract's properties on the text.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.inferfleet.fleet.plugins.filter.load_balancer import (
    haproxy_servers,
    load_balancer_seen,
)

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

KEYS = [
    {"id": "alice", "key": "sk-alice-0123456789abcdef"},
    {"id": "bob", "key": "sk-bob+/=.~_-0123456789", "rate_limit": 5},
]
UPSTREAM_KEY = "engine-key-0123456789abcdef"
ALLOWED = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/embeddings"]

pytestmark = pytest.mark.skipif(
    not (shutil.which("haproxy") and shutil.which("nginx") and shutil.which("openssl")),
    reason="haproxy, nginx and openssl are needed to validate the rendered configurations",
)

PLAYBOOK = """\
- name: Render the load balancer's configuration into a folder
  hosts: loadbalancers
  gather_facts: false
  tasks:
    - name: Run the role's preflight
      ansible.builtin.include_role:
        name: inferfleet.fleet.load_balancer
        tasks_from: preflight
    - name: Render the configuration
      ansible.builtin.include_role:
        name: inferfleet.fleet.load_balancer
        tasks_from: configure
    # The role's handlers would reload a real service on this machine: not here.
    - name: Stop before the handlers
      ansible.builtin.meta: end_play
"""


def _self_signed(folder: Path) -> tuple[str, str]:
    key, crt = folder / "tls.key", folder / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=lb.test", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )
    return crt.read_text(), key.read_text()


def _variants(tls: tuple[str, str]) -> dict[str, dict]:
    secure = {"load_balancer_api_keys": KEYS, "load_balancer_backend_api_key": UPSTREAM_KEY}
    return {
        "haproxy": {"load_balancer_kind": "haproxy", **secure},
        "nginx": {"load_balancer_kind": "nginx", **secure},
        "haproxy_tls": {
            "load_balancer_kind": "haproxy", "load_balancer_port": 443,
            "load_balancer_tls_certificate": tls[0], "load_balancer_tls_key": tls[1],
            "load_balancer_hsts_max_age": 31536000, **secure,
        },
        "nginx_tls": {
            "load_balancer_kind": "nginx", "load_balancer_port": 443,
            "load_balancer_tls_certificate": tls[0], "load_balancer_tls_key": tls[1],
            "load_balancer_hsts_max_age": 31536000, **secure,
        },
        "haproxy_open": {
            "load_balancer_kind": "haproxy", "load_balancer_api_keys_required": False,
            "load_balancer_routing": "roundrobin",
        },
        "nginx_open": {
            "load_balancer_kind": "nginx", "load_balancer_api_keys_required": False,
            "load_balancer_routing": "roundrobin",
        },
    }


def _inventory(backends: dict[str, dict], variants: dict[str, dict], out: Path) -> dict:
    lbs = {}
    for name, hostvars in variants.items():
        folder = out / name
        folder.mkdir()
        lbs[f"lb_{name}"] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "load_balancer_haproxy_config_dir": str(folder),
            "load_balancer_nginx_config_dir": str(folder),
            "load_balancer_haproxy_server_state_file": str(folder / "server-state"),
            # several load balancers here, each rendered alone: no floating address
            "load_balancer_ha": "none",
            **hostvars,
        }
    return {
        "all": {
            "children": {
                "loadbalancers": {"hosts": lbs},
                "inference": {"hosts": backends},
            }
        }
    }


def _render(tmp: Path, backends: dict[str, dict], only: tuple[str, ...] = (),
            extra: dict | None = None, addresses: dict | None = None) -> Path:
    out = tmp / "out"
    out.mkdir()
    variants = _variants(_self_signed(tmp))
    if only:
        variants = {name: variants[name] for name in only}
    variants = {name: {**hostvars, **(extra or {}),
                       **({"ansible_host": addresses[name]} if addresses else {})}
                for name, hostvars in variants.items()}
    inventory = _inventory(backends, variants, out)
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "render.yml").write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    run = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.yml"), str(tmp / "render.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    for entry in KEYS:
        assert entry["key"] not in run.stdout + run.stderr, "an API key reached Ansible's output"
    assert UPSTREAM_KEY not in run.stdout + run.stderr
    return out


TWO = {
    "node1": {"ansible_host": "10.0.0.11"},
    "node2": {"ansible_host": "10.0.0.12", "inference_engine_port": 8001},
}
# node1 alone on faster hardware; big = node3 + node4 (node4 is rank 0); small alone.
THREE = {
    "node1": {"ansible_host": "10.0.0.11", "load_balancer_backend_weight": 200,
              "load_balancer_backend_maxconn": 128},
    "node3": {"ansible_host": "10.0.0.13", "inferfleet_instance": "big", "inferfleet_rank": 1},
    "node4": {"ansible_host": "10.0.0.14", "inferfleet_instance": "big", "inferfleet_rank": 0},
    "small": {"load_balancer_backend_address": "10.0.0.20"},
}


# Two models: alpha (the fleet's default, group_vars/all) on node1 and node2, beta on node3;
# bob may use beta only, and beta has a per-key limit of its own.
MODELS = {
    "node1": {"ansible_host": "10.0.0.11", "inferfleet_model_name": "alpha"},
    "node2": {"ansible_host": "10.0.0.12", "inferfleet_model_name": "alpha"},
    "node3": {"ansible_host": "10.0.0.13", "inferfleet_model_name": "org/beta-1.5"},
}
MODEL_KEYS = [KEYS[0], {**KEYS[1], "models": ["org/beta-1.5"]}]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return _render(tmp_path_factory.mktemp("models"), MODELS, only=("haproxy",),
                   extra={"inferfleet_model_name": "alpha", "load_balancer_api_keys": MODEL_KEYS,
                          "load_balancer_model_rate_limits": {"org/beta-1.5": 30}})


@pytest.fixture(scope="module")
def models_nginx(tmp_path_factory) -> Path:
    """The same fleet behind Nginx, which cannot limit per model (it counts requests
    before it reads their body)."""
    return _render(tmp_path_factory.mktemp("models_nginx"), MODELS, only=("nginx",),
                   extra={"inferfleet_model_name": "alpha", "load_balancer_api_keys": MODEL_KEYS})


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    return _render(tmp_path_factory.mktemp("two"), TWO)


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return _render(tmp_path_factory.mktemp("three"), THREE, only=("haproxy", "nginx"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """Two HAProxy load balancers sharing a floating address."""
    ha = {"load_balancer_ha": "", "load_balancer_virtual_ip": "10.0.0.100",
          "load_balancer_vrrp_password": "pair-pw"}
    return _render(tmp_path_factory.mktemp("pair"), TWO, only=("haproxy", "haproxy_open"),
                   extra=ha, addresses={"haproxy": "10.0.0.2", "haproxy_open": "10.0.0.3"})


def _section(cfg: str, header: str) -> list[str]:
    """The stripped, non-comment lines of one HAProxy section."""
    lines, inside = [], False
    for raw in cfg.splitlines():
        if raw and not raw[0].isspace():
            inside = raw.strip() == header
            continue
        line = raw.strip()
        if inside and line and not line.startswith("#"):
            lines.append(line)
    return lines


def _haproxy_check(folder: Path) -> None:
    run = subprocess.run(["haproxy", "-c", "-f", str(folder / "haproxy.cfg")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Configuration file is valid" in run.stdout + run.stderr


def _nginx_check(folder: Path) -> None:
    run = subprocess.run(["nginx", "-t", "-c", str(folder / "nginx.conf")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


# --- HAProxy -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "sample, variant",
    [("two", "haproxy"), ("two", "haproxy_tls"), ("two", "haproxy_open"), ("three", "haproxy")],
)
def test_haproxy_accepts_every_variant(request, sample, variant):
    _haproxy_check(request.getfixturevalue(sample) / variant)


def test_haproxy_servers_are_every_instances_rank_0(two, three):
    backend = _section((two / "haproxy" / "haproxy.cfg").read_text(), "backend inferfleet_engines")
    servers = [line for line in backend if line.startswith("server ")]
    assert servers == [
        "server node1 10.0.0.11:8000 weight 100 maxconn 64 agent-port 8010",
        "server node2 10.0.0.12:8001 weight 100 maxconn 64 agent-port 8010",
    ]
    cfg = (three / "haproxy" / "haproxy.cfg").read_text()
    backend = _section(cfg, "backend inferfleet_engines")
    servers = [line for line in backend if line.startswith("server ")]
    assert servers == [
        "server big 10.0.0.14:8000 weight 100 maxconn 64 agent-port 8010",
        "server node1 10.0.0.11:8000 weight 200 maxconn 128 agent-port 8010",
        "server small 10.0.0.20:8000 weight 100 maxconn 64 agent-port 8010",
    ]


def test_haproxy_balancing_health_and_queue(two):
    cfg = (two / "haproxy" / "haproxy.cfg").read_text()
    backend = _section(cfg, "backend inferfleet_engines")
    assert "balance leastconn" in backend
    assert "option httpchk" in backend
    assert "http-check send meth GET uri /health ver HTTP/1.1 hdr Host inferfleet-lb" in backend
    assert "http-check expect status 200" in backend
    default_server = next(line for line in backend if line.startswith("default-server "))
    for word in ["check", "inter 2s", "fastinter 1s", "downinter 5s", "fall 3", "rise 2",
                 "slowstart 60s", "maxconn 64", "agent-check", "agent-inter 1s"]:
        assert f" {word}" in default_server, word
    defaults = _section(cfg, "defaults")
    assert "timeout queue 30s" in defaults
    assert any(line.startswith("http-error status 503 content-type application/json")
               and "Retry-After" in line for line in defaults)
    open_cfg = (two / "haproxy_open" / "haproxy.cfg").read_text()
    assert "balance roundrobin" in _section(open_cfg, "backend inferfleet_engines")


def test_haproxy_retries_only_what_never_reached_the_client(two):
    defaults = _section((two / "haproxy" / "haproxy.cfg").read_text(), "defaults")
    assert [line for line in defaults if line.startswith("retry-on")] == [
        "retry-on conn-failure 500 503"]
    assert "retries 2" in defaults
    assert "option redispatch 1" in defaults
    assert "option http-buffer-request" in defaults
    text = "\n".join(defaults)
    for risky in ["all-retryable-errors", "empty-response", "response-timeout", "junk-response",
                  "0rtt-rejected", "l7-retries"]:
        assert risky not in text


def test_haproxy_timeouts_do_not_cut_long_streams(two):
    defaults = _section((two / "haproxy" / "haproxy.cfg").read_text(), "defaults")
    assert "timeout client 10m" in defaults
    assert "timeout server 10m" in defaults
    assert not any(line.startswith("timeout tunnel") for line in defaults)


def test_haproxy_edge_security(two):
    cfg = (two / "haproxy" / "haproxy.cfg").read_text()
    public = _section(cfg, "frontend inferfleet_public")
    keys_map = two / "haproxy" / "inferfleet-api-keys.map"
    assert (f"http-request set-var(txn.key_id) http_auth_bearer,map_str({keys_map})") in public
    unauthorized = next(line for line in public if "return status 401" in line)
    assert unauthorized.endswith("unless { var(txn.key_id) -m found }")
    assert "WWW-Authenticate" in unauthorized
    assert f"acl inferfleet_allowed_path path {' '.join(ALLOWED)}" in public
    deny = next(line for line in public if "deny_status 403" in line)
    assert deny.startswith("http-request deny") and deny.endswith("unless inferfleet_allowed_path")
    # The 401 comes before the path check, the path check before the rate count.
    order = [i for i, line in enumerate(public)
             if "status 401" in line or "deny_status 403" in line or "track-sc0" in line]
    assert len(order) == 3 and order == sorted(order)
    assert any(line.startswith("stick-table type string") and "http_req_rate(60s)" in line
               for line in public)
    assert "http-request track-sc0 var(txn.key_id)" in public
    assert "http-request set-var(txn.rate_limit) int(600)" in public
    assert "http-request set-var(txn.rate_limit) int(5) if { var(txn.key_id) -m str bob }" in public
    assert any("deny_status 429" in line and "Retry-After" in line
               and line.endswith("if { var(txn.rate_excess) -m int gt 0 }") for line in public)
    assert "http-request del-header Authorization" in public
    backend = _section(cfg, "backend inferfleet_engines")
    upstream_map = two / "haproxy" / "inferfleet-upstream.map"
    bearer = f"Bearer %[str(upstream),map_str({upstream_map})]"
    assert f'http-request set-header Authorization "{bearer}"' in backend


def test_haproxy_admin_endpoint_is_apart_and_runtime_api_local(two):
    cfg = (two / "haproxy" / "haproxy.cfg").read_text()
    public = _section(cfg, "frontend inferfleet_public")
    admin = _section(cfg, "frontend inferfleet_admin")
    assert [line for line in public if line.startswith("bind ")] == ["bind 0.0.0.0:80"]
    assert [line for line in admin if line.startswith("bind ")] == ["bind 127.0.0.1:8404"]
    assert "http-request use-service prometheus-exporter if { path /metrics }" in admin
    assert "stats uri /stats" in admin
    assert not any(line.startswith("stats") or "prometheus" in line for line in public)
    glob = _section(cfg, "global")
    assert "stats socket /run/haproxy/admin.sock mode 600 level admin expose-fd listeners" in glob
    assert f"server-state-file {two / 'haproxy' / 'server-state'}" in glob
    assert "load-server-state-from-file global" in _section(cfg, "defaults")


def test_haproxy_secrets_stay_in_0600_files(two):
    folder = two / "haproxy"
    cfg = (folder / "haproxy.cfg").read_text()
    for entry in KEYS:
        assert entry["key"] not in cfg
    assert UPSTREAM_KEY not in cfg
    keys_map = folder / "inferfleet-api-keys.map"
    assert stat.S_IMODE(keys_map.stat().st_mode) == 0o600
    lines = [line for line in keys_map.read_text().splitlines() if not line.startswith("#")]
    assert lines == [f"{e['key']} {e['id']}" for e in KEYS]
    upstream = folder / "inferfleet-upstream.map"
    assert stat.S_IMODE(upstream.stat().st_mode) == 0o600
    assert upstream.read_text() == f"upstream {UPSTREAM_KEY}\n"


def test_haproxy_tls_terminates_only_when_given(two):
    tls = _section((two / "haproxy_tls" / "haproxy.cfg").read_text(), "frontend inferfleet_public")
    pem = two / "haproxy_tls" / "inferfleet-tls.pem"
    assert [line for line in tls if line.startswith("bind ")] == [
        f"bind 0.0.0.0:443 ssl crt {pem} alpn h2,http/1.1"
    ]
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    assert "PRIVATE KEY" in pem.read_text() and "BEGIN CERTIFICATE" in pem.read_text()
    assert not (two / "haproxy" / "inferfleet-tls.pem").exists()
    hsts = 'http-after-response set-header Strict-Transport-Security "max-age=31536000"'
    assert hsts in tls
    plain = _section((two / "haproxy" / "haproxy.cfg").read_text(), "frontend inferfleet_public")
    assert not [line for line in plain if "Strict-Transport-Security" in line]


def test_haproxy_open_endpoint_limits_per_client_address(two):
    public = _section((two / "haproxy_open" / "haproxy.cfg").read_text(),
                      "frontend inferfleet_public")
    assert "http-request set-var(txn.key_id) src" in public
    assert not any("status 401" in line for line in public)
    assert not any("upstream" in line for line in
                   _section((two / "haproxy_open" / "haproxy.cfg").read_text(),
                            "backend inferfleet_engines"))


def test_haproxy_routes_each_model_to_its_own_backend(models):
    _haproxy_check(models / "haproxy")
    cfg = (models / "haproxy" / "haproxy.cfg").read_text()
    # The default model keeps the single-model backend's name; the other gets its own.
    alpha = _section(cfg, "backend inferfleet_engines")
    beta = _section(cfg, "backend inferfleet_engines_org_beta-1.5")
    assert [line for line in alpha if line.startswith("server ")] == [
        "server node1 10.0.0.11:8000 weight 100 maxconn 64 agent-port 8010",
        "server node2 10.0.0.12:8000 weight 100 maxconn 64 agent-port 8010",
    ]
    assert [line for line in beta if line.startswith("server ")] == [
        "server node3 10.0.0.13:8000 weight 100 maxconn 64 agent-port 8010"]
    assert "option httpchk" in beta and "balance leastconn" in beta
    public = _section(cfg, "frontend inferfleet_public")
    assert "http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST" in public
    assert "use_backend inferfleet_engines if { var(txn.model) -m str alpha }" in public
    assert ("use_backend inferfleet_engines_org_beta-1.5 if { var(txn.model) -m str org/beta-1.5 }"
            in public)
    assert "tune.bufsize 262144" in _section(cfg, "global")

    def rule(word: str) -> list[str]:
        return [line for line in public if word in line]

    missing, = rule("missing_model")
    assert missing.startswith("http-request return status 400 ")
    assert missing.endswith("if METH_POST !{ var(txn.model) -m found }")
    unknown, = rule("model_not_found")
    assert unknown.startswith("http-request return status 404 ")
    assert "served: alpha, org/beta-1.5" in unknown
    assert unknown.endswith("!{ var(txn.model) -m str alpha org/beta-1.5 }")
    forbidden, = rule("model_not_allowed")
    assert forbidden.startswith("http-request return status 403 ")
    assert "{ var(txn.key_id) -m str bob }" in forbidden
    assert forbidden.endswith("!{ var(txn.model) -m str org/beta-1.5 }")
    listing = rule("if { path /v1/models } METH_GET")
    assert len(listing) == 2  # bob's own list, then everyone else's
    assert '"id":"org/beta-1.5"' in listing[0] and '"id":"alpha"' not in listing[0]
    assert '"id":"alpha"' in listing[1] and '"id":"org/beta-1.5"' in listing[1]
    limit = "set-var(txn.model_limit) int(30) if { var(txn.model) -m str org/beta-1.5 }"
    assert f"http-request {limit}" in public
    assert "stick-table type string len 192" in " ".join(
        _section(cfg, "backend inferfleet_rate_by_model"))
    # The key is checked, then the path, then the per-key rate, then the model.
    order = [public.index(r) for r in (rule("status 401")[0], rule("deny_status 403")[0],
                                       rule("track-sc0")[0], unknown, forbidden,
                                       rule("del-header Authorization")[0])]
    assert order == sorted(order)


def test_nginx_routes_each_model_to_its_own_upstream(models_nginx):
    _nginx_check(models_nginx / "nginx")
    conf = (models_nginx / "nginx" / "nginx.conf").read_text()
    lines = _directives(conf)
    assert "upstream inferfleet_engines {" in lines
    assert "upstream inferfleet_engines_org_beta-1.5 {" in lines
    beta = conf[conf.index("upstream inferfleet_engines_org_beta-1.5 {"):]
    assert [line for line in _directives(beta[:beta.index("}")]) if line.startswith("server ")] \
        == ["server 10.0.0.13:8000 weight=100 max_fails=3 fail_timeout=10s max_conns=64;"]
    # Every inference path reads the body first, then goes where the maps say.
    for path in ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]:
        block = conf[conf.index(f"location = {path} {{"):]
        block = _directives(block[:block.index("}")])
        assert "mirror /inferfleet-read-body;" in block and "mirror_request_body on;" in block
        assert "proxy_pass http://$inferfleet_route;" in block
    models_block = conf[conf.index("location = /v1/models {"):]
    assert "return 200 $inferfleet_models;" in models_block[:models_block.index("}")]
    assert '"alpha" inferfleet_engines;' in lines
    assert '"org/beta-1.5" inferfleet_engines_org_beta-1.5;' in lines
    assert '"" 127.0.0.1:8404/inferfleet-refused/missing;' in lines
    assert "default 127.0.0.1:8404/inferfleet-refused/unknown?model=$inferfleet_model;" in lines
    assert '"~^bob:" 0;' in lines and '"bob:org/beta-1.5" 1;' in lines
    assert "client_max_body_size 262144;" in lines and "client_body_in_single_buffer on;" in lines


def test_haproxy_peers_keep_the_rate_counters_in_step(pair, two):
    for name in ("haproxy", "haproxy_open"):
        _haproxy_check(pair / name)
        cfg = (pair / name / "haproxy.cfg").read_text()
        assert f"localpeer lb_{name}" in _section(cfg, "global")
        assert _section(cfg, "peers inferfleet_peers") == [
            "peer lb_haproxy 10.0.0.2:10000", "peer lb_haproxy_open 10.0.0.3:10000"]
        tables = [line for line in cfg.splitlines() if "stick-table" in line]
        assert tables and all(line.endswith(" peers inferfleet_peers") for line in tables)
        assert "pair-pw" not in cfg
    # one load balancer, or several without a floating address: no peers
    cfg = (two / "haproxy" / "haproxy.cfg").read_text()
    assert "peers" not in cfg and "localpeer" not in cfg


def test_haproxy_cache_aware_sends_each_model_to_its_router(tmp_path):
    """cache_aware: each model's backend has one server, this host's router on loopback
    (ports from load_balancer_router_port on, in backend order), checked on /readiness
    (its /health fails while any engine is down); the edge's keys and the engines' key
    stay as they are; each router's metrics are on the admin address."""
    out = _render(tmp_path, MODELS, only=("haproxy",),
                  extra={"inferfleet_model_name": "alpha", "load_balancer_routing": "cache_aware"})
    _haproxy_check(out / "haproxy")
    cfg = (out / "haproxy" / "haproxy.cfg").read_text()
    routers = {}
    for backend in ("inferfleet_engines", "inferfleet_engines_org_beta-1.5"):
        lines = _section(cfg, f"backend {backend}")
        assert [line for line in lines if line.startswith("server ")] == [
            line for line in lines if line.startswith("server router 127.0.0.1:")], lines
        routers[backend] = next(line.split()[2] for line in lines if line.startswith("server "))
        check = "http-check send meth GET uri /readiness ver HTTP/1.1 hdr Host inferfleet-lb"
        assert check in lines, lines
        assert not any(line.startswith("balance ") for line in lines), lines
        assert any("Authorization" in line and "upstream" in line for line in lines), lines
    assert routers == {"inferfleet_engines": "127.0.0.1:8600",
                       "inferfleet_engines_org_beta-1.5": "127.0.0.1:8601"}
    # the edge (keys, limits, allowed paths, routing by model) is leastconn's, line for line
    (tmp_path / "leastconn").mkdir()
    plain = _render(tmp_path / "leastconn", MODELS, only=("haproxy",),
                    extra={"inferfleet_model_name": "alpha"})
    public = "frontend inferfleet_public"
    assert _section(cfg, public) == _section(
        (plain / "haproxy" / "haproxy.cfg").read_text().replace(str(plain), str(out)), public)
    # each router's metrics on the admin address, at the metrics path + /router/<model>
    admin = _section(cfg, "frontend inferfleet_admin")
    metrics = {}
    for index, (model, port) in enumerate((("alpha", 8700), ("org/beta-1.5", 8701))):
        assert (f"use_backend inferfleet_router_metrics_{index} if "
                f"{{ path /metrics/router/{model} }}") in admin, admin
        metrics[model] = _section(cfg, f"backend inferfleet_router_metrics_{index}")
        assert metrics[model] == ["http-request set-path /metrics",
                                  f"server router 127.0.0.1:{port}"], metrics


def test_a_single_model_fleet_keeps_its_configuration(two):
    cfg = (two / "haproxy" / "haproxy.cfg").read_text()
    directives = [line.strip() for line in cfg.splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    assert not [line for line in directives if "txn.model" in line or "tune.bufsize" in line]
    assert [line for line in directives if line.startswith("backend ")] == [
        "backend inferfleet_engines"]
    assert "default_backend inferfleet_engines" in _section(cfg, "frontend inferfleet_public")


# --- Nginx ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "sample, variant",
    [("two", "nginx"), ("two", "nginx_tls"), ("two", "nginx_open"), ("three", "nginx")],
)
def test_nginx_accepts_every_variant(request, sample, variant):
    _nginx_check(request.getfixturevalue(sample) / variant)


def _directives(conf: str) -> list[str]:
    return [line.strip() for line in conf.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_nginx_upstream_contract(two, three):
    lines = _directives((two / "nginx" / "nginx.conf").read_text())
    assert "least_conn;" in lines
    assert [line for line in lines if line.startswith("server 10.")] == [
        "server 10.0.0.11:8000 weight=100 max_fails=3 fail_timeout=10s max_conns=64;",
        "server 10.0.0.12:8001 weight=100 max_fails=3 fail_timeout=10s max_conns=64;",
    ]
    lines = _directives((three / "nginx" / "nginx.conf").read_text())
    assert [line for line in lines if line.startswith("server 10.")] == [
        "server 10.0.0.14:8000 weight=100 max_fails=3 fail_timeout=10s max_conns=64;",
        "server 10.0.0.11:8000 weight=200 max_fails=3 fail_timeout=10s max_conns=128;",
        "server 10.0.0.20:8000 weight=100 max_fails=3 fail_timeout=10s max_conns=64;",
    ]
    assert "least_conn;" not in _directives((two / "nginx_open" / "nginx.conf").read_text())


def test_nginx_retries_and_streams(two):
    lines = _directives((two / "nginx" / "nginx.conf").read_text())
    assert [line for line in lines if line.startswith("proxy_next_upstream ")] == [
        "proxy_next_upstream error timeout;"
    ]
    assert "proxy_next_upstream_tries 3;" in lines
    assert not any("non_idempotent" in line or "http_50" in line for line in lines)
    assert "proxy_buffering off;" in lines
    assert "proxy_read_timeout 10m;" in lines
    assert "send_timeout 10m;" in lines


def test_nginx_edge_security(two):
    folder = two / "nginx"
    conf = (folder / "nginx.conf").read_text()
    lines = _directives(conf)
    assert f"include {folder / 'inferfleet-api-keys.conf'};" in lines
    assert 'if ($inferfleet_key_id = "") {' in lines and "return 401;" in lines
    for path in ALLOWED:
        assert f"location = {path} {{" in lines
    catch_all = conf.index("location / {")
    assert "return 403" in conf[catch_all:conf.index("}", catch_all)]
    assert "limit_req_status 429;" in lines
    for limit, rate in [(600, "600r/m"), (5, "5r/m")]:
        zone = f"zone=inferfleet_rate_{limit}:10m rate={rate};"
        assert f"limit_req_zone $inferfleet_rate_key_{limit} {zone}" in lines
    assert "limit_req zone=inferfleet_rate_600 burst=599 nodelay;" in lines
    assert re.search(r"map \$inferfleet_key_id \$inferfleet_rate_key_5 \{\s+"
                     r"default \"\";\s+\\bob bob;", conf)
    assert re.search(r"map \$inferfleet_key_id \$inferfleet_rate_key_600 \{\s+"
                     r"default \$inferfleet_key_id;\s+\\bob \"\";", conf)
    keys = (folder / "inferfleet-api-keys.conf").read_text()
    assert '"~^sk\\-alice\\-0123456789abcdef$" alice;' in keys
    assert stat.S_IMODE((folder / "inferfleet-api-keys.conf").stat().st_mode) == 0o600
    upstream = folder / "inferfleet-upstream-auth.conf"
    assert f'proxy_set_header Authorization "Bearer {UPSTREAM_KEY}";' in upstream.read_text()
    assert stat.S_IMODE(upstream.stat().st_mode) == 0o600
    for entry in KEYS:
        assert entry["key"] not in conf
    assert UPSTREAM_KEY not in conf
    open_auth = (two / "nginx_open" / "inferfleet-upstream-auth.conf").read_text()
    assert 'proxy_set_header Authorization "";' in open_auth


def test_nginx_admin_endpoint_is_apart(two):
    lines = _directives((two / "nginx" / "nginx.conf").read_text())
    assert [line for line in lines if line.startswith("listen ")] == [
        "listen 0.0.0.0:80;", "listen 127.0.0.1:8404;"
    ]
    assert "stub_status;" in lines
    tls = _directives((two / "nginx_tls" / "nginx.conf").read_text())
    assert "listen 0.0.0.0:443 ssl;" in tls
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in tls
    assert 'add_header Strict-Transport-Security "max-age=31536000" always;' in tls
    assert not [line for line in lines if "Strict-Transport-Security" in line]


def test_nginx_key_patterns_match_exactly(two):
    """The anchored, escaped patterns accept the key itself and nothing near it."""
    keys = (two / "nginx" / "inferfleet-api-keys.conf").read_text()
    patterns = re.findall(r'^"~(.*)" (\S+);$', keys, re.M)
    assert [key_id for _, key_id in patterns] == ["alice", "bob"]
    for (pattern, _), entry in zip(patterns, KEYS, strict=True):
        assert re.fullmatch(pattern, entry["key"])
        assert not re.fullmatch(pattern, entry["key"].upper())
        assert not re.fullmatch(pattern, entry["key"] + "x")
        assert not re.fullmatch(pattern, "x" + entry["key"])



class _Engine(http.server.ThreadingHTTPServer):
    """A stand-in engine on 127.0.0.1: /health 200, every POST answered with its name,
    after `hold` seconds for a body that asks to be slow. With `idle`, it keeps
    connections open (HTTP/1.1) and closes one idle for `idle` seconds, as vLLM does
    (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); `closed` lists who closed each: "engine" or "peer"."""

    daemon_threads = True

    def __init__(self, name: str, hold: float = 0, idle: float | None = None):
        closed = self.closed = []

        class Handler(http.server.BaseHTTPRequestHandler):
            if idle is not None:
                protocol_version, timeout = "HTTP/1.1", idle

            def handle(self):
                super().handle()
                if idle is not None:
                    closed.append("engine" if self.timed_out else "peer")

            def handle_one_request(self):
                self.timed_out = False
                super().handle_one_request()

            def log_error(self, message, *args):  # the standard library's word for a timeout
                self.timed_out = self.timed_out or message.startswith("Request timed out")

            def _answer(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (the standard library's name)
                self._answer(b"ok")

            def do_POST(self):  # noqa: N802
                if b"slow" in self.rfile.read(int(self.headers.get("Content-Length", 0))):
                    time.sleep(hold)
                self._answer(name.encode())

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _runtime(sock: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: s.recv(65536), b"")).decode()


def _local_haproxy(tmp_path: Path, free_port, engines: dict, agents: dict | None = None,
                   server: dict | None = None, **extra) -> tuple[Path, int, Path, subprocess.Popen]:
    """The open HAProxy variant rendered for stand-in engines on 127.0.0.1 (each with its
    agent's port, or a free one where no agent listens: the checks alone decide, and
    `server` settings), on a free port with its runtime socket in tmp_path, and started:
    (its configuration, the public port, the socket, the process)."""
    backends = {
        name: {"load_balancer_backend_address": "127.0.0.1",
               "inference_engine_port": engine.server_address[1],
               "inference_engine_agent_port": agents[name].port if agents else free_port(),
               **(server or {})}
        for name, engine in engines.items()
    }
    port, sock = free_port(), tmp_path / "admin.sock"
    out = _render(tmp_path, backends, only=("haproxy_open",), extra={
        "load_balancer_port": port, "load_balancer_bind_address": "127.0.0.1",
        "load_balancer_admin_port": free_port(), "load_balancer_haproxy_runtime_socket": str(sock),
        "load_balancer_haproxy_log": "stderr local0", "load_balancer_slowstart": "0s", **extra})
    cfg = out / "haproxy_open" / "haproxy.cfg"
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Started means its runtime socket answers: the file appears when HAProxy binds it,
    # a moment before it listens (a connection then is refused).
    for _ in range(100):
        try:
            _runtime(sock, "show info")
            return cfg, port, sock, proxy
        except (FileNotFoundError, ConnectionRefusedError):
            if proxy.poll() is not None:
                break
            time.sleep(0.1)
    proxy.kill()
    pytest.fail(f"HAProxy's runtime socket never answered: {proxy.communicate()[0][-2000:]}")


def test_nginx_closes_an_idle_engine_connection_before_the_engine(tmp_path, free_port):
    """vLLM closes a connection idle for 5 s; a request Nginx sends on it as it closes
    fails, and Nginx never re-sends a POST (a 502 to the client: CI saw one in a rollout).
    With the role's defaults Nginx must close its idle connection first."""
    engine = _Engine("engine", idle=5)
    port = free_port()
    out = _render(tmp_path, {"node1": {"load_balancer_backend_address": "127.0.0.1",
                                       "inference_engine_port": engine.server_address[1]}},
                  only=("nginx_open",),
                  extra={"load_balancer_port": port, "load_balancer_bind_address": "127.0.0.1",
                         "load_balancer_admin_port": free_port()})
    conf = out / "nginx_open" / "nginx.conf"
    conf.write_text(re.sub(r"(?m)^pid .*;$", f"pid {tmp_path / 'nginx.pid'};", conf.read_text()))
    proxy = subprocess.Popen(["nginx", "-c", str(conf), "-g", "daemon off;"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(100):
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                                 data=b'{"prompt": "hi"}')
                with urllib.request.urlopen(request, timeout=5) as answer:
                    assert (answer.status, answer.read()) == (200, b"engine")
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        else:
            pytest.fail("Nginx never answered")
        answered = time.monotonic()
        while not engine.closed and time.monotonic() - answered < 8:
            time.sleep(0.05)
        closed_after = time.monotonic() - answered
    finally:
        proxy.terminate()
        log = proxy.communicate(timeout=10)[0]
        engine.shutdown()
    assert engine.closed == ["peer"], (engine.closed, log)
    assert closed_after < 5, closed_after


def test_haproxy_takes_out_an_engine_that_refuses_connections(tmp_path, free_port):
    """An engine whose process has exited refuses connections before the checks notice
    (here they never would: fall 50), while the other engine is busy (maxconn 1). The
    request must wait for the busy one, not fail once every retry went to the refuser."""
    gone, busy = _Engine("gone"), _Engine("busy", hold=3)
    _, port, sock, proxy = _local_haproxy(
        tmp_path, free_port, {"gone": gone, "busy": busy},
        server={"load_balancer_backend_maxconn": 1},
        load_balancer_health_fall=50, load_balancer_health_rise=1)

    def complete(prompt: str = "hi") -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=f'{{"prompt": "{prompt}"}}'.encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def state(server: str) -> str:  # as the role reads it (tasks/server_state.yml)
        servers = haproxy_servers(_runtime(sock, "show stat -1 4 -1"), "inferfleet_engines")
        return next(s["status"] for s in servers if s["name"] == server)

    try:
        for _ in range(100):
            if state("gone") == state("busy") == "UP":
                break
            time.sleep(0.1)
        else:
            pytest.fail("HAProxy never had both servers up")
        # "busy" takes a slow request (with "gone" in maintenance meanwhile) and is full
        _runtime(sock, "disable server inferfleet_engines/gone")
        slow = []
        waiting = threading.Thread(target=lambda: slow.append(complete("slow")))
        waiting.start()
        time.sleep(0.5)
        _runtime(sock, "enable server inferfleet_engines/gone")
        for _ in range(100):
            if state("gone") == "UP":
                break
            time.sleep(0.1)
        gone.shutdown()
        gone.server_close()  # its port now refuses connections
        assert complete() == (200, "busy")
        waiting.join()
        assert slow == [(200, "busy")]
        # what `inferfleet doctor` reads (as tasks/servers.yml asks): a server's address and
        # last check, and the backend's queue, once the answered requests' sessions have
        # closed (CI once read the slow one's session a moment after its answer)
        for _ in range(60):
            seen = load_balancer_seen(
                {"rc": 0, "stdout": _runtime(sock, "show stat -1 6 -1")}, "inferfleet_engines")
            row = next(s for s in seen["servers"] if s["name"] == "gone")
            sessions = seen["queues"]["inferfleet_engines"]["sessions"]
            if row["check_status"] == "L4CON" and sessions == 0:
                break
            time.sleep(0.1)
        assert sorted(s["name"] for s in seen["servers"]) == ["busy", "gone"], seen
        assert seen["queues"] == {"inferfleet_engines": {"queued": 0, "sessions": 0}}, seen
        assert row["addr"] == f"127.0.0.1:{gone.server_address[1]}", row
        assert row["check_status"] == "L4CON", row
        assert "refused" in row["last_chk"].lower(), row
    finally:
        proxy.terminate()
        log = proxy.communicate(timeout=10)[0]
        busy.shutdown()
    assert "gone is DOWN" in log and "L4 unsuccessful connection" in log, log


class _Agent(threading.Thread):
    """A stand-in for an engine's agent (inferfleet-engine-agent.socket): each connection
    gets `word` and a newline."""

    def __init__(self, word: str):
        super().__init__(daemon=True)
        self.word, self.listener = word, socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.start()

    def run(self):
        while True:
            connection, _ = self.listener.accept()
            with connection:
                connection.sendall(f"{self.word}\n".encode())


def test_haproxy_takes_out_an_engine_whose_agent_says_down(tmp_path, free_port):
    """A stopping engine's agent answers "down" before its process closes its socket:
    HAProxy must stop sending it requests while its /health still answers 200, show it
    as DOWN with agent_down (the role's reading), keep an operator's drain a DRAIN, and
    take it back when the agent says "up"."""
    engines = {name: _Engine(name) for name in ("stopping", "staying")}
    agents = {name: _Agent("up") for name in engines}
    _, port, sock, proxy = _local_haproxy(tmp_path, free_port, engines, agents,
                                          load_balancer_routing="roundrobin")

    def servers() -> dict:
        seen = haproxy_servers(_runtime(sock, "show stat -1 4 -1"), "inferfleet_engines")
        return {s["name"]: s for s in seen}

    def until(name: str, status: str) -> dict:
        for _ in range(100):
            server = servers()[name]
            if server.get("status") == status:
                return server
            time.sleep(0.1)
        pytest.fail(f"{name} never {status}: {servers()}")

    def answers(count: int) -> list[str]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                         data=b'{"prompt": "hi"}')
        return [urllib.request.urlopen(request, timeout=10).read().decode()
                for _ in range(count)]

    try:
        until("stopping", "UP"), until("staying", "UP")
        agents["stopping"].word = "down"
        assert until("stopping", "DOWN")["agent_down"] is True
        assert servers()["staying"]["agent_down"] is False
        assert answers(6) == ["staying"] * 6  # its /health still answers 200
        _runtime(sock, "set server inferfleet_engines/staying state drain")
        assert until("staying", "DRAIN")["agent_down"] is False  # HAProxy: "DRAIN (agent)"
        _runtime(sock, "set server inferfleet_engines/staying state ready")
        agents["stopping"].word = "up"
        until("stopping", "UP")
        assert sorted(set(answers(6))) == ["staying", "stopping"]
    finally:
        proxy.terminate()
        proxy.communicate(timeout=10)
        for engine in engines.values():
            engine.shutdown()


def test_haproxy_prefix_routing_keeps_each_prefix_on_one_engine(tmp_path, free_port):
    """load_balancer_routing: prefix, through the real HAProxy: requests whose prompt (or
    chat's first message) begins with the same load_balancer_prefix_bytes land on one
    engine whatever follows and however the JSON is written; the prefixes spread over
    every engine; an engine taken out hands its prefixes on and gets them back when it
    returns; a prefix whose engine is over the load bound spills to another; a body with
    no string prompt is balanced in turn."""
    engines = {name: _Engine(name, hold=3) for name in ("e1", "e2", "e3")}
    cfg_path, port, sock, proxy = _local_haproxy(
        tmp_path, free_port, engines, load_balancer_routing="prefix",
        load_balancer_prefix_bytes=32, load_balancer_prefix_balance_factor=200)

    def post(body: str, path: str = "/v1/completions", settle: bool = True) -> str:
        # HAProxy ends a stream a moment after the client has its answer; the bound counts
        # it (factor 200, whole requests: with three engines and one in flight, 1, 1 and 2
        # slots; the default 300 would never bound three engines' requests), so
        # one request after another waits for the last to end, as the test means them to.
        for _ in range(200 if settle else 0):
            seen = load_balancer_seen(
                {"rc": 0, "stdout": _runtime(sock, "show stat -1 6 -1")}, "inferfleet_engines")
            if seen["queues"]["inferfleet_engines"]["sessions"] == 0:
                break
            time.sleep(0.01)
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.read().decode()

    def prompt(tenant: int, suffix: str) -> str:  # 32 bytes shared per tenant, then its own
        return f"tenant {tenant:02d} system prompt".ljust(32, ".") + suffix

    def where(tenant: int) -> set[str]:
        return {post(json.dumps({"model": "m", "prompt": prompt(tenant, f"question {i}")}))
                for i in range(4)}

    try:
        cfg = cfg_path.read_text()
        backend = _section(cfg, "backend inferfleet_engines")
        assert "balance hash var(txn.prefix)" in backend and "hash-balance-factor 200" in backend
        assert "tune.bufsize 262144" in _section(cfg, "global")
        for _ in range(100):
            seen = _runtime(sock, "show stat -1 4 -1")
            if {s["status"] for s in haproxy_servers(seen, "inferfleet_engines")} == {"UP"}:
                break
            time.sleep(0.1)
        else:
            pytest.fail("HAProxy never had every server up")
        home = {}
        for tenant in range(12):
            landed = where(tenant)
            assert len(landed) == 1, (tenant, landed)
            home[tenant] = landed.pop()
        assert set(home.values()) == set(engines), home
        # the body's key order, spacing and escapes do not matter: the decoded text does
        assert post('{ "prompt" : "tenant 03 system prompt.........\\u00e9t\\u00e9",'
                    ' "max_tokens": 3 }') == home[3]
        # chat: the first message's content (the system prompt) decides
        chats = {post(json.dumps({"model": "m", "messages": [
            {"role": "system", "content": prompt(5, "")},
            {"role": "user", "content": f"chat question {i}"}]}), "/v1/chat/completions")
            for i in range(4)}
        assert chats == {home[5]}
        # a prompt shorter than the prefix is hashed whole
        assert len({post('{"prompt": "hi"}') for _ in range(6)}) == 1
        # token ids (no string to hash): in turn, over more than one engine
        assert len({post('{"prompt": [1, 2, 3]}') for _ in range(6)}) > 1
        # an engine taken out: its tenants move, the others stay; back, they return
        gone = home[0]
        _runtime(sock, f"set server inferfleet_engines/{gone} state maint")
        moved = {t: where(t) for t in home}
        assert all(len(landed) == 1 for landed in moved.values()), moved
        assert all(moved[t] == {home[t]} for t in home if home[t] != gone), (home, moved)
        assert all(moved[t] != {gone} for t in home), moved
        _runtime(sock, f"set server inferfleet_engines/{gone} state ready")
        assert {t: where(t).pop() for t in home} == home
        # bounded load (200 % of the average in flight, this one counted): of three slow
        # requests of one tenant at once, its engine takes two, the next on the ring one
        slow = []
        threads = [threading.Thread(target=lambda: slow.append(post(json.dumps(
            {"prompt": prompt(1, "slow")}), settle=False))) for _ in range(3)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        for thread in threads:
            thread.join()
        assert len(slow) == 3 and slow.count(home[1]) == 2, slow
        assert where(1) == {home[1]}
    finally:
        proxy.terminate()
        proxy.communicate(timeout=10)
        for engine in engines.values():
            engine.shutdown()
