"""A small fleet of SIMULATED GPU engines through the operator's life cycle, in minutes.

`inferfleet lab up --nodes 6 --engine sim --nginx --routing cache_aware --monitoring` runs
site.yml over six nodes whose engine is the inference_engine role's sim runtime
(docs/engine.md: a stand-in for a GPU-backed vLLM, installed and run like it), behind
HAProxy and its vllm-router (cache_aware routing) and Nginx (leastconn), with Prometheus
on a monitoring host of its own. Every command runs through
Mitogen's strategy (INFERFLEET_MITOGEN=1), which the other scenarios leave off:
- a second deploy changes nothing;
- `verify`: every node healthy, one greedy answer from every node and both load
  balancers, the load spread over all six;
- Prometheus scrapes every engine, load balancer and router, and `status` shows its
  figures for each of the six instances;
- cache_aware routing: the requests of each of three tenants (one long shared prefix,
  then each request's own question) land on one engine, seen in the engines' counters;
  the edge still asks for a key, holds a key to its rate limit (429) and keeps the
  router's admin API out of reach;
- a tenant's engine killed under its load: the router takes it out within its checks'
  bound, no request started after that fails, the tenant moves to one other engine and
  comes back once its engine answers again;
- the engine role's compile-cache steps (tests/integration/compile_cache.yml; a folder
  planted as node1's compile cache, since a simulated engine compiles none): node1 finds
  none to take and offers its own, the other five take it at once from the peers alone,
  and every node holds the same files, the engine user's, under one key;
- `doctor`, with one engine given 96 requests at once (its max_num_seqs is 8): one
  finding, the queue in that engine, with its slots and the fix;
- `rollout --version v2` under load through both load balancers (HAProxy's through the
  router, which rollout drains and refills): no request fails, every node on v2;
- `scale --remove --purge-model` of node6 under load, then `scale --add`: no request
  fails, the fleet serves on five nodes, then six, and node6 is listed where it was
  (nodes.yml); the others' peer servers refuse node6 once it is out (403) and admit it
  again, and it takes the whole model from them, nothing from the object store.
The real vLLM CPU build stays in every functional scenario (the install test, molecule);
fleet-scale timings are benchmarks/fleet_scale.py's.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from inferfleet import fleet as fleet_mod
from inferfleet import paths
from inferfleet import verify as v
from inferfleet.lab import fleet

pytestmark = pytest.mark.lab

NODES = [fleet.node_name(i) for i in range(1, 7)]


def _cli(bin_dir: Path, env: dict, *args: str, timeout: int = 900) -> str:
    done = subprocess.run(
        [str(bin_dir / "inferfleet"), *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"inferfleet {' '.join(args)}: rc {done.returncode}\n" + (
        done.stdout[-4000:] + done.stderr[-3000:]
    )
    return done.stdout


def _record(out: str) -> dict:
    return json.loads(Path(out.rsplit("record: ", 1)[1].split()[0]).read_text())


def _events(out: str) -> list[dict]:
    """ansible-runner's events of a run, from beside its record."""
    events = Path(out.rsplit("record: ", 1)[1].split()[0]).parent.glob(
        "artifacts/*/job_events/*.json")
    return [json.loads(e.read_text()) for e in events]


def _changed(out: str) -> list[str]:
    """'host: task' of every change a run made."""
    found = [e.get("event_data", {}) for e in _events(out)]
    return sorted(f"{d.get('host')}: {d.get('task')}" for d in found
                  if (d.get("res") or {}).get("changed") is True)


def _roles_stepped(out: str) -> dict[str, set[str]]:
    """host -> the roles of which a run took a step (a task run or skipped) there."""
    stepped: dict[str, set[str]] = {}
    for event in _events(out):
        d = event.get("event_data", {})
        if event.get("event") in ("runner_on_ok", "runner_on_skipped") and d.get("role"):
            stepped.setdefault(d["host"], set()).add(d["role"])
    return stepped


def _serving(bin_dir: Path, env: dict) -> dict[str, str]:
    """host -> model version of each node `status` lists, all healthy."""
    nodes = json.loads(_cli(bin_dir, env, "status", "--json"))["nodes"]
    assert all(n["healthy"] and n["unit"] == "active" for n in nodes), nodes
    return {n["host"]: n["model_version"] for n in nodes}


def _prometheus_sees_the_fleet(bin_dir: Path, env: dict, inventory: Path,
                               balancers: list[str]) -> None:
    """The monitoring host's Prometheus has every engine, both load balancers, the router
    and one node exporter, its own (the simulated nodes share one machine), as targets,
    all up; `status --json` carries its request rate and KV-cache use for all six."""
    address = yaml.safe_load(
        (inventory / "host_vars" / f"{fleet.MONITORING_HOST}.yml").read_text())
    targets = f"http://{address['inferfleet_address']}:9090/api/v1/targets"
    deadline = time.monotonic() + 120
    while True:
        code, body = v.get(targets)
        assert code == 200, (targets, code, body[:300])
        active = json.loads(body)["data"]["activeTargets"]
        up = sorted((t["labels"]["job"], t["labels"]["instance"]) for t in active
                    if t["health"] == "up")
        if len(up) == len(active) or time.monotonic() > deadline:
            break
        time.sleep(2)
    jobs = {job: sorted(i for j, i in up if j == job) for job, _ in up}
    assert len(up) == len(active), [t for t in active if t["health"] != "up"]
    assert jobs.get("engine") == sorted(NODES), jobs
    assert jobs.get("loadbalancer") == sorted(balancers), jobs
    assert jobs.get("router") == ["inferfleet-lab-lb"], jobs
    assert jobs.get("node") == [fleet.MONITORING_HOST], jobs
    while True:  # a 5-minute rate needs two scrapes after the first requests
        shown = json.loads(_cli(bin_dir, env, "status", "--json"))
        rates = {n["host"]: n.get("requests_per_s") for n in shown["nodes"]}
        if all(r for r in rates.values()) or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert shown["prometheus"]["host"] == fleet.MONITORING_HOST, shown["prometheus"]
    assert shown["prometheus"]["errors"] == {}, shown["prometheus"]
    assert sorted(rates) == sorted(NODES) and all(r and r > 0 for r in rates.values()), rates
    assert all(isinstance(n.get("kv_cache_use"), float) for n in shown["nodes"]), shown["nodes"]


def _doctor(bin_dir: Path, env: dict) -> tuple[int, list[dict]]:
    done = subprocess.run([str(bin_dir / "inferfleet"), "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)["findings"]


def _doctor_finds_the_queue(bin_dir: Path, env: dict, inventory: Path) -> None:
    """With one engine given far more requests at once than its max_num_seqs (8),
    `inferfleet doctor` names that engine, its 8 running and the rest waiting, says to raise
    max_num_seqs or add instances, and finds nothing else on the fleet (six simulated
    engines behind HAProxy and Nginx)."""
    fleet = fleet_mod.load(inventory)
    node = next(n for n in fleet.serving if n.host == NODES[0])
    metrics = f"{node.base}/metrics"
    # 96 requests of 1000 tokens at once: 8 run, the rest wait (the sim's profile decodes
    # a token in about 5 ms: twelve rounds of about 5 s)
    with ThreadPoolExecutor(max_workers=96) as pool:
        calls = [pool.submit(v.complete, node.base, node.model, fleet.engine_key,
                             max_tokens=1000) for _ in range(96)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sums = v.metric_sums(v.get(metrics, fleet.engine_key)[1].splitlines())
            if sums.get("vllm:num_requests_waiting", 0) > 0:
                break
            time.sleep(0.5)
        rc, findings = _doctor(bin_dir, env)
        done = [c.result() for c in calls]
    assert all(c.ok for c in done), [c for c in done if not c.ok][:3]
    assert rc == 1 and [(f["case"], f["hosts"]) for f in findings] == [("queue", [NODES[0]])], (
        findings)
    [finding] = findings
    assert finding["evidence"][0].startswith(f"{NODES[0]}: 8 running (max_num_seqs 8), "), finding
    assert "waiting in the engine" in finding["evidence"][0], finding
    assert "every one of the 8 sequence slots is taken" in finding["cause"], finding
    assert "inference_engine_max_num_seqs" in finding["fix"], finding


def _served(fleet) -> dict[str, float]:
    """Each engine's own count of the requests it served."""
    return {n.host: v.served_requests(v.get(f"{n.base}/metrics", fleet.engine_key)[1])
            for n in fleet.serving}


def _system(tenant: str) -> str:
    """A tenant's long system prompt: what its requests share."""
    return f"You are the {tenant} assistant of tenant {tenant}. " * 12


def _tenant_engines(fleet, tenant: str, questions: int = 6) -> dict[str, float]:
    """Send a tenant's requests (its system prompt, then a question of each request's own)
    through HAProxy one after another on one kept connection, as the OpenAI SDKs send
    them; return which engines served them, by the engines' own counters."""
    haproxy = urlsplit(fleet.balancers[0])  # the lab's HAProxy; Nginx comes second
    connection = http.client.HTTPConnection(haproxy.hostname, haproxy.port, timeout=30)
    headers = {"Authorization": f"Bearer {fleet.api_key}", "Content-Type": "application/json"}
    before = _served(fleet)
    for question in range(questions):
        body = {"model": fleet.model, "prompt": f"{_system(tenant)}Question {question}: why?",
                "max_tokens": 4}
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        answer = connection.getresponse()
        assert answer.status == 200, (answer.status, answer.read()[:300])
        answer.read()
    connection.close()
    after = _served(fleet)
    return {h: after[h] - before[h] for h in after if after[h] > before[h]}


def _cache_aware_keeps_tenants_together(inventory: Path) -> None:
    """Through HAProxy and its router (load_balancer_routing: cache_aware), each tenant's
    requests all reach one engine; the edge still asks for a key, holds a key to its rate
    limit and keeps the router's admin API out of reach."""
    fleet = fleet_mod.load(inventory)
    assert fleet.routing == "cache_aware"
    # One tenant after another on an idle fleet: each tenant's first request matches no
    # engine's tree and goes to the least busy, the first listed among equals, so they may
    # all start on one engine (docs/load-balancer.md); what holds is each on one engine.
    for tenant in ("support desk", "legal review", "code helper"):
        got = _tenant_engines(fleet, tenant)
        assert len(got) == 1 and sum(got.values()) == 6, (tenant, got)
    base = fleet.balancers[0]
    body = {"model": fleet.model, "prompt": "hello", "max_tokens": 1}
    assert v.post_json(f"{base}/v1/completions", body, None).status == 401
    assert v.post_json(f"{base}/v1/completions", body, "sk-not-a-key").status == 401
    # and its rate limits: the lab's second key may send 3 requests a minute, the lab's
    # own key is not held back by it
    secrets = yaml.safe_load((inventory / "group_vars/all/secrets.yml").read_text())
    limited = [v.post_json(f"{base}/v1/completions", body, secrets["inferfleet_lab_limited_key"])
               for _ in range(4)]
    assert [c.status for c in limited] == [200, 200, 200, 429], limited
    assert v.post_json(f"{base}/v1/completions", body, fleet.api_key).status == 200
    admin = v.post_json(f"{base}/remove_worker?url=http://{NODES[0]}:8000", {}, fleet.api_key)
    assert admin.status == 403, admin


def _router_unhealthy(balancer: str) -> str:
    """The engines the lab HAProxy's router finds unhealthy (its /health, on loopback)."""
    return subprocess.run(
        ["docker", "exec", balancer, "curl", "-s", "http://127.0.0.1:8600/health"],
        capture_output=True, text=True, timeout=10,
    ).stdout


def _compile_cache_moves_between_nodes(bin_dir: Path, env: dict, inventory: Path) -> None:
    done = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inventory),
         str(Path(__file__).with_name("compile_cache.yml"))],
        env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def _reloads_since(node: str, since: int) -> int:
    """How many times the node's systemd read its units again since `since` (epoch s)."""
    out = subprocess.run(
        ["docker", "exec", node, "journalctl", "-q", "--no-pager", "-o", "cat",
         f"--since=@{since}", "SYSLOG_IDENTIFIER=systemd", "_PID=1"],
        capture_output=True, text=True, check=True).stdout
    return out.splitlines().count("Reloading.")


def _peer_status(asker: str, peer: str) -> int:
    """The HTTP status `peer`'s model peer server answers `asker` without a token: 403 to a
    host that is not a member of the fleet, 401 to a member."""
    address = yaml.safe_load((paths.LAB_INVENTORY / "host_vars" / f"{peer}.yml").read_text())
    probe = ("import sys, urllib.request, urllib.error\n"
             "try:\n    urllib.request.urlopen(sys.argv[1], timeout=5)\n    print(200)\n"
             "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    url = f"http://{address['inferfleet_address']}:8950/v1/tiny/v1/state"
    out = subprocess.run(["docker", "exec", asker, "python3", "-c", probe, url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def _synced(out: str, host: str) -> dict:
    """The model_sync module's result on `host` in a run."""
    [result] = [e["event_data"]["res"] for e in _events(out)
                if e.get("event") == "runner_on_ok" and e["event_data"].get("host") == host
                and e["event_data"].get("resolved_action") == "inferfleet.fleet.model_sync"]
    return result


def _until(what: str, ready, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return time.monotonic()


def _a_killed_engine_hands_its_tenant_over_and_takes_it_back(inventory: Path) -> None:
    """cache_aware under a tenant's load: its engine is killed (SIGKILL; systemd starts it
    again after inference_engine_restart_sec, 10 s). The router takes it out within its
    checks' bound (3 failed checks 2 s apart), no request started after that fails, the
    tenant's requests go to one other engine meanwhile, and once the engine answers again
    they come back to it."""
    fleet = fleet_mod.load(inventory)
    haproxy, lb = fleet.balancers[0], "inferfleet-lab-lb"
    tenant = "night shift"
    [home] = _tenant_engines(fleet, tenant)
    with v.LoadLoop([haproxy], fleet.model, fleet.api_key, workers=2, pause=0.05,
                    prompt=_system(tenant), max_tokens=4) as load:
        time.sleep(2)
        before = _served(fleet)
        killed = time.monotonic()
        subprocess.run(["docker", "exec", home, "systemctl", "kill", "-s", "KILL",
                        "inferfleet-engine"], check=True, timeout=30)
        out = _until(f"{home} unhealthy in the router", lambda: home in _router_unhealthy(lb), 30)
        back = _until(f"{home} healthy in the router again",
                      lambda: home not in _router_unhealthy(lb), 60)
        during = _served(fleet)
        time.sleep(1)
    assert out - killed <= 10, f"taken out {out - killed:.1f} s after the kill"
    late = [c for started, c in load.calls if started > out and not c.ok]
    assert not late, late[:3]
    moved = {h: during[h] - before[h] for h in during if h != home and during[h] > before[h]}
    assert len(moved) == 1 and sum(moved.values()) >= 10, moved
    print(f"kill {home}: out after {out - killed:.1f} s, back after {back - killed:.1f} s; "
          f"{len(load.calls)} requests, {len(load.failed())} failed (none after out); "
          f"meanwhile served by {moved}")
    time.sleep(5)  # the router's circuit breaker lets the engine try again after 4 s
    assert set(_tenant_engines(fleet, tenant)) == {home}


def test_a_simulated_fleet_deploys_verifies_rolls_and_scales(
    tmp_path, node_image, venv_bin, lab_names
):
    env = dict(os.environ, INFERFLEET_MITOGEN="1", INFERFLEET_RUNS_DIR=str(tmp_path / "runs"))
    inventory = paths.LAB_INVENTORY
    try:
        _cli(venv_bin, env, "lab", "up", "--nodes", "6", "--engine", "sim", "--nginx",
             "--routing", "cache_aware", "--monitoring", timeout=1200)
        balancers = fleet.inventory_hosts(inventory)["loadbalancers"]
        assert balancers == ["inferfleet-lab-lb", fleet.NGINX_HOST], balancers

        started = int(time.time()) + 1  # the next whole second: the CLI is still starting
        out = _cli(venv_bin, env, "deploy")
        again = _record(out)
        assert (again["rc"], again["mitogen"]) == (0, True), again
        hosts = [*NODES, *balancers, fleet.MONITORING_HOST]
        assert sorted(again["stats"]["ok"]) == sorted(hosts), again["stats"]
        assert sum(again["stats"]["changed"].values()) == 0, _changed(out)
        # CPU nodes, single-node instances, the lab's firewall off: those roles' plays
        # let the nodes go before their first step (each step costs the controller).
        stepped = _roles_stepped(out)
        for node in NODES:
            assert "inference_engine" in stepped[node], stepped[node]
            assert not {"gpu_driver", "fabric_preflight", "firewall"} & stepped[node], stepped[node]
        # nothing was written, so no node's systemd reads its units again (a reload is
        # about 0.2 s of a node's CPU: two a node on every run before)
        reloads = {node: _reloads_since(node, started) for node in NODES}
        assert reloads == dict.fromkeys(NODES, 0), reloads

        report = json.loads(_cli(venv_bin, env, "verify", "--json", "--count", "60"))
        assert report["ok"], report["checks"]
        passed = {c["check"] for c in report["checks"] if c["passed"]}
        assert {f"healthy {n}" for n in NODES} | {"identical greedy answers"} <= passed
        same = next(c for c in report["checks"] if c["check"] == "identical greedy answers")
        assert same["detail"].startswith(f"{len(NODES) + len(balancers)} answers"), same
        assert report["load"]["sent"] == 60 and report["load"]["failed"] == 0, report["load"]
        _compile_cache_moves_between_nodes(venv_bin, env, inventory)
        _cache_aware_keeps_tenants_together(inventory)
        _prometheus_sees_the_fleet(venv_bin, env, inventory, balancers)
        _a_killed_engine_hands_its_tenant_over_and_takes_it_back(inventory)
        _doctor_finds_the_queue(venv_bin, env, inventory)

        secrets = yaml.safe_load((inventory / "group_vars/all/secrets.yml").read_text())
        key = secrets["inferfleet_lab_api_key"]
        bases = []
        for lb in balancers:
            address = yaml.safe_load((inventory / "host_vars" / f"{lb}.yml").read_text())
            bases.append(f"http://{address['inferfleet_address']}:8080")
        _cli(venv_bin, env, "lab", "publish", "v2")
        with v.LoadLoop(bases, "tiny-llama", key, workers=2, pause=0.2) as load:
            _cli(venv_bin, env, "rollout", "--version", "v2")
        assert len(load.calls) >= 20 and not load.failed(), (len(load.calls), load.failed()[:3])
        assert _serving(venv_bin, env) == dict.fromkeys(NODES, "v2")

        assert _peer_status(NODES[-1], NODES[0]) == 401  # a member, without the token
        with v.LoadLoop(bases, "tiny-llama", key, workers=2, pause=0.2) as load:
            _cli(venv_bin, env, "scale", "--remove", NODES[-1], "--purge-model")
            assert sorted(_serving(venv_bin, env)) == sorted(NODES[:-1])
            standby = yaml.safe_load((inventory / fleet.NODES_FILE).read_text())
            assert NODES[-1] in standby["all"]["children"]["standby"]["hosts"], standby
            assert _peer_status(NODES[-1], NODES[0]) == 403
            added = _cli(venv_bin, env, "scale", "--add", NODES[-1])
        assert len(load.calls) >= 10 and not load.failed(), (len(load.calls), load.failed()[:3])
        synced = _synced(added, NODES[-1])
        assert synced["changed"] and synced["bytes_from_store"] == 0, synced
        assert sum(synced["bytes_from_peers"].values()) > 0, synced
        assert _serving(venv_bin, env) == dict.fromkeys(NODES, "v2")
        listed = yaml.safe_load((inventory / fleet.NODES_FILE).read_text())["all"]["children"]
        assert NODES[-1] in listed["inference"]["hosts"] and "standby" not in listed, listed
    finally:
        down = subprocess.run([str(venv_bin / "inferfleet"), "lab", "down"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
