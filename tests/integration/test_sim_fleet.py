"""A small fleet of SIMULATED GPU engines through the operator's life cycle, in minutes.

`inferfleet lab up --nodes 6 --engine sim --nginx --routing prefix` runs site.yml over six
nodes whose engine is the inference_engine role's sim runtime (docs/engine.md: a stand-in
for a GPU-backed vLLM, installed and run like it), behind HAProxy (prefix routing) and
Nginx (leastconn). Every command runs through Mitogen's strategy (INFERFLEET_MITOGEN=1),
which the other scenarios leave off:
- a second deploy changes nothing;
- `verify`: every node healthy, one greedy answer from every node and both load
  balancers, the load spread over all six;
- prefix routing: the requests of each of three tenants (one long shared prefix, then
  each request's own question) land on one engine, seen in the engines' counters;
- `doctor`, with one engine given 96 requests at once (its max_num_seqs is 8): one
  finding, the queue in that engine, with its slots and the fix;
- `rollout --version v2` under load through both load balancers: no request fails, every
  node on v2;
- `scale --remove` of node6 under load, then `scale --add`: no request fails, the fleet
  serves on five nodes, then six, and node6 is listed where it was (nodes.yml).
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


def _serving(bin_dir: Path, env: dict) -> dict[str, str]:
    """host -> model version of each node `status` lists, all healthy."""
    nodes = json.loads(_cli(bin_dir, env, "status", "--json"))["nodes"]
    assert all(n["healthy"] and n["unit"] == "active" for n in nodes), nodes
    return {n["host"]: n["model_version"] for n in nodes}


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


def _prefix_routing_keeps_tenants_together(inventory: Path) -> None:
    """Through HAProxy (load_balancer_routing: prefix), each tenant's requests (its long
    system prompt, then a question of each request's own) all reach one engine, by the
    engines' own request counters: one request after another on one kept connection, as
    the OpenAI SDKs send them (on a new connection each, a request may arrive while
    HAProxy still counts the one before it, and the coarse bound of a few requests in
    flight sends it on; docs/load-balancer.md)."""
    fleet = fleet_mod.load(inventory)
    assert fleet.routing == "prefix"
    haproxy = urlsplit(fleet.balancers[0])  # the lab's HAProxy; Nginx comes second
    connection = http.client.HTTPConnection(haproxy.hostname, haproxy.port, timeout=30)
    headers = {"Authorization": f"Bearer {fleet.api_key}", "Content-Type": "application/json"}

    def served() -> dict[str, float]:
        return {n.host: v.served_requests(v.get(f"{n.base}/metrics", fleet.engine_key)[1])
                for n in fleet.serving}

    homes = set()
    for tenant in ("support desk", "legal review", "code helper"):
        system = f"You are the {tenant} assistant of tenant {tenant}. " * 12
        before = served()
        for question in range(6):
            body = {"model": fleet.model, "prompt": f"{system}Question {question}: why?",
                    "max_tokens": 4}
            connection.request("POST", "/v1/completions", json.dumps(body), headers)
            answer = connection.getresponse()
            assert answer.status == 200, (answer.status, answer.read()[:300])
            answer.read()
        after = served()
        got = {h: after[h] - before[h] for h in after if after[h] > before[h]}
        assert len(got) == 1 and sum(got.values()) == 6, (tenant, got)
        homes |= set(got)
    connection.close()
    assert len(homes) > 1, homes  # the tenants do not all share one engine


def test_a_simulated_fleet_deploys_verifies_rolls_and_scales(
    tmp_path, node_image, venv_bin, lab_names
):
    env = dict(os.environ, INFERFLEET_MITOGEN="1", INFERFLEET_RUNS_DIR=str(tmp_path / "runs"))
    inventory = paths.LAB_INVENTORY
    try:
        _cli(venv_bin, env, "lab", "up", "--nodes", "6", "--engine", "sim", "--nginx",
             "--routing", "prefix", timeout=1200)
        balancers = fleet.inventory_hosts(inventory)["loadbalancers"]
        assert balancers == ["inferfleet-lab-lb", fleet.NGINX_HOST], balancers

        again = _record(_cli(venv_bin, env, "deploy"))
        assert (again["rc"], again["mitogen"]) == (0, True), again
        assert sorted(again["stats"]["ok"]) == sorted([*NODES, *balancers]), again["stats"]
        assert sum(again["stats"]["changed"].values()) == 0, again["stats"]["changed"]

        report = json.loads(_cli(venv_bin, env, "verify", "--json", "--count", "60"))
        assert report["ok"], report["checks"]
        passed = {c["check"] for c in report["checks"] if c["passed"]}
        assert {f"healthy {n}" for n in NODES} | {"identical greedy answers"} <= passed
        same = next(c for c in report["checks"] if c["check"] == "identical greedy answers")
        assert same["detail"].startswith(f"{len(NODES) + len(balancers)} answers"), same
        assert report["load"]["sent"] == 60 and report["load"]["failed"] == 0, report["load"]
        _prefix_routing_keeps_tenants_together(inventory)
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

        with v.LoadLoop(bases, "tiny-llama", key, workers=2, pause=0.2) as load:
            _cli(venv_bin, env, "scale", "--remove", NODES[-1])
            assert sorted(_serving(venv_bin, env)) == sorted(NODES[:-1])
            standby = yaml.safe_load((inventory / fleet.NODES_FILE).read_text())
            assert NODES[-1] in standby["all"]["children"]["standby"]["hosts"], standby
            _cli(venv_bin, env, "scale", "--add", NODES[-1])
        assert len(load.calls) >= 10 and not load.failed(), (len(load.calls), load.failed()[:3])
        assert _serving(venv_bin, env) == dict.fromkeys(NODES, "v2")
        listed = yaml.safe_load((inventory / fleet.NODES_FILE).read_text())["all"]["children"]
        assert NODES[-1] in listed["inference"]["hosts"] and "standby" not in listed, listed
    finally:
        down = subprocess.run([str(venv_bin / "inferfleet"), "lab", "down"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
