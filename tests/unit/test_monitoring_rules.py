"""The monitoring role's Prometheus files, rendered by Ansible itself and checked by promtool.

One `ansible-playbook` run renders prometheus.yml, the alert rules and the file_sd
targets into a temporary folder through the role's own `preflight` and
`prometheus-config` task files (the Prometheus host on a local connection; the other
hosts only exist in the inventory). Then:

- `promtool check config` reads prometheus.yml (and with it the rules and targets);
- `promtool test rules` runs every file of monitoring/rules-tests/ against the rendered
  rules, on synthetic series. The copy under test keeps each alert's `summary` as its only
  annotation (promtool compares annotations exactly, and the long ones are prose); the
  full file, every template included, passed `promtool check rules` when it was rendered.

promtool comes with Debian's `prometheus` package (scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
RULE_TESTS = sorted((REPO / "monitoring" / "rules-tests").glob("*.test.yml"))
DOCS = REPO / "docs" / "monitoring.md"

PLAYBOOK = """\
- name: Render Prometheus's files into a folder
  hosts: monitoring
  gather_facts: false
  tasks:
    - name: Run the role's preflight
      ansible.builtin.include_role:
        name: inferfleet.fleet.monitoring
        tasks_from: preflight
    - name: Render prometheus.yml, the rules and the targets
      ansible.builtin.include_role:
        name: inferfleet.fleet.monitoring
        tasks_from: prometheus-config
    # The role's handlers would reload a real Prometheus on this machine: not here.
    - name: Stop before the handlers
      ansible.builtin.meta: end_play
"""

# gpu-a alone; big = gpu-b1 + gpu-b0 (gpu-b0 is rank 0) on another port; cpu-c on CPU;
# lb1 with its admin bind on a management address, lb2 on every address.
ENGINES = {
    "gpu-a": {"ansible_host": "10.0.0.11"},
    "gpu-b1": {"ansible_host": "10.0.0.13", "inferfleet_instance": "big", "inferfleet_rank": 1},
    "gpu-b0": {"ansible_host": "10.0.0.14", "inferfleet_instance": "big", "inferfleet_rank": 0,
               "inference_engine_port": 8001},
    "cpu-c": {"ansible_host": "10.0.0.20", "inferfleet_accelerator": "cpu",
              "monitoring_scrape_address": "10.1.0.20", "inferfleet_model_name": "coder"},
}
LBS = {
    "lb1": {"ansible_host": "192.0.2.1", "load_balancer_admin_address": "10.0.0.1"},
    "lb2": {"ansible_host": "10.0.0.2", "load_balancer_admin_address": "0.0.0.0",
            "load_balancer_admin_port": 9404, "load_balancer_routing": "cache_aware"},
}


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool is missing: run `make setup` (it installs Debian's prometheus "
                    "package, which carries promtool)")
    return found


def _inventory(tmp: Path, lbs: dict, extra: dict | None = None,
               engines: dict | None = None) -> Path:
    """tmp/inventory.yml: `engines`, `lbs` and the monitoring host, which renders into
    tmp/etc-prometheus."""
    inventory = {
        "all": {
            # The fleet's model; cpu-c serves another.
            "vars": {"inferfleet_model_name": "m"},
            "children": {
                "inference": {"hosts": engines or ENGINES},
                "loadbalancers": {"hosts": lbs},
                "monitoring": {"hosts": {"mon": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "monitoring_prometheus_config_dir": str(tmp / "etc-prometheus"),
                    "monitoring_alertmanagers": ["am1:9093"],
                    "monitoring_prometheus_external_labels": {"fleet": "test"},
                    **(extra or {}),
                }}},
            }
        }
    }
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    return tmp / "inventory.yml"


def _render(tmp: Path, lbs: dict, extra: dict | None = None,
            inventory: Path | None = None) -> subprocess.CompletedProcess:
    """Render Prometheus's files from `inventory` (default: _inventory's in tmp)."""
    inventory = inventory or _inventory(tmp, lbs, extra)
    (tmp / "render.yml").write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(tmp / "render.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    _promtool()
    tmp = tmp_path_factory.mktemp("monitoring")
    run = _render(tmp, LBS)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    return tmp / "etc-prometheus"


@pytest.fixture(scope="module")
def alert_names(rendered) -> list[str]:
    rules = yaml.safe_load((rendered / "rules" / "inferfleet.rules.yml").read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_config(rendered):
    run = subprocess.run([_promtool(), "check", "config", str(rendered / "prometheus.yml")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout + run.stderr
    # Every job's target file was read, and none came out empty of meaning.
    assert "WARNING" not in run.stdout + run.stderr


def test_prometheus_yml_scrapes_every_job_from_its_file(rendered):
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "engine", "loadbalancer", "router", "node", "dcgm"}
    for name in ("engine", "loadbalancer", "router", "node", "dcgm"):
        assert jobs[name]["file_sd_configs"] == [
            {"files": [str(rendered / "inferfleet-targets" / f"{name}.json")]}]
    assert config["rule_files"] == [str(rendered / "rules" / "inferfleet.rules.yml")]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["am1:9093"]
    assert config["global"]["external_labels"] == {"fleet": "test"}


def _targets(rendered: Path, job: str) -> dict[str, dict]:
    groups = json.loads((rendered / "inferfleet-targets" / f"{job}.json").read_text())
    return {g["labels"]["instance"]: {"targets": g["targets"], **g["labels"]} for g in groups}


def test_engine_targets_are_every_instances_rank_0(rendered):
    engines = _targets(rendered, "engine")
    assert engines == {
        "cpu-c": {"targets": ["10.1.0.20:8000"], "instance": "cpu-c",
                  "inferfleet_instance": "cpu-c", "inferfleet_rank": "0",
                  "inferfleet_instance_size": "1", "inferfleet_model": "coder"},
        "gpu-a": {"targets": ["10.0.0.11:8000"], "instance": "gpu-a",
                  "inferfleet_instance": "gpu-a", "inferfleet_rank": "0",
                  "inferfleet_instance_size": "1", "inferfleet_model": "m"},
        "gpu-b0": {"targets": ["10.0.0.14:8001"], "instance": "gpu-b0",
                   "inferfleet_instance": "big", "inferfleet_rank": "0",
                   "inferfleet_instance_size": "2", "inferfleet_model": "m"},
    }


def test_every_host_has_a_node_exporter_target_with_its_instance(rendered):
    nodes = _targets(rendered, "node")
    assert set(nodes) == {"gpu-a", "gpu-b0", "gpu-b1", "cpu-c", "lb1", "lb2", "mon"}
    # The pipeline's rank 1 serves no HTTP, but its node exporter tells whether its engine runs.
    assert nodes["gpu-b1"] == {"targets": ["10.0.0.13:9100"], "instance": "gpu-b1",
                               "inferfleet_instance": "big", "inferfleet_rank": "1",
                               "inferfleet_instance_size": "2", "inferfleet_model": "m"}
    assert nodes["lb1"] == {"targets": ["192.0.2.1:9100"], "instance": "lb1"}
    assert nodes["mon"]["targets"] == ["mon:9100"]


def test_hosts_on_their_way_out_are_no_longer_scraped(tmp_path):
    run = _render(tmp_path, LBS, {"monitoring_leaving": ["gpu-a"]})
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    rendered = tmp_path / "etc-prometheus"
    assert sorted(_targets(rendered, "engine")) == ["cpu-c", "gpu-b0"]
    assert "gpu-a" not in _targets(rendered, "node")
    assert "gpu-a" not in _targets(rendered, "dcgm")


def test_the_group_labels_follow_a_migration_step(tmp_path):
    """`inferfleet migrate` runs scale.yml, and so this role, with a mixed inventory: the
    pipeline `big`'s members, moved to replicas, lose its labels (and the group alert,
    which counts members by them, goes with them); the others keep theirs."""
    from inferfleet import migrate

    group = ("inferfleet_instance", "inferfleet_rank")
    replicas = {h: {k: v for k, v in hv.items() if k not in group} for h, hv in ENGINES.items()}
    old = migrate.read(_inventory(tmp_path / "old", LBS))
    new = migrate.read(_inventory(tmp_path / "new", LBS, engines=replicas))
    mixed = migrate.write(migrate.mixed(old, new, {"gpu-b0", "gpu-b1"}), tmp_path / "mixed.yml")
    run = _render(tmp_path, LBS, inventory=mixed)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    # (the mixed inventory's monitoring host renders where the old layout's would)
    rendered = tmp_path / "old" / "etc-prometheus"
    nodes = _targets(rendered, "node")
    assert {h: (nodes[h]["inferfleet_instance"], nodes[h]["inferfleet_instance_size"])
            for h in ("gpu-a", "gpu-b0", "gpu-b1")} == {
        "gpu-a": ("gpu-a", "1"), "gpu-b0": ("gpu-b0", "1"), "gpu-b1": ("gpu-b1", "1")}
    assert sorted(_targets(rendered, "engine")) == ["cpu-c", "gpu-a", "gpu-b0", "gpu-b1"]


def test_dcgm_only_on_gpu_nodes(rendered):
    assert sorted(_targets(rendered, "dcgm")) == ["gpu-a", "gpu-b0", "gpu-b1"]
    assert _targets(rendered, "dcgm")["gpu-b1"]["targets"] == ["10.0.0.13:9400"]


def test_load_balancer_targets_use_the_admin_bind(rendered):
    lbs = _targets(rendered, "loadbalancer")
    assert lbs["lb1"]["targets"] == ["10.0.0.1:8404"]
    # A wildcard bind is reached at the host's own address.
    assert lbs["lb2"]["targets"] == ["10.0.0.2:9404"]
    assert {lb["__metrics_path__"] for lb in lbs.values()} == {"/metrics"}


def test_each_model_s_router_is_scraped_through_a_cache_aware_load_balancer(rendered):
    """lb2 routes cache_aware: a target per model, its router's metrics on the admin bind;
    lb1 (leastconn) has none."""
    groups = json.loads((rendered / "inferfleet-targets" / "router.json").read_text())
    assert groups == [
        {"targets": ["10.0.0.2:9404"], "labels": {
            "instance": "lb2", "inferfleet_model": model,
            "__metrics_path__": f"/metrics/router/{model}"}}
        for model in ("coder", "m")]


def test_preflight_refuses_a_loopback_admin_bind_for_a_remote_prometheus(tmp_path):
    run = _render(tmp_path, {"lb1": {"ansible_host": "192.0.2.1"}})
    assert run.returncode != 0
    out = " ".join((run.stdout + run.stderr).split())
    assert "lb1 (127.0.0.1)" in out
    assert "set load_balancer_admin_address on those hosts" in out


def test_preflight_refuses_a_percentage_for_a_ratio(tmp_path):
    run = _render(tmp_path, LBS, {"monitoring_alert_kv_cache_ratio": 95})
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert "monitoring_alert_kv_cache_ratio: a share between 0 and 1" in out


def test_promtool_check_rules(rendered):
    run = subprocess.run(
        [_promtool(), "check", "rules", str(rendered / "rules" / "inferfleet.rules.yml")],
        capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _summary_only(rendered: Path, folder: Path) -> None:
    rules = yaml.safe_load((rendered / "rules" / "inferfleet.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "annotations" in rule:
                rule["annotations"] = {"summary": rule["annotations"]["summary"]}
    (folder / "inferfleet.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(rendered, tmp_path, test_file):
    _summary_only(rendered, tmp_path)
    shutil.copy(test_file, tmp_path / test_file.name)
    run = subprocess.run([_promtool(), "test", "rules", test_file.name], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_every_alert_fires_in_a_rule_test(alert_names):
    fired = set()
    for test_file in RULE_TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    assert sorted(set(alert_names) - fired) == [], "alerts that no promtool test fires"


def test_every_alert_is_documented(alert_names):
    docs = DOCS.read_text()
    missing = [name for name in alert_names if f"### {name}" not in docs]
    assert missing == [], f"docs/monitoring.md has no section for {missing}"
