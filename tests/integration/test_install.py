"""The product as an operator installs it. The collection tarball and the wheel are built
from this tree, then installed (the wheel with its [lab] extra) into a fresh virtualenv
and a fresh collections path in a folder outside the checkout, with the source tree on no
path. The installed CLI answers `--help` and `plan`, and brings up the lab from the
inventory its wheel carries: `inferfleet lab up --no-deploy` starts SeaweedFS with the
tiny model and the hosts, an operator's own playbook, written there, uses the
collection's role and module by FQCN on a node, `inferfleet lab up` runs site.yml from the
installed collection (vLLM's CPU build behind HAProxy), the curl line it prints gets a
completion through the load balancer, and `inferfleet lab down` removes it all.

The lab's containers are those of tests/integration/test_lab_cli.py (the lab has one set
of names, in its inventory): the lab_hosts fixture lets one of the two run at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

LAB_LABEL = "inferfleet.lab=inferfleet-lab"  # what `inferfleet lab` labels its containers with


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
        "XDG_STATE_HOME": str(work / "state"),
    }
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE", "DOCKER_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    run([work / "venv" / "bin" / "pip", "install", "--quiet", f"{wheel}[lab]"], cwd=work, env=env)
    run([work / "venv" / "bin" / "ansible-galaxy", "collection", "install", "--offline", "--force",
         "-p", work / "collections", tarball], cwd=work, env=env)
    return {"work": work, "env": env, "bin": work / "venv" / "bin", "wheel": wheel,
            "lab_inventory": work / "state" / "inferfleet" / "lab"}


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


def test_the_wheel_carries_the_lab_inventory_as_committed(installed, repo_root):
    tracked = run(["git", "ls-files", "inventories/lab"], cwd=repo_root).stdout.split()
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        shipped = [n for n in wheel.namelist() if n.startswith("inferfleet/lab/inventory/")]
    assert sorted(n.replace("inferfleet/lab/inventory/", "inventories/lab/") for n in shipped) \
        == sorted(tracked)


OPERATOR_PLAYBOOK = """\
- name: Weights on the node with the collection's role, then its module by FQCN
  hosts: {node}
  gather_facts: false
  roles:
    - role: inferfleet.fleet.model_sync
  tasks:
    - name: The same version again through the module itself changes nothing
      inferfleet.fleet.model_sync:
        name: "{{{{ inferfleet_model_name }}}}"
        version: "{{{{ inferfleet_model_version }}}}"
        s3_endpoint: "{{{{ model_sync_s3_endpoint }}}}"
        s3_bucket: "{{{{ model_sync_s3_bucket }}}}"
        s3_prefix: "{{{{ model_sync_s3_prefix }}}}"
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


def operators_playbook(installed: dict, inventory: Path, node: str) -> dict:
    """Run the operator's playbook on `node`; return its Report."""
    playbook = installed["work"] / "weights.yml"
    playbook.write_text(OPERATOR_PLAYBOOK.format(node=node))
    env = dict(installed["env"], ANSIBLE_STDOUT_CALLBACK="json")
    played = run([installed["bin"] / "ansible-playbook", "-i", inventory, playbook],
                 cwd=installed["work"], env=env)
    results = json.loads(played.stdout)
    report = next(t["hosts"][node]["msg"] for t in results["plays"][0]["tasks"]
                  if t["task"]["name"] == "Report")
    return json.loads(report) if isinstance(report, str) else report


def labelled(kind: str) -> list[str]:
    return subprocess.run(["docker", kind, "ls", "-q", "--filter", f"label={LAB_LABEL}"],
                          capture_output=True, text=True, check=True).stdout.split()


def test_the_installed_cli_runs_the_lab(installed, node_image, wheelhouse, lab_hosts):
    """node_image and wheelhouse: built under the suite's locks, found by `lab up`."""
    cli, work, env = installed["bin"] / "inferfleet", installed["work"], installed["env"]
    inventory = installed["lab_inventory"]
    try:
        run([cli, "lab", "up", "--no-deploy"], cwd=work, env=env)
        groups = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]
        node, balancer = next(iter(groups["inference"]["hosts"])), \
            next(iter(groups["loadbalancers"]["hosts"]))
        report = operators_playbook(installed, inventory, node)
        assert report["path"] == "/var/lib/inferfleet/models/tiny-llama/current"
        assert report["digest"].startswith("sha256:")
        assert report["again"] is False

        # the life-cycle playbooks are collection playbooks, from the operator's collections
        checked = run([installed["bin"] / "ansible-playbook", "-i", inventory,
                       "inferfleet.fleet.site", "--syntax-check"], cwd=work, env=env).stdout
        assert f"playbook: {work / 'collections'}" in checked

        up = run([cli, "lab", "up"], cwd=work, env=env, timeout=1200).stdout
        curl = next(line for line in up.splitlines() if line.startswith("curl -s http://"))
        answer = json.loads(run(["bash", "-c", curl], cwd=work, env=env, timeout=120).stdout)
        assert answer["object"] == "text_completion" and "text" in answer["choices"][0], answer
        (record,) = [json.loads(p.read_text()) for p in (work / "runs").glob("*/record.json")]
        assert (record["command"], record["playbook"], record["rc"]) == ("lab up", "site.yml", 0)
        assert record["inventory"] == str(inventory)
        assert record["stats"]["ok"][balancer] > 0

        status = run([cli, "lab", "status"], cwd=work, env=env).stdout
        assert node in status and balancer in status
    finally:
        down = subprocess.run([cli, "lab", "down"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert labelled("container") == [] and labelled("network") == []
    assert not inventory.exists()
