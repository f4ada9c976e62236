"""The product as an operator installs it. The collection tarball and the wheel are built
from this tree, then installed into a fresh virtualenv and a fresh collections path in a
folder outside the checkout, with the source tree on no path. An operator's own playbook,
written there, uses the collection's role and module by FQCN against a lab container; the
same install runs `inferfleet --help`, `inferfleet plan` and `inferfleet deploy`: site.yml
from the installed collection, vLLM's CPU build behind HAProxy, ending with a completion
through the load balancer.
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

pytestmark = pytest.mark.lab

LAB = "inferfleet-install"
NODE = f"{LAB}-node1"
BALANCER = f"{LAB}-lb"


def run(cmd: list, cwd: Path, env: dict | None = None, timeout: int = 900):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
        f"{done.stderr[-4000:]}"
    )
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory, repo_root, venv_bin) -> dict:
    """Build both artefacts, install them away from the checkout; the operator's env."""
    work = tmp_path_factory.mktemp("operator")
    dist = work / "dist"
    run([venv_bin / "ansible-galaxy", "collection", "build", "--output-path", dist, repo_root],
        cwd=repo_root)
    run([venv_bin / "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, repo_root],
        cwd=work)
    tarball = next(dist.glob("inferfleet-fleet-*.tar.gz"))
    wheel = next(dist.glob("inferfleet-*.whl"))
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3")
    run([base_python, "-m", "venv", work / "venv"], cwd=work)
    env = {
        "PATH": f"{work / 'venv' / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ["HOME"],
        "LANG": "C.UTF-8",
        "ANSIBLE_COLLECTIONS_PATH": str(work / "collections"),
        "ANSIBLE_NOCOLOR": "1",
        "INFERFLEET_RUNS_DIR": str(work / "runs"),
    }
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE", "DOCKER_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    run([work / "venv" / "bin" / "pip", "install", "--quiet", wheel], cwd=work, env=env)
    run([work / "venv" / "bin" / "ansible-galaxy", "collection", "install", "--offline", "--force",
         "-p", work / "collections", tarball], cwd=work, env=env)
    return {"work": work, "env": env, "bin": work / "venv" / "bin", "tarball": tarball}


def test_nothing_of_the_checkout_is_on_a_path(installed, repo_root):
    probe = (
        "import json, sys, inferfleet, ansible_collections.inferfleet.fleet as c; "
        "print(json.dumps({'sys_path': sys.path, 'cli': inferfleet.__file__, "
        "'collection': list(c.__path__)}))"
    )
    seen = json.loads(run([installed["bin"] / "python", "-c", probe], cwd=installed["work"],
                          env=installed["env"]).stdout)
    assert seen["cli"].startswith(str(installed["work"] / "venv"))
    # the operator's collections path comes first (then the wheel's copy in site-packages)
    assert seen["collection"] == [
        str(installed["work"] / "collections" / "ansible_collections" / "inferfleet" / "fleet")
    ]
    assert [p for p in seen["sys_path"] if p.startswith(str(repo_root))] == []
    listed = run([installed["bin"] / "ansible-galaxy", "collection", "list", "inferfleet.fleet"],
                 cwd=installed["work"], env=installed["env"]).stdout
    assert str(installed["work"] / "collections") in listed
    assert str(repo_root) not in listed


def test_the_cli_answers_help_and_plan(installed, repo_root):
    helped = run([installed["bin"] / "inferfleet", "--help"], cwd=installed["work"],
                 env=installed["env"]).stdout
    for command in ("plan", "deploy", "status", "verify", "rollout", "rollback", "scale"):
        assert command in helped
    config = repo_root / "tests" / "fixtures" / "configs" / "llama-3.1-8b.json"
    shutil.copy(config, installed["work"] / "config.json")
    planned = run([installed["bin"] / "inferfleet", "plan", installed["work"] / "config.json",
                   "--gpus-per-node", "1", "--gpu-memory-gib", "80", "--json"],
                  cwd=installed["work"], env=installed["env"]).stdout
    assert json.loads(planned)["decision"] == "replicated"


@pytest.fixture(scope="module")
def lab_hosts(installed, node_image, wheelhouse, tmp_path_factory):
    """SeaweedFS with the tiny model, an engine node and a load balancer, as containers."""
    from inferfleet.lab import fleet, services

    services.down(LAB)
    lab = services.up(LAB, node_image)
    services.publish_tiny(lab, "inferfleet", "models", "tiny-llama", "v1", seed=1,
                          workdir=tmp_path_factory.mktemp("tiny"))
    fleet.create(LAB, lab.network, node_image, [NODE, BALANCER], wheelhouse)
    yield lab
    services.down(LAB)


def write_inventory(installed: dict, lab) -> Path:
    inventory = installed["work"] / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {
            "ansible_connection": "community.docker.docker",
            "ansible_python_interpreter": "/usr/bin/python3",
            "inferfleet_accelerator": "cpu",
            "inferfleet_model_name": "tiny-llama",
            "inferfleet_model_version": "v1",
            "model_sync_s3_endpoint": lab.s3_endpoint_nodes,
            "model_sync_s3_bucket": "inferfleet",
            "model_sync_s3_prefix": "models",
            "model_sync_s3_access_key": lab.access_key,
            "model_sync_s3_secret_key": lab.secret_key,
            "model_sync_min_free_mb": 256,
            "inference_engine_pip_find_links": "/opt/inferfleet/wheelhouse",
            "inference_engine_cpu_kvcache_space": 1,
            "inference_engine_max_model_len": 1024,
            "inference_engine_dtype": "float16",
            "inference_engine_max_num_seqs": 4,
            "inference_engine_extra_args": ["--enforce-eager"],
            "inference_engine_extra_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                           "OMP_NUM_THREADS": "1"},
            "load_balancer_port": 8080,
            "inference_engine_api_key": "sk-install-engine-0123456789",
            "load_balancer_api_keys": [{"id": "op", "key": "sk-install-client-0123456789"}],
            "load_balancer_backend_api_key": "sk-install-engine-0123456789",
            "firewall_enabled": False,
        },
        "children": {
            "inference": {"hosts": {NODE: None}},
            "loadbalancers": {"hosts": {BALANCER: None}},
        },
    }}))
    return inventory


OPERATOR_PLAYBOOK = f"""\
- name: Weights on the node with the collection's role, then its module by FQCN
  hosts: {NODE}
  gather_facts: false
  roles:
    - role: inferfleet.fleet.model_sync
  tasks:
    - name: The same version again through the module itself changes nothing
      inferfleet.fleet.model_sync:
        name: tiny-llama
        version: v1
        s3_endpoint: "{{{{ model_sync_s3_endpoint }}}}"
        s3_bucket: inferfleet
        s3_prefix: models
        access_key: "{{{{ model_sync_s3_access_key }}}}"
        secret_key: "{{{{ model_sync_s3_secret_key }}}}"
        cache_root: /var/lib/inferfleet/models
        min_free_mb: 256
      register: again

    - name: Report
      ansible.builtin.debug:
        msg: "{{{{ {{'path': model_sync_model_path, 'digest': model_sync_manifest_digest,
                  'again': again.changed}} | to_json }}}}"
"""


def test_an_operators_playbook_and_a_life_cycle_command(installed, lab_hosts):
    inventory = write_inventory(installed, lab_hosts)
    playbook = installed["work"] / "weights.yml"
    playbook.write_text(OPERATOR_PLAYBOOK)
    env = dict(installed["env"], ANSIBLE_STDOUT_CALLBACK="json")
    played = run([installed["bin"] / "ansible-playbook", "-i", inventory, playbook],
                 cwd=installed["work"], env=env)
    results = json.loads(played.stdout)
    report = next(t["hosts"][NODE]["msg"] for t in results["plays"][0]["tasks"]
                  if t["task"]["name"] == "Report")
    report = json.loads(report) if isinstance(report, str) else report
    assert report["path"] == "/var/lib/inferfleet/models/tiny-llama/current"
    assert report["digest"].startswith("sha256:")
    assert report["again"] is False

    # the life-cycle playbooks are collection playbooks, from the operator's collections path
    checked = run([installed["bin"] / "ansible-playbook", "-i", inventory,
                   "inferfleet.fleet.site", "--syntax-check"], cwd=installed["work"],
                  env=installed["env"]).stdout
    assert f"playbook: {installed['work'] / 'collections'}" in checked

    # site.yml's last play asks the load balancer for a completion: rc 0 means it answered
    run([installed["bin"] / "inferfleet", "deploy", "-i", inventory],
        cwd=installed["work"], env=installed["env"], timeout=1200)
    records = list((installed["work"] / "runs").glob("*/record.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert (record["playbook"], record["check"], record["rc"]) == ("site.yml", False, 0)
    assert record["stats"]["ok"][BALANCER] > 0
